"""compressor="auto" across real processes: every link measured on its own traffic, profiled
and decided at the same step on both of its ends; a zero error budget keeps training exact.
The scenario's messages are tiny, so ``min_bytes`` is lowered to let them decide."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import ROOT, run_ranks
from tests.strategy.scenario import reference

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"


@pytest.mark.slow
def test_every_link_gets_a_codec_within_budget_and_training_goes_on(tmp_path):
    out = tmp_path / "r.pt"
    _, log = run_ranks(SCRIPT, "--out", out, "--steps", 8, "--compressor", "auto",
                       "--compressor-kwargs", json.dumps({"retune_every": 3, "min_bytes": 1024, "min_frames": 1}), timeout=240)
    got = torch.load(out, weights_only=False)
    assert sorted(got["auto"]) == sorted(f"{d}/cut{c}" for d in ("activation", "gradient") for c in range(3))
    # step 1's frames all follow a resize notice (first sizes), so step 2 is the first decided on
    assert "EPipeStrategy compressor='auto' at step 2:" in log and "ms/msg" in log
    assert len(got["losses"]) == 8 and all(torch.isfinite(torch.tensor(got["losses"])))


def test_decisions_come_from_the_trainings_own_traffic(tmp_path):
    out = tmp_path / "r.pt"
    kwargs = {"retune_every": 3, "min_bytes": 1024, "min_frames": 1, "window_bytes": 1 << 16}
    _, log = run_ranks(SCRIPT, "--out", out, "--steps", 5, "--compressor", "auto",
                       "--compressor-kwargs", json.dumps(kwargs), timeout=240)
    got = torch.load(out, weights_only=False)
    history = got["auto_history"]
    assert "probe" not in log and {d["step"] for d in history} <= {2, 4}
    assert sorted({d["link"] for d in history if d["step"] == 2}) == sorted(got["auto"])
    assert len(got["auto"]) == 6  # every link decided
    for d in history:
        assert "link rate: " in d["reason"] and ("sustained" in d["reason"] or "not saturated" in d["reason"])
        assert 0 < d["bandwidth"] < float("inf")
    assert len(got["losses"]) == 5 and all(torch.isfinite(torch.tensor(got["losses"])))


def test_links_that_carried_too_little_stay_uncompressed(tmp_path):
    out = tmp_path / "r.pt"
    _, log = run_ranks(SCRIPT, "--out", out, "--steps", 3, "--compressor", "auto", timeout=240)  # ~3 kB per link
    got = torch.load(out, weights_only=False)
    assert got["auto"] == {} and got["auto_history"] == [] and "compressor='auto' at step" not in log
    ref = reference(steps=3, batch_size=16)
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref.losses), rtol=1e-5, atol=1e-6)


def test_zero_error_budget_picks_lossless_codecs_and_stays_exact(tmp_path):
    out = tmp_path / "r.pt"
    run_ranks(SCRIPT, "--out", out, "--steps", 6, "--compressor", "auto",
              "--compressor-kwargs", json.dumps({"error_budget": 0.0, "retune_every": 2, "min_bytes": 1024, "min_frames": 1}), timeout=240)
    got = torch.load(out, weights_only=False)
    # every link's codec was exact on what it carried: `none`, or one exact on so few values
    # (`lloydmax` 8 bits has a level for each of up to 256 distinct values), chosen where the
    # link timed slow
    assert got["auto"] and got["auto_history"]
    assert all(d["error"] == 0.0 for d in got["auto_history"]), got["auto_history"]
    ref = reference(steps=6, batch_size=16)
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref.losses), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_resumed_run_starts_with_the_checkpoints_choices(tmp_path):
    kwargs = json.dumps({"min_bytes": 1024, "min_frames": 1, "retune_every": 1000, "tolerance": 1e9})  # no change after resume
    common = ["--compressor", "auto", "--compressor-kwargs", kwargs, "--epochs", 4, "--timeout", 60]
    run_ranks(SCRIPT, "--out", tmp_path / "full.pt", "--ckpt-dir", tmp_path / "ckpt", *common, timeout=240)
    state = torch.load(tmp_path / "ckpt" / "epoch=1.ckpt", weights_only=False)["epipe"]["auto"]
    saved = {f"{c['direction']}/cut{c['cut']}": c["label"] for c in state["choices"]}
    assert len(saved) == 6 and state["last_step"] >= 1
    json.dumps(state, allow_nan=False)  # strict JSON: unlimited rates are written as "inf"
    run_ranks(SCRIPT, "--out", tmp_path / "resumed.pt", "--resume", tmp_path / "ckpt" / "epoch=1.ckpt", *common,
              timeout=240)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=False)
    history, trial = resumed["auto_history"], state.get("trial")
    if trial is None:
        assert resumed["auto"] == saved and history == []
    else:  # the checkpoint caught a trial: the resumed run gives its verdict and changes nothing else
        tried = {f"{direction}/cut{cut}" for cut, direction in trial["links"]}
        assert history and all(d["link"] in tried and d["step"] >= trial["end"] for d in history)
        assert all(d["reason"].startswith(("kept after its trial", "back from a trial")) for d in history)
        untouched = {link: label for link, label in saved.items() if link not in tried}
        assert {link: label for link, label in resumed["auto"].items() if link not in tried} == untouched
