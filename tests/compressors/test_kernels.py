"""The compiled host loops (``kernels``) against their numpy definitions, bit for bit."""

import warnings

import numpy as np
import pytest
import torch

from lightning_epipe.compressors import Packet, get_compressor, host, kernels, lloydmax
from lightning_epipe.compressors.bitpack import pack, pack_into, packed_nbytes
from lightning_epipe.compressors.kernels.sorting import radix_sort_f32
from lightning_epipe.compressors.levels import lookup, read_levels


def _cut_cases():
    """(x, cuts): values on the cuts, between them and outside, crowded and repeated cuts."""
    rng = np.random.default_rng(5)
    spread = np.sort(rng.standard_normal(255))
    crowded = np.sort(np.concatenate([np.zeros(100), rng.random(30) * 1e-9, rng.standard_normal(125)]))
    for cuts in (spread, crowded, np.array([0.0, 1.0] * 10 + [2.0]).cumsum() / 7, np.full(31, 0.5),
                 np.array([-1e300, 0.0, 1e300] + [1e300] * 20), spread[::17], spread[:1], crowded[95:110],
                 np.float32(np.pi) + np.arange(3) * 1e-9):  # cuts between float32 neighbours
        cuts = np.sort(cuts)
        x = np.concatenate([rng.standard_normal(3000), cuts, np.nextafter(cuts, np.inf), np.nextafter(cuts, -np.inf),
                            np.zeros(500), [np.inf, -np.inf, np.nan, 1e308, -1e308]])
        yield rng.permutation(x), cuts


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_count_below_is_searchsorted(dtype):
    for x, cuts in _cut_cases():
        with np.errstate(over="ignore"):
            x = x.astype(dtype)
        out = kernels.count_below(x, cuts, np.empty(x.size, dtype=np.int32))
        assert np.array_equal(out, np.searchsorted(cuts, x.astype(np.float64))), cuts.size


@pytest.mark.parametrize("width", range(1, 33))
@pytest.mark.parametrize("count", [0, 1, 7, 9, 4099])
def test_packing_is_the_torch_layout_and_unpacks_back(width, count):
    codes = np.random.default_rng(width * count).integers(0, 1 << width, count, dtype=np.int64)
    out = np.empty(packed_nbytes(count, width), dtype=np.uint8)
    kernels.pack_codes(codes, width, out)
    torch_layout = torch.empty(packed_nbytes(count, width), dtype=torch.uint8)
    for start in range(0, count, 4096):  # the torch path, block by block
        pack_into(torch.from_numpy(codes[start:start + 4096]), width, torch_layout, start, count)
    assert np.array_equal(out, torch_layout.numpy())
    back = kernels.unpack_codes(out, width, count, np.empty(count, dtype=np.int64 if width > 31 else np.int32))
    assert np.array_equal(back, codes)
    if width in kernels.LOOKUP_WIDTHS:
        table = np.random.default_rng(width).standard_normal(1 << width)
        assert np.array_equal(kernels.lookup_codes(table, out, width, count, np.empty(count)), table[codes])


def test_packing_drops_the_bits_above_the_width():
    codes = np.array([0x1F3, 0x2F, 0x10], dtype=np.int32)
    out = np.empty(2, dtype=np.uint8)
    kernels.pack_codes(codes, 4, out)
    assert np.array_equal(out, pack(torch.from_numpy(codes & 15), 4).numpy())


def test_lookup_reads_only_widths_it_knows():
    with pytest.raises(ValueError, match="widths"):
        kernels.lookup_codes(np.zeros(8), np.zeros(3, np.uint8), 3, 8, np.empty(8))


def _numpy_bucket_codes(x, thresholds, lo, step, q_bits):
    bucket = (x[:, None] >= thresholds[None, :]).sum(axis=1)
    q = np.subtract(x, lo[bucket], dtype=np.float32) / step[bucket]
    return np.clip(np.rint(q), 0, (1 << q_bits) - 1).astype(np.int32) + (bucket.astype(np.int32) << q_bits)


@pytest.mark.parametrize("buckets", [1, 2, 5, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bucket_codes_are_the_float32_arithmetic_of_the_torch_path(buckets, dtype):
    rng = np.random.default_rng(buckets)
    x = np.concatenate([rng.standard_normal(5000) * 3, np.zeros(100), [np.inf, -np.inf]]).astype(dtype)
    thresholds = np.sort(rng.standard_normal(buckets - 1)).astype(dtype)
    x[:buckets - 1] = thresholds  # elements on the thresholds
    lo = np.concatenate([[-12.0], thresholds]).astype(np.float32)
    step = rng.random(buckets).astype(np.float32) / 20 + 1e-3
    q_bits = 5
    pad = kernels.CHAIN_BUCKETS - buckets

    def padded(a, fill):
        return np.concatenate([a, np.full(pad, fill, dtype=a.dtype)])

    out = np.empty(x.size, dtype=np.int32)
    kernels.bucket_codes(x, padded(thresholds, np.inf), padded(lo, lo[-1]), padded(step, step[-1]),
                         padded(np.arange(buckets, dtype=np.int32) << q_bits, (buckets - 1) << q_bits),
                         np.float32((1 << q_bits) - 1), out)
    assert np.array_equal(out, _numpy_bucket_codes(x, thresholds, lo, step, q_bits))


def test_retag_run_gives_a_values_elements_new_codes_by_count():
    x = np.array([2.0, 0.0, 1.0, 0.0, 0.0, 0.0, 3.0, 0.0], dtype=np.float32)
    out = np.full(x.size, -1, dtype=np.int32)
    kernels.retag_run(x, np.float32(0.0), np.array([1, 3]), np.array([10, 11], dtype=np.int32), out)
    assert out.tolist() == [-1, 10, -1, 11, 11, -1, -1, -1]  # the fourth and fifth zeros keep theirs


LEVELS_CASES = [("quantize", {"bits": b}) for b in (2, 5, 8, 13, 16)] + [
    ("sortquant", {"bits": 8}), ("sortquant", {"bits": 12, "split": 3}), ("sortquant", {"bits": 4})]


def _inputs(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    return [torch.relu(x), torch.where(x < 0, -1e4, 0.0), x * 1e-3]


@pytest.mark.parametrize("case", LEVELS_CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_levels_decode_is_the_parse_and_lookup_in_one_call(case, dtype):
    name, kwargs = case
    c = get_compressor(name, **kwargs)
    for n in (1, 37, 5000):
        for x in _inputs(n):
            p = c.encode(x.to(dtype))
            out = np.empty(n, dtype=np.float32 if dtype == torch.float32 else np.float64)
            assert kernels.levels_decode(p.payload.numpy(), n, 0, 15, out) == 0
            assert np.array_equal(out, lookup(read_levels(c, p), n, dtype).numpy())


def _corruptions(raw: np.ndarray, split: int, entries: int):
    """A valid levels payload broken one way at a time: each must be refused."""
    k = 1 << split
    yield raw[:3]
    yield raw[:-1]
    for at, value in [(0, 1), (0, 17), (1, 9), (3, 1)]:
        bad = raw.copy()
        bad[at] = value
        yield bad
    for at, value in [(4, np.float32(np.nan)), (4 + 4 * k, np.float32(-1.0)), (4 + 4 * k, np.float32(np.inf))]:
        bad = raw.copy()
        bad[at:at + 4] = np.frombuffer(np.float32(value).tobytes(), np.uint8)
        yield bad
    if entries and raw[0] < 16:  # a code past 2**bits (every uint16 is a 16-bit code)
        bad = raw.copy()
        bad[4 + 8 * k:4 + 8 * k + 2] = np.frombuffer(np.uint16(0xFFFF).tobytes(), np.uint8)
        yield bad
    if entries:
        bad = raw.copy()
        at = 4 + 8 * k + 2 * entries
        bad[at:at + 8] = np.frombuffer(np.float64(np.inf).tobytes(), np.uint8)
        yield bad


@pytest.mark.parametrize("case", LEVELS_CASES, ids=str)
def test_levels_decode_refuses_every_broken_payload_and_a_split_out_of_range(case):
    name, kwargs = case
    n = 100
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    x[::4] = 0.1234567  # a repeated value, exact: an entry of the exact table
    raw = get_compressor(name, **kwargs).encode(x).payload.numpy()
    split, entries = int(raw[1]), int(raw[2])
    assert entries > 0
    out = np.empty(n, dtype=np.float32)
    for bad in _corruptions(raw, split, entries):
        assert kernels.levels_decode(bad, n, 0, 15, out) == 1
    assert kernels.levels_decode(raw, n + 8, 0, 15, out) == 1  # another shape's size
    assert kernels.levels_decode(raw, n, split + 1, 15, out) == 1
    assert kernels.levels_decode(raw, n, 0, split - 1, out) == 1 if split else True


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_codebook_decode_is_lloydmax_decode_in_one_call_and_refuses_broken_payloads(bits, dtype, monkeypatch):
    c = get_compressor("lloydmax", bits=bits)
    x = torch.randn(1001, generator=torch.Generator().manual_seed(bits)).to(dtype)
    raw = c.encode(x).payload.numpy()
    out = np.empty(x.numel(), dtype=np.float32 if dtype == torch.float32 else np.float64)
    assert kernels.codebook_decode(raw, x.numel(), lloydmax.MAX_BITS, out) == 0
    monkeypatch.setattr(host, "COMPILED_MAX", -1)  # the torch path's decode
    assert np.array_equal(out, c.decode(c.encode(x)).numpy())
    for at, value in [(0, 0), (0, 9), (2, 1)]:
        bad = raw.copy()
        bad[at] = value
        assert kernels.codebook_decode(bad, x.numel(), lloydmax.MAX_BITS, out) == 1
    bad = raw.copy()
    bad[4:8] = np.frombuffer(np.float32(np.nan).tobytes(), np.uint8)
    assert kernels.codebook_decode(bad, x.numel(), lloydmax.MAX_BITS, out) == 1
    assert kernels.codebook_decode(raw[:-1], x.numel(), lloydmax.MAX_BITS, out) == 1


def _pair_cases():
    """(bits, split, lo, step, pair codes, pair values): already-exact levels, a code twice
    (the first value wins), more pairs than an exact table holds, none."""
    rng = np.random.default_rng(11)
    lo, step = np.array([-1.0, 0.1, 0.5, 2.0]), np.array([0.01, 0.02, 0.0, 0.3])
    exact_level = float(np.float64(np.float32(0.1)) + 3 * np.float64(np.float32(0.02)))
    yield 8, 2, lo, step, np.array([67, 67, 0, 255, 130]), np.array([exact_level, 7.0, -1.0, 1e-3, 0.5])
    yield 4, 0, np.array([0.3]), np.array([1 / 15]), np.array([15, 3]), np.array([1.3, 0.5])
    codes = rng.integers(0, 1 << 12, 400)
    yield 12, 3, rng.standard_normal(8), rng.random(8), codes, rng.standard_normal(400)
    yield 8, 2, lo, step, np.empty(0, dtype=np.int64), np.empty(0)


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("count", [0, 5, 1000])
def test_levels_payload_writes_the_levels_head_in_one_call(case, dtype, count):
    from lightning_epipe.compressors.levels import host_levels_payload, levels_head

    bits, split, lo, step, codes, values = list(_pair_cases())[case]
    payload, segment = host_levels_payload(bits, split, lo, step, codes.astype(np.int64), values, dtype, count)
    head = levels_head(bits, split, lo, step, list(zip(codes.tolist(), values.tolist())), dtype)
    assert payload[:len(head)].tobytes() == head
    assert payload.size == len(head) + packed_nbytes(count, bits) and segment.size == packed_nbytes(count, bits)
    assert count == 0 or np.shares_memory(segment, payload)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lloydmax_codes_is_the_host_fit_then_the_nearest_level(bits, dtype):
    rng = np.random.default_rng(bits)
    x = np.maximum(rng.standard_normal(20_000), 0).astype(dtype)  # ReLU: a spike at 0
    values, weights = lloydmax.fit_sample(x, 8192)
    codes = np.empty(x.size, dtype=np.uint8)
    codebook = kernels.lloydmax_codes(x, values, weights, 1 << bits, 8, 1e-4, lloydmax.PIN_ENDS_FROM,
                                      lloydmax.NEIGHBOURS, codes)
    levels, _ = kernels.fit_levels_sorted(values, weights, 1 << bits, 8, 1e-4, lloydmax.PIN_ENDS_FROM,
                                          lloydmax.NEIGHBOURS)
    assert np.array_equal(codebook, levels.astype(np.float32))
    wide = codebook.astype(np.float64)
    assert np.array_equal(codes, np.searchsorted((wide[1:] + wide[:-1]) / 2, x.astype(np.float64)))


def _largest_reference(x: np.ndarray, k: int) -> np.ndarray:
    """The k largest |x| (NaN as inf), the lowest positions at the k-th largest, ascending."""
    magnitude = np.abs(x.astype(np.float64))
    magnitude[np.isnan(magnitude)] = np.inf
    return np.sort(np.lexsort((np.arange(x.size), -magnitude))[:k])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_largest_positions_are_the_largest_magnitudes_lowest_positions_at_ties(dtype):
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 300, 5000):
        normal = rng.standard_normal(n)
        special = normal.copy()
        special[: min(n, 6)] = [np.nan, np.inf, -np.inf, -0.0, 0.0, -np.nan][: min(n, 6)]
        for x in (normal, np.maximum(normal, 0), np.where(normal < 0.4, -1e4, 0.0), np.full(n, -0.5),
                  special, normal * 1e-40, np.float64(np.float32(normal)) * (1 + 2.0 ** -40)):
            with np.errstate(over="ignore", under="ignore"):
                x = x.astype(dtype)
            for k in sorted({1, max(1, n // 10), max(1, n // 2), n}):
                out = np.empty(k, dtype=np.int64)
                nonfinite = kernels.largest_positions(x, k, out)
                assert np.array_equal(out, _largest_reference(x, k)), (n, k)
                assert nonfinite == int((~np.isfinite(x)).sum())


@pytest.mark.parametrize("kwargs", [{}, {"bits": 8}, {"bits": 13}, {"fraction": 0.9}], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_sparse_decode_is_topk_decode_in_one_call_and_refuses_broken_payloads(kwargs, dtype, monkeypatch):
    c = get_compressor("topk", **{"fraction": 0.2, **kwargs})
    x = torch.randn(1001, generator=torch.Generator().manual_seed(5)).to(dtype)
    x[::7] = 0.25  # a repeated value: an exact entry of the quantized values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fraction 0.9: dense
        raw = c.encode(x).payload.numpy()
    out = np.empty(x.numel(), dtype=np.float32 if dtype == torch.float32 else np.float64)
    assert kernels.sparse_decode(raw, x.numel(), out) == 0
    monkeypatch.setattr(host, "COMPILED_MAX", -1)  # the torch path's decode
    assert np.array_equal(out, c.decode(Packet(c.codec_id, dtype, x.shape, torch.from_numpy(raw))).numpy())
    for at, value in [(0, 2), (1, 1), (1, 17), (2, 11), (3, 1), (4, 0), (5, 9)]:
        bad = raw.copy()
        bad[at] = value
        assert kernels.sparse_decode(bad, x.numel(), out) == 1, at
    for bad in (raw[:7], raw[:-1], np.concatenate([raw, raw[-1:]])):
        assert kernels.sparse_decode(bad, x.numel(), out) == 1
    wider = 2 * x.numel() + 1  # another shape's position width
    assert kernels.sparse_decode(raw, wider, np.empty(wider, dtype=out.dtype)) == 1
    if raw[0] == 0:  # sparse: the last position (10 bits: a byte plane, then 2 bits) past the tensor
        k = int(raw[4:8].view("<u4")[0])
        bad = raw.copy()
        bad[raw.size - packed_nbytes(k, 10) + k - 1] = 255
        bad[-1] = 255
        assert kernels.sparse_decode(bad, x.numel(), out) == 1


def _unweighted_lloyd_reference(values: np.ndarray, levels: np.ndarray, iterations: int) -> np.ndarray:
    """``hadamard``'s fit in numpy: values [M] float32 sorted, levels [L] float32."""
    prefix = np.zeros(values.size + 1)
    np.cumsum(values.astype(np.float64), out=prefix[1:])
    edges = np.empty(levels.size + 1, dtype=np.int64)
    edges[0], edges[-1] = 0, values.size
    cuts = np.empty(levels.size - 1, dtype=np.float32)
    for _ in range(iterations):
        np.add(levels[1:], levels[:-1], out=cuts)
        cuts /= 2
        edges[1:-1] = values.searchsorted(cuts)
        at = prefix[edges]
        counts = edges[1:] - edges[:-1]
        moved = ((at[1:] - at[:-1]) / np.maximum(counts, 1)).astype(np.float32)
        moved[counts == 0] = levels[counts == 0]
        if (moved == levels).all():
            break
        levels = moved
    return levels


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("iterations", [0, 1, 8, 100])
def test_hadamard_fit_and_codes_are_the_numpy_fit_then_the_count_of_cuts_below(bits, iterations):
    from lightning_epipe.compressors.hadamard import normal_levels

    rng = np.random.default_rng(bits * 100 + iterations)
    start = normal_levels(1 << bits).numpy()
    for u in (rng.standard_normal(5000).astype(np.float32), np.repeat(rng.standard_normal(7), 300).astype(np.float32),
              (rng.standard_t(3, 3000) * 0.5).astype(np.float32), np.zeros(64, dtype=np.float32)):
        values = np.sort(u[::3])
        codes = np.empty(u.size, dtype=np.uint8)
        levels = kernels.hadamard_codes(u, values, start, iterations, codes)
        expected = _unweighted_lloyd_reference(values, start, iterations)
        assert levels.dtype == np.float32 and np.array_equal(levels, expected)
        assert np.array_equal(codes, np.searchsorted((expected[1:] + expected[:-1]) / 2, u))


def test_rank_near_is_searchsorted_from_any_guess():
    from lightning_epipe.compressors.kernels.lloyd import _rank_near

    rng = np.random.default_rng(8)
    for points in (np.sort(rng.standard_normal(1000)), np.repeat(np.arange(20.0), 37), np.zeros(5), np.array([1.0])):
        cuts = np.concatenate([rng.standard_normal(200) * 3, points[::7], [-np.inf, np.inf, points[0], points[-1]]])
        for cut in cuts:
            expected = np.searchsorted(points, cut)
            for guess in {0, points.size, expected, max(expected - 1, 0), min(expected + 1, points.size),
                          int(rng.integers(0, points.size + 1))}:
                assert _rank_near(points, cut, guess) == expected, (cut, guess)


def _lloyd_steps_reference(points, weight, levels, fixed, iterations):
    """``lloyd_steps`` in numpy (binary searches for the boundaries)."""
    weight_below = np.concatenate([[0.0], np.cumsum(weight)])
    total_below = np.concatenate([[0.0], np.cumsum(points * weight)])
    for _ in range(iterations):
        edges = np.concatenate([[0], np.searchsorted(points, (levels[1:] + levels[:-1]) * 0.5), [points.size]])
        n = weight_below[edges[1:]] - weight_below[edges[:-1]]
        s = total_below[edges[1:]] - total_below[edges[:-1]]
        moved = np.where((n > 0) & ~fixed, s / np.where(n > 0, n, 1), levels)
        if (moved == levels).all():
            break
        levels = moved
    return levels


@pytest.mark.parametrize("levels_n", [2, 16, 256])
def test_lloyd_steps_are_the_binary_search_steps(levels_n):
    rng = np.random.default_rng(levels_n)
    for points in (np.sort(rng.standard_normal(3000)), np.sort(rng.standard_t(2, 500)), np.arange(300.0)):
        weight = rng.random(points.size) + 0.5
        levels = np.sort(rng.choice(points, levels_n))
        fixed = rng.random(levels_n) < 0.1
        for iterations in (1, 8, 50):
            assert np.array_equal(kernels.lloyd_steps(points, weight, levels, fixed, iterations),
                                  _lloyd_steps_reference(points, weight, levels, fixed, iterations))


def _spread_reference(weight: np.ndarray, n: int) -> np.ndarray:
    """``lloyd._spread`` by numpy's searchsorted: equal-weight quantile targets, hit cells
    taken once, more targets until n cells are hit (8 rounds at most), thinned evenly."""
    cells = weight.size
    if cells <= n:
        return np.arange(cells)
    below = np.cumsum(weight)
    targets_n, chosen = n, np.empty(0, dtype=np.int64)
    for _ in range(8):
        hit = np.minimum(np.searchsorted(below, (np.arange(targets_n) + 0.5) * (below[-1] / targets_n)), cells - 1)
        chosen = hit[np.concatenate(([True], hit[1:] != hit[:-1]))]
        if chosen.size >= n:
            break
        targets_n = min(max(targets_n + 1, -(-targets_n * n // chosen.size)), 4 * cells)
    if chosen.size > n:
        chosen = chosen[np.rint(np.linspace(0, chosen.size - 1, n)).astype(np.int64)]
    return chosen


def test_spread_is_searchsorted_of_the_quantile_targets_ties_included():
    from lightning_epipe.compressors.kernels.lloyd import _spread

    rng = np.random.default_rng(3)
    for weight, n in [(np.ones(10), 5), (np.ones(4096), 255), (np.ones(300), 299), (rng.uniform(0.1, 5, 2000), 254),
                      (np.concatenate([np.ones(50), [500.0], np.ones(50)]), 20), (rng.pareto(1.5, 3000) + 0.01, 255),
                      (np.full(7, 2.0), 9)]:
        assert np.array_equal(_spread(weight, n), _spread_reference(weight, n)), (weight.size, n)


def _total_order(x: np.ndarray) -> np.ndarray:
    """x [N] float32 sorted by the IEEE total order of its bits (-0.0 before +0.0), NaNs
    last as the quiet NaN 0x7FFFFFFF: ``radix_sort_f32``'s definition."""
    bits = x.view(np.uint32)
    nan = np.isnan(x)
    keys = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(1 << 31))[~nan]
    ordered = np.sort(keys)
    finite = np.where(ordered >> 31 == 1, ordered ^ np.uint32(1 << 31), ~ordered).view(np.float32)
    return np.concatenate([finite, np.full(int(nan.sum()), np.uint32(0x7FFFFFFF)).view(np.float32)])


@pytest.mark.parametrize("n", [0, 1, 2, 2047, 2048, 5000, 70000])
def test_radix_sort_is_the_bits_total_order_nans_last(n):
    rng = np.random.default_rng(n)
    normal = rng.standard_normal(n).astype(np.float32)
    special = normal.copy()
    special[: min(n, 8)] = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, -np.nan, 1e-45, -1e-45],
                                    dtype=np.float32)[: min(n, 8)]
    for x in (normal, np.maximum(normal, 0), np.where(normal < 0.4, -0.0, 0.0).astype(np.float32),
              np.full(n, -0.5, dtype=np.float32), special, normal * np.float32(1e-3) + np.float32(7),
              np.sort(normal)[::-1].copy()):
        out = radix_sort_f32(x)
        assert np.array_equal(out.view(np.uint32), _total_order(x).view(np.uint32)), n
        assert np.array_equal(kernels.sort_values(x), np.sort(x), equal_nan=True)  # values as numpy's


def test_sort_values_keeps_numpys_sort_for_float64_small_and_strided_arrays():
    x = np.random.default_rng(1).standard_normal(6000)
    assert np.array_equal(kernels.sort_values(x), np.sort(x))                       # float64
    strided = x.astype(np.float32)[::2]
    assert np.array_equal(kernels.sort_values(strided), np.sort(strided))           # not contiguous
    assert np.array_equal(kernels.sort_values(strided[:100]), np.sort(strided[:100]))
