"""DeltaCompressor and SampleCache: caches in lockstep, new vs seen rows, bad input."""

from __future__ import annotations


import pytest
import torch

from lightning_epipe.compressors import PacketError
from lightning_epipe.compressors.delta import CacheTooLarge, DeltaCompressor, SampleCache


def pair(**kwargs):
    return DeltaCompressor(inner="quantize", bits=2, **kwargs), DeltaCompressor(inner="quantize", bits=2, **kwargs)


def send(sender, receiver, x, ids, num_samples=0):
    sender.bind(ids, num_samples)
    receiver.bind(ids, num_samples)
    packet = sender.encode(x)
    return packet, receiver.decode(packet)


def test_first_crossing_is_exact_with_an_uncompressed_first_codec():
    s, r = pair()
    x = torch.randn(6, 5)
    _, y = send(s, r, x, torch.tensor([4, 0, 9, 2, 7, 1]))
    assert torch.equal(y, x)


def test_mixed_micro_batch_of_new_and_seen_samples_keeps_row_order():
    s, r = pair()
    x = torch.randn(10, 8)
    send(s, r, x[:5], torch.arange(5))
    ids = torch.tensor([7, 3, 5, 1, 6])          # 3 and 1 seen, 7, 5, 6 new
    x2 = torch.cat([x[7:8], x[3:4] + 0.01, x[5:6], x[1:2] - 0.01, x[6:7]])
    _, y = send(s, r, x2, ids)
    assert torch.equal(y[[0, 2, 4]], x2[[0, 2, 4]])            # new rows: exact
    assert (y[[1, 3]] - x2[[1, 3]]).abs().max() < 0.01         # seen rows: 2-bit deltas of +-0.01
    assert torch.equal(s.cache.rows, r.cache.rows) and int(s.cache.seen.sum()) == 8


def test_error_does_not_accumulate_over_many_steps():
    s, r = pair()
    g = torch.Generator().manual_seed(0)
    x, ids = torch.randn(4, 32, generator=g), torch.arange(4)
    for _ in range(50):
        x = x + 0.01 * torch.randn(4, 32, generator=g)
        _, y = send(s, r, x, ids)
    assert ((y - x).norm() / x.norm()) < 0.01


def test_deltas_are_smaller_on_the_wire_than_first_crossings():
    s, r = pair()
    x = torch.randn(16, 64)
    first, _ = send(s, r, x, torch.arange(16))
    again, _ = send(s, r, x + 0.1, torch.arange(16))
    assert again.nbytes < 0.15 * first.nbytes


def test_without_ids_everything_goes_through_first():
    s, r = pair(first="fp16")
    x = torch.randn(3, 4)
    s.bind(None)
    r.bind(None)
    y = r.decode(s.encode(x))
    torch.testing.assert_close(y, x.half().float())
    assert s.cache.rows is None


def test_diverged_caches_are_a_packet_error():
    s, r = pair()
    x, ids = torch.randn(4, 4), torch.arange(4)
    send(s, r, x, ids)
    r.cache.seen[2] = False                     # the receiver lost a row
    s.bind(ids)
    r.bind(ids)
    with pytest.raises(PacketError, match="the two caches of this cut diverged"):
        r.decode(s.encode(x))


def test_cache_limit_names_the_need():
    s = DeltaCompressor(inner="quantize", cache=SampleCache(max_bytes=1000, name="the activation cache of cut 1"))
    s.bind(torch.arange(4), num_samples=50)
    with pytest.raises(CacheTooLarge, match=r"cut 1: .* 50 samples x \[8\] torch.float32 = 1.6 KiB .* limit of 1000.0 B"):
        s.encode(torch.randn(4, 8))


def test_cache_state_round_trip():
    s, r = pair()
    send(s, r, torch.randn(4, 6), torch.arange(4))
    fresh = SampleCache()
    fresh.load_state_dict(s.cache.state_dict())
    assert torch.equal(fresh.rows, s.cache.rows) and fresh.nbytes == s.cache.nbytes == 4 * 6 * 4 + 4
    with pytest.raises(ValueError, match="state must be"):
        fresh.load_state_dict({"rows": torch.zeros(2, 3)})


@pytest.mark.parametrize("ids, match", [
    (torch.tensor([0, 0, 1]), "distinct"),
    (torch.tensor([0, 1]), "for a tensor of 3 rows"),
    (torch.tensor([0.0, 1.0, 2.0]), "integers"),
    (torch.tensor([-1, 0, 1]), ">= 0"),
])
def test_bad_ids(ids, match):
    s = DeltaCompressor(inner="quantize")
    s.bind(ids)
    with pytest.raises(ValueError, match=match):
        s.encode(torch.randn(3, 2))


def test_a_changing_row_shape_is_refused():
    s, r = pair()
    send(s, r, torch.randn(2, 4), torch.arange(2))
    s.bind(torch.arange(2))
    with pytest.raises(ValueError, match="keep its shape"):
        s.encode(torch.randn(2, 5))
