"""The process groups behind the streams (``streams.py``): one per stream, one for control.

A collective: every rank of the world creates every group, in the same order.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from lightning_epipe.strategy.engine.replicas import ReplicaLayout
from lightning_epipe.strategy.comm.streams import pipeline_streams

__all__ = ["StreamGroups", "create_stream_groups"]

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
