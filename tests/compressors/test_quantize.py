import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_epipe.compressors import Packet, PacketError, Quantize
from lightning_epipe.compressors.exact import MAX_SPIKES
from lightning_epipe.compressors.packet import header_nbytes

from .cases import FLOATS, sample, shares_exact_code, ulp_slack


def error_bound(x: torch.Tensor, bits: int) -> torch.Tensor:
    """|x - y| <= step / 2 plus rounding, step = (max - min) / (2**bits - 1); a step for an
    element that shares its code with an exact value (min, max, a repeated value)."""
    step = float(x.double().max() - x.double().min()) / (2**bits - 1)
    shared = shares_exact_code(Quantize(bits=bits), x).reshape(x.shape)
    return torch.where(shared, step, step / 2) + ulp_slack(x)


@pytest.mark.parametrize("bits", range(2, 17))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_error_is_at_most_half_a_step(bits, dtype):
    x = sample((3, 333), dtype) * 3 + 1
    y = Quantize(bits=bits).decode(Quantize(bits=bits).encode(x))
    assert ((y.double() - x.double()).abs() <= error_bound(x, bits)).all()


@pytest.mark.parametrize("bits", [2, 8, 16])
def test_ends_and_constants_are_exact(bits):
    x = torch.tensor([-2.5, 0.3, 7.25, 1.0])
    y = Quantize(bits=bits).decode(Quantize(bits=bits).encode(x))
    assert y[0] == -2.5 and y[2] == 7.25
    c = torch.full((5, 5), -1.75)
    assert torch.equal(Quantize(bits=bits).decode(Quantize(bits=bits).encode(c)), c)


@pytest.mark.parametrize("bits", [2, 3, 8, 12, 16])
@pytest.mark.parametrize("shape", [(1,), (7,), (4, 9, 5)])
def test_nbytes_formula(bits, shape):
    x = sample(shape, torch.float32)
    n = x.numel()
    packet = Quantize(bits=bits).encode(x)
    entries = int(packet.payload[2])  # exact values: the max, the repeated first three
    assert entries <= 2 + MAX_SPIKES
    expected = header_nbytes(len(shape)) + 4 + 8 + 10 * entries + -(-n * bits // 8)
    assert packet.nbytes == expected


def test_values_already_on_a_level_need_no_exact_entry():
    x = torch.arange(256.0).reshape(16, 16)  # every value is a level: step 1 from 0
    packet = Quantize(bits=8).encode(x)
    assert int(packet.payload[2]) == 0 and packet.nbytes == header_nbytes(2) + 12 + 256
    assert torch.equal(Quantize(bits=8).decode(packet), x)


@pytest.mark.parametrize("bits", [1, 17, 8.0, None, True])
def test_bad_bits(bits):
    with pytest.raises(ValueError, match=r"quantize: bits must be an integer in 2..16, got"):
        Quantize(bits=bits)


def tampered(offset: int, values: list[int]) -> Packet:
    packet = Quantize(bits=4).encode(torch.linspace(-3.3, 0.1, 10))
    payload = packet.payload.clone()
    payload[offset:offset + len(values)] = torch.tensor(values, dtype=torch.uint8)
    return Packet(packet.codec, packet.dtype, packet.shape, payload)


NAN = torch.tensor([float("nan")]).view(torch.uint8).tolist()


# linspace(-3.3, 0.1, 10) at 4 bits: one exact entry (the max, at code 15) at offset 12.
@pytest.mark.parametrize("offset, values, message", [
    (0, [5], "take 29 payload bytes"),     # bits 5: the codes need two more bytes
    (0, [1], "bits=1"),
    (1, [1], "take 35 payload bytes"),     # split 1: two buckets, 8 more table bytes
    (2, [2], "2 exact values take 37"),    # one more entry: 10 more bytes
    (3, [1], "zero padding"),
    (4, NAN, "non-finite value"),          # lo
    (8, NAN, "non-finite value"),          # step
    (11, [0x80], "negative step"),         # sign bit of step
    (12, [16], "a code past 15"),          # the exact entry's code
    (14, [0] * 6 + [0xF8, 0x7F], "exact table holds a non-finite value"),  # float64 NaN
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
    assert ((y.double() - x.double()).abs() <= error_bound(x, bits)).all()


def test_float64_range_narrower_than_a_float32_ulp_stays_in_range():
    """Codes come from float32 arithmetic: a float64 range of 1e-3 around 1e6 (a float32
    step there is 0.0625) must still clamp to valid codes, with exact ends."""
    x = 1e6 + torch.linspace(0, 1e-3, 100, dtype=torch.float64)
    y = Quantize(bits=8).decode(Quantize(bits=8).encode(x))
    assert y[0] == x[0] and y[-1] == x[-1]
    assert ((y >= x[0]) & (y <= x[-1])).all()
