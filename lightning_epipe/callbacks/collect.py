"""Bring every rank's pipeline counters to rank 0 as one fixed-layout float64 vector.

Every rank derives the same layout from the plan: for each link of
:func:`~lightning_epipe.callbacks.meter.pipeline_links`, the sender's and the receiver's
:class:`~lightning_epipe.strategy.engine.stats.LinkCounter` (5 numbers each), then compute seconds
per stage, then wait seconds, steps, samples and the delta caches' bytes. A rank fills what it counted and leaves
the rest zero; ``torch.distributed.gather`` brings the rows to rank 0. Nothing is pickled.
Byte counts stay exact in float64 up to 2**53 (9 PB).
"""

from __future__ import annotations

import warnings
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_epipe.callbacks.meter import PipelineLink
from lightning_epipe.strategy.planning.partition import PipelinePlan
from lightning_epipe.strategy.engine.stats import LinkCounter, PipelineStats

__all__ = ["row_length", "pack_stats", "unpack_stats", "gather_stats"]

_COUNTER = len(LinkCounter().as_list())
_TAIL = 4  # wait_seconds, steps, samples, cache_bytes


def row_length(links: Sequence[PipelineLink], plan: PipelinePlan) -> int:
    return len(links) * 2 * _COUNTER + plan.num_stages + _TAIL


def pack_stats(stats: PipelineStats, links: Sequence[PipelineLink], plan: PipelinePlan, rank: int) -> Tensor:
    """Rank ``rank``'s counters as a ``[row_length]`` float64 vector."""
    values: list[float] = []
    known = set()
    for link in links:
        for side_rank, key in ((link.src, link.send_key), (link.dst, link.recv_key)):
            counter = stats.links.get(key) if side_rank == rank else None
            values += counter.as_list() if counter is not None else [0.0] * _COUNTER
            if side_rank == rank:
                known.add(key)
    unknown = sorted(key.label(rank) for key in stats.links if key not in known)
    if unknown:
        warnings.warn(
            f"EPipeMonitor: rank {rank} counted messages on {unknown}, which the pipeline plan has no link for;"
            " they are left out of the metrics",
            RuntimeWarning,
            stacklevel=2,
        )
    values += [stats.compute_seconds.get(s, 0.0) if r == rank else 0.0 for s, r in enumerate(plan.stage_ranks)]
    values += [stats.wait_seconds, float(stats.steps), float(stats.samples), float(stats.cache_bytes)]
    return torch.tensor(values, dtype=torch.float64)


def unpack_stats(row: Tensor, links: Sequence[PipelineLink], plan: PipelinePlan, rank: int) -> PipelineStats:
    """Inverse of :func:`pack_stats` for rank ``rank``'s row."""
    expected = row_length(links, plan)
    if row.numel() != expected:
        raise ValueError(f"a stats row of rank {rank} has {row.numel()} numbers but the plan's layout has {expected}")
    values = row.tolist()
    stats = PipelineStats()
    offset = 0
    for link in links:
        for side_rank, key in ((link.src, link.send_key), (link.dst, link.recv_key)):
            chunk = values[offset : offset + _COUNTER]
            offset += _COUNTER
            if side_rank == rank and any(chunk):
                stats.links[key] = LinkCounter.from_list(chunk)
    for stage, stage_rank in enumerate(plan.stage_ranks):
        if stage_rank == rank:
            stats.compute_seconds[stage] = values[offset]
        offset += 1
    stats.wait_seconds, steps, samples, cache_bytes = values[offset : offset + _TAIL]
    stats.steps, stats.samples, stats.cache_bytes = int(steps), int(samples), int(cache_bytes)
    return stats


def gather_stats(
    stats: PipelineStats, links: Sequence[PipelineLink], plan: PipelinePlan, rank: int, world_size: int, device: torch.device
) -> Optional[dict[int, PipelineStats]]:
    """Every rank's ``stats`` on global rank 0 (``None`` elsewhere). A collective: every rank calls it.

    ``rank`` is the rank within the pipeline; with several pipeline replicas (``world_size``
    a multiple of ``plan.num_ranks``) the first replica's ranks are reported.
    """
    row = pack_stats(stats, links, plan, rank).to(device)
    rows = [torch.empty_like(row) for _ in range(world_size)] if dist.get_rank() == 0 else None
    dist.gather(row, rows, dst=0)
    if rows is None:
        return None
    return {r: unpack_stats(rows[r].cpu(), links, plan, r) for r in range(plan.num_ranks)}
