"""The learned bottlenecks' parameters in the user's optimizer, and its LR schedulers following.

The pairs are on the module before ``configure_optimizers`` runs, so an optimizer over
``self.parameters()`` trains them with the model. Two cases need more:

- an optimizer over part of the model (``self.layers.parameters()``) leaves them out: they
  go to the first optimizer as a param group of their own;
- ``Bottleneck(lr=...)``: new layers in a pretrained model usually want a larger learning rate
  than the fine-tuning's, so the pairs get a group of their own at that rate wherever they are.

A group added after the LR schedulers were made would break them (they keep one entry per
group and ``step()`` zips those with the groups, strictly). The new group therefore copies the
first group's settings, its learning-rate keys (``lr``, ``initial_lr``, ``max_lr``,
``min_lr``) scaled by ``lr / the first group's initial lr``, and every scheduler of that
optimizer gets the first group's entry of each per-group list it keeps (``base_lrs``,
``lr_lambdas``, ...), scaled alike where it is a learning rate: the pairs follow the first
group's schedule at their own rate.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

__all__ = ["optimize_bottlenecks"]

_LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")
#: torch's schedulers' per-group lists: learning rates (scaled) and the others (copied)
_LR_LISTS = ("base_lrs", "_last_lr", "max_lrs", "min_lrs")
_OTHER_LISTS = ("lr_lambdas", "base_momentums", "max_momentums")


def optimize_bottlenecks(holder: Optional[nn.Module], lr: Optional[float], optimizers: list[torch.optim.Optimizer],
                         schedulers: list[Any]) -> list[str]:
    """Put the pairs of ``holder`` into ``optimizers[0]`` as a group of their own where the
    optimizers miss them or ``lr`` is given (then out of the groups that held them); extend
    ``schedulers`` of that optimizer to the new group. Returns the names of the parameters moved."""
    if holder is None or not optimizers:
        return []
    pairs = dict(holder.named_parameters())
    mine = {id(p) for p in pairs.values()}
    held = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    moving = [n for n, p in pairs.items() if lr is not None or id(p) not in held]
    if not moving:
        return []
    optimizer = optimizers[0]
    if lr is not None:
        for opt in optimizers:
            for group in opt.param_groups:
                group["params"] = [p for p in group["params"] if id(p) not in mine]
    first = optimizer.param_groups[0]
    base = first.get("initial_lr", first["lr"])
    if lr is not None and not base:
        raise ValueError("Bottleneck(lr=...) scales the first param group's learning rate, which is 0: give that group"
                         " a learning rate, or leave lr unset")
    scale = 1.0 if lr is None else lr / base
    group = {k: (v * scale if k in _LR_KEYS else v) for k, v in first.items() if k != "params"}
    optimizer.add_param_group({**group, "params": [pairs[n] for n in moving]})
    for scheduler in schedulers:
        if getattr(scheduler, "optimizer", None) is optimizer:
            _extend(scheduler, len(optimizer.param_groups) - 1, scale)
    return moving


def _extend(scheduler: Any, groups_before: int, scale: float) -> None:
    """Give ``scheduler``'s per-group lists (``groups_before`` long) the first group's entry."""
    for name in _LR_LISTS + _OTHER_LISTS:
        value = getattr(scheduler, name, None)
        if isinstance(value, list) and len(value) == groups_before:
            entry = value[0]
            value.append(entry * scale if name in _LR_LISTS and isinstance(entry, (int, float)) else entry)
    for part in getattr(scheduler, "_schedulers", []):  # SequentialLR, ChainedScheduler
        _extend(part, groups_before, scale)
