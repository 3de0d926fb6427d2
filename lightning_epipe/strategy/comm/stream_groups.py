"""The process groups behind the streams (``streams.py``): one per stream on NCCL (on gloo
the data streams take TCP connections of their own instead, ``socket_streams.py``), one for
control, one per stage across replicas; and the transports over them, the pipeline's with
its command connections (``command_channel.py``).

A collective: every rank of the world creates every group, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from lightning_epipe.strategy.comm.command_channel import connect_commands
from lightning_epipe.strategy.comm.socket_streams import SOCKET_BACKEND, connect_streams
from lightning_epipe.strategy.engine.replicas import ReplicaLayout
from lightning_epipe.strategy.comm.streams import pipeline_streams
from lightning_epipe.strategy.comm.transport import DIST_BACKEND, Transport
from lightning_epipe.strategy.engine.stats import PipelineStats

__all__ = ["StreamGroups", "PipelineGroups", "create_groups", "create_transports"]

StreamGroups = dict[tuple[str, int, int], Any]  # (stream name, src, dst) in pipeline ranks -> process group


@dataclass(frozen=True)
class PipelineGroups:
    """This rank's process groups."""

    streams: StreamGroups  # data on NCCL (none on gloo: the data streams are connections of their own)
    control: Any  # gloo: commands, sample ids and checkpoint state stay in host memory whatever the accelerator
    stage: Optional[Any]  # replicas > 1: the ranks holding this rank's stages (gradient averaging)


def create_groups(layout: ReplicaLayout, placement: str, rank: int, backend: str) -> PipelineGroups:
    """Every group of the world (a collective), this rank's kept."""
    mine: StreamGroups = {}
    if backend != "gloo":  # on gloo the data streams are connections of their own (create_transports)
        for replica in range(layout.replicas):
            offset = replica * layout.size
            for stream in pipeline_streams(placement, layout.size):
                group = dist.new_group(sorted({offset + stream.src, offset + stream.dst}), backend=backend)
                if layout.replica_of(rank) == replica:
                    mine[(stream.name, stream.src, stream.dst)] = group
    control = dist.new_group(list(range(layout.world_size)), backend="gloo")
    stage = None
    if layout.replicas > 1:
        stage_groups = [dist.new_group(list(layout.stage_group(k))) for k in range(layout.size)]
        stage = stage_groups[layout.pipeline_rank(rank)]
    return PipelineGroups(mine, control, stage)


def create_transports(layout: ReplicaLayout, placement: str, global_rank: int, device: torch.device,
                      groups: PipelineGroups, timeout: timedelta, verify_checksum: bool, stats: PipelineStats,
                      backend: str, main_address: Optional[str]) -> tuple[Transport, Transport]:
    """``(global, pipeline)`` transports (a collective: every rank of the world): the first speaks in
    global ranks (checkpoint state over the control group), the second in this pipeline's ranks (the
    training's messages; commands on connections of their own). ``main_address``: the rendezvous
    host (``MASTER_ADDR``), which the command connections take their route from."""
    host, control = torch.device("cpu"), groups.control
    prank, offset = layout.pipeline_rank(global_rank), layout.offset(global_rank)
    commands = connect_commands(prank, layout.size, offset, global_rank, control, timeout, main_address)
    streams, p2p = groups.streams, DIST_BACKEND
    if backend == "gloo":  # host frames: each data stream on a connection of its own
        streams, p2p = connect_streams(placement, layout.size, offset, global_rank, control, timeout, main_address), SOCKET_BACKEND
    world = Transport(global_rank, device, timeout, verify_checksum, stats, control_group=control, control_device=host)
    pipeline = Transport(prank, device, timeout, verify_checksum, stats, offset=offset, groups=streams,
                         control_group=control, control_device=host, backend=p2p, commands=commands,
                         host_staged=backend == "gloo")  # gloo carries host memory only
    return world, pipeline
