"""The chain placement's raw inputs on the in-memory fabric: their layout (tensor, tuple, dict)
travels in a leading message only when it changes, small batches travel whole (split on the
first stage) and larger ones as micro-batch 0 and then growing groups of micro-batches, and
every structure arrives intact."""

from __future__ import annotations

import contextlib
import threading
from datetime import timedelta

import pytest
import torch
from torch import nn

from lightning_epipe.strategy.compression.codec_book import CodecBook, resolve_specs
from lightning_epipe.strategy.comm.memory_backend import MemoryFabric
from lightning_epipe.strategy.engine.microbatch import scatter
from lightning_epipe.strategy.planning.partition import plan_pipeline
from lightning_epipe.strategy.engine.runtime import PipelineRuntime
from lightning_epipe.strategy.engine.server_loop import ServerHooks, StepEnd, serve_step
from lightning_epipe.strategy.engine.stats import LinkKey, PipelineStats
from lightning_epipe.strategy.comm.streams import pipeline_streams
from lightning_epipe.strategy.comm.transport import Transport
from lightning_epipe.strategy.comm.wire import Command, WireError


class Merge(nn.Module):
    """A first layer that takes a tensor, a tuple or a dict of [b, 4] tensors."""

    def forward(self, x):
        if isinstance(x, torch.Tensor):
            return x
        parts = list(x.values()) if isinstance(x, dict) else list(x)
        return parts[0] * 2 + parts[1]


def make_layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(Merge(), nn.Linear(4, 4), nn.Linear(4, 2))


# 5 steps of 2 micro-batches: tensor, tensor, tuple, tuple, dict; a LAYOUT message leads each change.
# Streamed: one message per tensor of each micro-batch; whole: one per tensor of the batch.
STREAMED = 3 + 2 + 5 + 4 + 5
WHOLE = 2 + 1 + 3 + 2 + 3


def run_chain(batches: list, chunks: int, input_group_bytes: int | None, timeout_s: float = 20) -> tuple[list, dict, list]:
    """Evaluate ``batches`` through a 2-process chain on the in-memory fabric (stage 0 on rank 1,
    fed the raw inputs by rank 0); the outputs, the runtimes and what either rank raised."""
    plan = plan_pipeline(3, 2, [2, 1], "chain")  # stage 0 (with the inputs) on rank 1, the last stage on rank 0
    fabric = MemoryFabric(2, "nccl")
    groups = {(s.name, s.src, s.dst): str(s) for s in pipeline_streams("chain", 2)}
    runtimes, errors, outputs = {}, [], []
    for rank in (0, 1):
        timeout = timedelta(seconds=timeout_s)
        transport = Transport(rank, torch.device("cpu"), timeout, groups=groups, control_group="control",
                              backend=fabric.backend(rank), commands=fabric.commands(rank, timeout))
        codecs = CodecBook(resolve_specs("none", {}, plan.num_cuts, "a"), resolve_specs("none", {}, plan.num_cuts, "g"))
        runtimes[rank] = PipelineRuntime(plan, rank, make_layers(), transport, codecs, PipelineStats())
        if input_group_bytes is not None:
            runtimes[rank].input_group_bytes = input_group_bytes

    def client():
        runtime = runtimes[0]
        with torch.no_grad():
            for batch in batches:
                microbatches = scatter(batch, chunks)
                runtime.begin_step(len(microbatches))
                runtime.command(Command.FORWARD, len(microbatches))
                outputs.append(torch.cat(runtime.forward(microbatches)))
                runtime.command(Command.FINISH_STEP)
        runtime.transport.flush()

    def server():
        hooks = ServerHooks(lambda: None, lambda i: None, contextlib.nullcontext, lambda i, algorithm, value: None)
        for _ in batches:
            assert serve_step(runtimes[1], hooks, training=False) is StepEnd.EVALUATED
        runtimes[1].transport.flush()

    def guarded(fn):
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(f,), daemon=True) for f in (client, server)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return outputs, runtimes, errors


def assert_intact(batches: list, outputs: list, errors: list) -> None:
    """Every batch came through the pipeline as through the layers in one process."""
    assert not errors, errors
    reference = make_layers()
    with torch.no_grad():
        for batch, got in zip(batches, outputs, strict=True):
            torch.testing.assert_close(got, reference(batch))


def input_messages(runtimes: dict) -> tuple[int, int]:
    """Input messages the client sent and the first stage received."""
    return (runtimes[0].stats.link(LinkKey("send", 1, "input")).messages,
            runtimes[1].stats.link(LinkKey("recv", 0, "input")).messages)


@pytest.mark.parametrize("input_group_bytes, messages", [(0, STREAMED), (None, WHOLE)], ids=["streamed", "whole-batch"])
def test_input_layouts_change_between_steps_and_arrive_intact(input_group_bytes, messages):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    batches = [a, b, (a, b), (b, a), {"x": a, "y": b}]
    outputs, runtimes, errors = run_chain(batches, 2, input_group_bytes)
    assert_intact(batches, outputs, errors)
    assert input_messages(runtimes) == (messages, messages)


def test_inputs_cross_in_growing_groups_split_back_into_their_microbatches():
    """A batch larger than ``input_group_bytes`` crosses as micro-batch 0, micro-batch 1, then
    micro-batches 2-3 in one message per tensor (``input_groups``); the first stage splits the
    group back into the client's micro-batches, also where they differ by a row (7 rows in 4)."""
    g = torch.Generator().manual_seed(2)
    full = (torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g))  # 64 bytes a micro-batch of 2 rows
    short = (torch.randn(7, 4, generator=g), torch.randn(7, 4, generator=g))  # micro-batches of 2, 2, 2, 1 rows
    batches = [full, short, full]
    outputs, runtimes, errors = run_chain(batches, 4, 128)
    assert_intact(batches, outputs, errors)
    # the layout leads once; then three groups of two tensors a step
    assert input_messages(runtimes) == (1 + 3 * 2 * 3, 1 + 3 * 2 * 3)


def test_an_input_message_claiming_more_microbatches_than_the_step_has_is_a_wire_error(monkeypatch):
    """A corrupted micro-batch count in an input header (here 3 of a step's 2) names the link
    instead of splitting the inputs wrongly."""
    import lightning_epipe.strategy.engine.runtime as runtime_module

    monkeypatch.setattr(runtime_module, "input_groups", lambda sizes, limit: [range(0, len(sizes) + 1)])
    _, _, errors = run_chain([torch.randn(6, 4)], 2, None, timeout_s=2)  # the client then waits in vain
    wire = [e for e in errors if isinstance(e, WireError)]
    assert wire and "link rank 0 -> rank 1" in str(wire[0]) and "3 micro-batches from micro-batch 0 of 2" in str(wire[0])
