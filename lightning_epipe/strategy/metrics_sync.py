"""Give every rank the client's callback metrics, so monitoring callbacks agree.

Only the client (rank 0) runs the user's steps, so only it has the logged values that
``ModelCheckpoint(monitor=...)`` and ``EarlyStopping`` read. This callback, placed first,
broadcasts them (as JSON, never pickle) right before those callbacks run on every rank.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from lightning_epipe.strategy.comm.collectives import broadcast_json

__all__ = ["CallbackMetricsSync", "keep_metrics_local"]


def _not_distributed() -> bool:
    return False


def keep_metrics_local(module: torch.nn.Module) -> None:
    """torchmetrics would all-gather states over every rank; only the client updates them."""
    from torchmetrics import Metric

    for m in module.modules():
        if isinstance(m, Metric):
            m.distributed_available_fn = _not_distributed


class CallbackMetricsSync(Callback):
    """Copies rank 0's ``trainer.callback_metrics`` to every rank before monitors read them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @staticmethod
    def _needed(trainer: Trainer, per_step: bool) -> bool:
        for cb in trainer.callbacks:
            if isinstance(cb, EarlyStopping) and not per_step:
                return True
            if isinstance(cb, ModelCheckpoint) and cb.monitor is not None:
                if not per_step or getattr(cb, "_every_n_train_steps", 0) or getattr(cb, "_train_time_interval", None):
                    return True
        return False

    def _sync(self, trainer: Trainer) -> None:
        metrics = trainer.callback_metrics
        values = {k: float(v) for k, v in metrics.items() if isinstance(v, torch.Tensor) and v.numel() == 1}
        values = broadcast_json(values if trainer.is_global_zero else None, self.device)
        if not trainer.is_global_zero:
            trainer._logger_connector._callback_metrics.update({k: torch.tensor(v) for k, v in values.items()})

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if self._needed(trainer, per_step=True):
            self._sync(trainer)

    def on_train_epoch_end(self, trainer: Trainer, *args: Any) -> None:
        if self._needed(trainer, per_step=False):
            self._sync(trainer)

    def on_validation_end(self, trainer: Trainer, *args: Any) -> None:
        if self._needed(trainer, per_step=False) and not trainer.sanity_checking:
            self._sync(trainer)
