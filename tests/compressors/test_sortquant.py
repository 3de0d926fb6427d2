import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_epipe.compressors import Packet, PacketError, SortQuant, get_compressor
from lightning_epipe.compressors.bitpack import unpack
from lightning_epipe.compressors.levels import read_levels
from lightning_epipe.compressors.packet import header_nbytes
from lightning_epipe.compressors.sortquant import SAMPLE

from .cases import FLOATS, sample, shares_exact_code, ulp_slack


def parts(codec: SortQuant, x: torch.Tensor):
    """(codes [N] int64, lo [K] float64, step [K] float64, decoded [N] float64)."""
    packet = codec.encode(x)
    levels = read_levels(codec, packet)
    codes = unpack(levels.codes, levels.bits, x.numel()).long()
    y = SortQuant().decode(packet).reshape(-1).double()
    return (codes, torch.from_numpy(levels.lo).double(), torch.from_numpy(levels.step).double(),
            y)


def half_step_or_step(codec: SortQuant, x: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """The error bound per element: step / 2, or a step where it shares an exact value's code."""
    return torch.where(shares_exact_code(codec, x), step, step / 2)


def equal_counts(n: int, buckets: int) -> list[int]:
    starts = [-(-k * n // buckets) for k in range(buckets + 1)]
    return [b - a for a, b in zip(starts, starts[1:])]


def heavy_ties(n: int = 3000) -> torch.Tensor:
    """70% zeros (a ReLU), a block of repeats of 6.0 (a ReLU6 ceiling), the rest spread."""
    x = torch.zeros(n)
    x[: n // 10] = 6.0
    x[n // 10: 3 * n // 10] = torch.rand(2 * n // 10, generator=torch.Generator().manual_seed(3))
    return x[torch.randperm(n, generator=torch.Generator().manual_seed(4))]


@pytest.mark.parametrize("bits, split", [(2, 1), (4, 1), (6, 2), (8, 2), (12, 3), (16, 4)])
def test_default_split_is_three_to_one(bits, split):
    assert SortQuant(bits=bits).split == split
    assert get_compressor("sortquant", bits=bits).split == split


@pytest.mark.parametrize("bits, split", [(8, 2), (8, 4), (5, 2), (12, 3), (3, 2)])
@pytest.mark.parametrize("x", [sample((1001,), torch.float32), heavy_ties()],
                         ids=["normal", "ties"])
def test_exact_buckets_hold_equal_counts_and_bound_the_error(bits, split, x):
    codec = SortQuant(bits=bits, split=split, boundaries="exact")
    codes, lo, step, y = parts(codec, x)
    q_bits = bits - split
    bucket = codes >> q_bits
    assert torch.bincount(bucket, minlength=2**split).tolist() == equal_counts(x.numel(), 2**split)
    # sorted by value, the buckets come in order: bucket k holds ranks of bucket k
    assert (bucket[x.argsort(stable=True)].diff() >= 0).all()
    xd = x.double()
    assert ((xd - y).abs() <= half_step_or_step(codec, x, step[bucket]) + ulp_slack(x)).all()
    assert ((xd >= lo[bucket]) & (xd <= lo[bucket] + step[bucket] * (2**q_bits - 1)
                                  + ulp_slack(x))).all()


@pytest.mark.parametrize("boundaries", ["exact", "estimated"])
@pytest.mark.parametrize("bits, split", [(5, 2), (7, 3), (8, 2), (11, 2), (16, 4)])
def test_code_zero_of_bucket_zero_round_trips(boundaries, bits, split):
    """The report's decoder dropped code 0 of bucket 0 unless bits was 8 or 16."""
    x = sample((500,), torch.float32)
    codes, lo, _, y = parts(SortQuant(bits=bits, split=split, boundaries=boundaries), x)
    smallest = int(x.argmin())
    assert codes[smallest] == 0 and y[smallest] == x[smallest] == lo[0]


@pytest.mark.parametrize("n", [1000, 200_000])
@pytest.mark.parametrize("bits", [4, 8, 12])
@pytest.mark.parametrize("data", ["normal", "ties", "outliers"])
def test_estimated_error_is_at_most_half_a_step_of_its_bucket(n, bits, data):
    x = heavy_ties(n) if data == "ties" else sample((n,), torch.float32)
    if data == "outliers":
        x[::2] *= 1000
    codec = SortQuant(bits=bits)
    codes, _, step, y = parts(codec, x)
    # an element rounding up lands on code 0 of the next bucket: bound by either bucket's step
    bucket = codes >> (bits - codec.split)
    below = (bucket - 1).clamp(min=0)
    bound = half_step_or_step(codec, x, torch.maximum(step[bucket], step[below]))
    assert ((x.double() - y).abs() <= bound + ulp_slack(x)).all()


@pytest.mark.parametrize("split", [2, 3])
@pytest.mark.parametrize("kind", ["normal", "laplace"])
def test_estimated_buckets_are_nearly_equal_on_continuous_data(kind, split):
    """Up to sampling and the grid, for densities without spikes between grid lines: a
    boundary's rank is off by sqrt(q (1 - q) / SAMPLE) of N (one standard deviation), so a
    bucket's count by at most 4 of those at each of its two ends."""
    n, buckets = 300_000, 1 << split
    x = sample((n,), torch.float32)
    if kind == "laplace":
        x = x.sign() * torch.log1p(x.abs() * 3) ** 2
    _, lo, _, _ = parts(SortQuant(bits=8, split=split), x)
    counts = torch.bincount(torch.searchsorted(lo[1:], x.double(), right=True), minlength=buckets)
    allowed = 2 * 4 * (0.25 / SAMPLE) ** 0.5 * n
    assert ((counts - n / buckets).abs() < allowed).all(), (counts, allowed)


@pytest.mark.parametrize("bits", [4, 8, 12])
@pytest.mark.parametrize("kind", ["normal", "gelu", "relu6"])
def test_estimated_quality_is_near_exact(bits, kind):
    x = sample((64, 4096), torch.float32)
    if kind != "normal":
        x = torch.nn.functional.gelu(x) if kind == "gelu" else torch.nn.functional.relu6(3 * x)

    def rel_err(boundaries):
        c = SortQuant(bits=bits, boundaries=boundaries)
        return float((c.decode(c.encode(x)) - x).norm() / x.norm())

    assert rel_err("estimated") <= 1.1 * rel_err("exact")


@pytest.mark.parametrize("bits, split", [(8, 2), (12, 3), (3, 1), (16, 4)])
@pytest.mark.parametrize("shape", [(1,), (9,), (3, 7, 11)])
def test_nbytes_formula(bits, split, shape):
    x = sample(shape, torch.float16)
    n = x.numel()
    expected = header_nbytes(len(shape)) + 4 + 8 * 2**split + -(-n * bits // 8)
    for boundaries in ("exact", "estimated"):
        assert SortQuant(bits=bits, split=split, boundaries=boundaries).encode(x).nbytes == expected


def test_twelve_bits_cost_one_and_a_half_bytes():
    x = sample((1000,), torch.float32)
    assert SortQuant(bits=12).encode(x).payload.numel() == 4 + 8 * 8 + 1500


def test_decode_needs_no_sort(monkeypatch):
    x = sample((2000,), torch.float32)
    packet = SortQuant(boundaries="exact").encode(x)

    def no_sort(*args, **kwargs):
        raise AssertionError("decode sorted")

    monkeypatch.setattr(torch, "sort", no_sort)
    monkeypatch.setattr(torch.Tensor, "sort", no_sort)
    SortQuant().decode(packet)


@pytest.mark.parametrize("kwargs, message", [
    ({"bits": 8, "split": 8}, r"sortquant: split must be an integer in 1..7 for bits=8"),
    ({"bits": 8, "split": 0}, r"split must be an integer in 1..7"),
    ({"bits": 1}, r"sortquant: bits must be an integer in 2..16, got 1"),
    ({"bits": 20}, r"bits must be an integer in 2..16"),
    ({"boundaries": "fast"}, r"boundaries must be one of \('estimated', 'exact'\), got 'fast'"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SortQuant(**kwargs)


def test_a_quantize_payload_is_refused():
    packet = get_compressor("quantize").encode(torch.randn(10))
    with pytest.raises(PacketError, match="split is 0"):
        SortQuant().decode(Packet(SortQuant.codec_id, packet.dtype, packet.shape, packet.payload))


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.floats(-1e3, 1e3, width=32, allow_subnormal=False) | st.just(0.0),
                       min_size=1, max_size=70),
       bits=st.integers(2, 16), data=st.data(), dtype=st.sampled_from(FLOATS))
def test_exact_property(values, bits, data, dtype):
    split = data.draw(st.integers(1, bits - 1))
    x = torch.tensor(values).to(dtype)
    codec = SortQuant(bits=bits, split=split, boundaries="exact")
    codes, _, step, y = parts(codec, x)
    bucket = codes >> (bits - split)
    assert torch.bincount(bucket, minlength=2**split).tolist() == equal_counts(x.numel(), 2**split)
    assert ((x.double() - y).abs() <= half_step_or_step(codec, x, step[bucket])
            + ulp_slack(x)).all()


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.floats(-1e3, 1e3, width=32, allow_subnormal=False) | st.just(1.0),
                       min_size=1, max_size=70),
       bits=st.integers(2, 16), data=st.data(), dtype=st.sampled_from(FLOATS))
def test_estimated_property(values, bits, data, dtype):
    split = data.draw(st.integers(1, bits - 1))
    x = torch.tensor(values).to(dtype)
    codec = SortQuant(bits=bits, split=split)
    codes, _, step, y = parts(codec, x)
    bucket = codes >> (bits - split)
    below = (bucket - 1).clamp(min=0)
    bound = half_step_or_step(codec, x, torch.maximum(step[bucket], step[below]))
    assert ((x.double() - y).abs() <= bound + ulp_slack(x)).all()


def torch_path(monkeypatch) -> None:
    """Exact boundaries on the torch path (a stable torch sort) at every size."""
    from lightning_epipe.compressors import sortquant

    monkeypatch.setattr(sortquant, "EXACT_BELOW", 0)
    monkeypatch.setattr(sortquant, "EXACT_HOST_MAX", 0)


@pytest.mark.parametrize("bits, split", [(8, 2), (5, 2), (12, 3)])
@pytest.mark.parametrize("dtype", FLOATS + [torch.float64], ids=str)
@pytest.mark.parametrize("n", [5, 500, 3000, 30_000])
def test_small_tensors_on_the_host_give_the_tensor_paths_bytes(monkeypatch, bits, split, dtype, n):
    """Tensors of at most EXACT_BELOW elements are encoded on the host (a sort, then rank
    buckets by comparison, compiled); the payload must be the one the torch path of exact
    boundaries writes."""
    from lightning_epipe.compressors import sortquant

    assert n <= sortquant.EXACT_BELOW  # each size on the host
    x = heavy_ties(n).to(dtype) * 1.37 - 0.25
    small = SortQuant(bits=bits, split=split).encode(x).payload
    torch_path(monkeypatch)
    assert torch.equal(SortQuant(bits=bits, split=split, boundaries="exact").encode(x).payload,
                       small)


@pytest.mark.parametrize("bits, split", [(8, 2), (4, 1), (12, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_exact_boundaries_of_larger_cpu_tensors_take_the_host_path_with_the_same_bytes(monkeypatch, bits, split,
                                                                                       dtype):
    """Above EXACT_BELOW, exact boundaries on a CPU tensor of up to EXACT_HOST_MAX elements are
    found on the host (radix sort, compiled codes): the torch path's payload, bit for bit."""
    from lightning_epipe.compressors import sortquant

    n = 3 * sortquant.EXACT_BELOW + 7
    assert n <= sortquant.EXACT_HOST_MAX
    x = torch.cat([heavy_ties(n // 2), torch.randn(n - n // 2, generator=torch.Generator().manual_seed(2))]).to(dtype)
    calls = []
    monkeypatch.setattr(SortQuant, "_encode_exact", lambda self, flat: calls.append(flat.numel()))
    host = SortQuant(bits=bits, split=split, boundaries="exact").encode(x).payload
    assert calls == []                                    # the host path wrote it
    monkeypatch.undo()
    torch_path(monkeypatch)
    assert torch.equal(SortQuant(bits=bits, split=split, boundaries="exact").encode(x).payload, host)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("split", [1, 2, 3])
def test_host_buckets_of_ties_crossing_bucket_starts_are_the_stable_sorts(monkeypatch, seed, split):
    """Runs of equal values in the middle of the range that cross one or several bucket
    starts: each element of a run takes the bucket of its rank in a stable sort, on the
    host path as on the torch path."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(50, 4000, (1,), generator=g))
    x = torch.randint(0, 5, (n,), generator=g).float() * 0.75 - 1.0  # 5 values, each a fifth
    small = SortQuant(bits=8, split=split).encode(x).payload
    torch_path(monkeypatch)
    assert torch.equal(SortQuant(bits=8, split=split, boundaries="exact").encode(x).payload, small)


@pytest.mark.parametrize("split", [1, 2])
def test_host_codes_of_exact_values_near_float32s_max_are_the_tensor_paths(monkeypatch, split):
    """An exact value whose distance to its bucket's start overflows float32 (finite values
    near +-3e38) takes the numpy arithmetic: the same payload as the torch path."""
    x = torch.full((300,), 3e38)
    x[::3] = -3e38
    x[1::3] = -2e38  # the top bucket spans -2e38 .. 3e38: 3e38 - (-2e38) overflows float32
    small = SortQuant(bits=8, split=split).encode(x).payload
    torch_path(monkeypatch)
    assert torch.equal(SortQuant(bits=8, split=split, boundaries="exact").encode(x).payload, small)
