"""A uniform grid of ``GRID`` cells over a tensor's [min, max]: ``lloydmax``'s histogram and
its per-cell code table.

Shape legend: n values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GRID", "MIN_GRID", "Grid", "grid_size", "affine_scale"]

#: Cells of the uniform grid over [min, max]: the histogram and the per-cell code table.
GRID = 1 << 16
#: Cells of the grid of the smallest tensors.
MIN_GRID = 1 << 10


def grid_size(count: int) -> int:
    """Cells for a tensor of ``count`` elements: 4 per element (a power of two), from
    ``MIN_GRID`` to ``GRID``. A grid much finer than the tensor only costs: the histogram,
    the code table and their scans are as long as the grid."""
    return min(GRID, max(MIN_GRID, 4 << max(count - 1, 0).bit_length()))


@dataclass(frozen=True)
class Grid:
    """``size`` uniform cells over [lo, lo + span] and the map of a value to its cell."""

    size: int              # cells, at most GRID
    lo: torch.Tensor       # 0-d float64, the minimum
    scale64: torch.Tensor  # 0-d float64, cells per unit (0 for a zero span)
    start: torch.Tensor    # 0-d float32: lo (halved with ``halve``)
    scale: torch.Tensor    # 0-d float32: scale64 (doubled with ``halve``)
    halve: bool            # the span overflows float32: halve values before subtracting

    @classmethod
    def over(cls, lo: torch.Tensor, span: torch.Tensor, size: int = GRID) -> Grid:
        """lo, span: 0-d float64; size: cells."""
        scale64, scale, _ = affine_scale(lo, span, size)
        halve = bool(span > 2.0 ** 127)
        start = lo.float() * 0.5 if halve else lo.float()
        return cls(size, lo, scale64, start, scale * 2 if halve else scale, halve)

    def cells(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """x: [n] float32 -> [n] cells ``floor((x - lo) * scale)`` clamped to 0..size-1.

        A subtraction then a multiplication, each rounded once: no fused multiply-add that
        a kernel may or may not use, so a value maps to the same cell wherever it is
        computed, and ``x - lo`` is exact for x near lo.
        """
        if self.halve:
            x = x * 0.5
        return torch.sub(x, self.start).mul_(self.scale).to(dtype).clamp_(0, self.size - 1)


def affine_scale(lo: torch.Tensor, span: torch.Tensor,
                 units: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Map [lo, lo + span] onto [0, units]: (scale64, scale32, offset32), all 0-d.

    ``x * scale32 + offset32`` is the position of x in units; a zero span (or one so small
    that the float32 scale overflows) maps everything to 0. lo, span: 0-d float64.
    """
    scale = torch.where(span > 0, units / span, 0.0)
    scale32 = scale.float()
    scale32 = torch.where(torch.isfinite(scale32), scale32, 0.0)
    return scale32.double(), scale32, (-lo * scale32.double()).float()
