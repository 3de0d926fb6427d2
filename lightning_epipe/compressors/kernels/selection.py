"""``topk``'s selection on the host, compiled: the positions of the k largest magnitudes.

A radix select on the magnitudes' bit patterns (for a non-negative float the pattern
orders as the value): a histogram of the top 11 bits over every element finds the digit
holding the k-th largest, a second pass gathers the elements with that digit, which are
narrowed 8 bits at a time to the k-th largest magnitude itself, and a last pass writes the
positions in ascending order. Three passes over N whatever k, where a sort or a heap costs
N log k.

The rule is ``topk._largest``'s on every device: the k largest magnitudes, NaN as large as
infinity, and among magnitudes equal to the k-th largest the lowest positions.

Shape legend: N elements, k kept.
"""

from __future__ import annotations

import numpy as np

from .jit import jit

__all__ = ["largest_positions"]

#: Bits of the magnitude read by the pass over every element (for float32: the exponent
#: and the top 3 bits of the mantissa).
_FIRST_DIGIT = 11
#: Bits read by each later pass, over the elements left (a smaller table to clear and walk).
_DIGIT = 8


def largest_positions(x: np.ndarray, k: int, out: np.ndarray) -> int:
    """x: [N] float32/float64, 1 <= k <= N -> out [k] int64, the positions of the k largest
    |x| in ascending order (written); returns how many elements are NaN or infinite."""
    if x.dtype == np.float32:
        return _select(x.view(np.int32), k, 31, 0x7F800000, out)
    return _select(x.view(np.int64), k, 63, 0x7FF0000000000000, out)


@jit
def _select(bits, k, key_bits, inf_key, out):  # pragma: no cover - compiled
    """bits: [N] int32/int64 float patterns; key_bits: 31 or 63; inf_key: infinity's pattern."""
    n = bits.size
    magnitude = (np.int64(1) << key_bits) - 1
    keys = np.empty(n, dtype=np.int64)                                           # [N] |x|, NaN as inf
    hist = np.zeros(1 << _FIRST_DIGIT, dtype=np.int64)
    shift = key_bits - _FIRST_DIGIT
    nonfinite = 0
    top = 0
    for i in range(n):
        key = np.int64(bits[i]) & magnitude
        if key >= inf_key:
            key = inf_key
            nonfinite += 1
        keys[i] = key
        top = max(top, key)
        hist[key >> shift] += 1
    digit, above = _digit_of_rank(hist, top >> shift, k)
    need = k - above                                                             # ranks left to place
    candidates = np.empty(hist[digit], dtype=np.int64)                          # keys with that digit
    m = 0
    for i in range(n):
        if keys[i] >> shift == digit:
            candidates[m] = keys[i]
            m += 1
    while shift > 0:
        width = min(_DIGIT, shift)
        shift -= width
        mask = (np.int64(1) << width) - 1
        hist[:mask + 1] = 0
        for j in range(m):
            hist[(candidates[j] >> shift) & mask] += 1
        digit, above = _digit_of_rank(hist, mask, need)
        need -= above
        kept = 0
        for j in range(m):
            if (candidates[j] >> shift) & mask == digit:
                candidates[kept] = candidates[j]
                kept += 1
        m = kept
    threshold = candidates[0]                                                    # the k-th largest key
    t = 0
    for i in range(n):
        key = keys[i]
        if key > threshold or (key == threshold and need > 0):
            need -= key == threshold
            out[t] = i
            t += 1
    return nonfinite


@jit
def _digit_of_rank(hist, start, rank):  # pragma: no cover - compiled
    """Walking down from digit ``start`` (no key above it): (d, the keys above d) for the digit d
    whose bin holds the rank-th largest key (1-based)."""
    above = 0
    d = start
    while above + hist[d] < rank:
        above += hist[d]
        d -= 1
    return d, above
