"""A server starts the client's next training step as soon as its own step has ended.

Lightning's work between two steps on the rank of the first stage (``on_train_batch_end``,
its loop, the per-step signal, ``on_train_batch_start``, ``training_step``'s way in) is on the
critical path of a pipeline with few micro-batches: every stage waits for that rank's next
forward. A server needs none of it before its forward, so :class:`StartAhead`, first among a
server's callbacks, runs that forward (under 1F1B the step's tasks up to its first backward)
at the end of each training batch where the client has already begun the next one
(``engine/server_loop.start_next_step``; docs/engine.md, "Servers start the next step
ahead"). Not at an epoch's last batch: the hooks at an epoch's end may change weights
(pruning, averaging).
"""

from __future__ import annotations

from typing import Any, Callable

from lightning.pytorch import Callback, Trainer

__all__ = ["StartAhead", "another_batch_follows"]


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
