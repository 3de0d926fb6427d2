"""Codes in and out of ``bitpack``'s layout, and whole decodes, in one compiled pass each.

Packing and unpacking codes of any width (``pack_codes``, ``unpack_codes``); a decoding
lookup straight from the packed bytes (``lookup_codes``); and the decodes of the two table
formats, which check the payload and look every code up in one call (``levels_decode``:
``quantize`` and ``sortquant``; ``codebook_decode``: ``lloydmax``); and ``topk``'s sparse
decode, checked, its values and packed positions read and placed in one call (``sparse_decode``).

Shape legend: N codes, B payload bytes.
"""

from __future__ import annotations

import numpy as np

from .jit import jit

__all__ = ["LOOKUP_WIDTHS", "pack_codes", "unpack_codes", "lookup_codes", "levels_decode", "codebook_decode",
           "sparse_decode"]

#: Widths whose codes ``lookup_codes`` reads straight from the bytes: whole bytes, or
#: several codes a byte.
LOOKUP_WIDTHS = (1, 2, 4, 8)


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
    if 8 % rest == 0:  # whole codes a byte
        per_byte = 8 // rest
        full = n // per_byte
        start = np.uint64(base)  # unsigned: no wraparound select, so the loops vectorize
        if rest == 4:  # spelled out, so the compiler vectorizes them
            for j in range(full):
                out[start + np.uint64(j)] = ((codes[2 * j] >> top) & 15) | (((codes[2 * j + 1] >> top) & 15) << 4)
        elif rest == 2:
            for j in range(full):
                out[start + np.uint64(j)] = (((codes[4 * j] >> top) & 3) | (((codes[4 * j + 1] >> top) & 3) << 2)
                                             | (((codes[4 * j + 2] >> top) & 3) << 4)
                                             | (((codes[4 * j + 3] >> top) & 3) << 6))
        else:
            for j in range(full):
                byte = 0
                for k in range(8):
                    byte |= ((codes[8 * j + k] >> top) & 1) << k
                out[start + np.uint64(j)] = byte
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
def _gather(table, data, width, count, out):  # pragma: no cover - compiled
    """``table[codes]`` for ``count`` codes of any width packed in data: straight from the
    bytes at ``LOOKUP_WIDTHS``, else unpacked first."""
    if 8 % width == 0:
        _lookup(table, data, width, count, out)
        return
    index = np.empty(count, dtype=np.int32)
    _unpack(data, width, count, index)
    for i in range(count):
        out[i] = table[index[i]]


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
    _gather(table.astype(out.dtype), raw[head:], bits, count, out)
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
    _gather(table, raw[head:], bits, count, out)
    return 0


@jit
def sparse_decode(raw, count, out):  # pragma: no cover - compiled
    """A ``topk`` payload (prefix ``[dense][value_bits][index_bits][0][k u32]``, k values raw
    or as a one-bucket levels payload, k positions packed unless dense) checked and decoded in
    one call: raw [B] uint8 -> out [count] float32/float64, zero where no value was kept.
    -> 0, or 1 where anything is wrong (prefix, size, the values' levels payload, a position
    past count): the caller words the error."""
    if raw.size < 8:
        return 1
    dense, value_bits, index_bits = np.int64(raw[0]), np.int64(raw[1]), np.int64(raw[2])
    k = np.int64(raw[4]) | (np.int64(raw[5]) << 8) | (np.int64(raw[6]) << 16) | (np.int64(raw[7]) << 24)
    width = 1
    while (1 << width) < count:
        width += 1
    if not (dense <= 1 and raw[3] == 0 and index_bits == width and (value_bits == 0 or 2 <= value_bits <= 16)
            and (k == count if dense else 1 <= k <= count)):
        return 1
    if value_bits:
        entries = np.int64(raw[10]) if raw.size > 10 else 0
        values_nbytes = 12 + 10 * entries + (k * value_bits + 7) // 8
    else:
        values_nbytes = k * out.itemsize
    index_nbytes = 0 if dense else (k * index_bits + 7) // 8
    if raw.size != 8 + values_nbytes + index_nbytes:
        return 1
    values = out if dense else np.empty(k, dtype=out.dtype)                      # [k]
    if value_bits:
        if levels_decode(raw[8:8 + values_nbytes], k, 0, 0, values) != 0:
            return 1
    elif out.itemsize == 4:
        word32 = np.empty(1, np.uint32)
        for j in range(k):
            values[j] = _float32_at(raw, 8 + 4 * j, word32)
    else:
        word64 = np.empty(1, np.uint64)
        for j in range(k):
            values[j] = _float64_at(raw, 8 + 8 * j, word64)
    if dense:
        return 0
    positions = np.empty(k, dtype=np.int64)
    _unpack(raw[8 + values_nbytes:], index_bits, k, positions)
    for j in range(k):
        if positions[j] >= count:
            return 1
    out[:] = 0
    for j in range(k):
        out[positions[j]] = values[j]
    return 0
