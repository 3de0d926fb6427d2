"""Exact bit packing: N codes of ``width`` bits take ``ceil(N * width / 8)`` bytes.

Layout (the wire format of every packed code array), for ``width = 8 * F + R``:

- F byte planes: plane p holds byte p of every code (N bytes each).
- then, if R > 0, the top R bits of every code: groups of ``G = 8 / gcd(R, 8)`` codes
  fill ``G * R / 8`` bytes exactly, code i of a group at bit ``i * R`` of the
  little-endian group; the last group is zero-padded and its unused bytes are not sent.

So 12-bit codes cost 1.5 bytes each: N low bytes, then N nibbles. The layout is split at
any code position that is a multiple of 8, which lets callers pack and unpack chunk by
chunk (``pack_into``, ``unpack_range``) while the codes are still in cache. The torch path
is vectorized (a Python loop runs over the planes and the at most 8 columns of a group,
never over codes); the host path (``pack_host``, ``unpack_host``) is one compiled pass.
Widths 1, 2 and 4 decode straight to values (``lookup_packed``): one gather per byte from a
table of the values of every byte's codes.

Example:
    >>> codes = torch.tensor([1, 2, 3, 4, 5])
    >>> packed = pack(codes, 3)
    >>> packed.numel(), unpack(packed, 3, 5).tolist()
    (2, [1, 2, 3, 4, 5])
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .cache_blocks import cache_blocks
from .kernels import pack_codes, unpack_codes

__all__ = ["pack", "unpack", "pack_into", "unpack_range", "packed_nbytes", "pack_host",
           "unpack_host", "lookup_packed", "gather_codes", "BYTE_WIDTHS", "MAX_WIDTH", "HOST_CODES"]

MAX_WIDTH = 32
#: Codes up to which ``pack`` and ``unpack`` of CPU tensors run on the host (``pack_host``,
#: ``unpack_host``: the same layout in one compiled pass instead of a few dozen tensor ops;
#: above it, torch's kernels, which use every thread torch is given). 4 MiB of int32 codes.
HOST_CODES = 1 << 20


def packed_nbytes(count: int, width: int) -> int:
    """Bytes that ``count`` codes of ``width`` bits take."""
    return (count * width + 7) // 8


def pack(codes: torch.Tensor, width: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """codes: [N] integers in [0, 2**width) -> [packed_nbytes(N, width)] uint8, same device.

    Values outside the range lose their high bits; callers clamp first. ``out``: a
    [packed_nbytes(N, width)] uint8 tensor to write into (e.g. a slice of a payload).
    """
    _check_width(width)
    codes = codes.reshape(-1)
    count = codes.numel()
    if out is None:
        out = torch.empty(packed_nbytes(count, width), dtype=torch.uint8, device=codes.device)
    elif out.numel() != packed_nbytes(count, width):
        raise ValueError(f"out has {out.numel()} bytes; {count} codes of {width} bits take "
                         f"{packed_nbytes(count, width)}")
    if count <= HOST_CODES and codes.device.type == "cpu" and out.device.type == "cpu":
        pack_host(codes.numpy(), width, out.numpy())
        return out
    for start, stop in cache_blocks(count, codes.device):
        pack_into(codes[start:stop], width, out, start, count)
    return out


def unpack(data: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """data: [packed_nbytes(count, width)] uint8 -> [count] int32 (int64 for width 32)."""
    _check_width(width)
    if data.dim() != 1 or data.numel() != packed_nbytes(count, width):
        raise ValueError(f"{count} codes of {width} bits take {packed_nbytes(count, width)} "
                         f"bytes, got {data.numel()}")
    if count <= HOST_CODES and data.device.type == "cpu":
        return torch.from_numpy(unpack_host(data.numpy(), width, count))
    out = torch.empty(count, dtype=_code_dtype(width), device=data.device)
    for start, stop in cache_blocks(count, data.device):
        out[start:stop] = unpack_range(data, width, count, start, stop)
    return out


def pack_into(codes: torch.Tensor, width: int, out: torch.Tensor, start: int,
              count: int) -> None:
    """Write the codes at positions [start, start + len(codes)) of an array of ``count``.

    codes: [k] integers; out: [packed_nbytes(count, width)] uint8; start: a multiple of 8.
    """
    stop = start + codes.numel()
    planes, rest = divmod(width, 8)
    for p in range(planes):
        plane = codes if p == 0 and codes.dtype == torch.uint8 else (codes >> (8 * p)) & 0xFF
        out[p * count + start: p * count + stop] = plane
    if rest:
        top = codes >> (8 * planes) if planes else codes
        group, group_bytes, word_dtype = _layout(rest)
        cols = _pad(top.to(word_dtype), group).view(-1, group)
        word = cols[:, 0].clone()
        for i in range(1, group):
            word |= cols[:, i] << (i * rest)
        if group_bytes > 1:
            word = torch.stack([(word >> (8 * j)) & 0xFF for j in range(group_bytes)], dim=1)
        base = planes * count + start * rest // 8
        out[base: planes * count + packed_nbytes(stop, rest)] = (
            word.reshape(-1)[: packed_nbytes(stop - start, rest)])


def unpack_range(data: torch.Tensor, width: int, count: int, start: int,
                 stop: int) -> torch.Tensor:
    """The codes at positions [start, stop) (start a multiple of 8) of ``count`` packed codes.

    data: [packed_nbytes(count, width)] uint8 -> [stop - start] int32 (int64 for width 32).
    """
    out_dtype = _code_dtype(width)
    planes, rest = divmod(width, 8)
    codes = None
    for p in range(planes):
        plane = data[p * count + start: p * count + stop].to(out_dtype)
        codes = plane if codes is None else codes.bitwise_or_(plane << (8 * p))
    if rest:
        group, group_bytes, word_dtype = _layout(rest)
        segment = data[planes * count + start * rest // 8: planes * count
                       + packed_nbytes(stop, rest)]
        cols = _pad(segment, group_bytes).view(-1, group_bytes).to(word_dtype)
        word = cols[:, 0].clone()
        for j in range(1, group_bytes):
            word |= cols[:, j] << (8 * j)
        mask = (1 << rest) - 1
        top = torch.stack([(word >> (i * rest)) & mask for i in range(group)], dim=1)
        top = top.reshape(-1)[: stop - start].to(out_dtype)
        codes = top if codes is None else codes.bitwise_or_(top << (8 * planes))
    return codes


def pack_host(codes: np.ndarray, width: int, out: np.ndarray) -> None:
    """``pack`` on the host (one compiled pass, ``kernels.pack_codes``; same layout): codes
    [N] integers in [0, 2**width) -> out [packed_nbytes(N, width)] uint8, written in place."""
    pack_codes(codes, width, out)


def unpack_host(data: np.ndarray, width: int, count: int) -> np.ndarray:
    """``unpack`` on the host (``kernels.unpack_codes``): data [packed_nbytes(count, width)]
    uint8 -> [count] int32 (int64 for width 32)."""
    return unpack_codes(data, width, count, np.empty(count, dtype=np.int64 if width > 31 else np.int32))


#: Widths whose codes fill whole bytes, several a byte: :func:`lookup_packed` reads a byte's codes at once.
BYTE_WIDTHS = (1, 2, 4)


def lookup_packed(table: torch.Tensor, data: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """``table[codes]`` for ``count`` codes of ``width`` bits (``BYTE_WIDTHS``) packed in ``data``.

    table: [2**width]; data: [packed_nbytes(count, width)] uint8 on table's device
    -> [count] of table's dtype. Each byte holds ``8 / width`` codes (code i at bit
    ``i * width``), so a table of the values of every byte's codes ([256, 8 / width]) turns
    the decode into one gather per byte: no codes array, no shifts per code.
    """
    if width not in BYTE_WIDTHS:
        raise ValueError(f"lookup_packed reads widths {BYTE_WIDTHS}, got {width!r}")
    per_byte = 8 // width
    values = table.index_select(0, _byte_codes(width, table.device)).view(256, per_byte)   # [256, 8 / width]
    out = torch.empty(data.numel() * per_byte, dtype=table.dtype, device=table.device)
    rows = out.view(-1, per_byte)
    for start, stop in cache_blocks(data.numel(), data.device):
        torch.index_select(values, 0, data[start:stop].to(torch.int32), out=rows[start:stop])
    return out[:count]


def gather_codes(table: torch.Tensor, data: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """``table[codes]`` for ``count`` codes of ``width`` bits packed in ``data`` (the torch path of
    a decode): one gather per byte for ``BYTE_WIDTHS`` (:func:`lookup_packed`), else the codes
    unpacked and gathered cache block by cache block.

    table: [2**width]; data: [packed_nbytes(count, width)] uint8 on table's device -> [count] of table's dtype.
    """
    if width in BYTE_WIDTHS:
        return lookup_packed(table, data, width, count)
    out = torch.empty(count, dtype=table.dtype, device=table.device)
    for start, stop in cache_blocks(count, data.device):
        torch.index_select(table, 0, unpack_range(data, width, count, start, stop), out=out[start:stop])
    return out


@functools.lru_cache(maxsize=16)
def _byte_codes(width: int, device: torch.device) -> torch.Tensor:
    """[256 * 8 / width] int64: the codes of every byte value, in the order they are packed; cached."""
    shifts = torch.arange(0, 8, width)
    return ((torch.arange(256)[:, None] >> shifts) & ((1 << width) - 1)).reshape(-1).to(device)


def _code_dtype(width: int) -> torch.dtype:
    return torch.int64 if width > 31 else torch.int32


def _layout(width: int) -> tuple[int, int, torch.dtype]:
    """(codes per group, bytes per group, integer dtype holding a group) for width < 8."""
    group = 8 // math.gcd(width, 8)
    bits = group * width
    word_dtype = torch.uint8 if bits <= 8 else torch.int32 if bits < 32 else torch.int64
    return group, bits // 8, word_dtype


def _pad(t: torch.Tensor, multiple: int) -> torch.Tensor:
    """t: [N] -> [ceil(N / multiple) * multiple], zero-padded at the end."""
    extra = -t.numel() % multiple
    return torch.cat([t, t.new_zeros(extra)]) if extra else t


def _check_width(width: int) -> None:
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"width must be an integer in 1..{MAX_WIDTH}, got {width!r}")
