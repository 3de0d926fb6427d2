"""The small-tensor host path: a small CPU tensor is coded in numpy, not in torch ops.

Each torch op on a small CPU tensor costs a few microseconds of dispatch, a numpy op on a
small array about one; an encode or decode is a few dozen ops, so below a few thousand
elements the fixed cost, not the data, sets the time (a micro-batch of 8 x 256 floats
crosses a cut hundreds of times a second). A CPU tensor of at most ``HOST_MAX`` elements
is read through a zero-copy ``.numpy()`` view (float16 and bfloat16 widened to float32,
exactly) and its payload is written in numpy; the wire format is the one the torch path
writes, and a codec's guarantees hold on both paths. CUDA tensors, and larger ones, take
the torch path.

Shape legend: N elements, E weighted points, L levels.
"""

from __future__ import annotations

import numpy as np
import torch

from .bitpack import pack_host, packed_nbytes
from .exact import host_values

__all__ = ["HOST_MAX", "on_host", "host_array", "host_payload", "lloyd_steps", "nearest"]

#: Elements of a CPU tensor (16 KiB of float32) up to which codecs take the host path.
HOST_MAX = 1 << 12


def on_host(numel: int, device: torch.device) -> bool:
    """Whether a tensor of ``numel`` elements on ``device`` takes the host path."""
    return device.type == "cpu" and numel <= HOST_MAX


def host_array(x: torch.Tensor) -> np.ndarray | None:
    """x: [N] float -> [N] float32 or float64 numpy (a view where the dtype allows) if x
    takes the host path, else None."""
    if not on_host(x.numel(), x.device):
        return None
    return host_values(x)


def host_payload(head: bytes, codes: np.ndarray, bits: int) -> torch.Tensor:
    """``head`` followed by ``codes`` [N] packed at ``bits`` bits: a CPU uint8 payload."""
    payload = np.empty(len(head) + packed_nbytes(codes.size, bits), dtype=np.uint8)
    payload[:len(head)] = np.frombuffer(head, dtype=np.uint8)
    pack_host(codes, bits, payload[len(head):])
    return torch.from_numpy(payload)


def lloyd_steps(points: np.ndarray, weight: np.ndarray, levels: np.ndarray,
                fixed: np.ndarray | None, iterations: int) -> np.ndarray:
    """Weighted Lloyd steps: each level not ``fixed`` moves to the mean of the points
    nearest to it (boundaries at the midpoints of the levels, prefix sums: O(L log E) a
    step); stops early when no level moves. A level without points keeps its value.

    points: [E] sorted; weight: [E] > 0; levels: [L] float64 sorted; fixed: [L] bool or
    None -> [L] float64.
    """
    below = np.zeros((2, points.size + 1))  # prefix sums of weight and of weight * point
    np.cumsum(weight, out=below[0, 1:])
    np.cumsum(points * weight, out=below[1, 1:])
    edges = np.empty(levels.size + 1, dtype=np.int64)                            # [L+1]
    edges[0], edges[-1] = 0, points.size
    free = np.ones(levels.size, dtype=bool) if fixed is None else ~fixed
    for _ in range(iterations):
        edges[1:-1] = np.searchsorted(points, (levels[1:] + levels[:-1]) * 0.5)
        at = below[:, edges]                                                     # [2, L+1]
        n, s = at[:, 1:] - at[:, :-1]                                            # [L] each
        moved = np.where((n > 0) & free, s / np.maximum(n, 1e-300), levels)
        if (moved == levels).all():
            break
        levels = moved
    return levels


def nearest(x: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """x: [N] -> [N] index of the nearest of the sorted ``levels`` [L] (ties to the lower),
    i.e. the number of midpoints below each value: uint8 for L <= 256, else int32."""
    cuts = (levels[1:] + levels[:-1]) / 2                                        # [L-1]
    x = x.astype(np.float64, copy=False)  # a value on a level is never past its midpoint
    if cuts.size > 15:
        return np.searchsorted(cuts, x).astype(np.uint8 if levels.size <= 256 else np.int32)
    codes = np.zeros(x.size, dtype=np.uint8)
    for cut in cuts:  # 15 branch-free compares beat a binary search per element
        codes += x > cut
    return codes
