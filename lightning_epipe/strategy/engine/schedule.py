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

1F1B (``stage_1f1b``): stage ``s`` of ``K`` runs ``min(K - s - 1, m)`` forwards, then
alternates one forward and one backward, then drains; so it holds at most ``K - s``
micro-batches' activations instead of ``m``. A rank with two stages (the client-server
client runs the first and the last) interleaves them in the order of a simulated clock in
which every task runs one tick after what it depends on (``rank_tasks_1f1b``): each blocking
receive then waits only for work that comes earlier on every other rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal

__all__ = ["Task", "clock_cycles", "rank_tasks", "ideal_efficiency", "recomputes", "stage_1f1b", "rank_tasks_1f1b"]


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


def stage_1f1b(stage: int, num_stages: int, num_microbatches: int) -> list[Task]:
    """The 1F1B order of one stage: warm-up forwards, one-forward-one-backward, cool-down backwards."""
    m = num_microbatches
    warmup = min(num_stages - stage - 1, m)
    tasks = [Task("forward", stage, i) for i in range(warmup)]
    for i in range(warmup, m):
        tasks += [Task("forward", stage, i), Task("backward", stage, i - warmup)]
    tasks += [Task("backward", stage, i) for i in range(m - warmup, m)]
    return tasks


def _ready(task: Task, done: set[Task], last: int) -> bool:
    if task.phase == "forward":
        return task.stage == 0 or Task("forward", task.stage - 1, task.microbatch) in done
    if task.stage == last:
        return Task("forward", task.stage, task.microbatch) in done
    return Task("backward", task.stage + 1, task.microbatch) in done


def rank_tasks_1f1b(stage_ranks: tuple[int, ...], num_microbatches: int) -> dict[int, list[Task]]:
    """Every rank's 1F1B tasks in execution order, for stages placed on ``stage_ranks``.

    Simulates a clock: at each tick every stage whose next task has its inputs (computed at
    earlier ticks) runs it; a rank's order is its stages' tasks by tick, then by stage.
    """
    last = len(stage_ranks) - 1
    queues = {s: stage_1f1b(s, len(stage_ranks), num_microbatches) for s in range(len(stage_ranks))}
    position = dict.fromkeys(queues, 0)
    done: set[Task] = set()
    order: dict[int, list[Task]] = {r: [] for r in sorted(set(stage_ranks))}
    while any(position[s] < len(q) for s, q in queues.items()):
        tick = [q[position[s]] for s, q in queues.items() if position[s] < len(q) and _ready(q[position[s]], done, last)]
        if not tick:  # pragma: no cover - the 1F1B orders are consistent by construction
            raise RuntimeError("1F1B schedule cannot progress")
        for task in tick:
            order[stage_ranks[task.stage]].append(task)
            position[task.stage] += 1
        done.update(tick)
    return order
