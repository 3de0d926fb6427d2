import math
import warnings

import numpy as np
import pytest
import torch

from lightning_epipe.compressors import NonFiniteError, Packet, PacketError, TopK, host
from lightning_epipe.compressors import topk as topk_module
from lightning_epipe.compressors.kernels import largest_positions
from lightning_epipe.compressors.packet import header_nbytes

from .cases import sample, ulp_slack


def distinct(n: int, seed: int = 0) -> torch.Tensor:
    """Values with distinct magnitudes and random signs."""
    g = torch.Generator().manual_seed(seed)
    magnitude = (torch.randperm(n, generator=g) + 1).float()
    return magnitude * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)


@pytest.mark.parametrize("n, fraction", [(10, 0.1), (1000, 0.05), (100_000, 0.01), (5000, 0.2)])
def test_keeps_exactly_the_largest_and_zeroes_the_rest(n, fraction):
    x = distinct(n)
    y = TopK(fraction=fraction).decode(TopK(fraction=fraction).encode(x))
    k = math.ceil(fraction * n)
    kept = y != 0
    assert int(kept.sum()) == k
    assert set(kept.nonzero().squeeze(1).tolist()) == set(x.abs().topk(k).indices.tolist())
    assert torch.equal(y[kept], x[kept])


@pytest.mark.parametrize("n, index_bits", [(2, 1), (256, 8), (257, 9), (70_000, 17)])
def test_positions_are_as_narrow_as_the_tensor_needs(n, index_bits):
    x = (distinct(n) / n).half()
    k = math.ceil(0.1 * n)
    packet = TopK(fraction=0.1).encode(x)
    assert packet.payload[2] == index_bits
    assert packet.nbytes == header_nbytes(1) + 8 + 2 * k + -(-k * index_bits // 8)


def test_quantized_values_are_within_half_a_step():
    x = sample((4000,), torch.float32)
    codec = TopK(fraction=0.1, bits=6)
    y = codec.decode(codec.encode(x))
    kept = y != 0
    top = x[x.abs().topk(400).indices]
    step = float(top.max() - top.min()) / 63
    assert int(kept.sum()) == 400
    assert float((y[kept] - x[kept]).abs().max()) <= step / 2 + ulp_slack(x)
    assert codec.encode(x).nbytes == header_nbytes(1) + 8 + (12 + 400 * 6 // 8) + 400 * 12 // 8


def test_candidate_threshold_finds_the_same_set_as_a_full_topk():
    x = sample((300_000,), torch.float32)
    for k in (1, 77, 3000):
        fast = topk_module._largest(x, k)
        assert set(fast.tolist()) == set(x.abs().topk(k).indices.tolist())


def test_ties_at_the_threshold_keep_exactly_k():
    x = torch.ones(50_000)
    x[::7] = -1
    positions = topk_module._largest(x, 100)
    assert positions.unique().numel() == 100


@pytest.mark.parametrize("n", [9, 5000, topk_module.SAMPLE + 1, 300_000])
def test_torch_selection_and_host_selection_pick_the_same_positions(n):
    """Both paths: the largest magnitudes, NaN as inf, the lowest positions at the k-th largest."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    ties = torch.where(x < 0.5, -2.0, 0.0)                  # ~69% at magnitude 2: ties at the threshold
    special = torch.relu(x)
    special[[1, 4, n // 2]] = torch.tensor([math.nan, -math.inf, math.nan])
    for values in (x, ties, special, torch.full((n,), 0.5)):
        for k in sorted({1, 3, n // 10 or 1, n // 2, n}):
            chosen = np.empty(k, dtype=np.int64)
            largest_positions(values.numpy(), k, chosen)
            assert torch.equal(topk_module._largest(values, k), torch.from_numpy(chosen)), k
            assert torch.equal(topk_module._largest(values.double(), k), torch.from_numpy(chosen)), k


def test_unchecked_nan_is_kept_as_the_largest_on_both_paths(monkeypatch):
    x = distinct(400)
    x[[3, 250]] = math.nan
    codec = TopK(fraction=0.01, check_finite=False)
    fast = codec.encode(x)
    y = codec.decode(fast)
    assert y[[3, 250]].isnan().all() and int((y != 0).sum()) == 4  # k = 4: the 2 NaN and the 2 largest
    monkeypatch.setattr(host, "COMPILED_MAX", -1)
    assert torch.equal(TopK(fraction=0.01, check_finite=False).encode(x).payload, fast.payload)
    with pytest.raises(NonFiniteError, match="2 of 400 values are not finite"):
        TopK(fraction=0.01).encode(x)


def test_dense_when_sparse_costs_more_warns_once():
    x = sample((1000,), torch.float32)
    codec = TopK(fraction=0.8)
    with pytest.warns(UserWarning, match=r"800 of 1000 values with 10-bit positions cost 4200 "
                                         r"bytes, no less than all 1000 values \(4000 bytes\)"):
        packet = codec.encode(x)
    assert packet.payload[0] == 1 and packet.payload.numel() == 8 + 4000
    assert torch.equal(TopK().decode(packet), x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codec.encode(x)
        TopK(fraction=1.0).encode(x)  # everything kept: dense without a word


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5, "0.5", True, None])
def test_bad_fraction(fraction):
    with pytest.raises(ValueError, match=r"topk: fraction must be a number in \(0, 1\]"):
        TopK(fraction=fraction)


def test_bad_bits():
    with pytest.raises(ValueError, match=r"topk: bits must be an integer in 2..16 or None"):
        TopK(bits=1)


def test_position_beyond_the_tensor_is_refused():
    packet = TopK(fraction=0.5).encode(distinct(200))   # 8-bit positions, 100 of them
    payload = packet.payload.clone()
    payload[-1] = 255
    with pytest.raises(PacketError, match="a position is 255, beyond 200 elements"):
        TopK().decode(Packet(packet.codec, packet.dtype, packet.shape, payload))


def test_prefix_that_does_not_fit_the_shape_is_refused():
    packet = TopK(fraction=0.5).encode(distinct(200))
    payload = packet.payload.clone()
    payload[4] = 201  # k > numel
    with pytest.raises(PacketError, match="k=201"):
        TopK().decode(Packet(packet.codec, packet.dtype, packet.shape, payload))
