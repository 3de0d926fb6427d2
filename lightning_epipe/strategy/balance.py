"""Automatic balance: per-layer cost (parameters or measured time) -> layers per stage."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from lightning_epipe.strategy.microbatch import Batch
from lightning_epipe.strategy.partition import balance_by_cost

__all__ = ["balance_by_parameters", "balance_by_time"]


def balance_by_parameters(layers: nn.Sequential, num_ranks: int, placement: str = "client-server") -> list[int]:
    """Balance so that every rank holds about the same number of parameters (+1 per layer).

    Example:
        >>> seq = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
        >>> balance_by_parameters(seq, 3)
        [1, 2, 2, 1]
    """
    costs = [1 + sum(p.numel() for p in layer.parameters()) for layer in layers]
    return balance_by_cost(costs, num_ranks, placement)


def balance_by_time(
    layers: nn.Sequential,
    sample: Batch,
    num_ranks: int,
    placement: str = "client-server",
    device: torch.device | str = "cpu",
    repeats: int = 3,
) -> list[int]:
    """Balance by each layer's measured forward+backward time on ``sample`` (torchgpipe's rule)."""
    costs = [0.0] * len(layers)
    x: Any = _to(sample, device)
    for _ in range(repeats):
        x_i = x
        for i, layer in enumerate(layers):
            x_i = _detach(x_i)
            start = time.perf_counter()
            y = layer(x_i)
            outs = [t for t in (y if isinstance(y, (tuple, list)) else (y,)) if t.requires_grad]
            if outs:
                torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
            costs[i] += time.perf_counter() - start
            x_i = y
    return balance_by_cost(costs, num_ranks, placement)


def _to(x: Any, device: torch.device | str) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return type(x)(_to(v, device) for v in x)


def _detach(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().requires_grad_(x.is_floating_point())
    if isinstance(x, dict):
        return {k: _detach(v) for k, v in x.items()}
    return type(x)(_detach(v) for v in x)
