"""The pipeline's ranks as threads of one process on the in-memory fabric (not collected).

``run_threaded`` drives every rank's ``PipelineRuntime`` the way ``EPipeStrategy`` does (the
client commands, runs its stages and the loss; servers follow the commands) for a few SGD
steps, and returns each rank's weights: the same code paths as real processes, without
process start-up, under NCCL's or gloo's completion rule.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from datetime import timedelta
from typing import Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

from lightning_epipe.strategy.planning.layer_costs import balance_by_parameters
from lightning_epipe.strategy.compression.codec_book import CodecBook, resolve_specs
from lightning_epipe.strategy.comm.memory_backend import MemoryFabric
from lightning_epipe.strategy.engine.microbatch import batch_size, scatter
from lightning_epipe.strategy.planning.partition import plan_pipeline
from lightning_epipe.strategy.engine.replicas import ReplicaLayout
from lightning_epipe.strategy.engine.runtime import PipelineRuntime
from lightning_epipe.strategy.engine.server_loop import ServerHooks, StepEnd, serve_step, start_next_step
from lightning_epipe.strategy.engine.stats import PipelineStats
from lightning_epipe.strategy.comm.streams import pipeline_streams
from lightning_epipe.strategy.comm.transport import Transport
from lightning_epipe.strategy.comm.wire import Command, StepFlag

LR = 0.1


def make_layers() -> nn.Sequential:
    torch.manual_seed(1234)
    return nn.Sequential(
        nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
        nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 16), nn.Linear(16, 4),
    )


def make_batches(steps: int, rows: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 16, generator=g), torch.randint(0, 4, (rows,), generator=g)) for _ in range(steps)]


def reference(batches, make: Callable[[], nn.Sequential] = make_layers) -> nn.Sequential:
    """The same SGD steps in one process, without a pipeline."""
    layers = make()
    for x, y in batches:
        layers.zero_grad()
        F.cross_entropy(layers(x), y).backward()
        with torch.no_grad():
            for p in layers.parameters():
                p -= LR * p.grad
    return layers


def _sgd(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            if p.grad is not None:
                p -= LR * p.grad
                p.grad = None


def _client(runtime: PipelineRuntime, stages: nn.Module, batches, chunks: int, schedule: str,
            open_ends: list[tuple[int, int]], ahead: bool) -> None:
    for x, y in batches:
        microbatches, targets = scatter(x, chunks), scatter(y, chunks)
        if ahead:  # as the strategy's StepStartSignal does where Lightning starts a training batch
            runtime.command(Command.BATCH_START)
        runtime.begin_step(len(microbatches))
        flags = StepFlag.GRAD_ENABLED | (StepFlag.ONE_F_ONE_B if schedule == "1f1b" else 0)
        runtime.command(Command.FORWARD, len(microbatches), flags=flags)
        if schedule == "1f1b":  # the whole step runs inside training_step
            def loss_of(i, out):
                return F.cross_entropy(out, targets[i]) * (batch_size(targets[i]) / batch_size(y))
            runtime.run_1f1b(microbatches, loss_of)
            runtime.command(Command.FINISH_STEP)
            runtime.backward()  # as EPipeStrategy.backward does: nothing left but to close the step
        else:  # training_step returns the loss (FINISH_STEP), then Lightning calls strategy.backward
            loss = F.cross_entropy(torch.cat(runtime.forward(microbatches)), y)
            runtime.command(Command.FINISH_STEP)
            runtime.prepost_gradients()  # as EPipeStrategy.backward does
            loss.backward()
            runtime.backward()
        open_ends.append(runtime.open_ends)
        _sgd(stages)


def _no_optimizer_step(index: int) -> None:
    raise AssertionError("automatic optimization sends no OPTIMIZER_STEP")


def _no_clip(index: int, algorithm, value: float) -> None:
    raise AssertionError("automatic optimization sends no CLIP_GRADIENTS")


def _server(runtime: PipelineRuntime, stages: nn.Module, steps: int, open_ends: list[tuple[int, int]],
            ahead: bool, timeout: float) -> None:
    """The strategy's own server loop; Lightning's part (backward, optimizer step) done by hand.
    ``ahead``: the client starts each step with ``BATCH_START``, and after each optimizer step
    but the last this rank waits until the next step's commands have arrived and starts it
    ahead (``start_next_step``: GPipe's forward, a 1F1B step's tasks up to its first backward),
    which must start it."""
    hooks = ServerHooks(after_backward=lambda: None, optimizer_step=_no_optimizer_step,
                        set_gradients_aside=contextlib.nullcontext,  # 1F1B's gradients stay for the SGD below
                        clip_gradients=_no_clip)
    for step in range(steps):
        if ahead and not runtime.started_ahead:
            assert runtime.next_command().command == Command.BATCH_START
        assert serve_step(runtime, hooks, training=True) is StepEnd.FINISHED
        runtime.backward()
        open_ends.append(runtime.open_ends)
        _sgd(stages)
        if ahead and step + 1 < steps:
            deadline = time.monotonic() + timeout
            while len(runtime.commands_arrived(2)) < 2:
                assert time.monotonic() < deadline, "the client's next step never started"
                time.sleep(0.001)
            assert start_next_step(runtime, hooks)


def run_threaded(placement: str, size: int, schedule: str, chunks: int, replicas: int = 1, rule: str = "nccl",
                 shared_streams: bool = False, steps: int = 2, rows: int = 16, timeout: float = 20.0,
                 make: Callable[[], nn.Sequential] = make_layers, balance: Optional[list[int]] = None,
                 ahead: bool = False, split_backward: bool = False, checkpoint: str = "never"):
    """Train ``steps`` SGD steps on ``replicas`` pipelines of ``size`` ranks (each replica on the
    same batches) of the layers ``make()`` builds, split by ``balance`` (default: by parameters);
    ``ahead``: servers start every step but the first ahead (``server_loop.start_next_step``);
    ``split_backward``: every stage that sends gradients computes them before its weights';
    ``checkpoint``: the activation recomputation policy;
    returns ``(weights, fabric, plan, batches)``: every stage's trained Sequential per global rank;
    ``fabric.open_ends[rank]`` holds the rank's sends still unflushed after each step."""
    layout = ReplicaLayout(size * replicas, replicas)
    fabric = MemoryFabric(layout.world_size, rule, shared_streams)
    batches = make_batches(steps, rows)
    base = make()  # seeded here: threads sharing the global generator would race
    plan = plan_pipeline(len(base), size, balance or balance_by_parameters(base, size, placement), placement)
    trained: dict[int, nn.Sequential] = {}
    errors: dict[int, BaseException] = {}
    fabric.open_ends = {rank: [] for rank in range(layout.world_size)}

    def rank_main(rank: int) -> None:
        try:
            prank, offset = layout.pipeline_rank(rank), layout.offset(rank)
            layers = copy.deepcopy(base)
            groups = {(s.name, s.src, s.dst): f"{offset}:{s}" for s in pipeline_streams(placement, size)}
            transport = Transport(prank, torch.device("cpu"), timedelta(seconds=timeout), offset=offset, groups=groups,
                                  control_group="control", backend=fabric.backend(rank),
                                  commands=fabric.commands(rank, timedelta(seconds=timeout)))
            codecs = CodecBook(resolve_specs("none", {}, plan.num_cuts, "a"), resolve_specs("none", {}, plan.num_cuts, "g"))
            runtime = PipelineRuntime(plan, prank, layers, transport, codecs, PipelineStats(), checkpoint=checkpoint,
                                      split_backward=split_backward)
            stages = nn.ModuleList(runtime.stages.values())
            if prank == 0:
                _client(runtime, stages, batches, chunks, schedule, fabric.open_ends[rank], ahead)
            else:
                _server(runtime, stages, steps, fabric.open_ends[rank], ahead, timeout)
            transport.flush()
            trained[rank] = layers
        except BaseException as err:  # noqa: BLE001 - reported by the caller
            errors[rank] = err
            with fabric.cond:
                fabric.failed = fabric.failed or f"rank {rank} failed: {err}"
                fabric.cond.notify_all()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(layout.world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 3)
    if errors:
        first = min(errors)
        raise RuntimeError(f"rank {first}: {errors[first]}") from errors[first]
    return trained, fabric, plan, batches
