"""Pipeline x data parallel: 2 pipelines of 2 processes each train exactly like one process
on the global batch (the union of both replicas' shards)."""

from __future__ import annotations

import doctest

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightning_epipe.strategy.engine import replicas
from lightning_epipe.strategy.engine.replicas import ReplicaLayout
from tests.helpers import ROOT, run_ranks
from tests.strategy.scenario import TinyNet, make_data, trainer_kwargs

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"


def global_batches(num_replicas: int, per_replica: int, epochs: int = 1) -> list[list[int]]:
    """What the replicas read together at each step: Lightning's DistributedSampler shards (shuffled, seed 0)."""
    data, out = make_data(), []
    for epoch in range(epochs):
        shards = []
        for rank in range(num_replicas):
            sampler = DistributedSampler(data, num_replicas=num_replicas, rank=rank, shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            order = list(sampler)
            shards.append([order[i:i + per_replica] for i in range(0, len(order), per_replica)])
        out += [sum(step, []) for step in zip(*shards)]
    return out


def reference_on_global_batches(steps: int, clip=None, **model_kwargs) -> TinyNet:
    model = TinyNet(**model_kwargs)
    loader = DataLoader(make_data(), batch_sampler=global_batches(2, 8))
    L.Trainer(devices=1, gradient_clip_val=clip, **trainer_kwargs(steps)).fit(model, loader)
    return model


@pytest.mark.parametrize("case", [
    ["--placement", "client-server"],
    pytest.param(["--placement", "chain", "--optimizer", "adam", "--clip", "0.05"], marks=pytest.mark.slow),
    # manual optimization's clip by norm: the norm over every stage, counted once over the replicas
    pytest.param(["--placement", "client-server", "--manual", "--manual-clip", "norm:0.05"], marks=pytest.mark.slow),
])
def test_two_pipelines_of_two_match_one_process_on_the_global_batch(case, tmp_path):
    out = tmp_path / "r.pt"
    # the shards depend on the sampler's seed, which an earlier seed_everything may have exported
    run_ranks(SCRIPT, "--out", out, "--devices", 4, "--replicas", 2, "--steps", 5, "--batch-size", 8, *case, timeout=300,
              env={"PL_GLOBAL_SEED": "0"})
    got = torch.load(out, weights_only=False)
    kwargs = {"optimizer": "adam"} if "adam" in case else {}
    if "--manual" in case:
        kwargs.update(manual=True, manual_clip=("norm", 0.05))
    ref = reference_on_global_batches(5, clip=0.05 if "--clip" in case else None, **kwargs)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got["state_dict"][name], value, rtol=1e-5, atol=5e-5 if kwargs else 1e-6, msg=name)


def test_doctests():
    assert doctest.testmod(replicas).failed == 0


def test_layout():
    layout = ReplicaLayout(world_size=8, replicas=2)
    assert layout.size == 4
    assert [layout.replica_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [layout.offset(r) for r in (3, 5)] == [0, 4]
    assert [layout.stage_group(k) for k in range(4)] == [(0, 4), (1, 5), (2, 6), (3, 7)]


@pytest.mark.parametrize("world, count, match", [
    (5, 2, "5 processes do not split into replicas=2"),
    (4, 0, "replicas must be a positive integer"),
    (4, True, "replicas must be a positive integer"),
])
def test_bad_layouts(world, count, match):
    with pytest.raises(ValueError, match=match):
        ReplicaLayout(world, count)
