"""A server follows manual optimization's CLIP_GRADIENTS: the client's optimizer, algorithm and value."""

from __future__ import annotations

import contextlib

import pytest

from lightning_epipe.strategy.comm.wire import ClipAlgorithm, Command, Header
from lightning_epipe.strategy.engine.runtime import ControlMessage
from lightning_epipe.strategy.engine.server_loop import ServerHooks, StepEnd, serve_step


class _Commands:
    """The client's commands as a server's runtime reads them."""

    def __init__(self, headers: list[Header]) -> None:
        self.headers = headers
        self.discarded = 0
        self.started_ahead = False
        self.paused_1f1b = False  # no 1F1B step started ahead

    def next_command(self) -> ControlMessage:
        h = self.headers.pop(0)
        clip = h.clip_args("link") if h.arg == Command.CLIP_GRADIENTS else None
        return ControlMessage(Command(h.arg), h.step, h.num_microbatches, h.microbatch, h.flags, clip)

    def discard(self) -> None:
        self.discarded += 1


@pytest.mark.parametrize("algorithm", list(ClipAlgorithm))
def test_server_clips_what_the_client_clips(algorithm):
    clips, steps = [], []
    hooks = ServerHooks(after_backward=lambda: None, optimizer_step=steps.append,
                        set_gradients_aside=contextlib.nullcontext,
                        clip_gradients=lambda index, how, value: clips.append((index, how, value)))
    runtime = _Commands([Header.clip(0, 1, algorithm, 0.25), Header.command(Command.OPTIMIZER_STEP, 0, optimizer=1),
                         Header.command(Command.FINISH_STEP, 0)])
    assert serve_step(runtime, hooks, training=True) is StepEnd.EVALUATED
    assert clips == [(1, algorithm, 0.25)] and steps == [1] and runtime.discarded == 1
