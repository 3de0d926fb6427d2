"""ErrorFeedback: the residual of each compression reaches the receiver later, not never."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_epipe.compressors import ErrorFeedback, get_compressor


def test_sum_of_decoded_tracks_sum_of_inputs():
    """sum(decoded) = sum(inputs) - last residual: the error does not accumulate."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(500, generator=g) for _ in range(20)]
    fed, plain = ErrorFeedback("topk", fraction=0.1), get_compressor("topk", fraction=0.1)
    sent_fed = sum(fed.decode(fed.encode(x)) for x in xs)
    sent_plain = sum(plain.decode(plain.encode(x)) for x in xs)
    total = sum(xs)
    torch.testing.assert_close(sent_fed + fed.state_dict()["residual"], total, rtol=1e-5, atol=1e-4)
    assert (sent_fed - total).norm() < 0.5 * (sent_plain - total).norm()


def test_packets_are_the_inner_codecs():
    fed = ErrorFeedback("quantize", bits=4)
    packet = fed.encode(torch.randn(64))
    assert fed.codec_id == packet.codec == get_compressor("quantize").codec_id
    torch.testing.assert_close(get_compressor("quantize", bits=4).decode(packet), fed.decode(packet))


def test_state_round_trips_and_continues_identically():
    a = ErrorFeedback("powersgd", rank=1)
    for _ in range(3):
        a.encode(torch.randn(4, 8, 6))
    b = ErrorFeedback("powersgd", rank=1)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert set(a.state_dict()) == {"residual", "inner.q"}
    x = torch.randn(4, 8, 6)
    assert torch.equal(a.encode(x).payload, b.encode(x).payload)


def test_a_new_shape_starts_from_zero_residual():
    fed = ErrorFeedback("quantize", bits=2)
    fed.encode(torch.randn(16))
    x = torch.randn(7)   # a smaller last micro-batch
    assert torch.equal(fed.encode(x).payload, get_compressor("quantize", bits=2).encode(x).payload)


def test_lossless_inner_keeps_no_state():
    fed = ErrorFeedback("none")
    fed.encode(torch.randn(8))
    assert fed.state_dict() == {} and fed.lossless


def test_reset_and_deepcopy():
    fed = ErrorFeedback("quantize", bits=2)
    fed.encode(torch.randn(8))
    clone = copy.deepcopy(fed)
    assert torch.equal(clone.state_dict()["residual"], fed.state_dict()["residual"])
    fed.reset()
    assert fed.state_dict() == {} and "residual" in clone.state_dict()


@pytest.mark.parametrize("args, kwargs, error, match", [
    (("quantize",), {"bits": 1}, ValueError, "bits must be an integer"),
    ((get_compressor("topk"),), {"fraction": 0.1}, ValueError, "go with an inner codec given by name"),
    ((ErrorFeedback("topk"),), {}, TypeError, "wraps one codec"),
    ((3,), {}, TypeError, "wraps one codec"),
])
def test_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        ErrorFeedback(*args, **kwargs)


def test_bad_state():
    with pytest.raises(ValueError, match="state must hold 'residual'"):
        ErrorFeedback("topk").load_state_dict({"q": torch.zeros(2)})
