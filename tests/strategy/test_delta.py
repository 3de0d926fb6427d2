"""Delta compression (AQ-SGD) across real processes: exact with a lossless codec, caches in
checkpoints (exact resume), and a cache that would not fit refused at the first step."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import ROOT, run_ranks
from tests.strategy.resume import run_and_resume
from tests.strategy.scenario import reference

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"


def test_lossless_delta_matches_single_process(tmp_path):
    """Every sample crosses as its change since last epoch: with 'none' that is exact."""
    out = tmp_path / "r.pt"
    run_ranks(SCRIPT, "--out", out, "--epochs", 3, "--delta", "--compressor", "none", timeout=240)
    got = torch.load(out, weights_only=False)
    ref = reference(steps=len(got["losses"]), batch_size=16)
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref.losses), rtol=1e-5, atol=1e-6)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got["state_dict"][name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_quantized_delta_resumes_exactly_with_its_caches(tmp_path):
    full, ckpt = run_and_resume(tmp_path, "--delta", "--compressor", "quantize", "--bits", 2)
    per_epoch = len(full["losses"]) // 4
    # 2-bit deltas of the activations still train: close to the uncompressed run
    ref = reference(steps=len(full["losses"]), batch_size=16)
    assert abs(sum(full["losses"][-per_epoch:]) - sum(ref.losses[-per_epoch:])) / per_epoch < 0.1
    # each side of each cut keeps one row per training sample: 96 samples x 32 floats
    state = torch.load(ckpt, weights_only=False)["epipe"]["ranks"]
    caches = {r: {k: v for k, v in state[r]["codecs"].items() if k.startswith("cache:")} for r in state}
    assert sorted(caches["0"]) == ["cache:0:0", "cache:2:0"]   # the client sends cut 0, receives cut 2
    assert caches["1"]["cache:0:0"]["rows"].shape == (96, 32) and bool(caches["1"]["cache:0:0"]["seen"].all())
    torch.testing.assert_close(caches["0"]["cache:0:0"]["rows"], caches["1"]["cache:0:0"]["rows"], rtol=0, atol=0)


def test_a_cache_that_does_not_fit_is_refused_at_the_first_step(tmp_path):
    code, out = run_ranks(SCRIPT, "--out", tmp_path / "r.pt", "--epochs", 1, "--delta", "--compressor", "quantize",
                          "--bits", 4, "--delta-cache-limit", 4096, "--timeout", 20, expect_ok=False, timeout=240)
    assert code != 0
    assert "96 samples x [32] torch.float32 = 12.1 KiB on this rank" in out
    assert "over the limit of 4.0 KiB" in out
