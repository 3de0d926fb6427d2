"""The bottlenecks' parameters in the user's optimizer: a group of their own where the
optimizer misses them or ``Bottleneck(lr=...)`` asks for one, with the LR schedulers made
before it following (one process, no pipeline)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_epipe.compressors.bottleneck import Bottleneck
from lightning_epipe.strategy.compression.bottleneck_layers import bottleneck_lr
from lightning_epipe.strategy.compression.bottleneck_optimizer import optimize_bottlenecks

S = torch.optim.lr_scheduler


def _model_and_pairs():
    torch.manual_seed(0)
    return nn.Linear(4, 4), nn.ModuleDict({"0": nn.Linear(4, 2), "1": nn.Linear(2, 4)})


def _train(model, pairs, optimizer, schedulers, steps=6, metric=None):
    """A few optimizer and scheduler steps; the (first group's, pairs' group's) lr after each."""
    rates = []
    for _ in range(steps):
        loss = model(torch.randn(3, 4)).square().mean() + pairs["1"](pairs["0"](torch.randn(3, 4))).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        for s in schedulers:
            s.step(metric) if isinstance(s, S.ReduceLROnPlateau) else s.step()
        rates.append((optimizer.param_groups[0]["lr"], optimizer.param_groups[-1]["lr"]))
    return rates


SCHEDULES = {
    "lambda": lambda opt: [S.LambdaLR(opt, lambda step: (step + 1) / 4 if step < 3 else 1.0 / (step - 1))],
    "step": lambda opt: [S.StepLR(opt, step_size=2, gamma=0.5)],
    "sequential": lambda opt: [S.SequentialLR(opt, [S.LinearLR(opt, 0.25, total_iters=2),
                                                    S.CosineAnnealingLR(opt, T_max=5)], milestones=[2])],
    "onecycle": lambda opt: [S.OneCycleLR(opt, max_lr=0.4, total_steps=10)],
    "plateau": lambda opt: [S.ReduceLROnPlateau(opt, factor=0.5, patience=0)],
    "none": lambda opt: [],
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_pairs_missing_from_the_optimizer_follow_its_first_group(schedule):
    model, pairs = _model_and_pairs()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    schedulers = SCHEDULES[schedule](optimizer)
    moved = optimize_bottlenecks(pairs, None, [optimizer], schedulers)
    assert sorted(moved) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert optimizer.param_groups[-1]["momentum"] == optimizer.param_groups[0]["momentum"]
    rates = _train(model, pairs, optimizer, schedulers, metric=1.0)  # a constant metric: the plateau decays both
    for first, mine in rates:
        assert mine == pytest.approx(first)
    assert len({r[0] for r in rates}) > 1 or schedule == "none"  # the schedule did move


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_lr_gives_the_pairs_their_own_rate_on_the_same_schedule(schedule):
    model, pairs = _model_and_pairs()
    optimizer = torch.optim.AdamW([*model.parameters(), *pairs.parameters()], lr=0.01)  # the pairs in group 0
    schedulers = SCHEDULES[schedule](optimizer)
    first_lr = optimizer.param_groups[0].get("initial_lr", 0.01)
    optimize_bottlenecks(pairs, 10 * first_lr, [optimizer], schedulers)
    ids = {id(p) for p in pairs.parameters()}
    assert not ids & {id(p) for p in optimizer.param_groups[0]["params"]}
    assert ids == {id(p) for p in optimizer.param_groups[1]["params"]}
    for first, mine in _train(model, pairs, optimizer, schedulers, metric=1.0):
        assert mine == pytest.approx(10 * first)


def test_nothing_to_move():
    model, pairs = _model_and_pairs()
    optimizer = torch.optim.SGD([*model.parameters(), *pairs.parameters()], lr=0.1)
    assert optimize_bottlenecks(pairs, None, [optimizer], []) == []
    assert optimize_bottlenecks(None, 0.1, [optimizer], []) == []
    assert len(optimizer.param_groups) == 1


def test_bad_lr_is_refused():
    for bad in (0, -1e-3, "1e-3", True):
        with pytest.raises(ValueError, match="lr must be a positive number"):
            Bottleneck(ratio=0.5, lr=bad)
    with pytest.raises(ValueError, match="same lr"):
        bottleneck_lr({0: Bottleneck(lr=1e-3), 1: Bottleneck(lr=1e-2)})
    assert bottleneck_lr({0: Bottleneck(lr=1e-3), 1: Bottleneck(lr=1e-3)}) == 1e-3
    model, pairs = _model_and_pairs()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.raises(ValueError, match="learning rate, which is 0"):
        optimize_bottlenecks(pairs, 1e-3, [optimizer], [])
