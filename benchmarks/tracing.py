"""Where a pipeline step's time goes, per rank: wrap the engine's and Lightning's calls, time them.

:func:`install` (in every rank's process, before the Trainer starts) replaces the functions of
:data:`TRACED` by wrappers that record ``(label, start, end)`` with ``time.perf_counter``; at
exit :func:`install`'s handler writes the events to a JSON file per rank. The analysis is pure:
:func:`self_times` turns nested calls into each call's own time (its duration less its traced
callees'), :func:`step_windows` sums those by label over each training step, from the start of
one ``_TrainingEpochLoop.advance`` to the start of the next (the time between, Lightning's loop
around the steps, included as the step's ``between steps``).

Tracing is not free and moves a step's time (benchmarks/README.md, section 0, compares traced
and untraced steps), which is why :mod:`benchmarks.step_trace` times an untraced run beside it.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

STEP = "Lightning loop (advance)"  # the label whose calls delimit training steps
BETWEEN = "between steps"  # time of a step window no traced call covers

#: (module, attribute path, label): what :func:`install` wraps. A call's own time is its
#: duration less its traced callees', so each label reads as the time of that code alone.
TRACED: list[tuple[str, str, str]] = [
    ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop.advance", STEP),
    ("lightning_epipe.strategy.sigterm_broadcast", "StepStartSignal.__call__", "batch start (SIGTERM signal)"),
    ("lightning.pytorch.loops.fetchers", "_PrefetchDataFetcher.__next__", "next batch"),
    ("lightning.pytorch.loops.optimization.automatic", "Closure.__call__", "Lightning closure"),
    ("lightning.pytorch.trainer.call", "_call_callback_hooks", "callback hooks"),
    ("lightning.pytorch.trainer.call", "_call_lightning_module_hook", "LightningModule hooks"),
    ("lightning.pytorch.trainer.call", "_call_strategy_hook", "strategy hooks"),
    ("torch.optim", "Optimizer.zero_grad", "zero_grad"),
    ("torch.optim", "SGD.step", "optimizer step"),
    ("lightning_epipe.strategy.engine.rank_steps", "RankSteps.backward", "strategy backward (last stage's autograd)"),
    ("lightning_epipe.strategy.engine.runtime", "PipelineRuntime._forward_task", "forward compute"),
    ("lightning_epipe.strategy.engine.runtime", "PipelineRuntime._backward_task", "backward compute"),
    ("lightning_epipe.strategy.engine.runtime", "PipelineRuntime._on_last_stage_grads", "gradient hook"),
    ("lightning_epipe.strategy.engine.runtime", "PipelineRuntime._run_weight_passes", "weight gradients (deferred)"),
    ("lightning_epipe.strategy.engine.runtime", "PipelineRuntime.command", "command (client)"),
    ("lightning_epipe.strategy.engine.runtime", "PipelineRuntime.next_command", "command (server)"),
    ("lightning_epipe.strategy.engine.runtime", "PipelineRuntime._send_one", "encode"),
    ("lightning_epipe.strategy.engine.runtime", "PipelineRuntime._decode", "decode"),
    ("lightning_epipe.strategy.engine.runtime", "_finite", "NaN/Inf probe"),
    ("lightning_epipe.strategy.comm.transport", "Transport.send", "frame (header, copy)"),
    ("lightning_epipe.strategy.comm.transport", "checksum", "hash"),
    ("lightning_epipe.strategy.comm.transport", "Transport._post", "post send"),
    ("lightning_epipe.strategy.comm.transport", "Transport._post_recv", "post receive"),
    ("lightning_epipe.strategy.comm.transport", "Transport._wait", "wait"),
]

Event = tuple[str, float, float]  # (label, start, end), seconds of time.perf_counter


def install(path: str) -> list[Event]:
    """Wrap every function of :data:`TRACED`; the events go to ``path`` (JSON) at exit, its
    ``{rank}`` replaced by the process's ``LOCAL_RANK`` (Lightning's launcher sets it in the
    processes it starts; the first process is rank 0)."""
    events: list[Event] = []
    for module_name, attribute, label in TRACED:
        owner: Any = importlib.import_module(module_name)
        *parents, name = attribute.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        setattr(owner, name, _timed(getattr(owner, name), label, events))
    atexit.register(lambda: Path(path.format(rank=os.environ.get("LOCAL_RANK", "0"))).write_text(json.dumps(events)))
    return events


def _timed(fn: Any, label: str, events: list[Event]) -> Any:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            events.append((label, start, time.perf_counter()))
    return timed


def self_times(events: Iterable[Sequence]) -> list[Event]:
    """Each call's own time: ``(label, start, own seconds)``, its traced callees' time taken out.

    Calls of one thread nest (a callee starts and ends inside its caller), so sorting by start,
    longest first, puts every caller before its callees."""
    ordered = sorted(((str(e[0]), float(e[1]), float(e[2])) for e in events), key=lambda e: (e[1], -e[2]))
    own = [e[2] - e[1] for e in ordered]
    stack: list[int] = []
    for k, (_, start, end) in enumerate(ordered):
        while stack and ordered[stack[-1]][2] <= start:
            stack.pop()
        if stack:
            own[stack[-1]] -= end - start
        stack.append(k)
    return [(label, start, t) for (label, start, _), t in zip(ordered, own)]


def step_windows(events: Iterable[Sequence], warmup: int = 0) -> list[dict[str, float]]:
    """Per training step after the first ``warmup``: seconds of own time by label, the step's
    wall time under ``"step"`` and the time no traced call covers under :data:`BETWEEN`. A step
    runs from one ``advance`` start to the next, so the last ``advance`` closes no window."""
    own = self_times(events)
    starts = [start for label, start, _ in own if label == STEP]
    windows: list[dict[str, float]] = []
    k = 0
    for first, last in zip(starts, starts[1:]):
        window: dict[str, float] = {}
        while k < len(own) and own[k][1] < first:
            k += 1
        while k < len(own) and own[k][1] < last:
            label, _, seconds = own[k]
            window[label] = window.get(label, 0.0) + seconds
            k += 1
        window[BETWEEN] = (last - first) - sum(window.values())
        window["step"] = last - first
        windows.append(window)
    return windows[warmup:]


def median_ms(windows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Milliseconds per step by label: the median over ``windows`` (a step without a label counts 0)."""
    labels = dict.fromkeys(label for window in windows for label in window)
    return {label: 1e3 * statistics.median(w.get(label, 0.0) for w in windows) for label in labels}
