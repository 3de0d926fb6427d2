"""The process groups behind the streams (``streams.py``): one per stream, one for control.

A collective: every rank of the world creates every group, in the same order.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from lightning_epipe.strategy.engine.replicas import ReplicaLayout
from lightning_epipe.strategy.comm.streams import pipeline_streams
from lightning_epipe.strategy.comm.transport import Transport
from lightning_epipe.strategy.engine.stats import PipelineStats

__all__ = ["StreamGroups", "create_stream_groups", "create_transports"]

StreamGroups = dict[tuple[str, int, int], Any]  # (stream name, src, dst) in pipeline ranks -> process group


def create_stream_groups(layout: ReplicaLayout, placement: str, rank: int, backend: str) -> tuple[StreamGroups, Any]:
    """This rank's stream groups (data on ``backend``) and the control group (gloo: commands,
    sample ids and checkpoint state stay in host memory whatever the accelerator)."""
    mine: StreamGroups = {}
    for replica in range(layout.replicas):
        offset = replica * layout.size
        for stream in pipeline_streams(placement, layout.size):
            group = dist.new_group(sorted({offset + stream.src, offset + stream.dst}), backend=backend)
            if layout.replica_of(rank) == replica:
                mine[(stream.name, stream.src, stream.dst)] = group
    control = dist.new_group(list(range(layout.world_size)), backend="gloo")
    return mine, control


def create_transports(layout: ReplicaLayout, global_rank: int, device: torch.device, groups: StreamGroups, control: Any,
                      timeout: timedelta, verify_checksum: bool, stats: PipelineStats, backend: str) -> tuple[Transport, Transport]:
    """``(global, pipeline)`` transports: the first speaks in global ranks (checkpoint state over the
    control group), the second in this pipeline's ranks (the training's messages)."""
    host = torch.device("cpu")
    world = Transport(global_rank, device, timeout, verify_checksum, stats, control_group=control, control_device=host)
    pipeline = Transport(layout.pipeline_rank(global_rank), device, timeout, verify_checksum, stats,
                         offset=layout.offset(global_rank), groups=groups, control_group=control, control_device=host,
                         host_staged=backend == "gloo")  # gloo carries host memory only
    return world, pipeline
