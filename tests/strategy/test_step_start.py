"""The start of a training batch: what the client sends and what a server does with it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_epipe.strategy.comm.wire import Command, WireError
from lightning_epipe.strategy.engine.runtime import ControlMessage
from lightning_epipe.strategy.sigterm_broadcast import StepStartSignal


class _Runtime:
    """The runtime's control calls, recorded: ``incoming`` is what a server reads next."""

    def __init__(self, rank: int, incoming: Command = Command.BATCH_START) -> None:
        self.rank, self.incoming, self.sent, self.flushed = rank, incoming, [], 0
        self.started_ahead = False  # server_loop.start_next_step read BATCH_START with the step's FORWARD
        self.transport = SimpleNamespace(flush=self._flush)

    def _flush(self) -> None:
        self.flushed += 1

    def command(self, command: Command, *args, **kwargs) -> None:
        self.sent.append(command)

    def next_command(self) -> ControlMessage:
        return ControlMessage(self.incoming, step=3)


def test_the_client_starts_every_batch_with_batch_start_and_stops_with_stop():
    runtime = _Runtime(rank=0)
    signal = StepStartSignal(trainer=None, runtime=runtime)
    signal()
    signal()
    assert runtime.sent == [Command.BATCH_START, Command.BATCH_START] and runtime.flushed == 0
    signal.record()
    with pytest.raises(SIGTERMException):
        signal()
    assert runtime.sent[-1] == Command.STOP and runtime.flushed == 1  # STOP has left before the client exits


def test_a_server_goes_on_at_batch_start_and_stops_at_stop():
    StepStartSignal(trainer=None, runtime=_Runtime(rank=1, incoming=Command.BATCH_START))()
    with pytest.raises(SIGTERMException):
        StepStartSignal(trainer=None, runtime=_Runtime(rank=1, incoming=Command.STOP))()


def test_a_server_that_reads_another_command_where_a_batch_starts_names_it():
    with pytest.raises(WireError, match="FORWARD where a training batch starts"):
        StepStartSignal(trainer=None, runtime=_Runtime(rank=2, incoming=Command.FORWARD))()


def test_a_server_that_started_the_step_ahead_reads_nothing_where_it_starts():
    """BATCH_START was read with the step's FORWARD (server_loop.start_next_step): what comes
    next is the step's own commands, not for the batch start to read."""
    runtime = _Runtime(rank=1, incoming=Command.FINISH_STEP)
    runtime.started_ahead = True
    StepStartSignal(trainer=None, runtime=runtime)()
    runtime.started_ahead = False
    with pytest.raises(WireError, match="FINISH_STEP where a training batch starts"):
        StepStartSignal(trainer=None, runtime=runtime)()
