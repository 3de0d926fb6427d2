"""1F1B's losses on the client: a loss per micro-batch, taken where its forward ends.

Under ``schedule="1f1b"`` the last stage backpropagates micro-batch ``i`` as soon as its
forward ends, inside the user's ``training_step`` and so before Lightning's ``zero_grad``.
The strategy needs four things for that, all here:

- the module's ``pipeline_loss(output, batch)`` (checked before any process starts);
- ``loss_of(i, y_i)``: micro-batch ``i``'s loss weighted by its share of the batch and by
  Lightning's gradient accumulation (:class:`MicrobatchLosses`);
- the step's gradients kept away from ``zero_grad`` until ``strategy.backward``
  (:class:`GradientStash`);
- the gathered output as a leaf (:func:`as_leaf`), so the loss ``training_step`` returns can be
  backpropagated by Lightning into nothing: the pipeline's gradients already exist.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Optional

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn

from lightning_epipe.strategy.engine.grad_scaling import scaler_of
from lightning_epipe.strategy.engine.microbatch import batch_size, scatter

__all__ = ["check_1f1b", "as_leaf", "MicrobatchLosses", "GradientStash"]


def check_1f1b(model: LightningModule) -> None:
    """Raise unless ``model`` can train under 1F1B (a per-micro-batch loss, automatic optimization)."""
    if not callable(getattr(model, "pipeline_loss", None)):
        raise ValueError(
            f"EPipeStrategy(schedule='1f1b') backpropagates every micro-batch as soon as its forward ends, so it needs"
            f" the loss per micro-batch: define `def pipeline_loss(self, output, batch)` on {type(model).__name__},"
            " returning the mean loss of one micro-batch (`output` and `batch` are its slices), e.g."
            " `return F.cross_entropy(output, batch[1])`; or use schedule='gpipe'"
        )
    if not model.automatic_optimization:
        raise ValueError("EPipeStrategy(schedule='1f1b') runs with automatic optimization; use schedule='gpipe' for manual")


def as_leaf(output: Any) -> Any:
    """The gathered output (a Tensor, or a tuple/list/dict of them) as leaves that require grad."""
    if isinstance(output, Tensor):
        return output.detach().requires_grad_(output.is_floating_point())
    if isinstance(output, dict):
        return {k: as_leaf(v) for k, v in output.items()}
    return type(output)(as_leaf(v) for v in output)


class MicrobatchLosses:
    """The step's per-micro-batch losses and their sum (to check the loss the step returns)."""

    def __init__(self) -> None:
        self.total: Optional[Tensor] = None

    def loss_fn(self, module: LightningModule, batch: Any, microbatches: list[Any]) -> Callable[[int, Any], Tensor]:
        """``loss_of(i, output_i)``: ``module.pipeline_loss`` on micro-batch ``i``'s slice of ``batch``
        (split like the pipeline's input), weighted by its rows' share and by gradient accumulation,
        and scaled by the GradScaler under ``precision="16-mixed"`` (Lightning scales the loss it
        backpropagates; these the pipeline backpropagates itself)."""
        parts = scatter(batch, len(microbatches)) if batch is not None else []
        rows = [batch_size(mb) for mb in microbatches]
        if [batch_size(p) for p in parts] != rows:
            raise ValueError(
                "schedule='1f1b' splits the training batch like the pipeline's input to call pipeline_loss per"
                f" micro-batch, but the batch's rows {[batch_size(p) for p in parts]} do not match the input's {rows}:"
                " the pipelined Sequential's input must have one row per row of the batch"
            )
        scale = 1.0 / module.trainer.accumulate_grad_batches
        scaler = scaler_of(module.trainer.precision_plugin)
        self.total = None

        def loss_of(i: int, output: Any) -> Tensor:
            loss = module.pipeline_loss(output, parts[i]) * (rows[i] / sum(rows))
            self.total = loss.detach() if self.total is None else self.total + loss.detach()
            return loss * scale if scaler is None else scaler.scale(loss * scale)

        return loss_of

    def check_returned(self, output: Any) -> None:
        """Warn (once per step) if the loss ``training_step`` returned is not the micro-batches' sum."""
        loss = output["loss"] if isinstance(output, Mapping) else output
        expected, self.total = self.total, None
        if expected is None:
            return
        if isinstance(loss, Tensor) and not torch.allclose(loss.detach().float(), expected.float(), rtol=1e-4, atol=1e-6):
            rank_zero_warn(
                f"EPipeStrategy(schedule='1f1b'): training_step returned loss {float(loss):.6g} but the micro-batches'"
                f" pipeline_loss adds up to {float(expected):.6g}; the gradients come from pipeline_loss"
            )


class GradientStash:
    """1F1B computes a step's gradients before Lightning's ``zero_grad``: :meth:`set_aside` keeps
    them away and leaves ``.grad`` as it was (the previous step's, which ``zero_grad`` clears,
    or an accumulation's); :meth:`restore` adds them back in ``strategy.backward``."""

    def __init__(self) -> None:
        self._stash: list[tuple[Tensor, Tensor]] = []

    @contextmanager
    def set_aside(self, module: nn.Module) -> Iterator[None]:
        params = list(module.parameters())
        before = [p.grad for p in params]
        for p in params:
            p.grad = None
        try:
            yield
        finally:
            self._stash = [(p, p.grad) for p in params if p.grad is not None]
            for p, g in zip(params, before):
                p.grad = g

    def restore(self) -> None:
        for p, g in self._stash:
            p.grad = g if p.grad is None else p.grad + g
        self._stash = []
