"""precision="16-mixed": the pipeline's ranks skip, step and scale as one.

Two real gloo processes share one GradScaler decision (``agree_on_overflow``); a pipelined
fit under float16 autocast and a GradScaler trains as one process does, through the steps
that overflow and back off as much as through the others.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lightning_epipe.strategy.assembly import check_setup
from lightning_epipe.strategy.engine.grad_scaling import agree_on_overflow, check_unscaling
from tests.helpers import ROOT, run_ranks, run_two_gloo_ranks
from tests.strategy.resume import run_and_resume
from tests.strategy.scenario import reference

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"


def _step(scaler: torch.amp.GradScaler, model: nn.Module, optimizer: torch.optim.Optimizer,
          grads: dict[str, float] | None) -> dict:
    """One optimizer step with these gradients (already scaled; None: no gradient at all)."""
    for name, p in model.named_parameters():
        p.grad = None if grads is None else torch.full_like(p, grads[name])
    before = [p.detach().clone() for p in model.parameters()]
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    stepped = any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    return {"stepped": stepped, "scale": float(scaler.get_scale())}


def _rank(rank: int) -> dict:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    agree_on_overflow(SimpleNamespace(scaler=scaler), torch.device("cpu"))
    if rank == 0:  # the client scales its loss; a server never does
        scaler.scale(torch.ones(()))
    inf = float("inf")
    got = {
        # only rank 0's gradients overflowed: both skip, both back off
        "overflow_on_one": _step(scaler, model, optimizer, {"weight": inf if rank == 0 else 512.0, "bias": 512.0}),
        "finite": _step(scaler, model, optimizer, {"weight": 512.0, "bias": 512.0}),
        # rank 1 holds no gradient for this optimizer: it still takes part, and steps nothing
        "no_grad_on_one": _step(scaler, model, optimizer, None if rank == 1 else {"weight": 512.0, "bias": 512.0}),
    }
    scaler.update(new_scale=2.0 if rank == 1 else 4.0)  # scales that disagree are refused
    try:
        _step(scaler, model, optimizer, {"weight": 1.0, "bias": 1.0})
        got["differing_scales"] = "no error"
    except RuntimeError as error:
        got["differing_scales"] = str(error)
    return got


def test_every_rank_skips_steps_and_scales_as_one() -> None:
    results = run_two_gloo_ranks(_rank)
    for rank in (0, 1):
        got = results[rank]
        assert got["overflow_on_one"] == {"stepped": False, "scale": 512.0}, rank
        assert got["finite"] == {"stepped": True, "scale": 512.0}, rank
        assert got["no_grad_on_one"] == {"stepped": rank == 0, "scale": 512.0}, rank
        assert "scale differs across ranks (2.0 to 4.0)" in got["differing_scales"], rank


def test_nonfinite_skip_is_refused_under_a_grad_scaler() -> None:
    module = nn.Module()
    with pytest.raises(ValueError, match="GradScaler already skips"):
        check_setup(module, module, SimpleNamespace(scaler=torch.amp.GradScaler("cpu")), "skip")
    check_setup(module, module, SimpleNamespace(scaler=torch.amp.GradScaler("cpu")), "raise")
    check_setup(module, module, SimpleNamespace(scaler=None), "skip")


def test_a_fused_optimizer_is_refused() -> None:
    fused = torch.optim.Adam(nn.Linear(2, 2).parameters(), fused=True)
    with pytest.raises(ValueError, match="fused=False"):
        check_unscaling([fused])
    check_unscaling([torch.optim.Adam(nn.Linear(2, 2).parameters())])


# At 2**28 the first two steps overflow on every rank (the scaler backs off 64x each time), the
# next four train at 2**16. Near the edge of overflow a pipeline's decision may differ from one
# process's: a micro-batch's weight gradient is a float16 sum over its rows before the float32
# accumulation, whose partial sums can overflow where the whole batch's does not (as under
# gradient accumulation); these scales are far from it.
INIT_SCALE, SCALES = 2.0 ** 28, [2.0 ** 22] + [2.0 ** 16] * 5

CASES = {  # name: (scenario arguments, the reference's model arguments)
    "client-server-3": (["--devices", "3"], {}),
    "chain-2": (["--devices", "2", "--placement", "chain"], {}),
    # 1F1B backpropagates each micro-batch's loss itself: the scaler scales those
    "1f1b-client-server-3": (["--devices", "3", "--schedule", "1f1b"], {}),
    "1f1b-chain-2": (["--devices", "2", "--placement", "chain", "--schedule", "1f1b"], {}),
    # the server steps on the client's OPTIMIZER_STEP, through its own scaler
    "manual-client-server-2": (["--devices", "2", "--manual"], {"manual": True}),
}
SLOW = {"1f1b-chain-2", "manual-client-server-2"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_fp16_mixed_pipeline_matches_one_process(case, tmp_path):
    """Float16 autocast with a GradScaler whose first scales overflow: the pipeline skips the same
    steps, backs off to the same scales and ends with the same weights as one process."""
    out, steps = tmp_path / "result.pt", len(SCALES)
    cli, model_kwargs = CASES[case]
    run_ranks(SCRIPT, "--out", out, "--steps", steps, "--fp16-scale", INIT_SCALE, *cli, timeout=240)
    got = torch.load(out, weights_only=False)
    ref = reference(steps=steps, batch_size=16, fp16_scale=INIT_SCALE, **model_kwargs)
    assert ref.scales == SCALES and got["scales"] == SCALES
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref.losses), rtol=1e-5, atol=1e-6)
    for name, value in ref.state_dict().items():  # float16 sums per micro-batch, not per batch: ~1e-6
        torch.testing.assert_close(got["state_dict"][name], value, rtol=1e-3, atol=5e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.slow
def test_fp16_mixed_resume_continues_exactly(tmp_path):
    """The checkpoint carries the client's scaler; every rank restores it, so the resumed run
    trains at the scale it had reached (at the initial scale it would overflow again, and a rank
    left at it would be refused)."""
    full, _ = run_and_resume(tmp_path, "--devices", 3, "--fp16-scale", INIT_SCALE)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=False)
    assert full["scales"][:2] == SCALES[:2] and resumed["scales"] == full["scales"][len(full["scales"]) // 2:]
