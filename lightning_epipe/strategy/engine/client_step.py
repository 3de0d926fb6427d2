"""The client's side of a step: the pipelined forward the user's code calls, and the step's end.

On the client (pipeline rank 0) Lightning runs the user's ``training_step`` (or another
step hook) as on one device. Its call of the pipelined Sequential is :meth:`ClientStep.forward`:
it tells every server ``FORWARD``, feeds the micro-batches through this rank's stages and
returns the gathered output of the last stage. When the hook returns, :meth:`ClientStep.end`
tells the servers how the step ends (``FINISH_STEP``, or ``SKIP_STEP`` for a step that
trains nothing); the servers' side is ``server_loop``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_epipe.strategy.config import PipelineConfig
from lightning_epipe.strategy.engine.microbatch import batch_size, gather, scatter
from lightning_epipe.strategy.engine.one_f_one_b import GradientStash, MicrobatchLosses, as_leaf
from lightning_epipe.strategy.engine.runtime import PipelineRuntime
from lightning_epipe.strategy.compression.sample_ids import SampleIdRecorder
from lightning_epipe.strategy.engine.stats import PipelineStats
from lightning_epipe.strategy.comm.wire import Command, StepFlag

__all__ = ["ClientStep"]


class ClientStep:
    """Drives the servers from inside the client's step hooks."""

    def __init__(self, config: PipelineConfig, stats: PipelineStats, sample_ids: SampleIdRecorder, stash: GradientStash) -> None:
        self.config = config
        self.stats = stats
        self.sample_ids = sample_ids  # delta compression: the dataset indices of each batch
        self.stash = stash  # 1F1B: the step's gradients, kept from Lightning's zero_grad
        self.losses = MicrobatchLosses()
        self._batch: Any = None  # the training batch, for pipeline_loss under 1F1B
        self._inside = False

    @contextmanager
    def inside(self, batch: Any) -> Iterator[None]:
        """While a step hook runs on ``batch`` (``None`` outside training): the pipeline may run."""
        self._batch, self._inside = batch, True
        try:
            yield
        finally:
            self._inside = False

    def forward(self, runtime: PipelineRuntime, module: LightningModule, inputs: Any) -> Any:
        """The user's ``self.layers(inputs)``: the whole pipeline, its output gathered ([B, ...])."""
        if not self._inside:
            raise RuntimeError(
                "The pipelined Sequential runs only inside training/validation/test/predict steps under"
                " EPipeStrategy (its layers live in other processes). Remove `example_input_array` summaries"
                " or other calls outside the steps."
            )
        chunks, training, grad = self.config.chunks, module.trainer.training, torch.is_grad_enabled()
        microbatches = scatter(inputs, chunks)
        ids = self.sample_ids.pop(batch_size(inputs)) if self.config.delta is not None and grad and training else None
        runtime.begin_step(len(microbatches), None if ids is None else scatter(ids, chunks), self.sample_ids.num_samples)
        one_f_one_b = self.config.schedule == "1f1b" and grad and training
        flags = ((StepFlag.GRAD_ENABLED if grad else 0) | (StepFlag.SAMPLE_IDS if ids is not None else 0)
                 | (StepFlag.ONE_F_ONE_B if one_f_one_b else 0))
        runtime.command(Command.FORWARD, len(microbatches), flags=flags)
        if ids is not None:
            runtime.send_sample_ids(ids, self.sample_ids.num_samples)
        if one_f_one_b:
            loss_of = self.losses.loss_fn(module, self._batch, microbatches)
            with self.stash.set_aside(module):
                outputs = runtime.run_1f1b(microbatches, loss_of)
        else:
            outputs = runtime.forward(microbatches)
        self.stats.samples += batch_size(inputs)
        self.stats.steps += 1
        output = gather(outputs)
        return as_leaf(output) if one_f_one_b else output

    def end(self, runtime: PipelineRuntime, output: Any, training: bool, automatic: bool) -> bool:
        """Tell the servers how the step ended; True if it trains nothing on any rank (a ``None``
        loss, or a non-finite one under ``nonfinite="skip"``)."""
        if training:
            self.losses.check_returned(output)
        if training and automatic:
            loss = output["loss"] if isinstance(output, Mapping) else output
            if loss is not None and self.config.nonfinite == "skip" and not bool(torch.isfinite(loss).all()):
                rank_zero_warn(f"EPipeStrategy: the loss of step {runtime.step} is not finite; skipping the step on every rank")
                output = None
            if output is None:  # skipped on every rank, as on one device
                runtime.discard()
                runtime.command(Command.SKIP_STEP)
                return True
        else:
            runtime.discard()  # evaluation, or manual optimization whose backward already ran
        runtime.command(Command.FINISH_STEP)
        return False
