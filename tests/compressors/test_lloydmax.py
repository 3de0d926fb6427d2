import pytest
import torch

from lightning_epipe.compressors import LloydMax, Packet, PacketError, get_compressor
from lightning_epipe.compressors.grid import GRID, MIN_GRID, grid_size
from lightning_epipe.compressors.packet import header_nbytes

from .cases import FLOATS, sample, ulp_slack


def rel_err(codec, x: torch.Tensor) -> float:
    y = codec.decode(codec.encode(x))
    return float((y.double() - x.double()).norm() / x.double().norm())


def tensor(kind: str, n: int = 200_000) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, generator=g)
    if kind == "relu6":
        return torch.nn.functional.relu6(2 * x)
    if kind == "gradient":
        return x * 1e-3 * torch.exp(0.5 * torch.randn(n, generator=g))
    return x


def codebook(packet: Packet) -> torch.Tensor:
    bits = int(packet.payload[0])
    return packet.payload[4:4 + 4 * 2**bits].clone().view(torch.float32)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("shape", [(1,), (9,), (3, 7, 11), (1001,)])
def test_nbytes_formula(bits, shape):
    x = sample(shape, torch.float16)
    expected = header_nbytes(len(shape)) + 4 + 4 * 2**bits + -(-x.numel() * bits // 8)
    packet = LloydMax(bits=bits).encode(x)
    assert packet.nbytes == expected
    assert packet.payload[:4].tolist() == [bits, 0, 0, 0]


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("kind", ["normal", "relu6", "gradient"])
def test_error_is_below_quantize_and_sortquant(bits, kind):
    x = tensor(kind)
    ours = rel_err(LloydMax(bits=bits), x)
    uniform = rel_err(get_compressor("quantize", bits=bits), x)
    sort = rel_err(get_compressor("sortquant", bits=bits), x)
    assert ours < 0.95 * uniform and ours < 0.95 * sort, (ours, uniform, sort)


@pytest.mark.parametrize("n", [1000, 3000, 10_000])
@pytest.mark.parametrize("kind", ["normal", "gradient"])
def test_small_tensors_at_eight_bits_beat_quantize(n, kind):
    """Few values per level: isolated extremes must still get levels of their own."""
    x = tensor(kind, n)
    assert rel_err(LloydMax(bits=8), x) < rel_err(get_compressor("quantize", bits=8), x)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_relu_zeros_and_a_clamp_ceiling_decode_exactly(bits):
    x = torch.nn.functional.relu6(4 * tensor("normal", 50_000))  # half 0, 7% at 6
    y = LloydMax(bits=bits).decode(LloydMax(bits=bits).encode(x))
    assert (y[x == 0] == 0).all()
    book = codebook(LloydMax(bits=bits).encode(x))
    assert (book == 0).sum() == 1  # one level for all the zeros, not several
    if bits >= 3:  # 6.0 holds 7% of the values: a spike once 1/(2L) <= 7%
        assert (y[x == 6] == 6).all()


def test_a_spike_inside_the_range_decodes_exactly():
    x = tensor("gradient", 100_000)
    x[::3] = 0.0  # e.g. dropped or masked entries between negative and positive values
    x[1::7] = 2.5e-3
    y = LloydMax(bits=4).decode(LloydMax(bits=4).encode(x))
    assert (y[x == 0] == 0).all() and (y[x == 2.5e-3] == 2.5e-3).all()


@pytest.mark.parametrize("bits", [1, 2, 8])
@pytest.mark.parametrize("dtype", FLOATS + [torch.float64], ids=str)
def test_constants_single_elements_and_few_values_are_exact(bits, dtype):
    for x in [torch.full((4, 5), -1.75), torch.tensor([2.5]), torch.tensor(3.0),
              torch.tensor([1.0, -2.0, 1.0, 4.0, 1.0, -2.0] * 10)]:
        if bits == 1 and x.unique().numel() > 2:
            continue
        x = x.to(dtype)
        y = LloydMax(bits=bits).decode(LloydMax(bits=bits).encode(x))
        assert y.dtype == dtype and y.shape == x.shape and torch.equal(y, x)


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2)])
def test_empty(shape):
    x = torch.empty(shape)
    packet = LloydMax().encode(x)
    assert packet.payload.numel() == 0
    assert LloydMax().decode(packet).shape == x.shape


@pytest.mark.parametrize("n", [300, 40_000])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", FLOATS + [torch.float64], ids=str)
def test_error_is_at_most_the_nearest_level_plus_a_cell(n, bits, dtype):
    """A cell of the grid the tensor's size gets: 2048 cells for 300 elements."""
    x = (sample((n,), torch.float32) * 3 + 1).to(dtype)
    packet = LloydMax(bits=bits).encode(x)
    y = LloydMax().decode(packet).double()
    assert y.dtype == torch.float64 or LloydMax().decode(packet).dtype == dtype
    book = codebook(packet).double()
    xd = x.double()
    nearest = (xd[:, None] - book[None, :]).abs().min(1).values
    cell = float(xd.max() - xd.min()) / grid_size(n)
    assert ((xd - y).abs() <= nearest + 1.01 * cell + ulp_slack(x)).all()
    assert (book.diff() >= 0).all() and torch.isfinite(book).all()


def test_huge_range():
    x = torch.tensor([-3e38, 3e38, 0.0, 1.0] * 50)
    y = LloydMax(bits=2).decode(LloydMax(bits=2).encode(x))
    assert (y[x == -3e38] == -3e38).all() and (y[x == 3e38] == 3e38).all()
    assert float((y - x).abs().max()) < 1e-6 * 3e38


def test_decode_is_deterministic_and_needs_no_state_nor_sort(monkeypatch):
    x = tensor("relu6", 30_000).reshape(30, 1000)
    packet = LloydMax(bits=4, iterations=20).encode(x)
    assert torch.equal(packet.to_bytes(), LloydMax(bits=4, iterations=20).encode(x).to_bytes())
    first = LloydMax(bits=4, iterations=20).decode(packet)

    def no_sort(*args, **kwargs):
        raise AssertionError("decode sorted")

    monkeypatch.setattr(torch, "sort", no_sort)
    monkeypatch.setattr(torch.Tensor, "sort", no_sort)
    # any instance decodes: bits and iterations come from (or do not matter for) the payload
    second = LloydMax(bits=8, iterations=0).decode(Packet.from_bytes(packet.to_bytes()))
    assert torch.equal(first, second) and LloydMax().state_dict() == {}


def test_lloyd_steps_lower_the_error():
    x = tensor("gradient")
    assert rel_err(LloydMax(bits=2, iterations=8), x) < 0.95 * rel_err(
        LloydMax(bits=2, iterations=0), x)


@pytest.mark.parametrize("kwargs, message", [
    ({"bits": 0}, r"lloydmax: bits must be an integer in 1..8 \(a codebook .*\), got 0"),
    ({"bits": 9}, r"bits must be an integer in 1..8 .* got 9"),
    ({"bits": 4.0}, r"bits must be an integer in 1..8"),
    ({"bits": True}, r"bits must be an integer in 1..8"),
    ({"iterations": -1}, r"lloydmax: iterations must be an integer in 0..100 .* got -1"),
    ({"iterations": 101}, r"iterations must be an integer in 0..100"),
    ({"iterations": "8"}, r"iterations must be an integer in 0..100"),
    ({"check_finite": 1}, r"check_finite must be True or False"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LloydMax(**kwargs)
    with pytest.raises(ValueError, match=message):
        get_compressor("lloydmax", **kwargs)


def tampered(offset: int, values: list[int], bits: int = 4) -> Packet:
    packet = LloydMax(bits=bits).encode(torch.linspace(0, 1, 100))
    payload = packet.payload.clone()
    payload[offset:offset + len(values)] = torch.tensor(values, dtype=torch.uint8)
    return Packet(packet.codec, packet.dtype, packet.shape, payload)


NAN = torch.tensor([float("nan")]).view(torch.uint8).tolist()
INF = torch.tensor([float("inf")]).view(torch.uint8).tolist()


@pytest.mark.parametrize("offset, values, message", [
    (0, [5], "take 195 payload bytes"),   # bits 5: 4 + 4 * 32 + 63 code bytes
    (0, [0], "bits=0"),
    (0, [9], "bits=9"),
    (1, [1], "zero padding"),
    (3, [7], "zero padding"),
    (4, NAN, "codebook holds a non-finite value"),
    (4 + 4 * 9, NAN, "codebook holds a non-finite value"),
    (4 + 4 * 15, INF, "codebook holds a non-finite value"),
])
def test_tampered_prefix_or_codebook(offset, values, message):
    with pytest.raises(PacketError, match=rf"lloydmax packet of shape \[100\].*{message}"):
        LloydMax().decode(tampered(offset, values))


def test_a_packet_of_the_wrong_size_raises():
    packet = LloydMax(bits=4).encode(torch.randn(100))
    with pytest.raises(PacketError, match="100 codes of 4 bits with a codebook of 16 levels "
                                          "take 118 payload bytes"):
        LloydMax().decode(Packet(packet.codec, packet.dtype, packet.shape, packet.payload[:-2]))


@pytest.mark.parametrize("count, cells", [(1, MIN_GRID), (256, MIN_GRID), (257, 2048),
                                          (4096, 16384), (16384, GRID), (10**8, GRID)])
def test_grid_has_four_cells_per_element_within_bounds(count, cells):
    assert grid_size(count) == cells
