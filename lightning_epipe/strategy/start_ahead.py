"""A server starts the client's next training step as soon as its own step has ended.

Lightning's work between two steps on the rank of the first stage (the rest of its optimizer
step, ``on_train_batch_end``, its loop, the per-step signal, ``on_train_batch_start``,
``training_step``'s way in) is on the critical path of a pipeline with few micro-batches: every
stage waits for that rank's next forward. A server needs none of it before its forward, so it
runs that forward (under 1F1B the step's tasks up to its first backward) as soon as its own
step's weights are final, where the client has already begun the next step
(``engine/server_loop.start_next_step``; docs/engine.md, "Servers start the next step ahead"):

- at the end of the strategy's ``optimizer_step`` (:func:`starts_at_optimizer_step`), where the
  LightningModule keeps Lightning's ``optimizer_step`` hook: nothing of the user's runs after the
  optimizer's step there;
- else at the end of the training batch, :class:`StartAhead` being first among a server's
  callbacks (a module's own ``optimizer_step`` may change weights after the step; a batch that
  accumulates gradients has no optimizer step).

Not at an epoch's last batch: the hooks at an epoch's end may change weights (pruning, averaging).
"""

from __future__ import annotations

from typing import Any, Callable

from lightning.pytorch import Callback, LightningModule, Trainer

__all__ = ["StartAhead", "another_batch_follows", "starts_at_optimizer_step"]


class StartAhead(Callback):
    """Calls ``start()`` (the strategy's: start the next step if the client has) at the end of
    every training batch but an epoch's last."""

    def __init__(self, start: Callable[[], None]) -> None:
        self.start = start

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if another_batch_follows(trainer):
            self.start()


def another_batch_follows(trainer: Trainer) -> bool:
    """Whether the training batch ending now is not the last of its epoch."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return not progress.is_last_batch and progress.current.ready < trainer.num_training_batches


def starts_at_optimizer_step(trainer: Trainer) -> bool:
    """Whether a server may start the next step at the end of this training batch's optimizer
    step: another batch follows in the epoch and the LightningModule's ``optimizer_step`` is
    Lightning's (it only steps the optimizer)."""
    module = trainer.lightning_module
    return (trainer.training and type(module).optimizer_step is LightningModule.optimizer_step
            and another_batch_follows(trainer))
