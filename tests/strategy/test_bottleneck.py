"""Learned bottlenecks and error feedback across real processes: placement, PCA start,
bytes on the wire, checkpoints that keep them apart from the model, exact resume."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import ROOT, run_ranks
from tests.strategy.resume import run_and_resume
from tests.strategy.scenario import TinyNet, make_data, reference

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"


def test_full_ratio_bottleneck_starts_as_the_identity(tmp_path):
    """ratio=1 with a PCA start: every cut's pair reconstructs exactly, so the first loss is
    the unpipelined model's; afterwards the pairs train with the model."""
    out = tmp_path / "r.pt"
    run_ranks(SCRIPT, "--out", out, "--steps", 3, "--compressor", "bottleneck",
              "--compressor-kwargs", json.dumps({"ratio": 1.0}), timeout=240)
    got = torch.load(out, weights_only=False)
    ref = reference(steps=3, batch_size=16)
    assert abs(got["losses"][0] - ref.losses[0]) < 1e-5
    pairs = {k for k in got["state_dict"] if k.startswith("epipe_bottlenecks.")}
    assert {k.split(".")[1] for k in pairs} == {"0", "1", "2"}      # one pair per cut, all gathered


def test_a_launching_process_that_is_not_a_rank_gets_the_trained_pairs(tmp_path):
    """start_method="fork": rank 0 built the pairs, so the launching process's module had none to
    load Lightning's returned weights into; it gets them as trained (those of the last
    checkpoint), and the predict launched from it runs with them."""
    out = tmp_path / "r.pt"
    run_ranks(SCRIPT, "--out", out, "--epochs", 1, "--compressor", "bottleneck", "--ckpt-dir", tmp_path / "ck",
              "--start-method", "fork", timeout=240)
    got = torch.load(out, weights_only=False)
    trained = torch.load(tmp_path / "ck" / "epoch=0.ckpt", weights_only=False)["epipe"]["bottlenecks"]
    assert sorted(trained) == sorted(k for k in got["state_dict"] if k.startswith("epipe_bottlenecks."))
    for name, value in trained.items():
        torch.testing.assert_close(got["state_dict"][name], value, rtol=0, atol=0, msg=name)
    assert got["predictions"].shape == (96, 4) and torch.isfinite(got["predictions"]).all()


@pytest.mark.slow
def test_compressed_bottleneck_with_error_feedback_resumes_exactly(tmp_path):
    full, ckpt = run_and_resume(tmp_path, "--compressor", "bottleneck", "--bits", 4, "--error-feedback",
                                "--compressor-kwargs", json.dumps({"ratio": 0.25, "wire": "quantize"}))
    per_epoch = len(full["losses"]) // 4
    assert sum(full["losses"][-per_epoch:]) < sum(full["losses"][:per_epoch]) - 0.5

    # 4-bit codes of a quarter-width activation: far below the raw activation's bytes
    for link in ("activation/2->0", "gradient/1->0"):
        _, wire, raw, *_ = full["stats"][link]
        assert wire < 0.35 * raw, (link, wire, raw)

    # the model's own state dict stays plain; pairs, residuals and warm starts ride in "epipe"
    state = torch.load(ckpt, weights_only=False)
    assert list(state["state_dict"]) == list(TinyNet().state_dict())
    assert {k.split(".")[1] for k in state["epipe"]["bottlenecks"]} == {"0", "1", "2"}
    streams = [s for r in ("0", "1", "2") for s in state["epipe"]["ranks"][r]["codecs"].values()]
    assert len(streams) == 3 * 4 and all("residual" in s for s in streams)  # 3 gradient cuts x 4 slots
    model = TinyNet.load_from_checkpoint(ckpt)
    assert torch.isfinite(model.layers(make_data().tensors[0])).all()


@pytest.mark.slow
def test_bottleneck_with_its_own_lr_under_a_schedule_resumes_exactly(tmp_path):
    """Bottleneck(lr=...) with an optimizer over the layers only and a per-step StepLR: the pairs'
    group and the scheduler's extension survive a resume (losses and weights equal)."""
    full, ckpt = run_and_resume(tmp_path, "--compressor", "bottleneck", "--optimizer", "adam-steplr",
                                "--compressor-kwargs", json.dumps({"ratio": 0.5, "lr": 0.05}))
    state = torch.load(ckpt, weights_only=False)
    groups = state["optimizer_states"][0]["param_groups"]
    assert len(groups) == 2 and groups[1]["lr"] == pytest.approx(5 * groups[0]["lr"])  # 0.05 / (0.1 / 10)
    assert len(state["lr_schedulers"][0]["base_lrs"]) == 2
