"""The fixed-layout vector that carries a rank's counters to rank 0."""

from __future__ import annotations

import pytest
import torch

from lightning_epipe.callbacks.collect import pack_stats, row_length, unpack_stats
from lightning_epipe.callbacks.meter import pipeline_links
from lightning_epipe.strategy import plan_pipeline
from lightning_epipe.strategy.engine.stats import LinkKey, PipelineStats

PLANS = {
    "client-server": plan_pipeline(8, 3, [1, 3, 3, 1]),
    "chain": plan_pipeline(8, 3, [2, 3, 3], "chain"),
}


def rank_stats(plan, rank: int) -> PipelineStats:
    """Counters on every link ``rank`` sends or receives on, with distinct numbers."""
    stats = PipelineStats(wait_seconds=0.5 + rank, steps=4, samples=128 if rank == 0 else 0, cache_bytes=1000 * rank)
    for n, link in enumerate(pipeline_links(plan), start=1):
        if link.src == rank:
            stats.link(link.send_key).add(100 * n, 400 * n)
        if link.dst == rank:
            stats.link(link.recv_key).add(100 * n, 400 * n, seconds=0.001 * n)
            stats.link(link.recv_key).add(2**40 + n, 2**41, seconds=0.5)  # large counts stay exact
    for stage in plan.stages_of(rank):
        stats.add_compute(stage, 0.25 * (stage + 1))
    return stats


@pytest.mark.parametrize("placement", list(PLANS))
def test_pack_unpack_round_trip_for_every_rank(placement):
    plan = PLANS[placement]
    links = pipeline_links(plan)
    for rank in range(plan.num_ranks):
        stats = rank_stats(plan, rank)
        row = pack_stats(stats, links, plan, rank)
        assert row.dtype == torch.float64 and row.shape == (row_length(links, plan),)
        assert unpack_stats(row, links, plan, rank) == stats


def test_a_row_holds_only_the_packing_ranks_counters():
    plan = PLANS["client-server"]
    links = pipeline_links(plan)
    row = pack_stats(rank_stats(plan, 1), links, plan, 1)
    as_rank2 = unpack_stats(row, links, plan, 2)
    assert as_rank2.links == {} and as_rank2.compute_seconds == {2: 0.0}


def test_counters_without_a_link_in_the_plan_warn_and_are_left_out():
    plan = PLANS["client-server"]
    links = pipeline_links(plan)
    stats = rank_stats(plan, 0)
    stats.link(LinkKey("send", 2, "activation")).add(10, 40)  # rank 0 never sends activations to rank 2
    with pytest.warns(RuntimeWarning, match=r"rank 0 counted messages on \['activation/0->2'\]"):
        row = pack_stats(stats, links, plan, 0)
    assert LinkKey("send", 2, "activation") not in unpack_stats(row, links, plan, 0).links


def test_a_row_of_the_wrong_length_is_refused():
    plan = PLANS["chain"]
    links = pipeline_links(plan)
    with pytest.raises(ValueError, match="has 3 numbers but the plan's layout has"):
        unpack_stats(torch.zeros(3, dtype=torch.float64), links, plan, 1)
