"""With compressor="none" a pipeline trains exactly like one process without it.

Every case starts real gloo processes on loopback (Lightning's launcher re-runs
``scenario.py`` per rank) and compares losses and weights with an in-process reference.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import ROOT, run_ranks
from tests.strategy.scenario import loader, reference

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"

# Adam divides by sqrt(v): float rounding of micro-batch gradient sums (a few ulp) is
# amplified to ~1e-5 for weights whose gradient is near zero, hence its wider tolerance.
ATOL = {"chain-3-adam": 5e-5}

CASES = {
    "client-server-3": (["--devices", "3"], dict(steps=4, batch_size=16)),
    "chain-3-adam": (["--devices", "3", "--placement", "chain", "--optimizer", "adam"], dict(steps=4, batch_size=16, optimizer="adam")),
    "client-server-2-manual": (["--devices", "2", "--manual"], dict(steps=4, batch_size=16, manual=True)),
    # manual optimization's self.clip_gradients: every server clips too (by norm, over every stage)
    "manual-clip-norm": (["--devices", "3", "--manual", "--manual-clip", "norm:0.05"],
                         dict(steps=4, batch_size=16, manual=True, manual_clip=("norm", 0.05))),
    "manual-clip-value-chain": (["--devices", "2", "--placement", "chain", "--manual", "--manual-clip", "value:0.01"],
                                dict(steps=4, batch_size=16, manual=True, manual_clip=("value", 0.01))),
    "clip-and-accumulate": (["--devices", "3", "--clip", "0.05", "--accumulate", "2"], dict(steps=3, batch_size=16, clip=0.05, accumulate=2)),
    "recompute-except-last": (["--devices", "3", "--checkpoint", "except_last"], dict(steps=3, batch_size=16)),
    "balance-by-time": (["--devices", "3", "--balance", "time"], dict(steps=3, batch_size=16)),
    "1f1b-client-server-3": (["--devices", "3", "--schedule", "1f1b", "--chunks", "6"], dict(steps=4, batch_size=16)),
    # two processes, chunks > 2: rank 0 runs the first and the last stage and talks to rank 1 both ways
    "1f1b-client-server-2": (["--devices", "2", "--schedule", "1f1b", "--chunks", "5"], dict(steps=3, batch_size=16)),
    # two processes: rank 0 feeds the first stage both its inputs and its gradients
    "1f1b-chain-2": (["--devices", "2", "--placement", "chain", "--schedule", "1f1b", "--chunks", "4"], dict(steps=3, batch_size=16)),
    "1f1b-chain-accumulate": (["--devices", "3", "--placement", "chain", "--schedule", "1f1b", "--accumulate", "2"], dict(steps=3, batch_size=16, accumulate=2)),
    "small-last-batch": (["--devices", "2", "--placement", "chain", "--chunks", "8", "--batch-size", "23"], dict(steps=5, batch_size=23)),
    # input gradients before the weights' on every stage that sends them (the test model is below "auto"'s size)
    "split-backward-clip-and-accumulate": (["--devices", "3", "--split-backward", "true", "--clip", "0.05", "--accumulate", "2"],
                                           dict(steps=3, batch_size=16, clip=0.05, accumulate=2)),
    "split-backward-1f1b-chain-2": (["--devices", "2", "--placement", "chain", "--schedule", "1f1b", "--chunks", "4",
                                     "--split-backward", "true"], dict(steps=3, batch_size=16)),
    "split-backward-manual-chain": (["--devices", "2", "--placement", "chain", "--manual", "--split-backward", "true"],
                                    dict(steps=4, batch_size=16, manual=True)),
}


SLOW = {"1f1b-chain-accumulate", "balance-by-time", "manual-clip-norm"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_pipeline_matches_single_process(case, tmp_path):
    cli, ref_kwargs = CASES[case]
    out = tmp_path / "result.pt"
    run_ranks(SCRIPT, "--out", out, "--steps", ref_kwargs["steps"], "--batch-size", ref_kwargs["batch_size"], *cli, timeout=240)
    got = torch.load(out, weights_only=False)
    ref = reference(**ref_kwargs)

    assert len(got["losses"]) == len(ref.losses) > 0
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref.losses), rtol=1e-5, atol=1e-6)
    expected = ref.state_dict()
    assert list(got["state_dict"]) == list(expected)
    for name, value in expected.items():
        torch.testing.assert_close(got["state_dict"][name], value, rtol=1e-5, atol=ATOL.get(case, 1e-6), msg=lambda m, n=name: f"{n}: {m}")
    # predict is a forward-only pipeline over the whole data set
    with torch.no_grad():
        torch.testing.assert_close(got["predictions"], ref.layers(torch.cat([b[0] for b in loader(16)])), rtol=1e-5, atol=max(1e-5, ATOL.get(case, 0)))


def test_spawn_launcher_returns_the_trained_weights(tmp_path):
    """start_method="spawn": the launching process is not a rank and gets rank 0's weights."""
    out = tmp_path / "result.pt"
    run_ranks(SCRIPT, "--out", out, "--steps", 4, "--start-method", "spawn", timeout=240)
    got = torch.load(out, weights_only=False)["state_dict"]
    for name, value in reference(steps=4, batch_size=16).state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6)


def test_compressed_bf16_pipeline_learns(tmp_path):
    """sortquant 8 bits on bf16-mixed activations: the loss still falls like the reference's."""
    out = tmp_path / "result.pt"
    run_ranks(SCRIPT, "--out", out, "--epochs", 5, "--compressor", "sortquant", "--bits", 8,
              "--precision", "bf16-mixed", timeout=240)
    losses = torch.tensor(torch.load(out, weights_only=False)["losses"])
    ref = torch.tensor(reference(steps=len(losses), batch_size=16).losses)
    assert losses[-6:].mean() < losses[:6].mean() - 0.5
    assert abs(losses[-6:].mean() - ref[-6:].mean()) < 0.15


# a few units in the last place of a loss near 1 in each dtype
HALF_ATOL = {"bf16-true": 0.03, "16-true": 0.005}


@pytest.mark.parametrize("precision", HALF_ATOL)
def test_half_precision_weights_train_like_one_process(tmp_path, precision):
    """Weights, activations and gradients in bfloat16 or float16 ("-true"): every step's loss is
    one process's within the dtype's rounding, and it falls."""
    out = tmp_path / "result.pt"
    run_ranks(SCRIPT, "--out", out, "--epochs", 5, "--precision", precision, timeout=240)
    losses = torch.tensor(torch.load(out, weights_only=False)["losses"])
    ref = torch.tensor(reference(steps=len(losses), batch_size=16, precision=precision).losses)
    assert len(losses) == 30 and losses[-6:].mean() < losses[:6].mean() - 0.5
    torch.testing.assert_close(losses, ref, rtol=0, atol=HALF_ATOL[precision])
