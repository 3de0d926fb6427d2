"""One-pass scans of a tensor or a sorted sample, compiled: ``quantize``'s range and codes, and
the runs of repeated values in a sample (``exact.repeated_values``).

Shape legend: N elements, M sampled elements.
"""

from __future__ import annotations

import math

import numpy as np

from .jit import jit

__all__ = ["min_max", "quantize_codes", "sampled_frequent_values"]

@jit
def _min_max(x):  # pragma: no cover - compiled
    lo, hi = x[0], x[0]
    nan = False
    for i in range(x.size):
        v = x[i]
        lo = min(lo, v)
        hi = max(hi, v)
        nan |= v != v
    return lo, hi, nan


def min_max(x: np.ndarray) -> tuple[float, float]:
    """(min, max) of x [N >= 1] in one pass, as Python floats; both NaN if x holds a NaN
    (as numpy's ``min`` and ``max``)."""
    lo, hi, nan = _min_max(x)
    return (math.nan, math.nan) if nan else (float(lo), float(hi))


@jit
def quantize_codes(x, lo, scale, top, out):  # pragma: no cover - compiled
    """``quantize``'s codes: ``min(max(rint((v - lo) * scale), 0), top)``, each operation
    rounded once in x's dtype (no fused multiply-add), as the torch path computes them.

    x: [N] float32/float64; lo, scale: scalars of x's dtype; top: x's dtype -> out [N]
    (uint8 up to 8 bits, else int32). +Inf takes ``top``, -Inf 0, NaN an unspecified code.
    """
    zero = top - top
    for i in range(x.size):
        out[i] = np.int32(min(max(np.rint((x[i] - lo) * scale), zero), top))


@jit
def _frequent_values(sample, run, known, limit):  # pragma: no cover - compiled
    """``exact.repeated_values`` past the sort: the finite values holding at least ``run``
    elements of the sorted ``sample`` [M], ``known`` [k] float64 left out, the ``limit`` most
    frequent, most frequent first (ties in ascending order) -> [<= limit] float64. A run of
    zeros is +0.0 where it holds one, else -0.0."""
    m = sample.size
    values = np.empty(m)
    counts = np.empty(m, dtype=np.int64)
    found = 0
    i = 0
    while i < m:
        j = i
        while j + 1 < m and sample[j + 1] == sample[i]:
            j += 1
        v = np.float64(sample[i])
        if v == 0.0:  # a run of zeros is +0.0 if it holds one, whatever order the sort left
            for k in range(i, j + 1):
                if math.copysign(1.0, sample[k]) > 0:
                    v = 0.0
        if j - i + 1 >= run and np.isfinite(v):
            fresh = True
            for k in range(known.size):
                fresh &= known[k] != v
            if fresh:
                values[found], counts[found] = v, j - i + 1
                found += 1
        i = j + 1
    order = np.argsort(-counts[:found], kind="mergesort")[:limit]
    return values[:found][order]


@jit
def sampled_frequent_values(x, positions, run, known, limit):  # pragma: no cover - compiled
    """``_frequent_values`` of the values of x [N] at ``positions`` [M] int64 (all of x where
    ``positions`` is empty), sorted here: a sample's gather, sort and scan in one call."""
    sample = x[positions] if positions.size else x.copy()
    sample.sort()
    return _frequent_values(sample, run, known, limit)
