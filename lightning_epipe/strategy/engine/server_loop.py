"""A server's step: follow the client's commands until the client ends the step.

Servers (pipeline ranks > 0) never run user code. Lightning calls their ``training_step``
(and the other step hooks) once per batch as on the client; inside it, :func:`serve_step`
reads the client's commands (``comm/command_channel``) and drives this rank's
:class:`~lightning_epipe.strategy.engine.runtime.PipelineRuntime`:

=================  ===========================================================
``FORWARD``        start the step: its micro-batch count and :class:`StepFlag`
                   bits (grad enabled, sample ids follow, the step runs as 1F1B)
``BACKWARD``       manual optimization's ``manual_backward``: run the backward
``OPTIMIZER_STEP`` manual optimization: step optimizer ``arg``
``CLIP_GRADIENTS`` manual optimization's ``clip_gradients``: clip optimizer ``arg``'s
                   gradients (by norm over every stage, or by value) as the client does
``FINISH_STEP``    the client's step returned: return (automatic optimization's
                   backward comes next, from Lightning)
``SKIP_STEP``      the step is skipped on every rank (NaN/Inf, or ``None`` loss)
``STOP``           the client stopped between two steps (SIGTERM in ``validate``,
                   ``test`` or ``predict``): stop too, before this step
=================  ===========================================================

Before every training batch, where Lightning would broadcast rank 0's SIGTERM flag, the
server reads ``BATCH_START`` (go on) or ``STOP`` (``sigterm_broadcast.StepStartSignal``).
Where the client is already a step ahead, a server reads both (and the step's ``FORWARD``)
at the end of its previous batch instead and runs the step's forward there, under 1F1B its
tasks up to its first backward (:func:`start_next_step`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import torch
from lightning.pytorch.utilities import GradClipAlgorithmType

from lightning_epipe.strategy.engine.microbatch import scatter
from lightning_epipe.strategy.engine.runtime import ControlMessage, PipelineRuntime
from lightning_epipe.strategy.comm.wire import ClipAlgorithm, Command, StepFlag

__all__ = ["StepEnd", "ServerHooks", "serve_step", "start_next_step", "step_optimizer", "clip_optimizer"]


class StepEnd(enum.Enum):
    """How the client ended a step."""

    FINISHED = "finished"  # after a forward: the step's backward follows
    EVALUATED = "evaluated"  # nothing to backpropagate (no forward, or evaluation)
    SKIPPED = "skipped"
    STOPPED = "stopped"  # the client stopped before this step (Command.STOP)


@dataclass(frozen=True)
class ServerHooks:
    """What a server's step needs from the strategy around it."""

    after_backward: Callable[[], None]  # agree on NaN/Inf, average over replicas
    optimizer_step: Callable[[int], None]  # step optimizer ``index`` (manual optimization)
    set_gradients_aside: Callable[[], ContextManager[Any]]  # 1F1B: keep the step's gradients from zero_grad
    clip_gradients: Callable[[int, ClipAlgorithm, float], None]  # clip optimizer ``index``'s gradients (manual)


def serve_step(runtime: PipelineRuntime, hooks: ServerHooks, training: bool) -> StepEnd:
    """Follow the client's commands for one step; returns how the client ended it. A 1F1B step
    started ahead runs its backward tasks first: the client's ``FINISH_STEP`` waits for them."""
    forwarded, runtime.started_ahead = runtime.started_ahead, False
    if runtime.paused_1f1b:
        with torch.enable_grad(), hooks.set_gradients_aside():
            runtime.resume_1f1b()
    while True:
        msg = runtime.next_command()
        if msg.command == Command.FORWARD:
            _forward(runtime, msg, hooks)
            forwarded = True
        elif msg.command == Command.BACKWARD:
            runtime.backward()
            hooks.after_backward()
        elif msg.command == Command.OPTIMIZER_STEP:
            hooks.optimizer_step(msg.arg)
        elif msg.command == Command.CLIP_GRADIENTS:
            hooks.clip_gradients(msg.arg, *msg.clip)
        elif msg.command == Command.SKIP_STEP:
            runtime.discard()
            return StepEnd.SKIPPED
        elif msg.command == Command.STOP:
            return StepEnd.STOPPED
        elif msg.command == Command.FINISH_STEP:
            if training and forwarded:
                return StepEnd.FINISHED
            runtime.discard()
            return StepEnd.EVALUATED
        else:
            raise RuntimeError(f"pipeline rank {runtime.rank}: unexpected command {msg.command.name}")


def start_next_step(runtime: PipelineRuntime, hooks: ServerHooks) -> bool:
    """Between two training steps, once this rank's batch has ended: if the client has
    already started the next step (its ``BATCH_START`` and a training ``FORWARD`` have both
    arrived), read them and run this rank's forward now (under 1F1B its tasks up to its first
    backward, whose gradient the client sends later), ahead of Lightning's work between the
    steps (its hooks, the loop, the next ``training_step``), which then finds the forward done
    (``runtime.started_ahead``) and runs in the wait for the first gradient. On the first
    stage's rank that work is on the critical path of every step: the whole pipeline waits for
    its forward. True if the step started."""
    arrived = runtime.commands_arrived(2)
    if [command for command, _ in arrived] != [Command.BATCH_START, Command.FORWARD]:
        return False
    if not arrived[1][1] & StepFlag.GRAD_ENABLED:
        return False
    runtime.next_command()  # BATCH_START: the client did not stop
    _forward(runtime, runtime.next_command(), hooks, ahead=True)
    runtime.started_ahead = True
    return True


def _forward(runtime: PipelineRuntime, msg: ControlMessage, hooks: ServerHooks, ahead: bool = False) -> None:
    """``FORWARD``: begin the step and run this rank's forward (or the whole step under 1F1B;
    ``ahead``: its tasks up to the first backward, no gradient computed yet)."""
    runtime.begin_step(msg.num_microbatches)
    if msg.flags & StepFlag.SAMPLE_IDS:
        ids, num_samples = runtime.recv_sample_ids()
        runtime.sample_ids, runtime.num_samples = scatter(ids, msg.num_microbatches), num_samples
    with torch.set_grad_enabled(bool(msg.flags & StepFlag.GRAD_ENABLED)):
        if msg.flags & StepFlag.ONE_F_ONE_B and ahead:
            runtime.run_1f1b(until_backward=True)
        elif msg.flags & StepFlag.ONE_F_ONE_B:
            with hooks.set_gradients_aside():
                runtime.run_1f1b()
        else:
            runtime.forward()


def step_optimizer(module: Any, index: int) -> None:
    """Manual optimization's ``OPTIMIZER_STEP`` on a server: step and zero optimizer ``index`` of the
    LightningModule ``module``, through its ``LightningOptimizer`` so this rank's global_step advances too."""
    optimizer = _optimizer(module, index, lightning_wrapper=True)
    optimizer.step()
    optimizer.zero_grad()


def clip_optimizer(module: Any, index: int, algorithm: ClipAlgorithm, value: float) -> None:
    """Manual optimization's ``CLIP_GRADIENTS`` on a server: clip optimizer ``index``'s gradients
    through the precision plugin, as ``LightningModule.clip_gradients`` does on the client."""
    module.trainer.precision_plugin.clip_gradients(_optimizer(module, index), value,
                                                   GradClipAlgorithmType(algorithm.name.lower()))


def _optimizer(module: Any, index: int, lightning_wrapper: bool = False) -> Any:
    """The LightningModule's optimizer ``index`` (in Lightning's ``LightningOptimizer`` wrapper, or bare)."""
    optimizers = module.optimizers(use_pl_optimizer=lightning_wrapper)
    return optimizers[index] if isinstance(optimizers, list) else optimizers
