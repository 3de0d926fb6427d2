"""Compiled host loops (numba): one pass over the elements where numpy takes one per operation.

A codec's host path in numpy is a few dozen array operations. In a pipeline each call
runs between a stage's matmuls, which have evicted the caches the interpreter and numpy's
dispatch used a call before: a small numpy operation that takes ~1 us back to back takes
~15 us there, so the number of operations, more than the work per element, sets a codec's
cost (``benchmarks/README.md``, section 5). These functions do a codec's per-element work
and its small-table bookkeeping in a few compiled calls, in the codecs' own arithmetic (the
float32 operations of the torch paths, in the same order), so a payload is the same bit
for bit whichever path wrote it; the tests hold each one to its numpy definition:

- packing and unpacking codes (``pack_codes``, ``unpack_codes``), decoding lookups
  (``lookup_codes``), and whole decodes that also check the payload (``levels_decode``
  for ``quantize`` and ``sortquant``, ``codebook_decode`` for ``lloydmax``);
- ``quantize``: ``min_max``, ``quantize_codes``;
- ``sortquant``: ``sortquant_tables`` (bucket tables and exact pairs), ``sortquant_codes``
  (a chain of selects, ``bucket_codes``, then the ties across bucket starts, ``retag_run``);
- ``lloydmax``: ``fit_levels_sorted`` (spikes, density-weighted start, ``lloyd_steps``),
  ``count_below`` (each element's nearest level);
- ``exact.repeated_values``: ``frequent_values``.

They are compiled on first use and cached on disk (``cache=True``: a process after the
first loads them in milliseconds), release the GIL, and run on one core: callers keep
torch's multi-threaded kernels for tensors above ``host.COMPILED_MAX`` elements.

Shape legend: N elements, C cuts, K buckets, B payload bytes, L levels, E cells.
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["jit", "CHAIN_BUCKETS", "min_max", "quantize_codes", "bucket_codes", "bucket_code", "retag_run",
           "sortquant_tables", "sortquant_codes", "count_below", "pack_codes",
           "unpack_codes", "lookup_codes", "LOOKUP_WIDTHS", "levels_decode", "codebook_decode", "lloyd_steps", "fit_levels_sorted", "frequent_values"]

#: The compile options of every loop here and of the codecs' own compiled functions.
jit = numba.njit(cache=True, nogil=True, error_model="numpy")

#: Buckets a compare chain sorts an element into (``bucket_codes``: tables padded to it).
CHAIN_BUCKETS = 8
#: Cuts a compare chain counts (``count_below``: padded to it); more take a guess table.
_CHAIN_CUTS = 15
#: Cells per cut of the guess table of ``count_below`` above ``_CHAIN_CUTS`` cuts.
_CELLS_PER_CUT = 16
#: Widths whose codes ``lookup_codes`` reads straight from the bytes: whole bytes, or
#: several codes a byte.
LOOKUP_WIDTHS = (1, 2, 4, 8)


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
def bucket_codes(x, thresholds, lo, step, offset, top, out):  # pragma: no cover - compiled
    """``sortquant``'s codes of unsorted values: bucket b is the number of ``thresholds``
    at or below an element, its code ``min(max(rint((v - lo[b]) / step[b]), 0), top) +
    offset[b]`` in float32 (v rounded to float32 first, as numpy's float32 ufuncs do).

    x: [N] float32/float64; thresholds: [CHAIN_BUCKETS - 1] of x's dtype, sorted, padded
    with +inf; lo, step: [CHAIN_BUCKETS] float32; offset: [CHAIN_BUCKETS] int32 (padding
    repeats the last real bucket); top: float32 -> out [N] (uint8 for 8 bits, else int32).
    NaN compares false: bucket 0, and an unspecified code. A chain of selects on scalars,
    not a gather by bucket: the compiler vectorizes it (~8x faster).
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
def _count_chain(x, cuts, nan_count, out):  # pragma: no cover - compiled
    """cuts: [_CHAIN_CUTS] of x's dtype, sorted, padded with +inf; NaN -> ``nan_count``."""
    for i in range(x.size):
        v = x[i]
        c = np.uint8(0)
        for j in range(_CHAIN_CUTS):
            c += np.uint8(v > cuts[j])
        out[i] = c if v == v else nan_count


@jit
def _count_guessed(x, cuts, lo, scale, table, out):  # pragma: no cover - compiled
    """Each element's count read from ``table`` [G + 1] over a uniform grid of the cuts'
    span (``scale`` cells a unit from ``lo``), then walked to the exact count by
    compares with the cuts around it."""
    n_cuts = cuts.size
    cells = float(table.size - 1)
    for i in range(x.size):
        v = np.float64(x[i])
        if v != v:
            out[i] = n_cuts
            continue
        c = table[int(min(max((v - lo) * scale, 0.0), cells))]
        while c < n_cuts and v > cuts[c]:
            c += 1
        while c > 0 and v <= cuts[c - 1]:
            c -= 1
        out[i] = c


def count_below(x: np.ndarray, cuts: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``np.searchsorted(cuts, x)``: the number of cuts below each value (a value on a cut is
    not past it; NaN past every one). x: [N] float32/float64; cuts: [C] float64 sorted
    -> out [N] integers (uint8 up to 255 cuts), written and returned."""
    if cuts.size <= _CHAIN_CUTS:
        padded = np.full(_CHAIN_CUTS, np.inf, dtype=x.dtype)
        if x.dtype == np.float32:  # v > c is v > (the largest float32 <= c)
            below = cuts.astype(np.float32)
            padded[:cuts.size] = np.where(below > cuts, np.nextafter(below, np.float32(-np.inf)), below)
        else:
            padded[:cuts.size] = cuts
        _count_chain(x, padded, np.uint8(cuts.size), out)
        return out
    lo, hi = float(cuts[0]), float(cuts[-1])
    cells = _CELLS_PER_CUT * cuts.size
    scale = cells / (hi - lo) if hi > lo else 0.0
    if not 0.0 < scale < np.inf:  # one distinct cut, or a span past float64's range
        out[:] = np.searchsorted(cuts, x)
        return out
    table = np.searchsorted(cuts, lo + np.arange(cells + 1) / scale)                # [G+1]
    _count_guessed(x, cuts, lo, scale, table, out)
    return out


@jit
def _pack(codes, width, out):  # pragma: no cover - compiled
    n = codes.size
    planes, rest = width // 8, width % 8
    for p in range(planes):
        shift = 8 * p
        for i in range(n):
            out[p * n + i] = (codes[i] >> shift) & 0xFF
    if rest == 0:
        return
    base = planes * n
    top = 8 * planes
    mask = (1 << rest) - 1
    if rest == 4:  # two codes a byte, spelled out: the compiler vectorizes it
        for j in range(n // 2):
            out[base + j] = ((codes[2 * j] >> top) & 15) | (((codes[2 * j + 1] >> top) & 15) << 4)
        if n % 2:
            out[base + n // 2] = (codes[n - 1] >> top) & 15
        return
    if 8 % rest == 0:  # whole codes a byte
        per_byte = 8 // rest
        full = n // per_byte
        for j in range(full):
            byte = 0
            for k in range(per_byte):
                byte |= ((codes[j * per_byte + k] >> top) & mask) << (k * rest)
            out[base + j] = byte
        if full * per_byte < n:
            byte = 0
            for k in range(n - full * per_byte):
                byte |= ((codes[full * per_byte + k] >> top) & mask) << (k * rest)
            out[base + full] = byte
        return
    acc, held, at = 0, 0, base  # a little-endian bit stream
    for i in range(n):
        acc |= ((codes[i] >> top) & mask) << held
        held += rest
        while held >= 8:
            out[at] = acc & 0xFF
            acc >>= 8
            held -= 8
            at += 1
    if held:
        out[at] = acc & 0xFF


def pack_codes(codes: np.ndarray, width: int, out: np.ndarray) -> None:
    """``bitpack``'s layout: codes [N] non-negative integers -> out [packed_nbytes(N, width)]
    uint8, written in place (bits above ``width`` dropped)."""
    _pack(codes, width, out)


@jit
def _unpack(data, width, count, out):  # pragma: no cover - compiled
    planes, rest = width // 8, width % 8
    top = 8 * planes
    mask = (1 << rest) - 1
    acc, held, at = 0, 0, planes * count  # the top bits: a little-endian bit stream
    for i in range(count):
        code = 0
        for p in range(planes):
            code |= np.int64(data[p * count + i]) << (8 * p)
        if rest:
            if held < rest:
                acc |= np.int64(data[at]) << held
                held += 8
                at += 1
            code |= (acc & mask) << top
            acc >>= rest
            held -= rest
        out[i] = code


def unpack_codes(data: np.ndarray, width: int, count: int, out: np.ndarray) -> np.ndarray:
    """Inverse of ``pack_codes``: data [packed_nbytes(count, width)] uint8 -> out [count]
    int32 (int64 for width 32), written and returned."""
    _unpack(data, width, count, out)
    return out


@jit
def _lookup(table, data, width, count, out):  # pragma: no cover - compiled
    if width == 8:
        for i in range(count):
            out[i] = table[data[i]]
        return
    if width == 4:  # spelled out: the compiler vectorizes it
        for j in range(count // 2):
            byte = data[j]
            out[2 * j] = table[byte & 15]
            out[2 * j + 1] = table[byte >> 4]
        if count % 2:
            out[count - 1] = table[data[count // 2] & 15]
        return
    per_byte = 8 // width
    mask = (1 << width) - 1
    full = count // per_byte
    for j in range(full):
        byte = data[j]
        for k in range(per_byte):
            out[j * per_byte + k] = table[(byte >> (k * width)) & mask]
    for k in range(count - full * per_byte):
        out[full * per_byte + k] = table[(data[full] >> (k * width)) & mask]


def lookup_codes(table: np.ndarray, data: np.ndarray, width: int, count: int,
                 out: np.ndarray) -> np.ndarray:
    """``table[codes]`` for ``count`` codes of ``width`` bits (``LOOKUP_WIDTHS``) packed in
    data: table [2**width]; data [packed_nbytes(count, width)] uint8 -> out [count] of
    table's dtype, written and returned."""
    if width not in LOOKUP_WIDTHS:
        raise ValueError(f"lookup_codes reads widths {LOOKUP_WIDTHS}, got {width!r}")
    _lookup(table, data, width, count, out)
    return out


@jit
def sortquant_tables(values, starts, q_bits, exact, lo, step, lo32, step32, pair_codes,
                             pair_values):  # pragma: no cover - compiled
    """``sortquant``'s host path: its bucket tables and exact pairs in one call.

    values: [N] sorted; starts: [K+1] int64 (``_starts``); exact: [E] float64, values of
    ``values`` -> lo, step [K] float64 (an empty bucket, where N < K: 0 and 0), lo32, step32
    [K] float32 (a step of 0 as 1), and (code, value) pairs in pair_codes, pair_values
    [E (K + 1)]: each exact value's run [a, b) of values takes the codes at a and at each
    bucket start inside it (``_exact_in_runs``), computed as every element's code. -> pairs.
    """
    count, buckets = values.size, starts.size - 1
    top = (1 << q_bits) - 1
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
    return pairs


@jit
def bucket_code(v, lo, step, top):  # pragma: no cover - compiled
    """One element's code in its bucket: ``clamp(rint((f32(v) - lo) / step), 0, top)``."""
    q = np.rint((np.float32(v) - lo) / step)
    return np.int64(min(max(q, np.float32(0.0)), np.float32(top)))


@jit
def sortquant_codes(x, values, starts, lo32, step32, q_bits, out):  # pragma: no cover - compiled
    """``sortquant``'s host path: the codes of x's elements in the buckets of their ranks in a
    stable sort, without the sort's permutation: x [N]; values [N] x sorted; starts [K+1] int64; lo32, step32 [K]
    -> out [N] (uint8 for 8-bit codes, else int32), written in place.

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


@jit
def _float32_at(raw, at, word):  # pragma: no cover - compiled
    """The little-endian float32 at byte ``at`` of raw (any alignment); word: [1] uint32 scratch."""
    word[0] = (np.uint32(raw[at]) | (np.uint32(raw[at + 1]) << 8) | (np.uint32(raw[at + 2]) << 16)
               | (np.uint32(raw[at + 3]) << 24))
    return word.view(np.float32)[0]


@jit
def _float64_at(raw, at, word):  # pragma: no cover - compiled
    """The little-endian float64 at byte ``at`` of raw (any alignment); word: [1] uint64 scratch."""
    bits = np.uint64(0)
    for b in range(8):
        bits |= np.uint64(raw[at + b]) << np.uint64(8 * b)
    word[0] = bits
    return word.view(np.float64)[0]


@jit
def levels_decode(raw, count, min_split, max_split, out):  # pragma: no cover - compiled
    """A levels payload (``levels.py``: prefix, bucket tables, exact table, packed codes)
    checked and decoded in one call: raw [B] uint8 -> out [count] float32/float64, each
    code's level ``lo + q * step`` in float64 (an exact entry's value in its place),
    rounded to out's dtype. -> 0, or 1 where anything is wrong (prefix, size, a non-finite
    table entry or a negative step, an exact code past ``2**bits`` or a non-finite value, a
    split outside [min_split, max_split]): the caller words the error.
    """
    if raw.size < 4:
        return 1
    bits, split, entries = np.int64(raw[0]), np.int64(raw[1]), np.int64(raw[2])
    if not (2 <= bits <= 16 and split < bits and raw[3] == 0 and min_split <= split <= max_split):
        return 1
    buckets = 1 << split
    head = 4 + 8 * buckets + 10 * entries
    if raw.size != head + (count * bits + 7) // 8:
        return 1
    word32, word64 = np.empty(1, np.uint32), np.empty(1, np.uint64)
    steps = 1 << (bits - split)
    table = np.empty(1 << bits)                                                 # [2**bits] float64
    for k in range(buckets):
        lo = _float32_at(raw, 4 + 4 * k, word32)
        step = _float32_at(raw, 4 + 4 * buckets + 4 * k, word32)
        if not (np.isfinite(lo) and np.isfinite(step) and step >= 0):
            return 1
        for q in range(steps):
            table[k * steps + q] = np.float64(lo) + q * np.float64(step)
    at = 4 + 8 * buckets
    for e in range(entries):
        code = np.int64(raw[at + 2 * e]) | (np.int64(raw[at + 2 * e + 1]) << 8)
        value = _float64_at(raw, at + 2 * entries + 8 * e, word64)
        if code >= (1 << bits) or not np.isfinite(value):
            return 1
        table[code] = value
    values = table.astype(out.dtype)
    codes = raw[head:]
    if bits == 8 or bits == 4 or bits == 2:
        _lookup(values, codes, bits, count, out)
    else:
        index = np.empty(count, dtype=np.int32)
        _unpack(codes, bits, count, index)
        for i in range(count):
            out[i] = values[index[i]]
    return 0


@jit
def codebook_decode(raw, count, max_bits, out):  # pragma: no cover - compiled
    """A ``lloydmax`` payload (prefix ``[bits][0][0][0]``, ``2**bits`` float32 levels, packed
    codes) checked and decoded in one call: raw [B] uint8 -> out [count] float32/float64.
    -> 0, or 1 where anything is wrong (prefix, size, a non-finite level): the caller words
    the error."""
    if raw.size < 4:
        return 1
    bits = np.int64(raw[0])
    if not (1 <= bits <= max_bits and raw[1] == 0 and raw[2] == 0 and raw[3] == 0):
        return 1
    levels = 1 << bits
    head = 4 + 4 * levels
    if raw.size != head + (count * bits + 7) // 8:
        return 1
    word = np.empty(1, np.uint32)
    table = np.empty(levels, dtype=out.dtype)
    for j in range(levels):
        level = _float32_at(raw, 4 + 4 * j, word)
        if not np.isfinite(level):
            return 1
        table[j] = level
    codes = raw[head:]
    if 8 % bits == 0:
        _lookup(table, codes, bits, count, out)
    else:
        index = np.empty(count, dtype=np.int32)
        _unpack(codes, bits, count, index)
        for i in range(count):
            out[i] = table[index[i]]
    return 0


@jit
def lloyd_steps(points, weight, levels, fixed, iterations):  # pragma: no cover - compiled
    """``iterations`` weighted Lloyd steps, all in one call: each level not ``fixed`` moves
    to the mean of the points nearest to it (boundaries at the midpoints ``(a + b) * 0.5``
    of the sorted levels; prefix sums of the weights and of weight * point, summed in
    order); a level without points keeps its value; stops early when no level moves.

    points: [E] float64 sorted; weight: [E] float64 > 0; levels: [L] float64 sorted;
    fixed: [L] bool -> [L] float64 (a new array).
    """
    count = points.size
    weight_below = np.zeros(count + 1)
    total_below = np.zeros(count + 1)
    for i in range(count):
        weight_below[i + 1] = weight_below[i] + weight[i]
        total_below[i + 1] = total_below[i] + points[i] * weight[i]
    levels = levels.copy()
    moved = levels.copy()
    n_levels = levels.size
    edges = np.empty(n_levels + 1, dtype=np.int64)
    edges[0], edges[n_levels] = 0, count
    for _ in range(iterations):
        for j in range(n_levels - 1):
            edges[j + 1] = np.searchsorted(points, (levels[j + 1] + levels[j]) * 0.5)
        same = True
        for j in range(n_levels):
            n = weight_below[edges[j + 1]] - weight_below[edges[j]]
            s = total_below[edges[j + 1]] - total_below[edges[j]]
            moved[j] = s / n if n > 0 and not fixed[j] else levels[j]
            same &= moved[j] == levels[j]
        if same:
            break
        levels, moved = moved, levels
    return levels


@jit
def fit_levels_sorted(values, weights, levels_n, iterations, cell, pin_ends_from,
                      neighbours):  # pragma: no cover - compiled
    """``lloydmax``'s host fit in one call (``lloydmax.fit_levels_host``): values [N] sorted,
    finite, not all equal; weights [N] float64 (the elements each value stands for)
    -> (levels [L] float64 sorted, pinned [L] bool).

    Each distinct value is a cell of its own, its weight the sum of its values' weights.
    Spikes: every cell holding ``1/(2L)`` of the total weight (the heaviest ``L/2`` at
    most; from ``pin_ends_from`` levels also the first and last cell, leaving two levels
    free) are pinned. The free levels start at equal-weight quantiles of the other cells,
    each weighted by ``density**(-2/3)`` (``neighbours`` cells on either side over their
    span, at least ``cell``); a cell hit by several quantiles is taken once and the
    quantiles recomputed with more targets (8 rounds at most). Then ``lloyd_steps``.
    """
    count = values.size
    first = np.empty(count, dtype=np.int64)                                      # [D] first index of each value
    cells = 0
    for i in range(count):
        if i == 0 or values[i] != values[i - 1]:
            first[cells] = i
            cells += 1
    distinct = np.empty(cells)
    freq = np.zeros(cells)
    for j in range(cells):
        stop = first[j + 1] if j + 1 < cells else count
        distinct[j] = values[first[j]]
        for i in range(first[j], stop):
            freq[j] += weights[i]
    total = 0.0
    for i in range(count):
        total += weights[i]
    heavy = np.nonzero(freq * (2 * levels_n) >= total)[0]
    pin_ends = levels_n >= pin_ends_from
    limit = min(levels_n // 2, levels_n - 2) if pin_ends else levels_n // 2
    if heavy.size > limit:
        heavy = np.sort(heavy[np.argsort(-freq[heavy], kind="mergesort")[:limit]])
    free = np.ones(cells, dtype=np.bool_)
    free[heavy] = False
    if pin_ends:
        free[0] = False
        free[cells - 1] = False
    spikes = distinct[~free]                                                     # [P] sorted
    mean = distinct[free]                                                        # [E]
    weight = freq[free]                                                          # [E]
    free_n = levels_n - spikes.size
    chosen = _spread(_scores(weight, _density(mean, weight, cell, neighbours)), free_n)
    start = mean[chosen] if chosen.size else spikes[:1]
    start = start[:free_n]
    if start.size < free_n:  # fewer values than free levels: repeat the top one (unused)
        start = np.concatenate((start, np.full(free_n - start.size, start[-1])))
    both = np.concatenate((spikes, start))
    order = np.argsort(both, kind="mergesort")
    levels = both[order]                                                         # [L]
    pinned = order < spikes.size
    if mean.size and iterations:
        levels = lloyd_steps(mean, weight, levels, pinned, iterations)
    return levels, pinned


@jit
def _density(mean, weight, cell, neighbours):  # pragma: no cover - compiled
    """[E] weight per unit over ``neighbours`` points on either side (a span of at least ``cell``)."""
    n = mean.size
    below = np.zeros(n + 1)
    for i in range(n):
        below[i + 1] = below[i] + weight[i]
    density = np.empty(n)
    for i in range(n):
        lo, hi = max(i - neighbours, 0), min(i + neighbours, n - 1)
        density[i] = (below[hi + 1] - below[lo]) / max(mean[hi] - mean[lo], cell)
    return density


@jit
def _scores(weight, density):  # pragma: no cover - compiled
    """``weight * density**(-2/3)`` [E]: the power in float32 (a quantile target needs no more,
    and ``powf`` costs about half of ``pow`` an element), in float64 where a density is
    outside float32's normal range."""
    scores = np.empty(weight.size)
    power = np.float32(-2.0 / 3.0)
    for i in range(weight.size):
        d = density[i]
        scores[i] = weight[i] * (np.float64(np.float32(d) ** power) if 1e-30 < d < 1e30 else d ** (-2.0 / 3.0))
    return scores


@jit
def _spread(weight, n):  # pragma: no cover - compiled
    """Indices (sorted, distinct) of ``min(n, E)`` points at equal-weight quantiles of ``weight`` [E] > 0."""
    cells = weight.size
    if cells <= n:
        return np.arange(cells)
    below = np.empty(cells)
    running = 0.0
    for i in range(cells):
        running += weight[i]
        below[i] = running
    targets_n = n
    chosen = np.empty(0, dtype=np.int64)
    for _ in range(8):
        hit = np.minimum(np.searchsorted(below, (np.arange(targets_n) + 0.5) * (below[-1] / targets_n)), cells - 1)
        keep = np.ones(hit.size, dtype=np.bool_)
        keep[1:] = hit[1:] != hit[:-1]
        chosen = hit[keep]
        if chosen.size >= n:
            break
        targets_n = min(max(targets_n + 1, -(-targets_n * n // chosen.size)), 4 * cells)
    if chosen.size > n:  # overshot: keep n of them, evenly spread
        chosen = chosen[np.rint(np.linspace(0, chosen.size - 1, n)).astype(np.int64)]
    return chosen



@jit
def frequent_values(sample, run, known, limit):  # pragma: no cover - compiled
    """``exact.repeated_values`` past the sort: the finite values holding at least ``run``
    elements of the sorted ``sample`` [M], ``known`` [k] float64 left out, the ``limit`` most
    frequent, most frequent first (ties in ascending order) -> [<= limit] float64."""
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
