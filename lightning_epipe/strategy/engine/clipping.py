"""Gradient clipping by norm over every stage's gradients.

Lightning clips in the precision plugin (``Precision.clip_grad_by_norm``), on each rank's own
parameters: under a pipeline each rank would clip by the norm of its stages alone.
Lightning offers no strategy hook for the norm, so :func:`clip_across_stages` replaces the
plugin instance's method: one all-reduce of the squared norm per clipped step.
"""

from __future__ import annotations

from typing import Callable, Union

import torch
import torch.distributed as dist
from lightning.pytorch.plugins.precision import Precision
from torch.optim import Optimizer

__all__ = ["clip_across_stages"]


def clip_across_stages(plugin: Precision, device: torch.device, replicas: int, automatic: Callable[[], bool]) -> None:
    """Make ``plugin`` clip by the norm over all ranks (each of ``replicas`` pipelines holds the
    same averaged gradients, so their sum counts once); ``automatic()``: whether the module
    uses automatic optimization (manual optimization cannot clip across stages)."""
    if getattr(plugin, "_epipe_clip", False):
        return

    def clip_grad_by_norm(optimizer: Optimizer, clip_val: Union[int, float]) -> None:
        if not automatic():
            raise RuntimeError(
                "gradient clipping by norm under manual optimization is not supported by EPipeStrategy:"
                " the other stages do not take part in the norm. Use automatic optimization for clipping."
            )
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        local = torch.zeros(1, dtype=torch.float64, device=device)
        for p in params:
            local += p.grad.detach().double().pow(2).sum()
        local /= replicas
        dist.all_reduce(local)
        coef = float(clip_val) / (float(local.sqrt()) + 1e-6)
        if coef < 1:
            for p in params:
                p.grad.detach().mul_(coef)

    plugin.clip_grad_by_norm = clip_grad_by_norm  # type: ignore[method-assign]
    plugin._epipe_clip = True  # type: ignore[attr-defined]
