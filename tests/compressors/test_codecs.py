"""What every codec promises: round trips, exact sizes, errors, independence of instances."""

import copy

import pytest
import torch

from lightning_epipe.compressors import (NonFiniteError, Packet, PacketError,
                                         available_compressors, get_compressor)

from .cases import CODECS, FLOATS, SHAPES, codec_id, make, sample

LOSSY = [c for c in CODECS if c[0] != "none"]


def test_every_codec_is_swept():
    assert {name for name, _ in CODECS} == set(available_compressors()) - {"halve-example"}


@pytest.mark.parametrize("case", CODECS, ids=codec_id)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_through_bytes_on_a_fresh_instance(case, dtype, shape):
    x = sample(shape, dtype)
    packet = make(case).encode(x)
    wire = packet.to_bytes()
    assert wire.numel() == packet.nbytes
    y = make(case).decode(Packet.from_bytes(wire))
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    assert torch.isfinite(y).all()
    if x.numel() == 0:
        assert packet.payload.numel() == 0 and make(case).ratio(x) == 1.0


@pytest.mark.parametrize("case", CODECS, ids=codec_id)
def test_deterministic(case):
    x = sample((6, 50), torch.float32)
    assert torch.equal(make(case).encode(x).to_bytes(), make(case).encode(x).to_bytes())


@pytest.mark.parametrize("case", CODECS, ids=codec_id)
def test_input_is_left_alone_and_layout_does_not_matter(case):
    x = sample((8, 40), torch.float32).requires_grad_()
    before = x.detach().clone()
    y = make(case).decode(make(case).encode(x))
    y_t = make(case).decode(make(case).encode(x.detach().t().contiguous().t()))
    assert torch.equal(x.detach(), before) and not y.requires_grad
    assert torch.equal(y, y_t)


@pytest.mark.parametrize("case", CODECS, ids=codec_id)
def test_decode_does_not_alias_the_payload(case):
    x = sample((4, 30), torch.float32)
    packet = make(case).encode(x)
    y = make(case).decode(packet)
    before = y.clone()
    packet.payload.zero_()
    assert torch.equal(y, before)


@pytest.mark.parametrize("case", LOSSY, ids=codec_id)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_raises(case, bad):
    x = sample((4, 30), torch.float32)
    x[1, 3] = bad
    x[2, 7] = bad
    with pytest.raises(NonFiniteError, match=rf"{case[0]}: 2 of 120 values are not finite"):
        make(case).encode(x)


@pytest.mark.parametrize("case", LOSSY, ids=codec_id)
def test_check_finite_false_skips_the_check(case):
    x = sample((4, 30), torch.float32)
    x[0, 0] = float("nan")
    name, kwargs = case
    get_compressor(name, **kwargs, check_finite=False).encode(x)  # no error: the caller's risk


# powersgd left out: its products of values near the float32 maximum overflow.
@pytest.mark.parametrize("case", [c for c in CODECS if c[0] != "powersgd"], ids=codec_id)
def test_finite_but_huge_values_pass_the_check(case):
    x = torch.full((1000,), 3e38)  # the float32 sum overflows; the values are finite
    x[::2] = -3e38
    if case[0] == "fp16":
        with pytest.raises(NonFiniteError, match="exceed the torch.float16 range"):
            make(case).encode(x)
        return
    y = make(case).decode(make(case).encode(x))
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("case", LOSSY, ids=codec_id)
def test_lossy_codecs_refuse_integer_tensors(case):
    with pytest.raises(TypeError, match="send integer and bool tensors with 'none'"):
        make(case).encode(torch.arange(10))


@pytest.mark.parametrize("case", CODECS, ids=codec_id)
def test_packet_of_another_codec_raises(case):
    other = "quantize" if case[0] != "quantize" else "none"
    packet = get_compressor(other).encode(sample((4, 5), torch.float32))
    with pytest.raises(PacketError, match=rf"cannot decode a packet of codec {packet.codec}"):
        make(case).decode(packet)


@pytest.mark.parametrize("case", CODECS, ids=codec_id)
@pytest.mark.parametrize("change", ["truncate", "extend", "shape", "empty"])
def test_payload_that_does_not_match_its_fields_raises(case, change):
    packet = make(case).encode(sample((4, 30), torch.float32))
    payload, shape = packet.payload, packet.shape
    if change == "truncate":
        payload = payload[:-1]
    elif change == "extend":
        payload = torch.cat([payload, payload[:1]])
    elif change == "shape":
        shape = torch.Size([40, 30])
    else:
        payload = payload[:0]
    with pytest.raises(PacketError, match=f"{case[0]} packet of shape"):
        make(case).decode(Packet(packet.codec, packet.dtype, shape, payload))


@pytest.mark.parametrize("case", LOSSY, ids=codec_id)
def test_packet_with_an_integer_dtype_raises(case):
    packet = make(case).encode(sample((4, 5), torch.float32))
    with pytest.raises(PacketError, match="this one says torch.int32"):
        make(case).decode(Packet(packet.codec, torch.int32, packet.shape, packet.payload))


@pytest.mark.parametrize("case", CODECS, ids=codec_id)
def test_ratio_is_nbytes_over_raw_bytes_and_leaves_state_alone(case):
    x = sample((4, 30), torch.float16)
    codec = make(case)
    state = copy.deepcopy(codec.state_dict())
    assert codec.ratio(x) == codec.encode(x).nbytes / (120 * 2)
    fresh = make(case)
    fresh.ratio(x)
    assert fresh.state_dict().keys() == state.keys()


@pytest.mark.parametrize("case", CODECS, ids=codec_id)
def test_repr_shows_the_settings(case):
    name, kwargs = case
    text = repr(make(case))
    assert all(f"{k}={v!r}" in text for k, v in kwargs.items()) and "check_finite=True" in text


def test_only_none_is_lossless():
    assert [n for n in available_compressors() if get_compressor(n).lossless] == ["none"]
