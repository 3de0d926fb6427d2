"""Checkpoints of a pipelined run: consolidated on rank 0, loadable without the strategy,
and a resumed run continues with exactly the losses of an uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import ROOT, run_ranks
from tests.strategy.resume import EPOCHS, run_and_resume
from tests.strategy.scenario import TinyNet, make_data

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"


def test_resume_continues_exactly_with_codec_state(tmp_path):
    # powersgd keeps a warm-start matrix per stream: it must travel in the checkpoint too
    full, _ = run_and_resume(tmp_path, "--compressor", "powersgd")
    ckpt = tmp_path / "ckpt" / f"epoch={EPOCHS - 1}.ckpt"  # the weights the run ended with

    # the consolidated checkpoint: ordinary keys, every stage's optimizer state, codec state
    state = torch.load(ckpt, weights_only=False)
    assert list(state["state_dict"]) == list(TinyNet().state_dict())
    assert sorted(state["optimizer_states"][0]["state"]) == list(range(len(list(TinyNet().parameters()))))
    assert any(state["epipe"]["ranks"][r]["codecs"] for r in ("0", "1", "2"))

    # ... and it loads without the strategy, into a module that predicts like the pipeline did
    model = TinyNet.load_from_checkpoint(ckpt)
    for name, value in full["state_dict"].items():
        assert torch.equal(model.state_dict()[name], value), name
    with torch.no_grad():
        logits = model.layers(make_data().tensors[0])
    pipelined = full["predictions"]  # through the pipeline's powersgd cuts: close, not equal
    agree = (logits.argmax(dim=1) == pipelined.argmax(dim=1)).float().mean()
    error = (logits - pipelined).norm() / logits.norm()
    assert agree >= 0.9 and error < 0.2, (agree, error)


def test_validation_metrics_reach_monitors_on_every_rank(tmp_path):
    """ModelCheckpoint(monitor="val_loss") and EarlyStopping run on servers that never log."""
    run_ranks(SCRIPT, "--out", tmp_path / "r.pt", "--epochs", "2", "--val", "--ckpt-dir", tmp_path / "ck",
              "--placement", "chain", "--timeout", "60", timeout=240)
    result = torch.load(tmp_path / "r.pt", weights_only=False)
    assert (tmp_path / "ck" / "best.ckpt").exists()
    assert len(result["val_losses"]) == 2 + 2 * 6  # sanity check + 2 epochs of 6 batches
    last_epoch = result["val_losses"][-6:]  # batches of 16: the epoch's value is their plain mean
    assert result["callback_metrics"]["val_loss"] == pytest.approx(sum(last_epoch) / 6, rel=1e-6)
