import math

import pytest
import torch

from lightning_epipe.compressors import Compressor, available_compressors, profile, registry
from lightning_epipe.compressors.profile import (
    DEFAULT_CANDIDATES,
    CodecProfile,
    codec_label,
    profile_codecs,
)


def relu_activation(shape=(64, 256), seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.relu(torch.randn(*shape, generator=g))


@pytest.fixture(scope="module")
def default_profiles() -> list[CodecProfile]:
    return profile_codecs(relu_activation(), repeats=2, warmup=1)


def by_label(profiles: list[CodecProfile]) -> dict[str, CodecProfile]:
    return {p.label: p for p in profiles}


def test_every_default_candidate_is_profiled(default_profiles):
    assert "lloydmax" in available_compressors()
    expected = [codec_label(name, kwargs) for name, kwargs in DEFAULT_CANDIDATES]
    assert [p.label for p in default_profiles] == expected
    assert expected[:4] == ["none", "fp16", "bf16", "quantize(bits=8)"]
    assert "topk(fraction=0.1, bits=8)" in expected
    for p, (name, kwargs) in zip(default_profiles, DEFAULT_CANDIDATES):
        assert p.name == name and p.kwargs == kwargs
        assert p.kwargs is not kwargs  # a copy: editing it cannot change the defaults
        assert 0 < p.ratio <= 1.01
        assert math.isfinite(p.error) and p.error >= 0
        assert 0 < p.encode_s < 60 and 0 < p.decode_s < 60


def test_ratios_include_headers(default_profiles):
    p = by_label(default_profiles)
    assert 1.0 < p["none"].ratio < 1.01  # raw bytes plus a small header
    assert 0.5 < p["fp16"].ratio < 0.51
    assert 0.5 < p["bf16"].ratio < 0.51
    assert 0.25 < p["quantize(bits=8)"].ratio < 0.26
    assert 0.25 < p["sortquant(bits=8)"].ratio < 0.26
    assert p["lloydmax(bits=4)"].ratio < p["lloydmax(bits=6)"].ratio < p["lloydmax(bits=8)"].ratio
    assert p["topk(fraction=0.1, bits=8)"].ratio < 0.1
    assert p["powersgd(rank=4)"].ratio < 0.1


def test_errors_are_ordered(default_profiles):
    p = by_label(default_profiles)
    assert p["none"].error == 0
    assert 0 < p["fp16"].error < p["bf16"].error < p["quantize(bits=8)"].error
    assert p["fp16"].error < 1e-3 and p["quantize(bits=8)"].error < 0.02
    assert p["lloydmax(bits=8)"].error < p["lloydmax(bits=6)"].error < p["lloydmax(bits=4)"].error
    assert p["topk(fraction=0.1, bits=8)"].error > 0.3  # keeps 10% of a dense activation


def test_error_matches_a_direct_measurement():
    x = relu_activation(seed=3)
    (p,) = profile_codecs(x, [("quantize", {"bits": 4})], repeats=1)
    codec = registry.get_compressor("quantize", bits=4)
    y = codec.decode(codec.encode(x))
    assert p.error == pytest.approx(float((y - x).norm() / x.norm()), rel=1e-5)


def test_powersgd_error_is_measured_after_warm_up():
    # A rank-8 tensor with a decaying spectrum: rank 4's warm start improves over calls.
    g = torch.Generator().manual_seed(0)
    spectrum = torch.tensor([10.0, 8, 6, 4, 3, 2, 1, 0.5])
    basis = torch.linalg.qr(torch.randn(256, 8, generator=g))[0]
    x = (torch.randn(64, 8, generator=g) * spectrum) @ basis.T
    candidate = [("powersgd", {"rank": 4})]
    cold = profile_codecs(x, candidate, repeats=1, warmup=0)[0].error
    warm = profile_codecs(x, candidate, repeats=1, warmup=5)[0].error
    assert warm < cold * 0.95


def test_a_custom_candidate_list():
    x = relu_activation((16, 32))
    candidates = [("sortquant", {"bits": 4}), ("none", {}), ("quantize", {"bits": 12})]
    profiles = profile_codecs(x, candidates, repeats=1)
    assert [p.label for p in profiles] == ["sortquant(bits=4)", "none", "quantize(bits=12)"]
    assert profiles[2].error < profiles[0].error
    assert profiles[0].ratio < profiles[2].ratio < profiles[1].ratio


def test_candidates_that_raise_for_this_tensor_are_skipped():
    x = torch.arange(64 * 256, dtype=torch.int32).reshape(64, 256)  # lossy codecs: floats only
    skipped: list[tuple[str, str]] = []
    profiles = profile_codecs(x, [("none", {}), ("fp16", {}), ("quantize", {"bits": 8})],
                              repeats=1, skipped=skipped)
    assert [p.label for p in profiles] == ["none"]
    assert profiles[0].error == 0 and profiles[0].ratio > 1
    assert [label for label, _ in skipped] == ["fp16", "quantize(bits=8)"]
    assert all(reason.startswith("TypeError") and "int32" in reason for _, reason in skipped)


class _Failing(Compressor):
    name, codec_id = "failing-profile-test", 250

    def _encode(self, x):
        raise ValueError("cannot encode this shape")

    def _decode(self, packet):  # pragma: no cover - never reached
        raise AssertionError


def test_a_codec_raising_value_error_is_skipped_and_logged(monkeypatch, caplog):
    monkeypatch.setitem(registry._by_name, _Failing.name, _Failing)
    skipped: list[tuple[str, str]] = []
    with caplog.at_level("INFO", logger=profile.__name__):
        profiles = profile_codecs(relu_activation(), [(_Failing.name, {}), ("fp16", {})],
                                  repeats=1, skipped=skipped)
    assert [p.label for p in profiles] == ["fp16"]
    assert skipped == [(_Failing.name, "ValueError: cannot encode this shape")]
    assert "skipping failing-profile-test" in caplog.text


def test_an_unregistered_name_is_skipped_not_raised():
    skipped: list[tuple[str, str]] = []
    profiles = profile_codecs(relu_activation(), [("not-a-codec", {"bits": 3}), ("none", {})],
                              repeats=1, skipped=skipped)
    assert [p.label for p in profiles] == ["none"]
    assert skipped[0][0] == "not-a-codec(bits=3)" and "not registered" in skipped[0][1]


def test_a_misconfigured_candidate_raises():
    with pytest.raises(ValueError, match=r"quantize\(bits=99\).*fix or remove"):
        profile_codecs(relu_activation(), [("quantize", {"bits": 99})])
    with pytest.raises(ValueError, match="unexpected"):
        profile_codecs(relu_activation(), [("fp16", {"bits": 8})])


@pytest.mark.parametrize("candidates", [[("none",)], ["none"], [(3, {})], [("none", {1: 2})]])
def test_malformed_candidates_raise(candidates):
    with pytest.raises(ValueError, match=r"\(name, kwargs\) pair"):
        profile_codecs(relu_activation(), candidates)


def test_bad_samples_and_counts_raise():
    with pytest.raises(ValueError, match="non-empty"):
        profile_codecs(torch.empty(0, 4))
    with pytest.raises(ValueError, match="NaN or Inf"):
        profile_codecs(torch.tensor([1.0, float("nan")]))
    with pytest.raises(TypeError, match="torch.Tensor"):
        profile_codecs([1.0, 2.0])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
            profile_codecs(relu_activation(), repeats=bad)
    with pytest.raises(ValueError, match="warmup must be an integer >= 0"):
        profile_codecs(relu_activation(), warmup=-1)


def test_zero_tensor_error_is_zero_when_exact():
    profiles = profile_codecs(torch.zeros(8, 8), [("none", {}), ("fp16", {})], repeats=1)
    assert [p.error for p in profiles] == [0.0, 0.0]


def test_label():
    assert codec_label("none", {}) == "none"
    assert codec_label("sortquant", {"bits": 8}) == "sortquant(bits=8)"
    assert codec_label("topk", {"fraction": 0.1, "bits": 8}) == "topk(fraction=0.1, bits=8)"


def test_hadamard_is_autos_4_bit_code_where_a_heavy_tailed_gradient_fails_lloydmax():
    """A gradient whose scale varies by element (normal times a log-normal): Lloyd-Max's 16 levels
    miss the budget, the rotated code's error does not depend on the tails; on a slow link auto
    takes it over the 6- and 8-bit codes."""
    from lightning_epipe.strategy.compression.auto_choice import GRADIENT_ERROR_BUDGET, choose_codec

    g = torch.Generator().manual_seed(0)
    grad = 1e-3 * torch.randn(32, 1024, generator=g) * torch.exp(torch.randn(32, 1024, generator=g))
    profiles = profile_codecs(grad, repeats=1, warmup=1)
    p = by_label(profiles)
    assert p["lloydmax(bits=4)"].error > GRADIENT_ERROR_BUDGET > p["hadamard(bits=4)"].error
    assert p["hadamard(bits=4)"].ratio < 0.6 * p["lloydmax(bits=8)"].ratio
    choice = choose_codec(profiles, grad.numel() * 4, 0.5e6, GRADIENT_ERROR_BUDGET, cut=0, direction="gradient")
    assert choice.label == "hadamard(bits=4)"   # 0.5 MB/s: every byte costs 2 us, a call ~0.3 ms
