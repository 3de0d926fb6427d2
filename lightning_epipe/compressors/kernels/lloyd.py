"""The Lloyd fits on the host, compiled: ``lloydmax``'s and ``hadamard``'s levels and each element's nearest.

``fit_levels_sorted`` (spikes, the density-weighted start, ``lloyd_steps``) takes the sorted
fit sample in one call; ``count_below`` counts the cuts under each element (a chain of
compares up to 15 cuts, else a guess table walked to the exact count). A host encode is
two calls past numpy's sorts: ``tail_fit_values`` (the fit sample's far values, one pass)
and ``lloydmax_codes`` (the fit and every element's nearest level). ``hadamard``'s fit, plain
Lloyd steps from the normal's levels in its own float32 arithmetic, is ``unweighted_lloyd``, its
levels and codes ``hadamard_codes``, and its host encode past the rotation and the sort one
call, ``hadamard_payload`` (codes packed, the payload written).

Shape legend: N elements, C cuts, L levels, E cells (distinct values).
"""

from __future__ import annotations

import numpy as np

from .jit import jit

__all__ = ["count_below", "lloyd_steps", "fit_levels_sorted", "tail_fit_values", "lloydmax_codes", "unweighted_lloyd",
           "hadamard_codes", "hadamard_payload"]

#: Cuts a compare chain counts (``count_below``: padded to it); more take a guess table.
_CHAIN_CUTS = 15
#: The float64 high word (32 bits) of a first guess of x**(-1/3) is this minus x's high word / 3
#: (within 4%; int32 arithmetic, which the compiler vectorizes where an int64 division is scalar).
_CUBE_ROOT_MAGIC = 0x553EF0FF
#: Cells per cut of the guess table of ``count_below`` above ``_CHAIN_CUTS`` cuts (at most:
#: fewer for a tensor of fewer than 64 elements a cut, 2 at least).
_CELLS_PER_CUT = 16


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


@jit
def _count_below(x, cuts, out):  # pragma: no cover - compiled
    """``count_below``'s body: a compare chain up to ``_CHAIN_CUTS`` cuts (float32 values
    compared with each cut rounded down to float32: ``v > c`` is ``v > (the largest float32
    <= c)``), else the guess table over a uniform grid of the cuts' span."""
    n_cuts = cuts.size
    if n_cuts <= _CHAIN_CUTS:
        padded = np.full(_CHAIN_CUTS, np.inf, dtype=x.dtype)
        down = np.full(1, -np.inf, dtype=x.dtype)[0]
        for j in range(n_cuts):
            padded[j] = cuts[j]
            if padded[j] > cuts[j]:
                padded[j] = np.nextafter(padded[j], down)
        _count_chain(x, padded, np.uint8(n_cuts), out)
        return
    lo, hi = cuts[0], cuts[n_cuts - 1]
    cells = min(_CELLS_PER_CUT * n_cuts, max(2 * n_cuts, x.size // 4))  # a table no larger than the work it saves
    scale = cells / (hi - lo) if hi > lo else 0.0
    if not 0.0 < scale < np.inf:  # one distinct cut, or a span past float64's range
        for i in range(x.size):
            v = x[i]
            out[i] = n_cuts if v != v else np.searchsorted(cuts, np.float64(v))
        return
    table = np.empty(cells + 1, dtype=np.int64)                                  # [G+1] cuts below each cell
    c = 0
    for g in range(cells + 1):  # one merge of the cells' edges with the cuts
        edge = lo + g / scale
        while c < n_cuts and cuts[c] < edge:
            c += 1
        table[g] = c
    _count_guessed(x, cuts, lo, scale, table, out)


def count_below(x: np.ndarray, cuts: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``np.searchsorted(cuts, x)``: the number of cuts below each value (a value on a cut is
    not past it; NaN past every one). x: [N] float32/float64; cuts: [C] float64 sorted
    -> out [N] integers (uint8 up to 255 cuts), written and returned."""
    _count_below(x, cuts, out)
    return out


@jit
def _rank_near(points, cut, guess):  # pragma: no cover - compiled
    """``np.searchsorted(points, cut)`` (points [E] sorted) by a galloping search from ``guess``:
    steps of 1, 2, 4, ... away from it, then a binary search within the last step. A Lloyd
    step's boundaries move little, so log of the move where a binary search takes log E."""
    n = points.size
    if guess < n and points[guess] < cut:  # the rank is past guess
        lo, step = guess + 1, 1
        hi = guess + step
        while hi < n and points[hi] < cut:
            lo = hi + 1
            step *= 2
            hi = guess + step
        hi = min(hi, n)
    else:  # the rank is at most guess
        hi, step = guess, 1
        at = guess - step
        while at >= 0 and points[at] >= cut:
            hi = at
            step *= 2
            at = guess - step
        lo = max(at + 1, 0)
    while lo < hi:  # the first of points[lo:hi] >= cut (a slice and np.searchsorted cost more here)
        mid = (lo + hi) >> 1
        if points[mid] < cut:
            lo = mid + 1
        else:
            hi = mid
    return lo


@jit
def _prefix_sums(points, weight):  # pragma: no cover - compiled
    """(weight_below [E + 1], total_below [E + 1]): running sums of weight [E] and of
    weight * points [E], in order, each from 0."""
    count = points.size
    weight_below = np.zeros(count + 1)
    total_below = np.zeros(count + 1)
    for i in range(count):
        weight_below[i + 1] = weight_below[i] + weight[i]
        total_below[i + 1] = total_below[i] + points[i] * weight[i]
    return weight_below, total_below


@jit
def _lloyd_moves(points, weight_below, total_below, levels, fixed, iterations):  # pragma: no cover - compiled
    """``lloyd_steps`` on the prefix sums of ``_prefix_sums(points, weight)``."""
    count = points.size
    levels = levels.copy()
    moved = levels.copy()
    n_levels = levels.size
    edges = np.zeros(n_levels + 1, dtype=np.int64)
    edges[n_levels] = count
    for _ in range(iterations):
        for j in range(n_levels - 1):
            edges[j + 1] = _rank_near(points, (levels[j + 1] + levels[j]) * 0.5, max(edges[j], edges[j + 1]))
        same = True
        for j in range(n_levels):
            lo, hi = np.uint64(edges[j]), np.uint64(edges[j + 1])  # unsigned: no wraparound select
            n = weight_below[hi] - weight_below[lo]
            s = total_below[hi] - total_below[lo]
            moved[j] = s / n if n > 0 and not fixed[j] else levels[j]
            same &= moved[j] == levels[j]
        if same:
            break
        levels, moved = moved, levels
    return levels


@jit
def lloyd_steps(points, weight, levels, fixed, iterations):  # pragma: no cover - compiled
    """``iterations`` weighted Lloyd steps, all in one call: each level not ``fixed`` moves
    to the mean of the points nearest to it (boundaries at the midpoints ``(a + b) * 0.5``
    of the sorted levels; prefix sums of the weights and of weight * point, summed in
    order); a level without points keeps its value; stops early when no level moves.

    points: [E] float64 sorted; weight: [E] float64 > 0; levels: [L] float64 or float32 sorted
    (float32: each cut the float32 sum halved, each mean rounded to float32 as it is stored);
    fixed: [L] bool -> [L] of levels' dtype (a new array).
    """
    weight_below, total_below = _prefix_sums(points, weight)
    return _lloyd_moves(points, weight_below, total_below, levels, fixed, iterations)


@jit
def _cells(values, weights):  # pragma: no cover - compiled
    """The distinct values of sorted ``values`` [N] and their weights, one pass:
    (distinct [D] float64, freq [D] float64, total). ``weights`` [N] float64, or empty:
    one element each (the counts then exact)."""
    count = values.size
    distinct = np.empty(count)                                                   # [D] each value once
    freq = np.empty(count)                                                       # [D] its weight
    cells = 0
    if weights.size == 0:
        repeats = 1  # values[i - 1]'s count so far
        for i in range(1, count):
            if values[i] != values[i - 1]:
                distinct[cells] = values[i - 1]
                freq[cells] = repeats
                cells += 1
                repeats = 0
            repeats += 1
        last, total = float(repeats), float(count)
    else:
        last = total = weights[0]  # a register, not freq[cells]: no store-to-load chain per repeat
        for i in range(1, count):
            w = weights[i]
            total += w
            if values[i] != values[i - 1]:
                distinct[cells] = values[i - 1]
                freq[cells] = last
                cells += 1
                last = w
            else:
                last += w
    distinct[cells] = values[count - 1]
    freq[cells] = last
    return distinct[:cells + 1], freq[:cells + 1], total


@jit
def _free_cells(freq, total, levels_n, pin_ends):  # pragma: no cover - compiled
    """[D] bool: the cells not pinned. Pinned: every cell of at least ``1/(2L)`` of ``total``
    (the heaviest ``L/2`` at most, ``L/2 - 2`` with the ends: ``min(L/2, L - 2)``; ties by
    position) and, with ``pin_ends``, the first and the last."""
    cells = freq.size
    limit = min(levels_n // 2, levels_n - 2) if pin_ends else levels_n // 2
    free = np.ones(cells, dtype=np.bool_)
    heavy_n = 0
    for c in range(cells):
        heavy = freq[c] * (2 * levels_n) >= total
        free[c] = not heavy
        heavy_n += heavy
    if heavy_n > limit:
        heavy = np.nonzero(~free)[0]
        heavy = heavy[np.argsort(-freq[heavy], kind="mergesort")[:limit]]
        free[:] = True
        free[heavy] = False
    if pin_ends:
        free[0] = False
        free[cells - 1] = False
    return free


@jit
def fit_levels_sorted(values, weights, levels_n, iterations, cell, pin_ends_from,
                      neighbours):  # pragma: no cover - compiled
    """``lloydmax``'s host fit in one call (``lloydmax._encode_host``): values [N] sorted,
    finite, not all equal; weights [N] float64 (the elements each value stands for), or
    empty: one each -> (levels [L] float64 sorted, pinned [L] bool).

    Each distinct value is a cell of its own, its weight the sum of its values' weights.
    Spikes: every cell holding ``1/(2L)`` of the total weight (the heaviest ``L/2`` at
    most; from ``pin_ends_from`` levels also the first and last cell, leaving two levels
    free) are pinned. The free levels start at equal-weight quantiles of the other cells,
    each weighted by ``density**(-2/3)`` (``neighbours`` cells on either side over their
    span, at least ``cell``); a cell hit by several quantiles is taken once and the
    quantiles recomputed with more targets (8 rounds at most). Then the Lloyd steps
    (``lloyd_steps``, on the running sums the density took too).
    """
    distinct, freq, total = _cells(values, weights)
    free = _free_cells(freq, total, levels_n, levels_n >= pin_ends_from)
    free_count = 0
    for c in range(free.size):
        free_count += free[c]
    spikes = np.empty(free.size - free_count)                                    # [P] sorted
    mean = np.empty(free_count)                                                  # [E]
    weight = np.empty(free_count)                                                # [E]
    p = e = 0
    for c in range(free.size):
        if free[c]:
            mean[e] = distinct[c]
            weight[e] = freq[c]
            e += 1
        else:
            spikes[p] = distinct[c]
            p += 1
    weight_below, total_below = _prefix_sums(mean, weight)
    free_n = levels_n - spikes.size
    chosen = _spread(_scores(mean, weight, weight_below, cell, neighbours), free_n)
    start = mean[chosen] if chosen.size else spikes[:1]
    start = start[:free_n]
    levels = np.empty(levels_n)                                                  # [L]
    pinned = np.zeros(levels_n, dtype=np.bool_)
    p = e = 0
    for j in range(levels_n):  # spikes and starts merged, a spike first on a tie
        value = start[min(e, start.size - 1)]  # fewer values than free levels: the top one repeats (unused);
        # start is never empty: spikes take at most L/2 levels and the ends two, so free_n >= 1
        if e >= free_n or (p < spikes.size and spikes[p] <= value):
            levels[j] = spikes[p]
            pinned[j] = True
            p += 1
        else:
            levels[j] = value
            e += 1
    if mean.size and iterations:
        levels = _lloyd_moves(mean, weight_below, total_below, levels, pinned, iterations)
    return levels, pinned


@jit
def _scores(mean, weight, weight_below, cell, neighbours):  # pragma: no cover - compiled
    """[E] ``weight * density**(-2/3)``: mean [E] sorted, weight [E] > 0, weight_below [E + 1]
    their running sums; the density the weight per unit over ``neighbours`` points on either
    side (a span of at least ``cell``). ``density**(-1/3)`` from a guess read off the float64
    bits (the exponent divided by -3) and three Newton steps ``r (4 - d r**3) / 3`` (relative
    error under 1e-9, where float32 ``powf`` had 1e-6 and took twice the time), the power
    itself for a density outside (1e-30, 1e30)."""
    n = mean.size
    density = np.empty(n)
    for i in range(n):
        lo, hi = max(i - neighbours, 0), min(i + neighbours, n - 1)
        density[i] = (weight_below[hi + 1] - weight_below[lo]) / max(mean[hi] - mean[lo], cell)
    scores = np.empty(n)
    guess = scores.view(np.int64)
    bits = density.view(np.int64)
    for i in range(n):
        guess[i] = np.int64(np.int32(_CUBE_ROOT_MAGIC) - np.int32(bits[i] >> 32) // np.int32(3)) << 32
    third = 1.0 / 3.0
    for i in range(n):
        d, r = density[i], scores[i]
        r = r * (4.0 - d * r * r * r) * third
        r = r * (4.0 - d * r * r * r) * third
        r = r * (4.0 - d * r * r * r) * third
        scores[i] = weight[i] * (r * r)
    for i in range(n):
        d = density[i]
        if not 1e-30 < d < 1e30:
            scores[i] = weight[i] * d ** (-2.0 / 3.0)
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
        hits = np.empty(targets_n, dtype=np.int64)
        step = below[cells - 1] / targets_n
        found, at = 0, 0
        for t in range(targets_n):  # searchsorted of the ascending targets, by one merge
            target = (t + 0.5) * step
            while at < cells and below[at] < target:
                at += 1
            hit = min(at, cells - 1)
            if found == 0 or hits[found - 1] != hit:
                hits[found] = hit
                found += 1
        chosen = hits[:found]
        if found >= n:
            break
        targets_n = min(max(targets_n + 1, -(-targets_n * n // found)), 4 * cells)
    if chosen.size > n:  # overshot: keep n of them, evenly spread
        chosen = chosen[np.rint(np.linspace(0, chosen.size - 1, n)).astype(np.int64)]
    return chosen


@jit
def tail_fit_values(x, sample, tail_ranks):  # pragma: no cover - compiled
    """``lloydmax.fit_sample`` past the sort of its strided sample, one pass over x: x [N];
    sample [M] sorted -> (values [V] sorted, weights [V] float64, whether x holds a NaN:
    then values and weights are empty). Every element of x below the sample's
    ``tail_ranks``-th value or above its ``tail_ranks``-th from the top enters one element
    each; the sampled values between stand for the rest, an equal share each."""
    below, above = sample[tail_ranks], sample[sample.size - 1 - tail_ranks]
    n_tails = 0
    nan = False
    for i in range(x.size):
        v = x[i]
        n_tails += v < below or v > above
        nan |= v != v
    if nan:
        return np.empty(0, dtype=x.dtype), np.empty(0), True
    tails = np.empty(n_tails, dtype=x.dtype)                                    # [T]
    t = 0
    for i in range(x.size):
        v = x[i]
        if v < below or v > above:
            tails[t] = v
            t += 1
    tails.sort()
    split = np.searchsorted(tails, below)
    first, stop = np.searchsorted(sample, below), np.searchsorted(sample, above, side="right")
    values = np.empty(n_tails + stop - first, dtype=x.dtype)
    values[:split] = tails[:split]
    values[split:split + stop - first] = sample[first:stop]
    values[split + stop - first:] = tails[split:]
    weights = np.ones(values.size)
    weights[split:split + stop - first] = (x.size - n_tails) / (stop - first)
    return values, weights, False


@jit
def lloydmax_codes(x, values, weights, levels_n, iterations, cell, pin_ends_from, neighbours,
                   out):  # pragma: no cover - compiled
    """``lloydmax``'s host encode past its fit sample, one call: the levels fitted on
    ``values``/``weights`` (``fit_levels_sorted``; weights empty: one element each), rounded
    to float32, and each element of x [N] coded as its nearest (``count_below`` of the
    midpoints) -> out [N] (uint8), written; returns the codebook [L] float32."""
    levels, _ = fit_levels_sorted(values, weights, levels_n, iterations, cell, pin_ends_from, neighbours)
    codebook = levels.astype(np.float32)
    wide = codebook.astype(np.float64)
    _count_below(x, (wide[1:] + wide[:-1]) / 2, out)
    return codebook


@jit
def unweighted_lloyd(values, levels, iterations):  # pragma: no cover - compiled
    """``hadamard``'s level fit: ``lloyd_steps`` on sorted float32 ``values`` [M], each of weight
    1, from float32 ``levels`` [L], none fixed -> [L] float32 (a new array). Its arithmetic is
    float32 cuts ``(a + b) / 2`` (a float32 sum halved, exact in float64) and float64 means of
    running sums in order, rounded to float32 where ``moved`` stores them."""
    return lloyd_steps(values.astype(np.float64), np.ones(values.size), levels, np.zeros(levels.size, np.bool_),
                       iterations)


@jit
def hadamard_codes(u, values, levels, iterations, out):  # pragma: no cover - compiled
    """``hadamard``'s host encode past the sort of its fit sample, one call: the levels fitted on
    sorted ``values`` [M] float32 (``unweighted_lloyd``) and each element of u [N] float32 coded
    as the number of float32 cuts ``(a + b) / 2`` below it -> out [N] (uint8), written; returns
    the levels [L] float32."""
    fitted = unweighted_lloyd(values, levels, iterations)
    cuts = np.empty(fitted.size - 1)
    two = np.float32(2)
    for j in range(cuts.size):
        cuts[j] = (fitted[j + 1] + fitted[j]) / two  # a float32 cut, exact in float64
    _count_below(u, cuts, out)
    return fitted


@jit
def _put_uint32(out, at, word):  # pragma: no cover - compiled
    """Write the uint32 ``word`` little-endian at byte ``at`` of out."""
    for b in range(4):
        out[at + b] = (word >> np.uint32(8 * b)) & np.uint32(0xFF)


@jit
def hadamard_payload(u, values, levels, iterations, head, sigma, bits, out):  # pragma: no cover - compiled
    """``hadamard``'s host encode past the sort of its fit sample, its whole payload in one call:
    the levels and codes of ``hadamard_codes``, and out [B] uint8 written: ``head`` [4] int32
    (seed, log2 block, bits, exponent), the levels [L] float32, ``sigma`` [R] (bfloat16 bits),
    the codes packed at ``bits`` (2..8: ``bitpack``'s little-endian bit stream, a byte a code
    at 8)."""
    codes = np.empty(u.size, dtype=np.uint8)
    fitted = hadamard_codes(u, values, levels, iterations, codes)
    word = np.empty(1, dtype=np.uint32)
    at = 0
    for k in range(4):
        word.view(np.int32)[0] = head[k]
        _put_uint32(out, at, word[0])
        at += 4
    for j in range(fitted.size):
        word.view(np.float32)[0] = fitted[j]
        _put_uint32(out, at, word[0])
        at += 4
    for r in range(sigma.size):
        out[at] = sigma[r] & 0xFF
        out[at + 1] = sigma[r] >> 8
        at += 2
    if bits == 8:
        for i in range(codes.size):
            out[at + i] = codes[i]
        return
    acc, held = 0, 0  # packing._pack's bit stream (compiled calls stay within a module: jit.py)
    for i in range(codes.size):
        acc |= np.int64(codes[i]) << held
        held += bits
        while held >= 8:
            out[at] = acc & 0xFF
            acc >>= 8
            held -= 8
            at += 1
    if held:
        out[at] = acc & 0xFF
