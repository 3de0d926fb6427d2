import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_epipe.compressors import Packet, PacketError, Quantize
from lightning_epipe.compressors.packet import header_nbytes

from .cases import FLOATS, sample, ulp_slack


def error_bound(x: torch.Tensor, bits: int) -> float:
    """|x - y| <= step / 2 plus rounding, step = (max - min) / (2**bits - 1)."""
    span = float(x.double().max() - x.double().min())
    return span / (2**bits - 1) / 2 + ulp_slack(x)


@pytest.mark.parametrize("bits", range(2, 17))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_error_is_at_most_half_a_step(bits, dtype):
    x = sample((3, 333), dtype) * 3 + 1
    y = Quantize(bits=bits).decode(Quantize(bits=bits).encode(x))
    assert float((y.double() - x.double()).abs().max()) <= error_bound(x, bits)


@pytest.mark.parametrize("bits", [2, 8, 16])
def test_ends_and_constants_are_exact(bits):
    x = torch.tensor([-2.5, 0.3, 7.25, 1.0])
    y = Quantize(bits=bits).decode(Quantize(bits=bits).encode(x))
    assert y[0] == -2.5 and abs(float(y[2]) - 7.25) < 1e-6
    c = torch.full((5, 5), -1.75)
    assert torch.equal(Quantize(bits=bits).decode(Quantize(bits=bits).encode(c)), c)


@pytest.mark.parametrize("bits", [2, 3, 8, 12, 16])
@pytest.mark.parametrize("shape", [(1,), (7,), (4, 9, 5)])
def test_nbytes_formula(bits, shape):
    x = sample(shape, torch.float32)
    n = x.numel()
    expected = header_nbytes(len(shape)) + 4 + 8 + -(-n * bits // 8)
    assert Quantize(bits=bits).encode(x).nbytes == expected


@pytest.mark.parametrize("bits", [1, 17, 8.0, None, True])
def test_bad_bits(bits):
    with pytest.raises(ValueError, match=r"quantize: bits must be an integer in 2..16, got"):
        Quantize(bits=bits)


def tampered(offset: int, values: list[int]) -> Packet:
    packet = Quantize(bits=4).encode(torch.linspace(0, 1, 10))
    payload = packet.payload.clone()
    payload[offset:offset + len(values)] = torch.tensor(values, dtype=torch.uint8)
    return Packet(packet.codec, packet.dtype, packet.shape, payload)


NAN = torch.tensor([float("nan")]).view(torch.uint8).tolist()


@pytest.mark.parametrize("offset, values, message", [
    (0, [5], "take 19 payload bytes"),     # bits 5: the codes need two more bytes
    (0, [1], "bits=1"),
    (1, [1], "take 25 payload bytes"),     # split 1: two buckets, 8 more table bytes
    (2, [1], "zero padding"),
    (4, NAN, "non-finite value"),          # lo
    (8, NAN, "non-finite value"),          # step
    (11, [0x80], "negative step"),         # sign bit of step
])
def test_tampered_prefix_or_tables(offset, values, message):
    with pytest.raises(PacketError, match=message):
        Quantize().decode(tampered(offset, values))


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(-1e4, 1e4, width=32, allow_subnormal=False), min_size=1,
                       max_size=60),
       bits=st.integers(2, 16), dtype=st.sampled_from(FLOATS))
def test_error_bound_property(values, bits, dtype):
    x = torch.tensor(values).to(dtype)
    y = Quantize(bits=bits).decode(Quantize(bits=bits).encode(x))
    assert float((y.double() - x.double()).abs().max()) <= error_bound(x, bits)
