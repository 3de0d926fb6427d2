"""A server starts the client's next step ahead of Lightning's work between steps
(``EPipeStrategy(start_ahead=True)``, ``server_loop.start_next_step``; under 1F1B the step's
tasks up to its first backward), in real processes:
wherever the client has begun the next step by the time the server's batch has ended, never
across an epoch's end, and the training is still one process's (a module whose own
``optimizer_step`` changes the weights after the step included)."""

from __future__ import annotations

import re

import pytest
import torch

from tests.helpers import ROOT, run_ranks
from tests.strategy.scenario import reference

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"
STEPS = 8  # 6 batches an epoch (96 samples, batches of 16): steps 7 and 8 run in the second epoch


def _train(tmp_path, *args):
    out = tmp_path / "result.pt"
    # chain: rank 1 runs the first stage; slowed before each optimizer step, it ends every step
    # after the client has begun the next one
    _, log = run_ranks(SCRIPT, "--out", out, "--steps", STEPS, "--batch-size", 16, "--devices", 2, "--placement", "chain",
                       "--slow-rank", 1, "--slow-seconds", 0.1, *args, timeout=240)
    started = {int(r): int(n) for r, n in re.findall(r"rank (\d) started (\d+) steps ahead", log)}
    return torch.load(out, weights_only=False), started


@pytest.mark.parametrize(("schedule", "start_ahead", "shrink"), [
    ("gpipe", True, False), ("gpipe", False, False), ("1f1b", True, False), ("gpipe", True, True),
])
def test_a_slow_first_stage_starts_every_step_ahead_but_across_epochs(tmp_path, schedule, start_ahead, shrink):
    flags = ([] if start_ahead else ["--no-start-ahead"]) + (["--shrink"] if shrink else [])
    got, started = _train(tmp_path, "--schedule", schedule, *flags)
    # every step but the first and the first of the second epoch; the client never starts ahead
    assert started == {0: 0, 1: STEPS - 2 if start_ahead else 0}
    ref = reference(steps=STEPS, batch_size=16, shrink=shrink)
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref.losses), rtol=1e-5, atol=1e-6)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got["state_dict"][name], value, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
