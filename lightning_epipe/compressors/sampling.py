"""Deterministic strided samples: a fixed-cost look at a tensor of any size.

Shape legend: N elements, M sampled elements.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["strided_sample"]

_GOLDEN = 0.6180339887498949


def strided_sample(flat: torch.Tensor, size: int) -> torch.Tensor:
    """A deterministic spread-out sample: [N] -> [min(N, size)] (all of flat if smaller).

    Index i takes position ``floor(frac(i * golden) * N)``: evenly spread, never periodic,
    so it does not alias with rows or channels the way a fixed stride can.
    """
    count = flat.numel()
    if count <= size:
        return flat
    return flat[_sample_positions(count, size, flat.device)]


@functools.lru_cache(maxsize=16)
def _sample_positions(count: int, size: int, device: torch.device) -> torch.Tensor:
    """[size] int64 positions in range(count); cached: a stream sends one shape over and over."""
    i = torch.arange(size, dtype=torch.float64, device=device)
    return ((i * _GOLDEN) % 1.0 * count).long()
