import pytest
import torch

from lightning_epipe.strategy.engine.microbatch import batch_size, flatten, gather, join, scatter, tensors_of, unflatten


def test_scatter_tensor_sizes_differ_by_at_most_one():
    parts = scatter(torch.arange(10), 4)
    assert [len(p) for p in parts] == [3, 3, 2, 2]
    assert torch.equal(gather(parts), torch.arange(10))


def test_small_last_batch_runs_as_fewer_microbatches():
    assert len(scatter(torch.zeros(3, 2), 8)) == 3


def test_scatter_dict_keeps_masks_with_their_rows():
    batch = {"input_ids": torch.arange(8).view(4, 2), "attention_mask": torch.ones(4, 2, dtype=torch.bool)}
    parts = scatter(batch, 2)
    assert list(parts[1]) == ["input_ids", "attention_mask"]
    assert torch.equal(parts[1]["input_ids"], batch["input_ids"][2:])
    assert parts[1]["attention_mask"].dtype == torch.bool


def test_scatter_tuple_and_gather_tuple():
    x, m = torch.randn(6, 3), torch.ones(6, dtype=torch.long)
    parts = scatter((x, m), 3)
    assert isinstance(parts[0], tuple) and len(parts) == 3
    out = gather(parts)
    assert torch.equal(out[0], x) and torch.equal(out[1], m)


def test_mismatched_batch_dims_are_an_error():
    with pytest.raises(ValueError, match="share dim 0"):
        batch_size((torch.zeros(4), torch.zeros(5)))


def test_non_tensor_inputs_are_an_error():
    with pytest.raises(TypeError, match="must be a Tensor"):
        scatter((torch.zeros(4), 3), 2)


def test_flatten_round_trip_and_errors():
    t = torch.zeros(2)
    assert unflatten(*flatten(t)) is t
    assert unflatten(*flatten((t, t))) == (t, t)
    with pytest.raises(TypeError, match="Tensor or a tuple of Tensors"):
        flatten({"x": t})


@pytest.mark.parametrize("rows, chunks", [(10, 4), (7, 8), (256, 8)])
def test_join_undoes_scatter_and_scatter_of_the_join_splits_the_same(rows, chunks):
    """The first stage splits a whole-batch input with scatter(batch, m): the client's micro-batches."""
    x = torch.arange(rows * 3).reshape(rows, 3)
    for batch in (x, (x, x * 2), {"ids": x, "mask": x > 4}):
        parts = scatter(batch, chunks)
        whole = join(parts)
        again = scatter(whole, len(parts))
        assert type(whole) is type(batch) and len(again) == len(parts)
        for a, b in zip(again, parts):
            assert all(torch.equal(u, v) for u, v in zip(tensors_of(a), tensors_of(b)))
