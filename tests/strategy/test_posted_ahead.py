"""Receives a server posts before the client sends: its next two commands, and on gloo the
next step's first raw inputs, so that a message the client sends while the server still
computes the step before leaves in the client's own send (on the in-memory fabric; the
message-order tests run whole steps this way under both backends' rules)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
from torch import nn

from lightning_epipe.strategy.comm.memory_backend import MemoryFabric
from lightning_epipe.strategy.comm.streams import pipeline_streams
from lightning_epipe.strategy.comm.transport import PeerError, Transport
from lightning_epipe.strategy.comm.wire import Command, StepFlag, WireError
from lightning_epipe.strategy.compression.codec_book import CodecBook, resolve_specs
from lightning_epipe.strategy.engine.runtime import COMMANDS_AHEAD, PipelineRuntime
from lightning_epipe.strategy.engine.stats import PipelineStats
from lightning_epipe.strategy.planning.partition import plan_pipeline

CHUNKS = 2


def _pair(rule: str, with_sample_ids: bool = False, seconds: float = 5.0) -> tuple[MemoryFabric, list[PipelineRuntime]]:
    """A 2-process chain (client rank 0, the first stage on rank 1) on the in-memory fabric."""
    fabric = MemoryFabric(2, rule=rule)
    plan = plan_pipeline(4, 2, [2, 2], "chain")
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])
    groups = {(s.name, s.src, s.dst): str(s) for s in pipeline_streams("chain", 2)}
    runtimes = []
    for rank in (0, 1):
        transport = Transport(rank, torch.device("cpu"), timedelta(seconds=seconds), groups=groups, control_group="c",
                              backend=fabric.backend(rank))
        specs = [resolve_specs("none", {}, plan.num_cuts, what) for what in ("activation", "gradient")]
        runtimes.append(PipelineRuntime(plan, rank, layers, transport, CodecBook(*specs), PipelineStats(),
                                        with_sample_ids=with_sample_ids))
    return fabric, runtimes


def test_a_server_keeps_two_command_receives_posted():
    """Under NCCL's rule a send completes only once its receive is posted: after the server has
    read BATCH_START, the client's FORWARD and FINISH_STEP both leave before it reads again."""
    assert COMMANDS_AHEAD == 2
    _, (client, server) = _pair("nccl", seconds=2.0)
    client.command(Command.BATCH_START)
    assert server.next_command().command == Command.BATCH_START
    client.begin_step(CHUNKS)
    client.command(Command.FORWARD, CHUNKS, flags=StepFlag.GRAD_ENABLED)
    client.command(Command.FINISH_STEP)
    client.transport.flush()  # both sends complete with the server still away
    forward = server.next_command()
    assert forward.command == Command.FORWARD and forward.num_microbatches == CHUNKS
    server.begin_step(forward.num_microbatches)
    assert server.next_command().command == Command.FINISH_STEP


def test_with_sample_ids_a_server_keeps_one_and_reads_them_after_forward():
    _, (client, server) = _pair("nccl", with_sample_ids=True, seconds=2.0)
    client.begin_step(CHUNKS)
    client.command(Command.FORWARD, CHUNKS, flags=StepFlag.GRAD_ENABLED | StepFlag.SAMPLE_IDS)
    client.send_sample_ids(torch.arange(6), 100)
    client.command(Command.FINISH_STEP)
    forward = server.next_command()
    server.begin_step(forward.num_microbatches)
    ids, num_samples = server.recv_sample_ids()
    assert torch.equal(ids, torch.arange(6)) and num_samples == 100
    assert server.next_command().command == Command.FINISH_STEP
    client.transport.flush()
    _, (client, server) = _pair("nccl", with_sample_ids=True, seconds=0.5)
    client.command(Command.BATCH_START)
    assert server.next_command().command == Command.BATCH_START
    client.command(Command.STOP)
    client.command(Command.STOP)
    with pytest.raises(PeerError):  # one receive posted: the second command waits for the server
        client.transport.flush()


def test_sample_ids_to_a_server_built_without_them_are_an_error_that_says_so():
    _, (client, server) = _pair("gloo")
    client.begin_step(CHUNKS)
    client.command(Command.FORWARD, CHUNKS, flags=StepFlag.GRAD_ENABLED | StepFlag.SAMPLE_IDS)
    with pytest.raises(WireError, match="with_sample_ids=True"):
        server.next_command()


def _steps(client: PipelineRuntime, server: PipelineRuntime, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Forwards of each ``x`` through both ranks, the server (first stage) on a thread of its own."""

    commands: list[Command] = []

    def serve() -> None:
        with torch.no_grad():
            for _ in xs:
                forward = server.next_command()
                server.begin_step(forward.num_microbatches)
                server.forward()
                commands.extend([forward.command, server.next_command().command])

    thread = threading.Thread(target=serve)
    thread.start()
    outputs = []
    with torch.no_grad():
        for x in xs:
            client.begin_step(CHUNKS)
            client.command(Command.FORWARD, CHUNKS)
            outputs.append(torch.cat(client.forward(list(x.chunk(CHUNKS)))))
            client.command(Command.FINISH_STEP)
    client.transport.flush()
    thread.join(timeout=10)
    assert not thread.is_alive() and commands == [Command.FORWARD, Command.FINISH_STEP] * len(xs)
    return outputs


@pytest.mark.parametrize(("rule", "ahead"), [("gloo", 1), ("nccl", 0)])
def test_the_next_steps_first_inputs_are_posted_once_this_steps_last_ones_are_read(rule, ahead):
    """Where tags are FIFOs of their own (gloo) the first stage posts the receive of the next
    step's first input message as soon as it has read this step's last one; under NCCL's rule
    when that step's forward starts, as every other stream's first receive."""
    fabric, (client, server) = _pair(rule)
    input_group = str(next(s for s in pipeline_streams("chain", 2) if s.name == "input"))
    xs = [torch.randn(6, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    outputs = _steps(client, server, xs)
    with torch.no_grad():
        expected = [client.stages[1](server.stages[0](x)) for x in xs]
    assert all(torch.allclose(y, e) for y, e in zip(outputs, expected))
    ops = [(rank, op) for rank, op, _peer, group, _n in fabric.log if group == input_group]
    assert ops.count((1, "recv")) - ops.count((0, "send")) == ahead  # one receive waits for step 4's inputs
    if ahead:
        assert ops[-1] == (1, "recv")
