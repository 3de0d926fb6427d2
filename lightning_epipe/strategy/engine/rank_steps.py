"""One rank's step hooks: what ``EPipeStrategy``'s step, backward and optimizer hooks do.

Lightning calls the same hooks on every rank; what they do depends on the rank's role:

- the client (pipeline rank 0) runs the user's hook inside :meth:`ClientStep.inside`, so its
  ``self.layers(x)`` runs the pipeline, then tells the servers how the step ended;
- a server follows the client's commands (:func:`serve_step`) and hands Lightning what it
  expects back: a placeholder loss whose backward runs the pipeline's, or ``None``.

A step that trains nothing (a ``None`` loss, or NaN/Inf under ``nonfinite="skip"``) returns a
zero loss and :meth:`RankSteps.backward` drops every gradient, as one device would train nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, ContextManager, Optional

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor

from lightning_epipe.strategy.comm.wire import ClipAlgorithm, Command
from lightning_epipe.strategy.engine.after_backward import finish_backward
from lightning_epipe.strategy.engine.client_step import ClientStep
from lightning_epipe.strategy.engine.runtime import PipelineRuntime
from lightning_epipe.strategy.engine.server_loop import (ServerHooks, StepEnd, clip_optimizer, serve_step, start_next_step,
                                                         step_optimizer)

__all__ = ["RankSteps"]

log = logging.getLogger(__name__)


@dataclass
class RankSteps:
    """This rank's step hooks, bound at setup to its runtime and the LightningModule."""

    runtime: PipelineRuntime
    module: LightningModule
    client: ClientStep
    device: torch.device
    stage_group: Optional[Any]  # replicas > 1: the ranks holding this rank's stages
    replicas: int
    skip_backward: bool = field(default=False, init=False)
    steps_started_ahead: int = field(default=0, init=False)  # server: steps whose forward ran before Lightning's step

    @property
    def is_client(self) -> bool:
        return self.runtime.rank == 0

    @property
    def _drives_manual_steps(self) -> bool:
        """The client under manual optimization: the user's optimizer calls reach the servers as commands."""
        return self.is_client and not self.module.automatic_optimization

    def pipelined_forward(self, inputs: Any) -> Any:
        """The client's ``self.layers(x)``: run the whole pipeline, return the gathered output."""
        return self.client.forward(self.runtime, self.module, inputs)

    def run(self, hook: str, context: ContextManager[Any], *args: Any, **kwargs: Any) -> Any:
        """Lightning's ``hook`` ("training_step", ...): the user's code on the client, the commands on a server."""
        training, automatic = hook == "training_step", self.module.automatic_optimization
        if not self.is_client:
            with context:
                return self._serve(training, automatic)
        batch = (args[0] if args else kwargs.get("batch")) if training else None
        with self.client.inside(batch), context:
            output = getattr(self.module, hook)(*args, **kwargs)
        return self._skipped_step_loss() if self.client.end(self.runtime, output, training, automatic) else output

    def _server_hooks(self) -> ServerHooks:
        return ServerHooks(after_backward=self.after_backward, optimizer_step=partial(step_optimizer, self.module),
                           set_gradients_aside=lambda: self.client.stash.set_aside(self.module),
                           clip_gradients=partial(clip_optimizer, self.module))

    def _serve(self, training: bool, automatic: bool) -> Optional[Tensor]:
        """A server's step hook: what Lightning expects back once the client ended the step."""
        end = serve_step(self.runtime, self._server_hooks(), training)
        if end is StepEnd.STOPPED:  # as the client did: Lightning's way out on SIGTERM
            raise SIGTERMException()
        if end is StepEnd.SKIPPED:
            return self._skipped_step_loss() if training and automatic else None
        if end is StepEnd.FINISHED and automatic:
            return torch.zeros((), device=self.device, requires_grad=True)  # Lightning's backward runs ours
        self.runtime.discard()
        return None

    def _skipped_step_loss(self) -> Tensor:
        """Lightning refuses ``None`` from a distributed training_step: a zero loss whose
        :meth:`backward` drops every gradient, so the optimizer updates nothing."""
        self.skip_backward = True
        return torch.zeros((), device=self.device, requires_grad=True)

    def start_next_step(self, context: ContextManager[Any]) -> None:
        """At the end of a training batch that another follows in its epoch (``start_ahead.py``): a
        server (automatic optimization) starts the client's next step at once if the client has
        begun it (``server_loop.start_next_step``; under 1F1B up to its first backward, the rest
        in the next ``training_step``), under the training step's ``context``."""
        if self.is_client or not self.module.automatic_optimization:
            return
        with context:
            if start_next_step(self.runtime, self._server_hooks()):
                self.steps_started_ahead += 1

    def backward(self, loss: Tensor, backward_on_client: Callable[[Tensor], Tensor]) -> Tensor:
        """Lightning's backward of ``loss``: on the client ``backward_on_client(loss)`` (Lightning's
        own, through the precision plugin) backpropagates the last stage, whose gradients leave
        micro-batch by micro-batch; then every rank drains the pipeline's backward."""
        runtime = self.runtime
        if self.skip_backward:
            self.skip_backward = False
            for p in self.module.parameters():
                p.grad = None
            return loss
        if self.is_client:
            if not self.module.automatic_optimization:
                if not runtime.has_pending_backward:
                    raise RuntimeError("manual_backward() needs a pipelined forward in the same training_step")
                runtime.command(Command.BACKWARD)
            runtime.prepost_gradients()
            with runtime.timer.measure(runtime.last_stage):
                loss = backward_on_client(loss)
        runtime.backward()
        self.client.stash.restore()  # 1F1B: the step's gradients, kept from Lightning's zero_grad
        self.after_backward()
        return loss

    def after_backward(self) -> None:
        """Agree on NaN/Inf across ranks, average gradients over replicas."""
        runtime = self.runtime
        finish_backward(self.module, runtime.nonfinite, runtime.nonfinite_seen, runtime.step, self.device,
                        self.stage_group, self.replicas)

    def retune(self, tuner: Any, step: int, offset: int) -> None:
        """``compressor="auto"`` at the start of training step ``step``: every rank measures and
        decides together (a collective); ``offset``: the global rank of this pipeline's client."""
        runtime = self.runtime
        made = tuner.maybe_retune(step, runtime.plan, runtime.rank, runtime.codecs, runtime.samples, self.device, offset,
                                  runtime.transport.rates, (runtime.stats.busy_seconds, runtime.microbatches_run),
                                  runtime.transport.arrivals)
        for choice in made:  # a new codec's frames start afresh on both ends of its link
            src, dst = runtime.plan.cut_ranks(choice.cut, choice.direction)
            if runtime.rank in (src, dst):
                runtime.transport.restart_frames(choice.direction, src, dst)

    def before_optimizer_step(self, optimizer: Any, optimizers: list[Any]) -> None:
        """Manual optimization on the client: every server steps ``optimizer`` (one of ``optimizers``,
        perhaps inside Lightning's wrapper) too."""
        if self._drives_manual_steps:
            self.runtime.command(Command.OPTIMIZER_STEP, arg=_index(optimizer, optimizers))

    def before_clip(self, optimizer: Any, optimizers: list[Any], algorithm: ClipAlgorithm, value: float) -> None:
        """Manual optimization on the client: every server clips ``optimizer``'s gradients too (by
        norm, the norm over every stage: all ranks take part)."""
        if self._drives_manual_steps:
            self.runtime.clip_command(_index(optimizer, optimizers), algorithm, value)

    def stop_servers(self) -> None:
        """SIGTERM outside fit stopped the client between two batches, where every server waits
        for its next command (in fit, rank 0's SIGTERM broadcast stops every rank): tell them."""
        try:
            self.runtime.command(Command.STOP)
            self.runtime.transport.flush()
        except Exception as error:  # a server already gone: it ends on its own
            log.info("EPipeStrategy: could not tell the servers to stop (%s)", error)


def _index(optimizer: Any, optimizers: list[Any]) -> int:
    """The index of ``optimizer`` (perhaps inside Lightning's wrapper) in the strategy's ``optimizers``."""
    return optimizers.index(getattr(optimizer, "_optimizer", optimizer))
