"""``hadamard``'s rotation in compiled loops: its signs, the transform, the block scales, the decode.

In the torch path's float32 arithmetic, operation for operation (``hadamard.py``): the signs
of a seed (``hadamard_signs``: a counter-based hash, the same on every device, machine and
torch version), the orthonormal Walsh-Hadamard transform of each block as ``log2(n)``
butterfly stages then one scaling (``fwht_rows``), the encode up to the level fit
(``hadamard_rotate``: normalize, sign, transform, scale each block by its bfloat16 RMS) and
the whole decode, checked (``hadamard_decode``). Sums and differences of two float32 values
and the products by one constant are correctly rounded on every device, so both paths
write the same payload and decode to the same values, bit for bit.

Shape legend: N elements, R blocks of n, L levels, B payload bytes.
"""

from __future__ import annotations

import math

import numpy as np

from .jit import jit

__all__ = ["hadamard_signs", "fwht_rows", "transform_scale", "hadamard_rotate", "hadamard_decode", "exponent_factors",
           "HEAD_NBYTES", "MAX_LOG2_BLOCK", "MAX_EXPONENT", "NONFINITE"]

#: Bytes of a payload's prefix: seed, log2(block), bits, exponent (int32 each).
HEAD_NBYTES = 16
#: The largest block is ``2**MAX_LOG2_BLOCK`` values.
MAX_LOG2_BLOCK = 16
#: A payload's exponent is at most this in magnitude (float64's range and then some).
MAX_EXPONENT = 1100
#: What ``hadamard_rotate`` returns for a tensor holding NaN or Inf.
NONFINITE = 1 << 30
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@jit
def transform_scale(n):  # pragma: no cover - compiled
    """The float32 factor ``1 / sqrt(n)`` that ends the transform of a block of ``n``."""
    return np.float32(1.0 / math.sqrt(n))


@jit
def exponent_factors(exponent):  # pragma: no cover - compiled
    """``2**exponent`` as two float64 factors, ``2**(e // 2)`` and ``2**(e - e // 2)``, each
    finite for ``|exponent| <= 2046``."""
    half = exponent // 2
    return math.ldexp(1.0, half), math.ldexp(1.0, exponent - half)


@jit
def _sign_bit(seed, i):  # pragma: no cover - compiled
    """Bit 63 of splitmix64's output for the counter ``seed * 2**32 + i``."""
    z = (np.uint64(seed) << np.uint64(32)) + np.uint64(i) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return np.int64(z >> np.uint64(63))


@jit
def hadamard_signs(seed, out):  # pragma: no cover - compiled
    """The signs of ``seed`` (0..2**31-1): out [n] float32, each +1 or -1, written."""
    for i in range(out.size):
        out[i] = np.float32(1 - 2 * _sign_bit(seed, i))


@jit
def fwht_rows(z, n, scale):  # pragma: no cover - compiled
    """z [R * n] float32, in place: each block of ``n`` (a power of two) times the orthonormal
    Sylvester-Hadamard matrix: butterflies ``(a + b, a - b)`` of elements ``h`` apart within
    each ``2h``, for h = 1, 2, ..., n / 2, then every element times ``scale`` (float32).
    Stages h = 1, 2, 4 run on eight values at a time, later ones two at a time (four values
    ``h`` apart), and the last scales as it stores: the same operations on the same values,
    so the same bits as stage after stage. Indices are unsigned (no wraparound select per
    access), so the compiler vectorizes the loops."""
    if n < 8:
        h = 1
        while h < n:
            for start in range(0, z.size, 2 * h):
                for j in range(start, start + h):
                    a, b = z[j], z[j + h]
                    z[j] = a + b
                    z[j + h] = a - b
            h *= 2
        for j in range(z.size):
            z[j] = z[j] * scale
        return
    _butterflies8(z)
    h = np.uint64(8)
    while 4 * h <= n:  # stages h and 2h
        _butterflies4(z, h, scale, 4 * h == n)
        h *= np.uint64(4)
    if h == n:  # the stages ended on a pair (or n = 8)
        if n == 8:
            for j in range(z.size):
                z[j] = z[j] * scale
        return
    for start in range(0, z.size, n):  # the last stage, h = n / 2
        for k in range(h):
            j = np.uint64(start) + k
            a, b = z[j], z[j + h]
            z[j] = (a + b) * scale
            z[j + h] = (a - b) * scale


@jit
def _butterflies8(z):  # pragma: no cover - compiled
    """Stages h = 1, 2, 4 of ``fwht_rows`` on each eight values of z [8 G]."""
    for g in range(z.size // 8):
        i = np.uint64(8 * g)
        a0, a1, a2, a3 = z[i], z[i + 1], z[i + 2], z[i + 3]
        a4, a5, a6, a7 = z[i + 4], z[i + 5], z[i + 6], z[i + 7]
        b0, b1, b2, b3, b4, b5, b6, b7 = a0 + a1, a0 - a1, a2 + a3, a2 - a3, a4 + a5, a4 - a5, a6 + a7, a6 - a7
        c0, c1, c2, c3, c4, c5, c6, c7 = b0 + b2, b1 + b3, b0 - b2, b1 - b3, b4 + b6, b5 + b7, b4 - b6, b5 - b7
        z[i], z[i + 1], z[i + 2], z[i + 3] = c0 + c4, c1 + c5, c2 + c6, c3 + c7
        z[i + 4], z[i + 5], z[i + 6], z[i + 7] = c0 - c4, c1 - c5, c2 - c6, c3 - c7


@jit
def _butterflies4(z, h, scale, last):  # pragma: no cover - compiled
    """Stages h and 2h of ``fwht_rows`` on each four values ``h`` apart of z [4h G] (h
    unsigned; ``last``: each result times ``scale``)."""
    for start in range(0, z.size, 4 * h):
        for k in range(h):
            j = np.uint64(start) + k
            a0, a1, a2, a3 = z[j], z[j + h], z[j + 2 * h], z[j + 3 * h]
            b0, b1, b2, b3 = a0 + a1, a0 - a1, a2 + a3, a2 - a3
            if last:
                z[j], z[j + h] = (b0 + b2) * scale, (b1 + b3) * scale
                z[j + 2 * h], z[j + 3 * h] = (b0 - b2) * scale, (b1 - b3) * scale
            else:
                z[j], z[j + h], z[j + 2 * h], z[j + 3 * h] = b0 + b2, b1 + b3, b0 - b2, b1 - b3


@jit
def _bfloat16_bits(value, word):  # pragma: no cover - compiled
    """A finite float32 rounded to bfloat16 (to nearest, ties to even): its 16 bits; word: [1] uint32 scratch."""
    word.view(np.float32)[0] = value
    bits = word[0]
    return np.uint16((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@jit
def _bfloat16_value(bits, word):  # pragma: no cover - compiled
    """The float32 value of bfloat16 ``bits``; word: [1] uint32 scratch."""
    word[0] = np.uint32(bits) << np.uint32(16)
    return word.view(np.float32)[0]


@jit
def _uint32_at(raw, at):  # pragma: no cover - compiled
    """The little-endian uint32 at byte ``at`` of raw (any alignment)."""
    return (np.uint32(raw[at]) | (np.uint32(raw[at + 1]) << np.uint32(8)) | (np.uint32(raw[at + 2]) << np.uint32(16))
            | (np.uint32(raw[at + 3]) << np.uint32(24)))


@jit
def hadamard_rotate(x, seed, n, min_exponent, z, sigma):  # pragma: no cover - compiled
    """The encode up to the level fit: x [N] float32/float64 -> the exponent ``e``, the least
    (at least ``min_exponent``) with ``max |x| < 2**e``, or ``NONFINITE`` where x holds NaN or
    Inf (then nothing else is written). z [R * n] float32, written: the blocks of
    ``float32(x * 2**-e)`` (the exact product rounded; zero padded) times the signs of
    ``seed``, transformed (``fwht_rows``), each divided by its scale; sigma
    [R] uint16, written: the bfloat16 bits of each block's RMS, ``sqrt(s / n)`` with ``s`` the
    float32 sum of the squares by halves (the block's first half plus its second, and again,
    down to one)."""
    count = x.size
    top = 0.0
    for i in range(count):
        value = abs(np.float64(x[i]))
        if value > top:
            top = value
        elif not value <= top:  # NaN
            return NONFINITE
    if top == np.inf:
        return NONFINITE
    exponent = max(math.frexp(top)[1], min_exponent)
    factor = math.ldexp(1.0, -exponent)
    for i in range(count):
        z[i] = np.float32(np.float64(x[i]) * factor)
    for i in range(count, z.size):
        z[i] = np.float32(0)
    signs = np.empty(n, dtype=np.float32)
    hadamard_signs(seed, signs)
    for base in range(0, z.size, n):
        for j in range(n):
            at = np.uint64(base) + np.uint64(j)  # unsigned: no wraparound select, vectorized
            z[at] = z[at] * signs[j]
    fwht_rows(z, n, transform_scale(n))
    squares = np.empty(n, dtype=np.float32)
    word = np.empty(1, dtype=np.uint32)
    width = np.float32(n)
    for r in range(sigma.size):
        base = np.uint64(r * n)
        for j in range(n):
            squares[j] = z[base + np.uint64(j)] * z[base + np.uint64(j)]
        half = np.uint64(n // 2)
        while half >= 1:
            for j in range(half):
                squares[j] = squares[j] + squares[j + half]
            half //= np.uint64(2)
        sigma[r] = _bfloat16_bits(np.sqrt(squares[0] / width), word)
        rms = _bfloat16_value(sigma[r], word)
        if rms > 0:
            for j in range(n):
                z[base + np.uint64(j)] = z[base + np.uint64(j)] / rms
    return exponent


@jit
def hadamard_decode(raw, count, low, high, out):  # pragma: no cover - compiled
    """A ``hadamard`` payload checked and decoded in one call: raw [B] uint8 -> out [count]
    float32 or float64 (clamped to ``[low, high]``, the packet dtype's finite range), written.
    -> 0, or 1 where anything is wrong (prefix, size, a non-finite level, a scale outside
    [0, 1]): the caller words the error. Per element, the torch path's operations:
    ``level[code] * scale`` (float32), the transform, times the sign, then
    ``x * 2**(e // 2) * 2**(e - e // 2)`` in float64, clamped."""
    if raw.size < HEAD_NBYTES:
        return 1
    word = np.empty(1, dtype=np.uint32)
    head = np.empty(4, dtype=np.int64)
    for k in range(4):
        word[0] = _uint32_at(raw, 4 * k)
        head[k] = word.view(np.int32)[0]
    seed, log2_block, bits, exponent = head[0], head[1], head[2], head[3]
    if not (2 <= bits <= 8 and 1 <= log2_block <= MAX_LOG2_BLOCK and seed >= 0 and abs(exponent) <= MAX_EXPONENT):
        return 1
    n = np.int64(1) << log2_block
    levels_n = np.int64(1) << bits
    rows = (count + n - 1) // n
    at = HEAD_NBYTES + 4 * levels_n
    codes_at = at + 2 * rows
    if raw.size != codes_at + (rows * n * bits + 7) // 8:
        return 1
    levels = np.empty(levels_n, dtype=np.float32)
    for j in range(levels_n):
        word[0] = _uint32_at(raw, HEAD_NBYTES + 4 * j)
        levels[j] = word.view(np.float32)[0]
        if not np.isfinite(levels[j]):
            return 1
    scales = np.empty(rows, dtype=np.float32)
    for r in range(rows):
        scales[r] = _bfloat16_value(np.uint32(raw[at + 2 * r]) | (np.uint32(raw[at + 2 * r + 1]) << np.uint32(8)), word)
        if not (scales[r] >= 0 and scales[r] <= 1):
            return 1
    z = np.empty(rows * n, dtype=np.float32)
    if bits == 4 or bits == 8:  # whole codes a byte (n is even)
        per_byte = 8 // bits
        mask = (1 << bits) - 1
        for r in range(rows):
            scale = scales[r]
            for k in range(r * n // per_byte, (r + 1) * n // per_byte):
                byte = raw[codes_at + k]
                for c in range(per_byte):
                    z[k * per_byte + c] = levels[(byte >> (c * bits)) & mask] * scale
    else:  # a little-endian bit stream: each code within two bytes
        nbytes = raw.size - codes_at
        data = np.zeros(nbytes + 1, dtype=np.int64)  # one spare byte
        for k in range(nbytes):
            data[k] = raw[codes_at + k]
        mask = (1 << bits) - 1
        for r in range(rows):
            scale = scales[r]
            for i in range(r * n, (r + 1) * n):
                bit = i * bits
                at_byte = bit >> 3
                code = ((data[at_byte] | (data[at_byte + 1] << 8)) >> (bit & 7)) & mask
                z[i] = levels[code] * scale
    fwht_rows(z, n, transform_scale(n))
    signs = np.empty(n, dtype=np.float32)
    hadamard_signs(seed, signs)
    first, second = exponent_factors(exponent)
    for base in range(0, count, n):
        for j in range(min(n, count - base)):
            at = np.uint64(base) + np.uint64(j)
            value = np.float64(z[at] * signs[j]) * first * second
            out[at] = min(max(value, low), high)
    return 0
