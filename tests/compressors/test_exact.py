"""Exact where it is cheap: min, max and repeated values decode bit for bit."""

import math

import pytest
import torch

from lightning_epipe.compressors import Packet, get_compressor
from lightning_epipe.compressors.exact import repeated_values

from .cases import FLOATS, codec_id

#: Every quantizer and mode (lloydmax pins the ends from 4 bits).
QUANTIZERS = [
    ("quantize", {"bits": 2}),
    ("quantize", {"bits": 8}),
    ("quantize", {"bits": 13}),
    ("sortquant", {"bits": 8}),
    ("sortquant", {"bits": 4, "split": 1}),
    ("sortquant", {"bits": 8, "boundaries": "exact"}),
    ("sortquant", {"bits": 12, "boundaries": "exact"}),
    ("lloydmax", {"bits": 4}),
    ("lloydmax", {"bits": 8}),
    ("topk", {"fraction": 1.0, "bits": 8}),  # every value kept, quantized
]
#: Small tensors take other paths than large ones (exact boundaries below 4096 elements).
SIZES = [(4, 64), (64, 1024)]


def round_trip(case, x: torch.Tensor) -> torch.Tensor:
    name, kwargs = case
    packet = get_compressor(name, **kwargs).encode(x)
    return get_compressor(name, **kwargs).decode(Packet.from_bytes(packet.to_bytes()))


def attention_mask(shape, dtype) -> torch.Tensor:
    """An additive mask: 0 where attended, -1e4 on padded positions (a third of them)."""
    g = torch.Generator().manual_seed(1)
    return torch.where(torch.rand(shape, generator=g) < 1 / 3, -1e4, 0.0).to(dtype)


@pytest.mark.parametrize("case", QUANTIZERS, ids=codec_id)
@pytest.mark.parametrize("shape", SIZES, ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_an_attention_mask_round_trips_exactly(case, shape, dtype):
    mask = attention_mask(shape, dtype)
    y = round_trip(case, mask)
    assert torch.equal(y == 0, mask == 0) and torch.equal(y, mask)


@pytest.mark.parametrize("case", QUANTIZERS, ids=codec_id)
@pytest.mark.parametrize("shape", SIZES, ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_relu_zeros_min_and_max_are_exact(case, shape, dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.relu(torch.randn(shape, generator=g)).to(dtype)
    y = round_trip(case, x)
    assert (y[x == 0] == 0).all()  # small positives may round to 0 too: that is quantization
    assert y.max() == x.max() and y.min() == x.min()


@pytest.mark.parametrize("case", [c for c in QUANTIZERS if c[1]["bits"] >= 8], ids=codec_id)
@pytest.mark.parametrize("shape", SIZES, ids=str)
def test_a_repeated_value_inside_the_range_is_exact(case, shape):
    """Dropout zeros, a clamp in the middle of the range, a ReLU gradient's zeros."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g) * 3
    x[torch.rand(shape, generator=g) < 0.2] = 0.3721  # not on any grid by chance
    x[torch.rand(shape, generator=g) < 0.1] = 0.0
    y = round_trip(case, x)
    assert (y[x == 0.3721] == 0.3721).all() and (y[x == 0] == 0).all()
    assert y.max() == x.max() and y.min() == x.min()


def test_repeated_values_sharing_a_code_the_more_frequent_wins():
    """At 2 bits (a step of a third of the range) 0 and 0.37 share a code: one level, one
    exact value; the other is within a step of it."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3)) * 3
    x.view(-1)[::3] = 0.0
    x.view(-1)[1::5] = 0.37
    y = round_trip(("quantize", {"bits": 2}), x)
    assert (y[x == 0] == 0).all() and (y[x == 0.37] == 0).all()
    assert y.max() == x.max() and y.min() == x.min()


@pytest.mark.parametrize("case", QUANTIZERS, ids=codec_id)
def test_ends_are_exact_on_continuous_data(case):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(300, 70, generator=g) * 1e-3 + 5.0  # ends far from a round number
    y = round_trip(case, x)
    assert y.max() == x.max() and y.min() == x.min()


@pytest.mark.parametrize("case", [c for c in QUANTIZERS if c[0] != "lloydmax"], ids=codec_id)
def test_float64_ends_are_exact(case):
    """The exact table holds float64, so even values a float32 table cannot hold come back."""
    x = torch.linspace(1 / 3, 2 / 3, 999, dtype=torch.float64)
    y = round_trip(case, x)
    assert y[0] == x[0] and y[-1] == x[-1]


def test_repeated_values_are_found_by_share_most_frequent_first():
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(5))
    x[::4] = 2.0     # 25 %
    x[1::10] = -1.0  # 10 %
    x[3::500] = 7.0  # 0.2 %: not a large share
    assert repeated_values(x) == [2.0, -1.0]
    assert repeated_values(torch.randn(10_000)) == []
    assert repeated_values(torch.tensor([1.0])) == []
    assert repeated_values(x.numpy()) == [2.0, -1.0]  # the host path's sample: the same positions


@pytest.mark.parametrize("size", [300, 5000])
def test_a_run_of_zeros_is_positive_zero_if_it_holds_one_whatever_the_order(size):
    for seed in range(4):
        x = torch.randn(size, generator=torch.Generator().manual_seed(seed))
        x[::3] = -0.0
        x[1::7] = 0.0
        x = x[torch.randperm(size, generator=torch.Generator().manual_seed(seed))]
        for flat in (x, x.numpy()):
            (zero,) = repeated_values(flat)
            assert zero == 0.0 and math.copysign(1.0, zero) == 1.0
    x[x == 0] = -0.0
    (zero,) = repeated_values(x)
    assert math.copysign(1.0, zero) == -1.0


def _sorted_cases():
    """Sorted tensors: spikes of equal and unequal counts, the ends repeated, zeros of both signs,
    infinities, fewer elements than a run, more spikes than the limit."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4096, generator=g)
    x[:300], x[300:600], x[600:1000], x[1000:1100], x[1100:1200] = 2.0, -1.0, 0.5, 7.0, -7.0  # the ends: 7, -7
    yield x
    y = torch.randn(4096, generator=g)
    y[::3] = -0.0
    y[1::9] = 0.0
    yield y
    yield y.clone().fill_(3.0)  # constant: first == last
    z = torch.randn(5000, generator=g)
    z[:800], z[800:1600] = z.min(), z.max()  # the ends repeated: left out
    yield z
    yield torch.tensor([0.0, 1.0])
    w = torch.randn(3000, generator=g, dtype=torch.float64)
    w[:100], w[100:200] = math.inf, -math.inf
    w[200:400], w[400:410] = 1.5, 2.5
    yield w
    yield (torch.arange(6000) // 200).float()  # 30 values of 200 each: ties, ascending


@pytest.mark.parametrize("case", range(7))
def test_repeated_in_sorted_counts_every_element_on_the_device_and_on_the_host(case):
    from lightning_epipe.compressors import kernels
    from lightning_epipe.compressors.exact import MAX_SPIKES, repeated_in_sorted, repeated_run

    values = torch.sort(list(_sorted_cases())[case]).values
    found = repeated_in_sorted(values)
    host = kernels.repeated_sorted(values.numpy(), repeated_run(values.numel()), MAX_SPIKES).tolist()
    assert [(v, math.copysign(1, v)) for v in found] == [(v, math.copysign(1, v)) for v in host]
    run = repeated_run(values.numel())
    counts = {v: int((values == v).sum()) for v in found}
    assert all(c >= run for c in counts.values()) and list(counts.values()) == sorted(counts.values(), reverse=True)
    assert not {float(values[0]), float(values[-1])} & set(found) and all(math.isfinite(v) for v in found)
    expected = {0: [0.5, -1.0, 2.0], 1: [0.0], 2: [], 3: [], 4: [], 5: [1.5], 6: [1.0, 2.0, 3.0, 4.0]}[case]
    assert found == expected
