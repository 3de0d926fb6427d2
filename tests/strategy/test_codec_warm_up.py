"""``CodecBook.warm_up``: every codec a run will use encodes and decodes once at setup, so its
compiled loops are compiled (or loaded from numba's disk cache) before the first step."""

import pytest
import torch

from lightning_epipe.compressors import Compressor, get_compressor
from lightning_epipe.compressors.profile import DEFAULT_CANDIDATES
from lightning_epipe.strategy.compression import codec_book
from lightning_epipe.strategy.compression.codec_book import CodecBook, DeltaConfig, resolve_specs


@pytest.fixture
def made(monkeypatch):
    """(name, kwargs without check_finite) of every codec the book makes, in order."""
    calls = []

    def spy(name, **kwargs):
        calls.append((name, {k: v for k, v in kwargs.items() if k != "check_finite"}))
        return get_compressor(name, **kwargs)

    monkeypatch.setattr(codec_book, "get_compressor", spy)
    return calls


def book(activation, gradient, delta=None, cuts=2):
    return CodecBook(resolve_specs(activation, {"bits": 8}, cuts, "a"), resolve_specs(gradient, {}, cuts, "g"), delta)


def test_each_named_codec_warms_up_once_with_the_delta_codec(made):
    b = book("sortquant", "lloydmax", DeltaConfig(first="quantize"))
    made.clear()
    b.warm_up()
    assert made == [("sortquant", {"bits": 8}), ("lloydmax", {}), ("quantize", {})]


def test_auto_warms_up_every_candidate_it_may_profile(made):
    b = book("auto", "auto")
    made.clear()
    b.warm_up()
    assert [m for m in made if m != ("none", {})] == [c for c in DEFAULT_CANDIDATES if c[0] != "none"]


class Refuses(Compressor):
    """A user's codec that must not be called before training."""

    name = "refuses-warm-up"
    codec_id = 250

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a user's instance was encoded at setup")

    def _decode(self, packet):
        raise AssertionError("a user's instance was decoded at setup")


def test_a_users_instance_is_left_alone(made):
    b = book(Refuses(), "quantize")
    made.clear()
    b.warm_up()
    assert made == [("quantize", {})]
