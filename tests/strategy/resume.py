"""Train 4 epochs with checkpoints, resume from the one after epoch 2, check it continued exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from tests.helpers import ROOT, run_ranks

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"
EPOCHS = 4


def train_ranks(out: Path, *args: object) -> None:
    """``scenario.py args`` through Lightning's launcher, rank 0's result written to ``out``."""
    run_ranks(SCRIPT, "--out", out, *args, timeout=240)


def run_and_resume(tmp_path: Path, *args: object, train: Callable[..., None] = train_ranks) -> tuple[dict, Path]:
    """``scenario.py`` for 4 epochs, then resumed from ``epoch=1.ckpt`` with the same ``args``;
    asserts the resumed run's losses and weights equal the uninterrupted run's. Returns the
    uninterrupted run's result and the checkpoint's path. ``train(out, *args)``: how the
    ranks are started (default :func:`train_ranks`)."""
    common = ["--epochs", EPOCHS, "--timeout", 60, *args]
    train(tmp_path / "full.pt", "--ckpt-dir", tmp_path / "ckpt", *common)
    ckpt = tmp_path / "ckpt" / "epoch=1.ckpt"
    train(tmp_path / "resumed.pt", "--resume", ckpt, *common)
    full = torch.load(tmp_path / "full.pt", weights_only=False)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=False)
    per_epoch = len(full["losses"]) // EPOCHS
    assert resumed["losses"] == full["losses"][2 * per_epoch:]
    for name, value in full["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], value), name
    return full, ckpt
