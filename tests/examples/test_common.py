"""The shared pieces: the pair dataset and the learning-rate schedule."""

import math

import pytest
import torch

from examples.common import PairDataset, warmup_decay


def _factors(warmup: int, total: int, decay: str) -> list[float]:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = warmup_decay(optimizer, warmup, total, decay)
    return [schedule.lr_lambdas[0](step) for step in range(total + 1)]


def test_warmup_then_cosine_reaches_zero_at_the_end():
    factors = _factors(warmup=2, total=6, decay="cosine")
    assert factors[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert factors[4] == pytest.approx(0.5 * (1 + math.cos(math.pi / 2)))
    assert factors[6] == pytest.approx(0.0)


def test_linear_decay_without_warmup():
    assert _factors(warmup=0, total=4, decay="linear") == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


def test_warmup_longer_than_training_is_refused():
    with pytest.raises(ValueError, match="warmup: 5, total: 5"):
        _factors(warmup=5, total=5, decay="cosine")


def test_pair_dataset_yields_tuples_of_inputs():
    dataset = PairDataset((torch.arange(6).view(3, 2), torch.ones(3, 2)), torch.tensor([0, 1, 2]))
    (first, second), label = dataset[1]
    assert first.tolist() == [2, 3] and second.tolist() == [1.0, 1.0] and int(label) == 1


def test_pair_dataset_refuses_inputs_and_labels_of_different_lengths():
    with pytest.raises(ValueError, match=r"inputs: \[4\], labels: 3"):
        PairDataset(torch.zeros(4, 2), torch.zeros(3, dtype=torch.long))
