import copy

import pytest
import torch

from lightning_epipe.compressors import (Compressor, Packet, available_compressors,
                                         get_compressor, register_compressor)
from lightning_epipe.compressors.packet import bytes_as

BUILT_IN = ["none", "fp16", "bf16", "quantize", "sortquant", "topk", "powersgd"]


def test_built_in_codecs_in_codec_id_order():
    assert available_compressors()[:7] == BUILT_IN
    assert [get_compressor(n).codec_id for n in BUILT_IN] == list(range(7))


def test_every_call_is_a_new_stream():
    assert get_compressor("powersgd") is not get_compressor("powersgd")


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown compressor 'zip'; available: \['none', "
                                         r"'fp16', 'bf16', 'quantize', 'sortquant'"):
        get_compressor("zip")


@pytest.mark.parametrize("name, kwargs", [
    ("quantize", {"bits": 8, "split": 2}),
    ("none", {"bits": 8}),
    ("powersgd", {"fraction": 0.1}),
])
def test_keyword_a_codec_does_not_take(name, kwargs):
    with pytest.raises(ValueError, match=rf"{name} takes the keywords \[.*'check_finite'\], got "
                                         r"unexpected \['(split|bits|fraction)'\]"):
        get_compressor(name, **kwargs)


@pytest.mark.parametrize("name, kwargs", [
    ("quantize", {"bits": 4}),
    ("sortquant", {"bits": 12, "split": 4, "boundaries": "exact"}),
    ("topk", {"fraction": 0.2, "bits": 8}),
    ("powersgd", {"rank": 3, "iterations": 2}),
    ("fp16", {"check_finite": False}),
])
def test_keywords_reach_the_codec(name, kwargs):
    codec = get_compressor(name, **kwargs)
    assert all(getattr(codec, k) == v for k, v in kwargs.items())


def test_deepcopy_and_reset_make_an_independent_stream():
    proto = get_compressor("powersgd", rank=2)
    proto.encode(torch.randn(4, 10))
    fresh = copy.deepcopy(proto)
    fresh.reset()
    assert fresh.state_dict() == {} and proto.state_dict() != {}


class Negate(Compressor):
    name = "test-negate"
    codec_id = 201

    def _encode(self, x):
        return (-x).reshape(-1).view(torch.uint8)

    def _decode(self, packet):
        return -bytes_as(packet.payload, packet.dtype).reshape(packet.shape)


def test_a_registered_codec_travels_like_a_built_in_one():
    register_compressor(Negate)
    register_compressor(Negate)  # the same class again is fine
    x = torch.randn(3, 4)
    packet = Packet.from_bytes(get_compressor("test-negate").encode(x).to_bytes())
    assert packet.codec == 201 and torch.equal(get_compressor("test-negate").decode(packet), x)


@pytest.mark.parametrize("name, codec_id, message", [
    ("quantize", 202, r"clashes with Quantize \(name 'quantize', codec id 3\)"),
    ("test-other", 3, r"clashes with Quantize"),
    ("", 203, r"name must be a non-empty str"),
    ("test-big", 256, r"codec_id must be an int in 0..255"),
])
def test_clashing_or_bad_registration(name, codec_id, message):
    cls = type("Clash", (Negate,), {"name": name, "codec_id": codec_id})
    with pytest.raises(ValueError, match=message):
        register_compressor(cls)


def test_only_compressor_classes_register():
    with pytest.raises(TypeError, match="takes a Compressor subclass"):
        register_compressor(object)
