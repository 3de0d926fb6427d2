"""What reaches a server before it asks: the client's commands, on their own channel, and on
gloo the next step's first raw inputs, whose receive the first stage posts ahead, so that a
message the client sends while the server still computes the step before leaves in the
client's own send (on the in-memory fabric; the message-order tests run whole steps this way
under both backends' rules)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
from torch import nn

from lightning_epipe.strategy.comm.memory_backend import MemoryFabric
from lightning_epipe.strategy.comm.streams import pipeline_streams
from lightning_epipe.strategy.comm.transport import PeerError, Transport
from lightning_epipe.strategy.comm.wire import Command, StepFlag
from lightning_epipe.strategy.compression.codec_book import CodecBook, resolve_specs
from lightning_epipe.strategy.engine.runtime import PipelineRuntime
from lightning_epipe.strategy.engine.stats import PipelineStats
from lightning_epipe.strategy.planning.partition import plan_pipeline

CHUNKS = 2


def _pair(rule: str, seconds: float = 5.0) -> tuple[MemoryFabric, list[PipelineRuntime]]:
    """A 2-process chain (client rank 0, the first stage on rank 1) on the in-memory fabric."""
    fabric = MemoryFabric(2, rule=rule)
    plan = plan_pipeline(4, 2, [2, 2], "chain")
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])
    groups = {(s.name, s.src, s.dst): str(s) for s in pipeline_streams("chain", 2)}
    runtimes = []
    for rank in (0, 1):
        timeout = timedelta(seconds=seconds)
        transport = Transport(rank, torch.device("cpu"), timeout, groups=groups, control_group="c",
                              backend=fabric.backend(rank), commands=fabric.commands(rank, timeout))
        specs = [resolve_specs("none", {}, plan.num_cuts, what) for what in ("activation", "gradient")]
        runtimes.append(PipelineRuntime(plan, rank, layers, transport, CodecBook(*specs), PipelineStats()))
    return fabric, runtimes


def test_commands_leave_at_once_and_take_no_message_of_the_process_groups():
    """Under NCCL's rule a message completes only once its receive is posted; commands do not
    wait for the server at all: a step's worth of them is sent while it reads none."""
    fabric, (client, server) = _pair("nccl", seconds=2.0)
    client.command(Command.BATCH_START)
    client.begin_step(CHUNKS)
    client.command(Command.FORWARD, CHUNKS, flags=StepFlag.GRAD_ENABLED)
    client.command(Command.FINISH_STEP)
    client.transport.flush()
    assert client.transport.sends_in_flight == 0 and fabric.log == []
    assert server.next_command().command == Command.BATCH_START
    forward = server.next_command()
    assert forward.command == Command.FORWARD and forward.num_microbatches == CHUNKS
    server.begin_step(forward.num_microbatches)
    assert server.next_command().command == Command.FINISH_STEP


def test_sample_ids_follow_their_forward_on_the_control_group():
    fabric, (client, server) = _pair("nccl", seconds=2.0)
    client.begin_step(CHUNKS)
    client.command(Command.FORWARD, CHUNKS, flags=StepFlag.GRAD_ENABLED | StepFlag.SAMPLE_IDS)
    client.send_sample_ids(torch.arange(6), 100)
    client.command(Command.FINISH_STEP)
    forward = server.next_command()
    # the ids' frame (after its first size notice) on the control group; FORWARD posted their receive
    assert {group for *_, group, _ in fabric.log} == {"c"}
    assert [(rank, op) for rank, op, *_ in fabric.log].count((1, "recv")) == 1
    server.begin_step(forward.num_microbatches)
    ids, num_samples = server.recv_sample_ids()
    assert torch.equal(ids, torch.arange(6)) and num_samples == 100
    assert server.next_command().command == Command.FINISH_STEP
    client.transport.flush()


def test_a_server_waiting_for_a_command_that_never_comes_says_so_within_the_timeout():
    _, (client, server) = _pair("gloo", seconds=0.3)
    with pytest.raises(PeerError, match=r"rank 1: rank 0 sent nothing for .* next command after step 0"):
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
