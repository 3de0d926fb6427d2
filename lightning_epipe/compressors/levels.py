"""Piecewise-uniform levels: the wire format and kernels ``quantize`` and ``sortquant`` share.

``2**split`` buckets of ``2**Q`` codes each (``Q = bits - split``); code ``k * 2**Q + q``
stands for ``lo[k] + q * step[k]``. Uniform min-max quantization is ``split = 0``.

Payload (little-endian):

    [bits u8][split u8][0 u8][0 u8] | lo: 2**split float32 | step: 2**split float32
    | codes: N codes of ``bits`` bits, packed exactly (``bitpack``)

Decoding is one table lookup per element (a table of ``2**bits`` values), no sort.
Shape legend: N elements, K = 2**split buckets, G grid cells.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .base import Compressor
from .bitpack import pack_into, packed_nbytes, unpack_range
from .chunks import chunks
from .packet import Packet, bytes_as

__all__ = ["Levels", "levels_nbytes", "new_payload", "write_codes", "read_levels", "lookup",
           "affine_scale", "strided_sample"]

_PREFIX = 4
_GOLDEN = 0.6180339887498949


@dataclass(frozen=True)
class Levels:
    """A parsed levels payload: ``codes`` still packed."""

    bits: int
    split: int
    lo: torch.Tensor     # [K] float32
    step: torch.Tensor   # [K] float32
    codes: torch.Tensor  # [packed_nbytes(N, bits)] uint8


def levels_nbytes(numel: int, bits: int, split: int) -> int:
    """Payload bytes for ``numel`` codes: prefix, two float32 per bucket, packed codes."""
    return _PREFIX + 8 * (1 << split) + packed_nbytes(numel, bits)


def new_payload(numel: int, bits: int, split: int, lo: torch.Tensor,
                step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate a payload with prefix and tables written: (payload, its codes segment).

    lo, step: [K] on the target device; the codes segment is left for ``write_codes``.
    """
    k = 1 << split
    payload = torch.empty(levels_nbytes(numel, bits, split), dtype=torch.uint8,
                          device=lo.device)
    payload[:_PREFIX] = torch.tensor([bits, split, 0, 0], dtype=torch.uint8)
    payload[_PREFIX:_PREFIX + 4 * k] = lo.float().view(torch.uint8)
    payload[_PREFIX + 4 * k:_PREFIX + 8 * k] = step.float().view(torch.uint8)
    return payload, payload[_PREFIX + 8 * k:]


def write_codes(flat: torch.Tensor, bits: int, code_of: Callable[[torch.Tensor], torch.Tensor],
                out: torch.Tensor) -> None:
    """Pack ``clamp(round(code_of(chunk)), 0, 2**bits - 1)`` for every chunk of ``flat``.

    flat: [N] float; code_of: [n] float32 -> fresh [n] float32 (unrounded codes);
    out: [packed_nbytes(N, bits)] uint8.
    """
    count, top = flat.numel(), (1 << bits) - 1
    code_dtype = torch.uint8 if bits <= 8 else torch.int32
    for start, stop in chunks(count, flat.device):
        codes = code_of(flat[start:stop].float()).round_().clamp_(0, top)
        if bits == 8:
            out[start:stop] = codes  # one byte per code: convert while copying
        else:
            pack_into(codes.to(code_dtype), bits, out, start, count)


def read_levels(codec: Compressor, packet: Packet) -> Levels:
    """Parse and check a levels payload against the packet's shape."""
    payload, numel = packet.payload, packet.shape.numel()
    codec._expect(packet, payload.numel() >= _PREFIX, f"shorter than the {_PREFIX}-byte prefix")
    bits, split, pad0, pad1 = payload[:_PREFIX].tolist()
    codec._expect(packet, 2 <= bits <= 16 and 0 <= split < bits and pad0 == pad1 == 0,
                  f"prefix says bits={bits} split={split} (pad {pad0}, {pad1}); expected "
                  "bits in 2..16, split in 0..bits-1, zero padding")
    expected = levels_nbytes(numel, bits, split)
    codec._expect(packet, payload.numel() == expected,
                  f"{numel} codes of {bits} bits with split {split} take {expected} payload "
                  "bytes")
    k = 1 << split
    lo = bytes_as(payload[_PREFIX:_PREFIX + 4 * k], torch.float32)
    step = bytes_as(payload[_PREFIX + 4 * k:_PREFIX + 8 * k], torch.float32)
    codec._expect(packet, bool(torch.isfinite(lo).all() & (step >= 0).all()
                               & torch.isfinite(step).all()),
                  "bucket tables hold a non-finite value or a negative step")
    return Levels(bits, split, lo, step, payload[_PREFIX + 8 * k:])


def lookup(levels: Levels, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Decode: [numel] of ``dtype``, each code replaced by ``lo[k] + q * step[k]``."""
    q = torch.arange(1 << (levels.bits - levels.split), dtype=torch.float64,
                     device=levels.lo.device)
    table = (levels.lo.double()[:, None] + q * levels.step.double()[:, None]).reshape(-1)
    table = table.to(dtype)  # [2**bits]
    out = torch.empty(numel, dtype=dtype, device=table.device)
    for start, stop in chunks(numel, table.device):
        codes = unpack_range(levels.codes, levels.bits, numel, start, stop)
        torch.index_select(table, 0, codes, out=out[start:stop])
    return out


def affine_scale(lo: torch.Tensor, span: torch.Tensor,
                 units: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Map [lo, lo + span] onto [0, units]: (scale64, scale32, offset32), all 0-d.

    ``x * scale32 + offset32`` is the position of x in units; a zero span (or one so small
    that the float32 scale overflows) maps everything to 0. lo, span: 0-d float64.
    """
    scale = torch.where(span > 0, units / span, 0.0)
    scale32 = scale.float()
    scale32 = torch.where(torch.isfinite(scale32), scale32, 0.0)
    return scale32.double(), scale32, (-lo * scale32.double()).float()


def strided_sample(flat: torch.Tensor, size: int) -> torch.Tensor:
    """A deterministic spread-out sample: [N] -> [min(N, size)] (all of flat if smaller).

    Index i takes position ``floor(frac(i * golden) * N)``: evenly spread, never periodic,
    so it does not alias with rows or channels the way a fixed stride can.
    """
    count = flat.numel()
    if count <= size:
        return flat
    return flat[_sample_positions(count, size, flat.device)]


@functools.lru_cache(maxsize=16)
def _sample_positions(count: int, size: int, device: torch.device) -> torch.Tensor:
    """[size] int64 positions in range(count); cached: a stream sends one shape over and over."""
    i = torch.arange(size, dtype=torch.float64, device=device)
    return ((i * _GOLDEN) % 1.0 * count).long()
