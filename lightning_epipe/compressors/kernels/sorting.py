"""A float32 sort, compiled: the host codecs' sorted values in a few linear passes.

``sortquant``'s exact boundaries and ``lloydmax``'s and ``hadamard``'s fits sort tens of
thousands of values per call. numpy's comparison sort is slow on some x86 guests (with this
sort ``sortquant``'s 128 KiB encode took 0.46x the time there: benchmarks/README.md, section
5); a least-significant-digit radix sort on the values' bits takes three passes of 11 bits
whatever the values, and skips a pass whose digit is the same in every element (a narrow
range's high bits).

Order: the IEEE total order of the bits, ``-inf < ... < -0.0 < +0.0 < ... < +inf``, every
NaN last (as ``np.sort``; each one written back as the quiet NaN 0x7FFFFFFF). Where numpy
leaves -0.0 and +0.0 in any order, this puts the negative zeros first.

Shape legend: N elements.
"""

from __future__ import annotations

import numpy as np

from .jit import jit

__all__ = ["RADIX_MIN", "sort_values", "radix_sort_f32"]

#: Below this many float32 elements ``sort_values`` takes numpy's sort: the radix sort's
#: three 2048-bin histograms cost more than sorting so few values.
RADIX_MIN = 1 << 11

_DIGIT_BITS = 11
_DIGITS = 3  # 3 x 11 bits cover a 32-bit key
_BINS = 1 << _DIGIT_BITS


@jit
def radix_sort_f32(x):  # pragma: no cover - compiled
    """x [N] float32 -> a sorted copy [N] float32 (the order of the module docstring)."""
    n = x.size
    bits = x.view(np.uint32)
    sign, nan_key = np.uint32(0x80000000), np.uint32(0xFFFFFFFF)
    out = np.empty(n, dtype=np.float32)
    keys = np.empty(n, dtype=np.uint32)    # order-preserving: flip a negative's bits, set a positive's sign
    spare = out.view(np.uint32)            # the passes' second buffer, then the result in place
    counts = np.zeros((_DIGITS, _BINS), dtype=np.int64)
    mask = np.uint32(_BINS - 1)
    for i in range(n):
        b = bits[i]
        if (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
            k = nan_key                    # every NaN after +inf
        elif b & sign:
            k = ~b
        else:
            k = b | sign
        keys[i] = k
        counts[0, k & mask] += 1
        counts[1, (k >> np.uint32(_DIGIT_BITS)) & mask] += 1
        counts[2, k >> np.uint32(2 * _DIGIT_BITS)] += 1
    source, target = keys, spare
    for digit in range(_DIGITS):
        shift = np.uint32(digit * _DIGIT_BITS)
        if n == 0 or counts[digit, (source[0] >> shift) & mask] == n:
            continue                       # every element has this digit: the pass keeps the order
        total = 0
        for d in range(_BINS):             # bin starts
            c = counts[digit, d]
            counts[digit, d] = total
            total += c
        for i in range(n):
            k = source[i]
            d = (k >> shift) & mask
            target[counts[digit, d]] = k
            counts[digit, d] += 1
        source, target = target, source
    for i in range(n):                     # source is keys or spare: element by element, in place too
        k = source[i]
        spare[i] = k ^ sign if k & sign else ~k
    return out


def sort_values(x: np.ndarray) -> np.ndarray:
    """x [N] float32 or float64 -> a sorted copy [N]: the radix sort for float32 from
    ``RADIX_MIN`` elements, numpy's sort otherwise. NaNs last either way."""
    if x.dtype == np.float32 and x.ndim == 1 and x.size >= RADIX_MIN and x.flags.c_contiguous:
        return radix_sort_f32(x)
    return np.sort(x)
