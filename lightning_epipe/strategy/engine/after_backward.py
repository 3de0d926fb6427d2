"""What every rank does once its backward has drained: agree on NaN/Inf, average over replicas.

Under ``nonfinite="skip"`` a rank that sent or received NaN/Inf this step makes every rank drop
its gradients (one all-reduce of a flag), so the step trains nothing anywhere, as on one
device. Otherwise, with ``replicas > 1``, the gradients of this rank's stages are averaged
over its stage group (:func:`~lightning_epipe.strategy.engine.replicas.average_gradients`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import nn

from lightning_epipe.strategy.engine.replicas import average_gradients

__all__ = ["finish_backward"]


def finish_backward(module: nn.Module, nonfinite: str, nonfinite_seen: bool, step: int, device: torch.device,
                    stage_group: Optional[Any], replicas: int) -> bool:
    """Drop every gradient if any rank saw NaN/Inf under ``nonfinite="skip"`` (True, a
    collective), else average this rank's over ``stage_group`` (if any; False)."""
    if nonfinite == "skip":
        flag = torch.tensor([float(nonfinite_seen)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            for p in module.parameters():
                p.grad = None
            rank_zero_warn(f"EPipeStrategy: NaN/Inf crossed a cut at step {step}; the step was skipped")
            return True
    if stage_group is not None:
        average_gradients([p for p in module.parameters() if not p.is_meta], stage_group, replicas)
    return False
