"""Gradient clipping over every stage's gradients, under automatic and manual optimization.

Lightning clips in the precision plugin (``Precision.clip_gradients``), on each rank's own
parameters: under a pipeline each rank would clip by the norm of its stages alone, and under
manual optimization, where only the client runs the user's ``self.clip_gradients(...)``, the
servers would not clip at all. Lightning offers no strategy hook for either, so
:func:`clip_across_stages` replaces the plugin instance's methods:

- by norm: one all-reduce of the squared norm per clipped step, on every rank;
- before any clip (by norm or by value), ``announce``: under manual optimization the client
  tells every server to clip the same optimizer the same way (``Command.CLIP_GRADIENTS``), so
  the servers join the all-reduce, or clip their values, at the same point of the step.
  Under automatic optimization Lightning's loop clips on every rank by itself.
"""

from __future__ import annotations

from typing import Callable, Union

import torch
import torch.distributed as dist
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from torch.optim import Optimizer

from lightning_epipe.strategy.comm.wire import ClipAlgorithm

__all__ = ["clip_across_stages"]

Announce = Callable[[Optimizer, ClipAlgorithm, float], None]


def clip_across_stages(plugin: Precision, device: torch.device, replicas: int, announce: Announce) -> None:
    """Make ``plugin`` clip by the norm over all ranks (each of ``replicas`` pipelines holds the
    same averaged gradients, so their sum counts once), calling ``announce(optimizer, algorithm,
    value)`` before every clip that does something (``value > 0``)."""
    if getattr(plugin, "_epipe_clip", False):
        return
    clip_gradients = plugin.clip_gradients

    def clip_gradients_on_every_stage(optimizer: Optimizer, clip_val: Union[int, float] = 0.0,
                                      gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM) -> None:
        if clip_val > 0:
            by_value = gradient_clip_algorithm == GradClipAlgorithmType.VALUE
            announce(optimizer, ClipAlgorithm.VALUE if by_value else ClipAlgorithm.NORM, float(clip_val))
        clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

    def clip_grad_by_norm(optimizer: Optimizer, clip_val: Union[int, float]) -> None:
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

    plugin.clip_gradients = clip_gradients_on_every_stage  # type: ignore[method-assign]
    plugin.clip_grad_by_norm = clip_grad_by_norm  # type: ignore[method-assign]
    plugin._epipe_clip = True  # type: ignore[attr-defined]
