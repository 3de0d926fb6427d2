import pytest
import torch

from lightning_epipe.compressors import Bf16, Fp16, NoCompression, NonFiniteError, Packet


@pytest.mark.parametrize("x", [
    torch.tensor([[True, False], [False, True]]),
    torch.arange(-5, 5, dtype=torch.int64).reshape(2, 5),
    torch.arange(0, 250, 7, dtype=torch.uint8),
    torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
    torch.tensor(3.5, dtype=torch.float64),
    torch.randn(3, 4, dtype=torch.bfloat16),
])
def test_none_carries_any_dtype_bit_exactly(x):
    c = NoCompression()
    packet = c.encode(x)
    assert packet.payload.numel() == x.numel() * x.element_size()
    y = NoCompression().decode(packet)
    assert y.dtype == x.dtype and torch.equal(y, x)


def test_none_payload_shares_memory_with_a_contiguous_input():
    x = torch.randn(10)
    assert NoCompression().encode(x).payload.data_ptr() == x.data_ptr()


@pytest.mark.parametrize("codec, dtype", [(NoCompression(), torch.float32), (NoCompression(), torch.int64),
                                          (Fp16(), torch.float16), (Bf16(), torch.bfloat16)])
def test_an_owned_packet_decodes_into_a_view_of_its_buffer_and_another_into_fresh_memory(codec, dtype):
    x = (torch.randn(6, 5) * 10).to(dtype)
    buf = codec.encode(x).to_bytes()  # what a receive frame holds
    for owned in (True, False):
        packet = Packet.from_bytes(buf, owned=owned)
        y = codec.decode(packet)
        assert y.dtype == dtype and torch.equal(y, x)
        assert (y.data_ptr() == packet.payload.data_ptr()) == owned
    y = codec.decode(Packet.from_bytes(buf, owned=False))
    buf.zero_()  # a receive buffer reused: an unowned packet's tensor keeps its values
    assert torch.equal(y, x)


def test_an_owned_fp16_packet_of_another_dtype_is_converted_not_viewed():
    x = torch.randn(8)
    packet = Packet.from_bytes(Fp16().encode(x).to_bytes(), owned=True)
    y = Fp16().decode(packet)
    assert y.dtype == torch.float32 and torch.equal(y, x.half().float())


def test_none_checks_floats_but_can_send_nan_raw():
    x = torch.tensor([1.0, float("nan")])
    with pytest.raises(NonFiniteError, match="none: 1 of 2"):
        NoCompression().encode(x)
    y = NoCompression().decode(NoCompression(check_finite=False).encode(x))
    assert y[0] == 1 and y[1].isnan()


@pytest.mark.parametrize("codec, wire", [(Fp16(), torch.float16), (Bf16(), torch.bfloat16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_cast_is_the_round_trip_through_the_wire_dtype(codec, wire, dtype):
    x = (torch.randn(100) * 100).to(dtype)
    packet = codec.encode(x)
    assert packet.payload.numel() == 200
    y = codec.decode(packet)
    assert y.dtype == dtype and torch.equal(y, x.to(wire).to(dtype))


def test_fp16_overflow_is_an_error_not_inf():
    x = torch.tensor([1.0, 7e4, -1e5])
    with pytest.raises(NonFiniteError, match=r"fp16: 2 of 3 values exceed the torch.float16 "
                                             r"range .* max \|x\| is 100000\); use bf16"):
        Fp16().encode(x)
    assert torch.equal(Bf16().decode(Bf16().encode(x)), x.bfloat16().float())


def test_fp16_overflow_is_an_error_even_unchecked_but_unchecked_nan_passes():
    """``check_finite=False`` (the pipeline's codecs: the engine checks inputs itself) leaves the
    input's own NaN/Inf alone, not a finite value the cast would turn into Inf."""
    with pytest.raises(NonFiniteError, match="fp16: 1 of 2 values exceed"):
        Fp16(check_finite=False).encode(torch.tensor([1.0, 7e4]))
    x = torch.tensor([1.0, float("nan"), float("inf")])
    y = Fp16(check_finite=False).decode(Fp16(check_finite=False).encode(x))
    assert torch.equal(y.isnan(), x.isnan()) and y[2] == float("inf") and y[0] == 1.0
