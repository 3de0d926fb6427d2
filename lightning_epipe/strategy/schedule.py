"""Pure GPipe schedule: which (micro-batch, stage) runs at which clock tick, and the order
in which one rank executes its share.

The staircase for ``m`` micro-batches over ``n`` stages (torchgpipe's ``clock_cycles``)::

    clock 0: (0,0)
    clock 1: (1,0) (0,1)
    clock 2: (2,0) (1,1) (0,2)
    ...

A rank runs its forward tasks stage by stage in pipeline order, micro-batches ascending
(fill), and its backward tasks in the reverse order (drain). Sends are asynchronous and
every link carries its messages in one agreed order, so this never deadlocks: a stage's
work depends only on lower stages in the forward and on higher stages in the backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal

__all__ = ["Task", "clock_cycles", "rank_tasks", "ideal_efficiency", "recomputes"]


@dataclass(frozen=True)
class Task:
    """One unit of pipeline work: run ``stage`` on micro-batch ``microbatch`` in ``phase``."""

    phase: Literal["forward", "backward"]
    stage: int
    microbatch: int


def clock_cycles(num_microbatches: int, num_stages: int) -> Iterator[list[tuple[int, int]]]:
    """Yield, per clock tick, the ``(microbatch, stage)`` pairs that can run concurrently."""
    m, n = num_microbatches, num_stages
    for k in range(m + n - 1):
        yield [(k - j, j) for j in range(max(1 + k - m, 0), min(1 + k, n))]


def rank_tasks(stages: tuple[int, ...], num_microbatches: int, phase: str) -> list[Task]:
    """The ordered tasks of a rank that runs ``stages`` (GPipe fill-drain)."""
    if phase == "forward":
        return [Task("forward", s, i) for s in sorted(stages) for i in range(num_microbatches)]
    if phase == "backward":
        return [Task("backward", s, i) for s in sorted(stages, reverse=True) for i in reversed(range(num_microbatches))]
    raise ValueError(f"phase must be 'forward' or 'backward', got {phase!r}")


def ideal_efficiency(num_microbatches: int, num_stages: int) -> float:
    """Busy fraction of a balanced GPipe pipeline: ``m / (m + n - 1)``."""
    return num_microbatches / (num_microbatches + num_stages - 1)


def recomputes(policy: str, microbatch: int, num_microbatches: int) -> bool:
    """Whether a stage drops a micro-batch's activations and recomputes them in backward.

    torchgpipe's policies: ``"always"``, ``"except_last"`` (the last micro-batch is the first
    to run backward, so keeping it costs no memory peak) and ``"never"``.
    """
    if policy == "always":
        return True
    return policy == "except_last" and microbatch < num_microbatches - 1
