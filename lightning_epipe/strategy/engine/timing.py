"""Compute time that means the same on every device.

On the CPU a stage's compute is over when the call returns. CUDA kernels run after the
call returns, so there a stage's compute is timed with CUDA events, read once per phase
(:meth:`ComputeTimer.settle`, one host sync where the phase ends anyway) rather than by
synchronizing around every micro-batch; and one-off measurements (link probes, the layer
timing of ``balance="time"``) synchronize with :func:`synchronize`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch

from lightning_epipe.strategy.engine.stats import PipelineStats

__all__ = ["ComputeTimer", "synchronize"]


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ComputeTimer:
    """Adds each stage's compute seconds to ``stats`` (host clock on CPU, CUDA events on GPU)."""

    def __init__(self, stats: PipelineStats, device: torch.device) -> None:
        self.stats = stats
        self.cuda = device.type == "cuda"
        self._pending: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def measure(self, stage: int) -> Iterator[None]:
        if not self.cuda:
            start = time.perf_counter()
            yield
            self.stats.add_compute(stage, time.perf_counter() - start)
            return
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        yield
        end.record()
        self._pending.append((stage, begin, end))

    def settle(self) -> None:
        """Add the CUDA-timed intervals whose events have been recorded (waits for the last one)."""
        for stage, begin, end in self._pending:
            end.synchronize()
            self.stats.add_compute(stage, begin.elapsed_time(end) / 1000)
        self._pending.clear()
