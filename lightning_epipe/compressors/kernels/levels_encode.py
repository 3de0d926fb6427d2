"""Levels payloads (``compressors/levels.py``'s format) written on the host, compiled: the
head of any levels payload in one call (``levels_payload``: ``quantize``'s and
``sortquant``'s), and ``sortquant``'s whole host encode past its sort in one call
(``sortquant_payload``: exact values, bucket tables, head and every element's code).

``sortquant``'s buckets are those of a stable sort's ranks; an element finds its bucket by
comparison with the values at the bucket starts (a chain of selects up to
``CHAIN_BUCKETS`` buckets, which the compiler vectorizes), and the elements of a value whose
run crosses a bucket start take the buckets of their ranks (``retag_run``). The arithmetic
is the torch path's, in float32 and in its order, so the payload is the same bit for bit.
In a pipeline a call runs between a stage's matmuls, where each call's dispatch costs
~20 us with the caches cold: one call, not four, is the point of ``sortquant_payload``.

Shape legend: N elements, K buckets, E exact values, S buckets a run spans, P exact pairs.
"""

from __future__ import annotations

import math

import numpy as np

from .jit import jit

__all__ = ["CHAIN_BUCKETS", "bucket_codes", "bucket_code", "retag_run", "sortquant_tables", "sortquant_codes",
           "levels_payload", "repeated_sorted", "sortquant_payload"]

#: Buckets a compare chain sorts an element into (``bucket_codes``: tables padded to it).
CHAIN_BUCKETS = 8


@jit
def bucket_codes(x, thresholds, lo, step, offset, top, out):  # pragma: no cover - compiled
    """``sortquant``'s codes of unsorted values: bucket b is the number of ``thresholds``
    at or below an element, its code ``min(max(rint((v - lo[b]) / step[b]), 0), top) +
    offset[b]`` in float32 (v rounded to float32 first, as numpy's float32 ufuncs do).

    x: [N] float32/float64; thresholds: [CHAIN_BUCKETS - 1] of x's dtype, sorted, padded
    with +inf; lo, step: [CHAIN_BUCKETS] float32; offset: [CHAIN_BUCKETS] int32 (padding
    repeats the last real bucket); top: float32 -> out [N] (uint8 for 8 bits, else int32).
    NaN compares false: bucket 0, and an unspecified code. A chain of selects on scalars,
    not a gather by bucket: the compiler vectorizes it.
    """
    t0, t1, t2, t3, t4, t5, t6 = thresholds[:7]
    l0, l1, l2, l3, l4, l5, l6, l7 = lo[:8]
    s0, s1, s2, s3, s4, s5, s6, s7 = step[:8]
    o0, o1, o2, o3, o4, o5, o6, o7 = offset[:8]
    zero = np.float32(0.0)
    for i in range(x.size):
        v = x[i]
        l, s, o = l0, s0, o0
        if v >= t0:
            l, s, o = l1, s1, o1
        if v >= t1:
            l, s, o = l2, s2, o2
        if v >= t2:
            l, s, o = l3, s3, o3
        if v >= t3:
            l, s, o = l4, s4, o4
        if v >= t4:
            l, s, o = l5, s5, o5
        if v >= t5:
            l, s, o = l6, s6, o6
        if v >= t6:
            l, s, o = l7, s7, o7
        q = min(max(np.rint((np.float32(v) - l) / s), zero), top)
        out[i] = np.int32(q) + o


#: Elements ``retag_run`` takes at a time where a block cannot pass the next end.
_RUN_BLOCK = 128


@jit
def retag_run(x, value, ends, codes, out):  # pragma: no cover - compiled
    """The elements equal to ``value``, in x's order, take new codes by count: the first
    ``ends[0]`` of them ``codes[0]``, up to the ``ends[1]``-th ``codes[1]``, and so on;
    the ones after ``ends[-1]`` keep theirs.

    x: [N]; ends: [S] int64 increasing, > 0; codes: [S] int32 -> out [N], written in place.
    Branch-free in blocks of ``_RUN_BLOCK`` (a select and a count per element, vectorized)
    while a block holds fewer elements than are left to the next end, one by one near it:
    a value that is every other element (ReLU's zeros) costs no mispredicted branches.
    """
    i, n, seen = 0, x.size, 0
    for segment in range(ends.size):
        end, code = ends[segment], codes[segment]
        while i < n and seen < end:
            if end - seen >= _RUN_BLOCK and i + _RUN_BLOCK <= n:
                hits = 0
                for k in range(i, i + _RUN_BLOCK):
                    hit = x[k] == value
                    out[k] = code if hit else out[k]
                    hits += hit
                seen += hits
                i += _RUN_BLOCK
            else:
                hit = x[i] == value
                out[i] = code if hit else out[i]
                seen += hit
                i += 1


@jit
def sortquant_tables(values, starts, q_bits, exact):  # pragma: no cover - compiled
    """``sortquant``'s host path: its bucket tables and exact pairs in one call.

    values: [N] sorted; starts: [K+1] int64 (``_starts``); exact: [E] float64, values of
    ``values`` -> (lo, step [K] float64: an empty bucket, where N < K, has 0 and 0; lo32,
    step32 [K] float32: a step of 0 as 1; pair codes [P] int64 and pair values [P] float64):
    each exact value's run [a, b) of values takes the codes at a and at each bucket start
    inside it (``sortquant._exact_in_runs``), computed as every element's code.
    """
    count, buckets = values.size, starts.size - 1
    top = (1 << q_bits) - 1
    lo, step = np.empty(buckets), np.empty(buckets)
    lo32, step32 = np.empty(buckets, dtype=np.float32), np.empty(buckets, dtype=np.float32)
    pair_codes = np.empty(exact.size * (buckets + 1), dtype=np.int64)
    pair_values = np.empty(exact.size * (buckets + 1))
    for k in range(buckets):
        first, last = min(starts[k], count - 1), max(starts[k + 1] - 1, 0)
        if count < buckets and starts[k + 1] == starts[k]:
            lo[k], step[k] = 0.0, 0.0
        else:
            lo[k] = np.float64(values[first])
            step[k] = (np.float64(values[last]) - lo[k]) / top
        lo32[k] = np.float32(lo[k])
        step32[k] = np.float32(step[k]) if step[k] > 0 else np.float32(1.0)
    pairs = 0
    for e in range(exact.size):
        a = np.searchsorted(values, exact[e], side="left")  # exact: one of values, widened
        b = np.searchsorted(values, exact[e], side="right")
        for j in range(-1, buckets + 1):  # rank a, then each bucket start inside (a, b)
            rank = a if j < 0 else starts[j]
            if j >= 0 and not a < rank < b:
                continue
            k = np.searchsorted(starts, rank, side="right") - 1
            pair_codes[pairs] = bucket_code(values[rank], lo32[k], step32[k], top) + (k << q_bits)
            pair_values[pairs] = exact[e]
            pairs += 1
    return lo, step, lo32, step32, pair_codes[:pairs], pair_values[:pairs]


@jit
def bucket_code(v, lo, step, top):  # pragma: no cover - compiled
    """One element's code in its bucket: ``clamp(rint((f32(v) - lo) / step), 0, top)``."""
    q = np.rint((np.float32(v) - lo) / step)
    return np.int64(min(max(q, np.float32(0.0)), np.float32(top)))


@jit
def sortquant_codes(x, values, starts, lo32, step32, q_bits, out):  # pragma: no cover - compiled
    """``sortquant``'s host path: the codes of x's elements in the buckets of their ranks in a
    stable sort, without the sort's permutation: x [N]; values [N] x sorted; starts [K+1]
    int64; lo32, step32 [K] -> out [N] (uint8 for 8-bit codes, else int32), written in place.

    An element reaches bucket k if it is at or above the value t at rank ``starts[k]``
    (#{t <= x} over the thresholds inside (0, N): a chain of selects up to
    ``CHAIN_BUCKETS`` buckets, ``bucket_codes``, else a binary search); the elements equal
    to a t whose run crosses a start take the buckets of their ranks, the j-th of them (in
    x's order) rank ``first rank of t + j``, as the stable sort places them
    (``retag_run``). NaN (``check_finite=False``) sorts last and compares false: bucket 0.
    """
    count, buckets = x.size, starts.size - 1
    top = (1 << q_bits) - 1
    last = values[0]
    inner = np.empty(buckets, dtype=np.int64)  # the bucket starts inside (0, N): thresholds' ranks
    held = 0
    for k in range(1, buckets):
        if starts[k] < count:
            inner[held] = starts[k]
            held += 1
    thresholds = np.empty(max(held, CHAIN_BUCKETS - 1), dtype=values.dtype)
    thresholds[:] = np.inf
    for j in range(held):
        thresholds[j] = values[inner[j]]
    if held < CHAIN_BUCKETS:
        lo = np.empty(CHAIN_BUCKETS, dtype=np.float32)
        step = np.empty(CHAIN_BUCKETS, dtype=np.float32)
        offset = np.empty(CHAIN_BUCKETS, dtype=np.int32)
        for k in range(CHAIN_BUCKETS):
            real = min(k, held)  # buckets 0..held hold elements; the rest repeat the last
            lo[k], step[k], offset[k] = lo32[real], step32[real], real << q_bits
        bucket_codes(x, thresholds, lo, step, offset, np.float32(top), out)
    else:
        for i in range(count):
            v = x[i]
            k = np.searchsorted(thresholds[:held], v, side="right") if v == v else 0
            out[i] = bucket_code(v, lo32[k], step32[k], top) + (k << q_bits)
    retagged = False
    for j in range(held):  # runs of a threshold that cross its bucket's start, each once
        t = thresholds[j]
        if values[inner[j] - 1] != t or (retagged and t == last):
            continue
        retagged, last = True, t
        first = np.searchsorted(values, t, side="left")
        stop = np.searchsorted(values, t, side="right")
        # the compares gave the run the bucket of its last rank: only ranks before that
        # bucket's start move down, bucket by bucket
        lower = first + max(starts[((stop - 1) * buckets) // count] - first, 0)
        ends = np.empty(buckets, dtype=np.int64)
        codes = np.empty(buckets, dtype=np.int32)
        moved = 0
        for k in range(buckets):
            if max(starts[k], first) < min(starts[k + 1], lower):
                ends[moved] = min(starts[k + 1], lower) - first
                codes[moved] = bucket_code(t, lo32[k], step32[k], top) + (k << q_bits)
                moved += 1
        if moved:
            retag_run(x, t, ends[:moved], codes[:moved], out)


#: Entries an exact table holds at most (``exact.MAX_ENTRIES``: its count is one byte).
_MAX_ENTRIES = 255


@jit
def _put(raw, at, word):  # pragma: no cover - compiled
    """The bytes of ``word`` [1] (any dtype) at byte ``at`` of raw, little-endian (any alignment)."""
    data = word.view(np.uint8)
    for b in range(data.size):
        raw[at + b] = data[b]


@jit
def levels_payload(bits, split, lo, step, pair_codes, pair_values, single, count):  # pragma: no cover - compiled
    """A fresh levels payload with its head written (``levels.levels_head``'s bytes): prefix,
    ``lo`` and ``step`` [K] float64 rounded to float32, and the exact table of the (code,
    value) pairs [P] in order of priority (a code keeps its first value; a code whose level,
    ``lo + q * step`` in float64 rounded to float32 if ``single`` else kept, is already its
    value is left out; ``_MAX_ENTRIES`` at most) -> (payload [head + packed bytes of count
    codes] uint8, head bytes). Little-endian hosts only (``levels.host_levels_payload``).
    """
    buckets, q_bits = lo.size, bits - split
    mask = (1 << q_bits) - 1
    keep = np.empty(min(pair_codes.size, _MAX_ENTRIES), dtype=np.int64)
    entries = 0
    for p in range(pair_codes.size):
        code = pair_codes[p]
        seen = entries == keep.size
        for j in range(p):
            seen |= pair_codes[j] == code
        if seen:
            continue
        k = code >> q_bits
        level = np.float64(np.float32(lo[k])) + np.float64(code & mask) * np.float64(np.float32(step[k]))
        if single:
            level = np.float64(np.float32(level))
        if level != pair_values[p]:
            keep[entries] = p
            entries += 1
    head = 4 + 8 * buckets + 10 * entries
    raw = np.empty(head + (count * bits + 7) // 8, dtype=np.uint8)
    raw[0], raw[1], raw[2], raw[3] = bits, split, entries, 0
    word32, word16, word64 = np.empty(1, np.float32), np.empty(1, np.uint16), np.empty(1, np.float64)
    for k in range(buckets):
        word32[0] = lo[k]
        _put(raw, 4 + 4 * k, word32)
        word32[0] = step[k]
        _put(raw, 4 + 4 * buckets + 4 * k, word32)
    at = 4 + 8 * buckets
    for e in range(entries):
        word16[0] = pair_codes[keep[e]]
        _put(raw, at + 2 * e, word16)
        word64[0] = pair_values[keep[e]]
        _put(raw, at + 2 * entries + 8 * e, word64)
    return raw, head


@jit
def repeated_sorted(values, run, limit):  # pragma: no cover - compiled
    """``exact.repeated_in_sorted`` compiled: the finite values holding at least ``run``
    elements of the sorted ``values`` [N] (``run >= 1``), the first and the last value left
    out, the ``limit`` most frequent, most frequent first (ties in ascending order); a run
    of zeros is +0.0 where it holds one -> [<= limit] float64. Every run of ``run`` or more
    holds one of the elements at ``run - 1, 2 run - 1, ...``: N / run binary searches."""
    n = values.size
    found_values = np.empty(n // run + 1)
    found_counts = np.empty(n // run + 1, dtype=np.int64)
    found = 0
    first, last = values[0], values[n - 1]
    previous = n  # the start of the last run counted
    for j in range(run - 1, n, run):
        v = values[j]
        left = np.searchsorted(values, v, side="left")
        if left == previous or not np.isfinite(v) or v == first or v == last:
            continue
        previous = left
        right = np.searchsorted(values, v, side="right")
        if right - left < run:
            continue
        value = np.float64(v)
        if value == 0.0:
            value = -0.0
            for k in range(left, right):
                if math.copysign(1.0, values[k]) > 0:
                    value = 0.0
        found_values[found], found_counts[found] = value, right - left
        found += 1
    order = np.argsort(-found_counts[:found], kind="mergesort")[:limit]
    return found_values[:found][order]


@jit
def sortquant_payload(x, values, starts, bits, split, run, limit, single):  # pragma: no cover - compiled
    """``sortquant``'s host encode past the sort, one call: x [N] float32/float64; values
    [N] x sorted; starts [K+1] int64 (``_starts``); run, limit: ``repeated_sorted``'s;
    single: float32 levels (else float64) -> (payload [head + packed codes] uint8, head
    bytes, codes [N] int32 still to pack at ``bits`` where bits != 8, else empty: written).

    The exact values are the first and last value, where the range is finite, and the
    repeated values (``repeated_sorted``); then ``sortquant_tables``, ``levels_payload``
    and ``sortquant_codes``, as the calls one by one would write them.
    """
    count, q_bits = values.size, bits - split
    first, last = np.float64(values[0]), np.float64(values[count - 1])
    if np.isfinite(last - first):
        spikes = repeated_sorted(values, run, limit)
        exact = np.empty(2 + spikes.size)
        exact[0], exact[1] = first, last
        exact[2:] = spikes
    else:
        exact = np.empty(0)
    lo, step, lo32, step32, pair_codes, pair_values = sortquant_tables(values, starts, q_bits, exact)
    raw, head = levels_payload(bits, split, lo, step, pair_codes, pair_values, single, count)
    if bits == 8:
        sortquant_codes(x, values, starts, lo32, step32, q_bits, raw[head:])
        return raw, head, np.empty(0, dtype=np.int32)
    codes = np.empty(count, dtype=np.int32)
    sortquant_codes(x, values, starts, lo32, step32, q_bits, codes)
    return raw, head, codes
