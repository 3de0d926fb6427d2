"""``balance="time"`` across processes: every rank measures, rank 0 solves, everyone agrees.

1. Every rank of the first pipeline times every layer's forward and backward on its own
   device with the module's ``example_input_array`` (:func:`~lightning_epipe.strategy.planning.layer_costs.measure_layers`),
   so a slow client and fast servers (the report's CPU client with GPU servers) each get
   the layers that fit them; it also reports its memory capacity.
2. Rank 0 sizes every possible cut after compression (the configured activation and
   gradient codecs on the example's activations) and times a ping-pong with rank 1 of the
   largest one: a cut after layer ``i`` costs both its ranks ``bytes_i / bandwidth``.
3. Rank 0 solves for the split that minimizes the busiest rank's load within every rank's
   memory (:func:`~lightning_epipe.strategy.planning.solver.solve_balance`) and broadcasts it.

All the numbers are at the example's batch size: compute and bytes both scale with it, so
their ratio holds for the training micro-batches; memory does not (weights and optimizer
state are exact, activations are at the example's size).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import nn

from lightning_epipe.compressors import Compressor
from lightning_epipe.strategy.planning.layer_costs import cut_nbytes, layer_memory, measure_layers
from lightning_epipe.strategy.planning.solver import rank_loads, solve_balance
from lightning_epipe.strategy.comm.collectives import broadcast_json, probe_bandwidth
from lightning_epipe.strategy.planning.device_memory import memory_capacity

__all__ = ["measured_balance"]


def measured_balance(layers: nn.Sequential, example: Any, size: int, placement: str, rank: int, device: torch.device,
                     codecs: tuple[Compressor, Compressor], local_processes: int) -> list[int]:
    """The balance for ``size`` processes per pipeline; a collective over every rank (``rank``
    global; the first pipeline's ranks ``0..size-1`` measure, the others only listen)."""
    costs, outputs = measure_layers(layers, example, device)
    mine = {"costs": costs, "memory": memory_capacity(device, local_processes)}
    tables = [broadcast_json(mine if rank == r else None, device, r) for r in range(size)]
    cut_bytes = cut_nbytes(outputs, *codecs) if rank == 0 else []
    # at least 1 MiB, so that the link's bandwidth, not its latency, is what is timed
    largest = max(1 << 20, int(max(cut_bytes, default=0)) // 2) if rank == 0 else 0
    bandwidth = None
    if rank in (0, 1):
        bandwidth = probe_bandwidth(0, 1, largest, rank, device)
    balance = None
    if rank == 0:
        cut_costs = [b / bandwidth for b in cut_bytes]
        layer_costs = [t["costs"] for t in tables]
        balance = solve_balance(layer_costs, size, placement, cut_costs=cut_costs,
                                layer_memory=layer_memory(layers, outputs), rank_memory=[t["memory"] for t in tables])
        loads = rank_loads(balance, layer_costs, size, placement, cut_costs)
        rank_zero_info(
            f"EPipeStrategy balance='time': {balance}; busiest rank {max(loads) * 1e3:.2f} ms per example batch"
            f" (per rank {[round(x * 1e3, 2) for x in loads]} ms, cuts cost {bandwidth / 1e6:.0f} MB/s"
            f" from {min(cut_bytes, default=0):.0f} to {max(cut_bytes, default=0):.0f} bytes after compression)"
        )
    return broadcast_json(balance, device)
