"""Pipeline x data parallel: ``replicas`` copies of one pipeline, each reading its own shard.

Global rank ``g`` is rank ``g % size`` of replica ``g // size`` (``size`` = processes per
pipeline), so a replica's ranks are contiguous and one node's processes can form a whole
pipeline. The ranks that run the same stages in every replica form a *stage group*; after
each backward, gradients are averaged within it, as DDP averages over its ranks, so every
replica keeps identical weights and the update equals one on the global batch.

    >>> layout = ReplicaLayout(world_size=6, replicas=2)
    >>> layout.size, layout.replica_of(4), layout.pipeline_rank(4), layout.stage_group(1)
    (3, 1, 1, (1, 4))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["ReplicaLayout", "average_gradients", "check_replicas"]


def check_replicas(value: object) -> int:
    """``value`` if it is a positive int, else a ValueError that says what ``replicas`` means."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"replicas must be a positive integer (pipelines trained data-parallel), got {value!r}")
    return value


@dataclass(frozen=True)
class ReplicaLayout:
    world_size: int
    replicas: int = 1

    def __post_init__(self) -> None:
        check_replicas(self.replicas)
        if self.world_size % self.replicas:
            raise ValueError(
                f"{self.world_size} processes do not split into replicas={self.replicas} pipelines of equal size:"
                f" use devices x num_nodes = a multiple of {self.replicas}"
            )

    @property
    def size(self) -> int:
        """Processes per pipeline."""
        return self.world_size // self.replicas

    def replica_of(self, rank: int) -> int:
        return rank // self.size

    def pipeline_rank(self, rank: int) -> int:
        """The rank within its pipeline (0: that replica's client)."""
        return rank % self.size

    def offset(self, rank: int) -> int:
        """Global rank of the client of ``rank``'s replica."""
        return self.replica_of(rank) * self.size

    def stage_group(self, pipeline_rank: int) -> tuple[int, ...]:
        """Global ranks running pipeline rank ``pipeline_rank``'s stages, one per replica."""
        return tuple(r * self.size + pipeline_rank for r in range(self.replicas))


def average_gradients(params: Iterable[Tensor], group: object, replicas: int) -> None:
    """Average the ``.grad`` of ``params`` (those that have one) over ``group``: one all-reduce.

    Every member must pass the same parameters in the same order with gradients present
    (the same model and the same stages in every replica guarantee it).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat.div_(replicas)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
