"""``precision="16-mixed"``: one GradScaler decision for the whole pipeline.

Lightning scales the loss on the client (``MixedPrecision.pre_backward``), so every gradient
that crosses a cut, and every rank's parameter gradients, carry the client's loss scale. Each
rank's precision plugin then unscales its own gradients and skips its optimizer step if it
found Inf/NaN there (``GradScaler.unscale_``, ``step``, ``update``). Left to itself, a rank
whose gradients overflowed would skip while the others stepped, and the ranks' scales would
drift apart, each unscaling by a scale the client did not use.

:func:`agree_on_overflow` replaces the scaler instance's ``unscale_`` (as ``clipping`` does
the plugin's methods): once this rank's gradients are unscaled, one all-reduce (MAX) over every
rank of three numbers per optimizer step, whether Inf/NaN was found and the scale (and its
negation), gives every rank the same verdict, written back where ``step`` and ``update`` read
it: every rank steps or skips, and grows or backs off its scale, together. Scales that differ
(a scaler restored on some ranks only) raise instead of training on wrong gradients. NaN/Inf
crossing a cut are then the scaler's to handle, not errors: the runtime sends them raw
(``nonfinite="allow"``). A server scales no loss: its scaler's scale starts at its first
unscale, from the same ``init_scale`` as the client's.

Reads GradScaler's ``_scale`` and ``_per_optimizer_states`` (``torch.amp.grad_scaler``), the
state its ``unscale_``, ``step`` and ``update`` share.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer

__all__ = ["agree_on_overflow", "scaler_of", "check_unscaling"]


def scaler_of(plugin: Any) -> Any:
    """The enabled GradScaler of a precision ``plugin``, or None."""
    scaler = getattr(plugin, "scaler", None)
    return scaler if scaler is not None and scaler.is_enabled() else None


def check_unscaling(optimizers: list[Optimizer]) -> None:
    """Refuse optimizers that unscale inside their own ``step`` (fused ones): each rank would
    decide alone whether to skip."""
    for optimizer in optimizers:
        if getattr(optimizer, "_step_supports_amp_scaling", False):
            raise ValueError(
                f"{type(optimizer).__name__} unscales its gradients inside its step (a fused optimizer), where"
                " the pipeline's ranks cannot agree on skipping a step that overflowed: pass fused=False"
                " with precision='16-mixed' under EPipeStrategy")


def agree_on_overflow(plugin: Any, device: torch.device) -> None:
    """Make the GradScaler of ``plugin`` (if any) skip or step, and scale, as every rank does."""
    scaler = scaler_of(plugin)
    if scaler is None or getattr(scaler, "_epipe_agreed", False):
        return
    unscale = scaler.unscale_

    def unscale_on_every_rank(optimizer: Optimizer) -> None:
        if scaler._scale is None:  # a server: no loss scaled here yet
            scaler.scale(torch.zeros((), device=device))
        unscale(optimizer)
        found = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        if not found:  # no gradient on this rank: it still takes part, and step() needs a verdict
            found[torch.device(device)] = torch.zeros(1, dtype=torch.float32, device=device)
        overflow = torch.stack([f.to(device).reshape(()) for f in found.values()]).max().double()
        scale = scaler._scale.to(device).reshape(()).double()
        verdict = torch.stack([overflow, scale, -scale])
        dist.all_reduce(verdict, op=dist.ReduceOp.MAX)
        any_overflow, high, low = verdict.tolist()
        if high != -low:
            raise RuntimeError(
                f"EPipeStrategy: the GradScaler's scale differs across ranks ({-low} to {high}): every rank must"
                " start from the same init_scale and restore the same checkpoint")
        for f in found.values():
            f.fill_(any_overflow)

    scaler.unscale_ = unscale_on_every_rank  # type: ignore[method-assign]
    scaler._epipe_agreed = True  # type: ignore[attr-defined]
