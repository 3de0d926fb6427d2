"""Where a server runs the next training step's forward early: the first ``on_train_batch_end``.

``server_loop.forward_ahead`` runs a server's next forward as soon as the client has begun the
next step. Lightning offers a strategy no hook between a batch's optimizer step and the next
batch's ``training_step``; the earliest point after the step counters and LR schedulers have
moved (so the forward sees the ``global_step`` it would see in ``training_step``) is the first
callback's ``on_train_batch_end``. :class:`ForwardAhead` is put there while fitting and taken
out at teardown; on the client it does nothing.
"""

from __future__ import annotations

from typing import Any, Callable

from lightning.pytorch import Callback

__all__ = ["ForwardAhead"]


class ForwardAhead(Callback):
    """The first of the Trainer's callbacks: ``after_batch()`` as each training batch ends."""

    def __init__(self, after_batch: Callable[[], None]) -> None:
        self.after_batch = after_batch

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.after_batch()

    def install(self, trainer: Any) -> None:
        trainer.callbacks.insert(0, self)

    def uninstall(self, trainer: Any) -> None:
        trainer.callbacks[:] = [callback for callback in trainer.callbacks if callback is not self]
