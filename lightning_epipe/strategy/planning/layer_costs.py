"""Automatic balance: per-layer cost (parameters or measured time) -> layers per stage.

``measure_layers`` is what every rank measures for ``balance="time"`` on its own device
(seconds per layer forward+backward, and each layer's output for the cuts' sizes);
``cut_nbytes`` and ``layer_memory`` turn the outputs into bytes crossing each possible cut
after compression and bytes each layer needs while training.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from lightning_epipe.strategy.engine.microbatch import Batch
from lightning_epipe.strategy.planning.solver import solve_balance
from lightning_epipe.strategy.engine.timing import synchronize

__all__ = ["balance_by_parameters", "balance_by_time", "measure_layers", "cut_nbytes", "layer_memory"]


def balance_by_parameters(layers: nn.Sequential, num_ranks: int, placement: str = "client-server") -> list[int]:
    """Balance so that every rank holds about the same number of parameters (+1 per layer).

    Example:
        >>> seq = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
        >>> balance_by_parameters(seq, 3)
        [1, 2, 2, 1]
    """
    costs = [1 + sum(p.numel() for p in layer.parameters()) for layer in layers]
    return solve_balance(costs, num_ranks, placement)


def balance_by_time(
    layers: nn.Sequential,
    sample: Batch,
    num_ranks: int,
    placement: str = "client-server",
    device: torch.device | str = "cpu",
    repeats: int = 3,
) -> list[int]:
    """Balance by each layer's measured forward+backward time on ``sample`` (torchgpipe's rule)."""
    costs, _ = measure_layers(layers, sample, device, repeats)
    return solve_balance(costs, num_ranks, placement)


def measure_layers(layers: nn.Sequential, sample: Batch, device: torch.device | str = "cpu",
                   repeats: int = 3) -> tuple[list[float], list[Any]]:
    """Seconds of every layer's forward+backward on ``sample`` (summed over ``repeats`` after one
    warm-up pass), and every layer's output (detached, where the layers live). Measured where
    the stage will run, one layer at a time: only that layer, its input and its output are on
    ``device`` at once, so a model larger than one device is measured too. Buffers (BatchNorm
    statistics) and the RNG are restored."""
    costs: list[float] = []
    outputs: list[Any] = []
    home = next((t.device for t in layers.state_dict().values()), torch.device(device))
    x: Any = _to(sample, device)
    with torch.random.fork_rng(devices=[]):
        for layer in layers:
            buffers = {name: b.detach().clone() for name, b in layer.named_buffers()}
            layer.to(device)
            seconds, first = 0.0, None
            for r in range(repeats + 1):
                x_r = _detach(x)
                synchronize(torch.device(device))
                start = time.perf_counter()
                y = layer(x_r)
                outs = [t for t in (y if isinstance(y, (tuple, list)) else (y,)) if t.requires_grad]
                if outs:
                    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
                synchronize(torch.device(device))
                if r:
                    seconds += time.perf_counter() - start
                else:
                    first = _detach(y)
            layer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for name, b in layer.named_buffers():
                    b.copy_(buffers[name])
            layer.to(home)
            costs.append(seconds)
            outputs.append(_to(first, home))
            x = first  # the next layer's input, still on the device
    return costs, outputs


def _float_tensors(x: Any) -> list[torch.Tensor]:
    items = x.values() if isinstance(x, dict) else (x if isinstance(x, (tuple, list)) else [x])
    return [t for t in items if isinstance(t, torch.Tensor)]


def cut_nbytes(outputs: list[Any], activation: Any = None, gradient: Any = None) -> list[float]:
    """Bytes crossing a cut after layer ``i`` (for ``i < n - 1``) per sample of the measured batch:
    the activation forward (through codec ``activation``) plus its gradient backward (through
    ``gradient``, on a same-shaped tensor); ``None`` codecs count raw bytes. Integer tensors
    (masks, ids) travel raw one way."""
    out = []
    for y in outputs[:-1]:
        total = 0.0
        for t in _float_tensors(y):
            raw = t.numel() * t.element_size()
            if not t.is_floating_point():
                total += raw
                continue
            for codec in (activation, gradient):
                total += raw if codec is None else codec.ratio(t.detach()) * raw
        out.append(total)
    return out


def layer_memory(layers: nn.Sequential, outputs: list[Any], optimizer_slots: int = 2) -> list[float]:
    """Bytes each layer needs while training: weights, their gradients and ``optimizer_slots``
    optimizer tensors (2 for Adam), plus its output kept for backward (at the measured batch)."""
    out = []
    for layer, y in zip(layers, outputs):
        params = sum(p.numel() * p.element_size() for p in layer.parameters())
        acts = sum(t.numel() * t.element_size() for t in _float_tensors(y))
        out.append(float(params * (2 + optimizer_slots) + acts))
    return out


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
