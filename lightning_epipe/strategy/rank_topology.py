"""Where this process stands: nodes, processes, pipeline replicas, its rank in its pipeline.

:class:`RankTopology` is the part of ``EPipeStrategy`` that answers Lightning's questions
about ranks and data shards (``world_size``, ``root_device``, ``distributed_sampler_kwargs``)
and the pipeline's own (``layout``, ``pipeline_rank``, ``is_client``). It is a mixin over
Lightning's ``ParallelStrategy``, whose ``parallel_devices``, ``local_rank`` and
``global_rank`` it reads; ``replicas`` comes from the strategy's configuration.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lightning_epipe.strategy.engine.replicas import ReplicaLayout

__all__ = ["RankTopology"]


class RankTopology:
    """Ranks and shards of a pipeline strategy; mixed in before ``ParallelStrategy``."""

    _num_nodes: int = 1
    # supplied by ParallelStrategy and by the strategy
    parallel_devices: Any
    cluster_environment: Any
    local_rank: int
    global_rank: int
    node_rank: int
    replicas: int

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        return self.parallel_devices[self.local_rank]

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_processes

    def set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = self.global_rank

    @property
    def is_distributed(self) -> bool:
        """For Lightning's data: with one pipeline the stages form *one* replica, so the user's
        sampler is used as is (no DistributedSampler); with ``replicas > 1`` each pipeline
        reads its own shard. ``sync_dist`` stays a no-op: logged values are rank 0's."""
        return self.replicas > 1

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """Every stage of a pipeline reads the same batches: the shard of its replica."""
        return {"num_replicas": self.replicas, "rank": self.layout.replica_of(self.global_rank)}

    @property
    def layout(self) -> ReplicaLayout:
        """Which global ranks form which pipeline replica."""
        return ReplicaLayout(self.world_size, self.replicas)

    @property
    def pipeline_rank(self) -> int:
        """This process's rank within its pipeline (0: the client)."""
        return self.layout.pipeline_rank(self.global_rank)

    @property
    def is_client(self) -> bool:
        """Rank 0 of a pipeline holds the data, the loss and the Lightning loop's user code."""
        return self.pipeline_rank == 0
