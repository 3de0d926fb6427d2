"""The small-tensor host path (``host.py``): same wire format and guarantees as the torch path."""

import numpy as np
import pytest
import torch

from lightning_epipe.compressors import (NonFiniteError, Packet, bitpack, get_compressor, hadamard, host, lloydmax,
                                        sortquant)
from lightning_epipe.compressors.bitpack import pack, pack_host, packed_nbytes, unpack, unpack_host
from lightning_epipe.compressors.exact import host_values
from lightning_epipe.compressors.levels import f32
from lightning_epipe.compressors.lloydmax import NEIGHBOURS, PIN_ENDS_FROM, TAIL_RANKS, fit_sample
from lightning_epipe.compressors.kernels import count_below, fit_levels_sorted, lloyd_steps, sortquant_codes
from lightning_epipe.compressors.sortquant import _starts

from .cases import codec_id

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
#: Codecs whose host and torch paths write the same payload, bit for bit.
SAME_PAYLOAD = [
    ("quantize", {"bits": 2}),
    ("quantize", {"bits": 4}),
    ("quantize", {"bits": 8}),
    ("quantize", {"bits": 13}),
    ("topk", {"fraction": 0.25, "bits": 6}),
    ("topk", {"fraction": 0.25}),
    ("hadamard", {"bits": 4}),
    ("hadamard", {"bits": 3, "iterations": 0}),
    ("hadamard", {"bits": 6, "block": 64}),
]


def inputs(n: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """ReLU activations, an additive attention mask, normal values, a constant: [n] each."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    mask = torch.where(torch.rand(n, generator=g) < 1 / 3, -1e4, 0.0)
    return [t.to(dtype) for t in (torch.relu(x), mask, x, torch.full((n,), 0.5))]


def torch_path(monkeypatch) -> None:
    monkeypatch.setattr(host, "HOST_MAX", -1)
    monkeypatch.setattr(host, "COMPILED_MAX", -1)
    monkeypatch.setattr(bitpack, "HOST_CODES", -1)
    monkeypatch.setattr(lloydmax, "SORTED_FIT_MAX", -1)
    monkeypatch.setattr(sortquant, "EXACT_BELOW", -1)
    monkeypatch.setattr(sortquant, "EXACT_BELOW_OTHERWISE", -1)
    monkeypatch.setattr(sortquant, "EXACT_HOST_MAX", -1)
    monkeypatch.setattr(hadamard, "_transforms_compiled", lambda x: False)


def host_threshold(codec: str) -> int:
    """The most elements of a CPU tensor that ``codec`` (at most 8 buckets) encodes on the host."""
    return {"lloydmax": lloydmax.SORTED_FIT_MAX, "sortquant": sortquant.EXACT_BELOW}.get(codec, host.HOST_MAX)


@pytest.mark.parametrize("width", range(1, 33))
@pytest.mark.parametrize("count", [1, 7, 8, 9, 100, 1001])
def test_host_packing_is_the_torch_layout(width, count, monkeypatch):
    codes = np.random.default_rng(width * count).integers(0, 1 << width, count, dtype=np.int64)
    out = np.empty(packed_nbytes(count, width), dtype=np.uint8)
    pack_host(codes, width, out)
    assert np.array_equal(pack(torch.from_numpy(codes), width).numpy(), out)  # small: numpy
    torch_path(monkeypatch)
    packed = pack(torch.from_numpy(codes), width).numpy()
    assert np.array_equal(out, packed)
    back = unpack_host(packed, width, count)
    assert np.array_equal(back, codes)
    torch_back = unpack(torch.from_numpy(packed), width, count).numpy()
    assert back.dtype == torch_back.dtype and np.array_equal(torch_back, codes)


@pytest.mark.parametrize("case", SAME_PAYLOAD, ids=codec_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 37, 2048, host.HOST_MAX])
def test_host_and_torch_paths_write_and_read_the_same_packets(case, dtype, n, monkeypatch):
    name, kwargs = case
    for x in inputs(n, dtype):
        fast = get_compressor(name, **kwargs).encode(x)
        decoded = get_compressor(name, **kwargs).decode(fast)
        with monkeypatch.context() as m:
            torch_path(m)
            slow = get_compressor(name, **kwargs).encode(x)
            assert torch.equal(get_compressor(name, **kwargs).decode(fast), decoded)
        assert torch.equal(fast.payload, slow.payload)
        assert decoded.dtype == dtype and decoded.shape == x.shape


@pytest.mark.parametrize("case", [("quantize", {"bits": 4}), ("sortquant", {"bits": 8}),
                                  ("lloydmax", {"bits": 4}), ("lloydmax", {"bits": 8})],
                         ids=codec_id)
@pytest.mark.parametrize("side", [0, 1], ids=["host", "torch"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_min_max_and_repeats_are_exact_on_both_sides_of_the_threshold(case, side, dtype):
    name, kwargs = case
    relu, mask, _, constant = inputs(host_threshold(name) + side, dtype)
    for x in (relu, mask, constant):
        p = get_compressor(name, **kwargs).encode(x)
        y = get_compressor(name, **kwargs).decode(Packet.from_bytes(p.to_bytes()))
        assert y.dtype == dtype and (y[x == 0] == 0).all()
        assert y.max() == x.max() and y.min() == x.min()
    y = get_compressor(name, **kwargs).decode(get_compressor(name, **kwargs).encode(mask))
    assert torch.equal(y, mask)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1000, 20_000])
def test_lloydmax_host_path_codes_each_value_as_its_nearest_level(bits, dtype, n):
    assert n <= lloydmax.SORTED_FIT_MAX
    x = torch.randn(n, generator=torch.Generator().manual_seed(bits)).to(dtype)
    c = get_compressor("lloydmax", bits=bits)
    p = c.encode(x)
    codebook = p.payload[4:4 + 4 * (1 << bits)].view(torch.float32).double()
    y = c.decode(p).double()
    nearest = (x.double()[:, None] - codebook[None, :]).abs().min(dim=1).values
    rounding = torch.finfo(dtype).eps * codebook.abs().max()  # a level rounded to dtype
    assert ((x.double() - y).abs() <= nearest + rounding).all()


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("n", [4000, 30_000])
def test_lloydmax_host_path_is_as_good_as_the_torch_path(bits, n, monkeypatch):
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))

    def error() -> float:
        c = get_compressor("lloydmax", bits=bits)
        return float((c.decode(c.encode(x)) - x).norm() / x.norm())

    fast = error()
    torch_path(monkeypatch)
    assert fast <= error() * 1.02


@pytest.mark.parametrize("bits", [2, 4, 5, 6])
@pytest.mark.parametrize("n", [16_500, 24_000, 32_768])
def test_lloydmax_fitted_on_a_sample_and_the_tails_is_as_good_as_fitted_on_everything(bits, n, monkeypatch):
    """Student-t (3 degrees of freedom): a heavy tail, whose far values a sample alone misses."""
    x = torch.from_numpy(np.random.default_rng(n).standard_t(3, n).astype(np.float32))
    assert n > lloydmax.fit_sample_size(1 << bits, lloydmax.SAMPLE)  # the sample is fitted

    def error() -> float:
        c = get_compressor("lloydmax", bits=bits)
        return float((c.decode(c.encode(x)) - x).norm() / x.norm())

    sampled = error()
    monkeypatch.setattr(lloydmax, "fit_sample_size", lambda levels_n, cap: n)
    assert sampled <= error() * 1.03


def test_lloydmax_fit_sample_takes_every_tail_value_and_the_ends():
    x = np.random.default_rng(0).standard_normal(20_000).astype(np.float32)
    positions = set(lloydmax.strided_sample(np.arange(x.size), 8192).tolist())
    outside = next(i for i in range(x.size) if i not in positions)
    x[outside] = 50.0  # the max, not in the strided sample
    values, weights = fit_sample(x, 8192)
    assert np.array_equal(values, np.sort(values)) and values[0] == x.min() and values[-1] == 50.0
    sample = np.sort(lloydmax.strided_sample(x, 8192))
    tails = np.sort(x[(x < sample[TAIL_RANKS]) | (x > sample[-1 - TAIL_RANKS])])
    assert np.array_equal(values[weights == 1.0], tails)
    assert weights.sum() == pytest.approx(x.size)  # the bulk's weights stand for the rest
    assert fit_sample(x, x.size)[1] is None and np.array_equal(fit_sample(x, x.size)[0], np.sort(x))


def test_lloydmax_weights_count_as_repeats():
    values = np.array([0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 5.0, 9.0, 9.0, 10.0])
    for levels_n in (2, 4, 16):
        plain = fit_levels_sorted(values, np.ones(values.size), levels_n, 8, 1e-3, PIN_ENDS_FROM, NEIGHBOURS)
        weighted = fit_levels_sorted(np.unique(values), np.unique(values, return_counts=True)[1].astype(np.float64),
                                     levels_n, 8, 1e-3, PIN_ENDS_FROM, NEIGHBOURS)
        assert np.array_equal(plain[0], weighted[0]) and np.array_equal(plain[1], weighted[1])
        each_one = fit_levels_sorted(values, np.empty(0), levels_n, 8, 1e-3, PIN_ENDS_FROM, NEIGHBOURS)
        assert np.array_equal(plain[0], each_one[0]) and np.array_equal(plain[1], each_one[1])


def test_lloydmax_fit_without_weights_is_the_fit_with_weights_of_one():
    """Empty weights (every value one element, the encode's case up to its sample size) fit the
    same levels as weights of 1.0: runs of repeats, spikes and ends included."""
    rng = np.random.default_rng(5)
    for trial in range(60):
        x = rng.standard_normal(int(rng.integers(2, 3000)))
        x = np.sort(np.where(rng.random(x.size) < 0.3, 0.0, np.round(x * rng.choice([1, 4, 100])) / 4))
        if x[0] == x[-1]:
            continue
        for levels_n in (2, 8, 256):
            ones = fit_levels_sorted(x, np.ones(x.size), levels_n, 8, 1e-3, PIN_ENDS_FROM, NEIGHBOURS)
            each_one = fit_levels_sorted(x, np.empty(0), levels_n, 8, 1e-3, PIN_ENDS_FROM, NEIGHBOURS)
            assert np.array_equal(ones[0], each_one[0]) and np.array_equal(ones[1], each_one[1]), (trial, levels_n)


@pytest.mark.parametrize("check_finite", [True, False])
def test_lloydmax_host_path_with_a_nan_outside_the_sample(check_finite):
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(3))
    positions = set(lloydmax.strided_sample(np.arange(x.numel()), 8192).tolist())
    x[next(i for i in range(x.numel()) if i not in positions)] = float("nan")
    c = get_compressor("lloydmax", bits=4, check_finite=check_finite)
    if check_finite:
        with pytest.raises(NonFiniteError):
            c.encode(x)
    else:  # as with the whole tensor sorted: a constant codebook at the min, no NaN in it
        book = c.encode(x).payload[4:4 + 64].view(torch.float32)
        assert (book == x.nan_to_num(nan=0.0).min()).all()


def test_lloydmax_host_path_pins_a_spike_inside_the_range():
    x = torch.randn(3000, generator=torch.Generator().manual_seed(1))
    x[::5] = 0.3
    c = get_compressor("lloydmax", bits=3)
    y = c.decode(c.encode(x))
    assert (y[x == 0.3] == 0.3).all()


@pytest.mark.parametrize("values", [[0, 0, 0, 1, 1, 1, 1, 2], [5] * 9, [1, 2, 2, 2, 2, 2, 2, 3],
                                    [0] * 7 + [1]])
@pytest.mark.parametrize("buckets", [2, 4, 16])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rank_codes_are_in_the_buckets_of_a_stable_sort(values, buckets, dtype):
    x = np.random.default_rng(len(values)).permutation(np.asarray(values, dtype=dtype))
    order = np.argsort(x, kind="stable")
    starts = _starts(x.size, buckets)
    expected = np.empty(x.size, dtype=np.int64)
    expected[order] = np.repeat(np.arange(buckets), np.diff(starts))
    codes = np.empty(x.size, dtype=np.int32)  # a code's top bits are its bucket (up to 8: one compiled pass)
    sortquant_codes(x, np.sort(x), np.asarray(starts), np.zeros(buckets, np.float32), np.ones(buckets, np.float32), 4, codes)
    assert np.array_equal(codes >> 4, expected)


@pytest.mark.parametrize("n", [1000, 100_000], ids=["host", "torch"])
@pytest.mark.parametrize("bits", [4, 8, 13])
def test_quantize_keeps_the_max_exact_when_the_span_overflows_float32(n, bits):
    x = torch.full((n,), 3e38)
    x[::2] = -3e38
    x[1] = 1.0
    c = get_compressor("quantize", bits=bits)
    y = c.decode(c.encode(x))
    assert torch.equal(y[x.abs() == 3e38], x[x.abs() == 3e38])


def test_cuda_tensors_and_large_ones_take_the_torch_path():
    assert host.on_host(host.HOST_MAX, torch.device("cpu"))
    assert not host.on_host(host.HOST_MAX + 1, torch.device("cpu"))
    assert not host.on_host(1, torch.device("cuda", 0))
    assert host.compiled_on(host.COMPILED_MAX, torch.device("cpu"))
    assert not host.compiled_on(host.COMPILED_MAX + 1, torch.device("cpu"))
    assert not host.compiled_on(1, torch.device("cuda", 0))
    assert host_values(torch.zeros(3, dtype=torch.bfloat16)).dtype == np.float32  # widened, exactly


def test_lloyd_steps_and_nearest():
    points = np.array([0.0, 1.0, 2.0, 10.0, 11.0])
    levels = lloyd_steps(points, np.ones(5), np.array([0.0, 5.0]), np.zeros(2, dtype=bool), 10)
    assert np.allclose(levels, [1.0, 10.5])
    fixed = lloyd_steps(points, np.ones(5), np.array([0.0, 5.0]), np.array([True, False]), 10)
    assert fixed[0] == 0.0
    assert nearest(np.array([0.4, 0.5, 0.6, 3.0], dtype=np.float32),
                        np.array([0.0, 1.0, 2.0])).tolist() == [0, 0, 1, 2]
    many = np.arange(100.0)
    assert np.array_equal(nearest(np.array([3.2, 50.5, 99.0]), many), [3, 50, 99])


def nearest(x: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """The index of the nearest of the sorted ``levels`` (ties to the lower): the cuts below."""
    return count_below(x, (levels[1:] + levels[:-1]) / 2, np.empty(x.size, dtype=np.int32))


def test_f32_rounds_as_numpy_float32_overflow_and_nan_included():
    """``levels.f32`` (the host path's float32 rounding of one Python float) is ``np.float32``'s,
    past float32's range an infinity of the value's sign."""
    g = np.random.default_rng(0)
    values = [*g.standard_normal(500) * 10.0 ** g.integers(-45, 39, 500), 3.4028235e38, 3.4028236e38, 3.5e38,
              -3.5e38, 1e300, -1e300, 1.4e-45, 7e-46, 0.0, -0.0, float("inf"), float("-inf")]
    with np.errstate(over="ignore"):
        expected = [float(np.float32(v)) for v in values]
    assert [f32(v) for v in values] == expected
    assert [np.copysign(1.0, f32(v)) for v in values] == [np.copysign(1.0, e) for e in expected]
    assert np.isnan(f32(float("nan")))


@pytest.mark.parametrize("dtype", DTYPES)
def test_host_values_of_a_cpu_tensor_are_its_values_flat(dtype):
    x = torch.randn(3, 4).to(dtype)
    for t in (x, x.t(), x.clone().requires_grad_()):  # contiguous (a view), strided (a copy), needing grad
        got = host_values(t)
        assert got.shape == (12,) and got.dtype in (np.float32, np.float64)
        assert np.array_equal(got, t.detach().reshape(-1).double().numpy().astype(got.dtype))
