"""Piecewise-uniform levels: the wire format and kernels ``quantize`` and ``sortquant`` share.

``2**split`` buckets of ``2**Q`` codes each (``Q = bits - split``); code ``k * 2**Q + q``
stands for ``lo[k] + q * step[k]`` (float64 arithmetic, then the tensor's dtype), except
the codes of the exact table (``exact.py``), which stand for their exact values: the
tensor's max, repeated values. Uniform min-max quantization is ``split = 0``.

Payload (little-endian):

    [bits u8][split u8][E u8][0 u8] | lo: 2**split float32 | step: 2**split float32
    | exact table: E entries (``exact.py``) | codes: N codes of ``bits`` bits, packed
    exactly (``bitpack``)

Prefix and tables are built and parsed on the host (a few hundred bytes), so a call costs
a handful of tensor ops whatever the size; a CPU tensor is coded and decoded on the host
(``host.py``, ``kernels``: a few compiled calls), with the same codes. Decoding is one
table lookup per element (a table of ``2**bits`` values), no sort.
Shape legend: N elements, K = 2**split buckets, E exact entries.
"""

from __future__ import annotations

import functools
import math
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .base import Compressor
from .bitpack import gather_codes, pack_into, packed_nbytes
from .cache_blocks import cache_blocks
from .exact import MAX_ENTRIES, exact_bytes, exact_nbytes, parse_exact
from .host import compiled_decode, compiled_on, lookup_host, new_host_payload
from .kernels import levels_decode, levels_payload
from .packet import Packet, host_bytes
from .sampling import strided_sample

__all__ = ["Levels", "levels_nbytes", "levels_head", "host_levels_payload", "compiled_head", "new_payload",
           "write_codes", "read_levels", "lookup", "decode_levels", "cast_levels",
           "f32", "F32_OVERFLOW", "float32_code", "work_dtype", "host_work",
           "strided_sample"]

_PREFIX = 4


@dataclass(frozen=True)
class Levels:
    """A parsed levels payload: tables on the host, ``codes`` still packed."""

    bits: int
    split: int
    lo: np.ndarray           # [K] float32
    step: np.ndarray         # [K] float32
    exact_codes: np.ndarray  # [E] int64
    exact_values: np.ndarray  # [E] float64
    codes: torch.Tensor      # [packed_nbytes(N, bits)] uint8


def levels_nbytes(numel: int, bits: int, split: int, entries: int = 0) -> int:
    """Payload bytes: prefix, two float32 per bucket, ``entries`` exact entries, codes."""
    return _PREFIX + 8 * (1 << split) + exact_nbytes(entries) + packed_nbytes(numel, bits)


#: The smallest value that rounds to Inf in float32 (half an ulp above its max).
F32_OVERFLOW = 2.0 ** 128 - 2.0 ** 103


_F32 = struct.Struct("<f")


def f32(value: float) -> float:
    """``value`` rounded to the nearest float32 (as a Python float; past float32's range, an
    infinity of its sign, as numpy rounds it)."""
    try:
        return _F32.unpack(_F32.pack(value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def float32_code(value: float, lo: float, factor: float, top: int, divide: bool = False) -> int | None:
    """``clamp(rint((f32(value) - lo) * factor), 0, top)`` (``/ factor`` with ``divide``) in
    float32 arithmetic on Python floats, for float32 ``lo`` and ``factor``: a float32
    difference, product or quotient computed in float64 and rounded once to float32 is the
    float32 result (float64 carries more than twice float32's 24 bits), and ``round`` rounds
    half to even as ``np.rint`` does. None where a float32 step would overflow (or is NaN):
    the caller's numpy arithmetic handles those."""
    if not abs(value) < F32_OVERFLOW:
        return None
    diff = f32(value) - lo
    if not abs(diff) < F32_OVERFLOW:
        return None
    diff = f32(diff)
    pos = diff / factor if divide else diff * factor
    if not abs(pos) < F32_OVERFLOW:
        return None
    return min(max(round(f32(pos)), 0), top)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype codes are computed in: float64 for float64 tensors, float32 else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def host_work(value: float | np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """``value`` in the numpy dtype that ``work_dtype(dtype)`` computes in."""
    return np.asarray(value, dtype=np.float64 if dtype == torch.float64 else np.float32)


def cast_levels(values: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """float64 levels rounded to ``dtype``: [n] numpy -> [n] CPU tensor (numpy rounds to
    float32, torch to the 16-bit types; ``_rounded`` rounds one level the same way)."""
    if dtype == torch.float64:
        return torch.from_numpy(values)
    if dtype == torch.float32:
        return torch.from_numpy(values.astype(np.float32))
    return torch.from_numpy(values).to(dtype)


def levels_head(bits: int, split: int, lo: Sequence[float], step: Sequence[float],
                exact: Sequence[tuple[int, float]], dtype: torch.dtype) -> bytes:
    """Prefix, tables and exact table of a payload.

    lo, step: K floats (rounded to float32 here); exact: (code, value) pairs in order of
    priority: a code keeps its first value; codes whose computed level already rounds to
    the value are left out, and at most ``MAX_ENTRIES`` are kept.
    """
    lo32 = np.asarray(lo, dtype=np.float32)
    step32 = np.asarray(step, dtype=np.float32)
    q_bits = bits - split
    codes, values, seen = [], [], set()
    los, steps = lo32.tolist(), step32.tolist()
    for code, value in exact:
        if code in seen or len(codes) == MAX_ENTRIES:
            continue
        seen.add(code)
        k = code >> q_bits  # the level as lookup computes it, in float64, then rounded
        level = los[k] + (code & ((1 << q_bits) - 1)) * steps[k]
        if _rounded(level, dtype) != value:
            codes.append(int(code))
            values.append(float(value))
    return (bytes([bits, split, len(codes), 0]) + lo32.astype("<f4").tobytes()
            + step32.astype("<f4").tobytes() + exact_bytes(codes, values))


def compiled_head(dtype: torch.dtype) -> bool:
    """Whether the compiled loops write the head of a ``dtype`` tensor's payload
    (``kernels.levels_payload``): float32 and float64, whose levels they round as
    ``levels_head`` does, on a little-endian host (the wire's byte order)."""
    return dtype in (torch.float32, torch.float64) and sys.byteorder == "little"


def host_levels_payload(bits: int, split: int, lo: np.ndarray, step: np.ndarray, pair_codes: np.ndarray,
                        pair_values: np.ndarray, dtype: torch.dtype, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``levels_head``'s head in a fresh host payload with room for ``count`` codes:
    (payload, its codes segment), uint8 numpy arrays.

    lo, step: [K] float64; pair_codes [P] int64 and pair_values [P] float64: the exact
    pairs in order of priority. One compiled call for float32 and float64 tensors
    (``kernels.levels_payload``); the 16-bit dtypes' levels are rounded by ``levels_head``.
    """
    if compiled_head(dtype):
        payload, head = levels_payload(bits, split, lo, step, pair_codes, pair_values,
                                       dtype == torch.float32, count)
        return payload, payload[head:]
    head = levels_head(bits, split, lo, step, list(zip(pair_codes.tolist(), pair_values.tolist())), dtype)
    return new_host_payload(head, count, bits)


def _rounded(level: float, dtype: torch.dtype) -> float:
    """One float64 level rounded to ``dtype`` exactly as ``cast_levels`` rounds it."""
    if dtype == torch.float64:
        return level
    if dtype == torch.float32:
        return f32(level)
    if dtype == torch.float16:  # numpy rounds to float16 as torch does (to nearest even)
        return float(np.float16(level))
    return float(cast_levels(np.asarray([level]), dtype)[0])


def new_payload(numel: int, bits: int, head: bytes,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate a payload with ``head`` written: (payload, its codes segment)."""
    payload = torch.empty(len(head) + packed_nbytes(numel, bits), dtype=torch.uint8,
                          device=device)
    payload[:len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    return payload, payload[len(head):]


def write_codes(flat: torch.Tensor, bits: int, code_of: Callable[[torch.Tensor], torch.Tensor],
                out: torch.Tensor, clamp: bool = True) -> None:
    """Pack ``clamp(round(code_of(chunk)), 0, 2**bits - 1)`` for every chunk of ``flat``.

    flat: [N] float; code_of: [n] float32 (float64 for a float64 flat, see ``work_dtype``)
    -> fresh [n] of that dtype (unrounded codes);
    out: [packed_nbytes(N, bits)] uint8. ``clamp=False`` when code_of cannot leave the
    range once rounded (saves a pass over the chunk).
    """
    count, top = flat.numel(), (1 << bits) - 1
    work = work_dtype(flat.dtype)
    for start, stop in cache_blocks(count, flat.device):
        codes = code_of(flat[start:stop].to(work)).round_()
        if clamp:
            codes.clamp_(0, top)
        # float -> int32 -> uint8 is several times faster on CPU than float -> uint8.
        codes = codes.to(torch.int32)
        if bits == 8:
            out[start:stop] = codes  # one byte per code: narrow while copying
        else:
            pack_into(codes, bits, out, start, count)


def read_levels(codec: Compressor, packet: Packet) -> Levels:
    """Parse and check a levels payload against the packet's shape (what failed is worded only
    when a check fails, and small tables are checked as Python numbers: this runs once per
    received message)."""
    payload, numel = packet.payload, packet.shape.numel()
    size = payload.numel()
    if size < _PREFIX:
        codec.expect_packet(packet, False, f"shorter than the {_PREFIX}-byte prefix")
    bits, split, entries, pad = host_bytes(payload, _PREFIX).tolist()
    if not (2 <= bits <= 16 and 0 <= split < bits and pad == 0):
        codec.expect_packet(packet, False, f"prefix says bits={bits} split={split} (pad {pad}); expected "
                            "bits in 2..16, split in 0..bits-1, zero padding")
    expected = levels_nbytes(numel, bits, split, entries)
    if size != expected:
        codec.expect_packet(packet, False, f"{numel} codes of {bits} bits with split {split} and {entries} exact "
                            f"values take {expected} payload bytes")
    k = 1 << split
    head = _PREFIX + 8 * k + exact_nbytes(entries)
    raw = host_bytes(payload, head)[_PREFIX:]
    tables = raw[:8 * k].view("<f4")
    if not _tables_ok(tables, k):
        codec.expect_packet(packet, False, "bucket tables hold a non-finite value or a negative step")
    codes, values = parse_exact(raw[8 * k:], entries)
    if not _exact_ok(codes, values, bits):
        codec.expect_packet(packet, False, f"the exact table holds a non-finite value or a code past {(1 << bits) - 1}")
    return Levels(bits, split, tables[:k], tables[k:], codes, values, payload[head:])


#: Table entries up to which checks run on Python numbers (a numpy reduction costs more there).
_SMALL_TABLE = 32


def _tables_ok(tables: np.ndarray, k: int) -> bool:
    """tables: [2 K] float32 (lo, then step): all finite, every step >= 0."""
    if tables.size <= _SMALL_TABLE:
        numbers = tables.tolist()
        return all(map(math.isfinite, numbers)) and min(numbers[k:]) >= 0
    return bool(np.isfinite(tables).all() and (tables[k:] >= 0).all())


def _exact_ok(codes: np.ndarray, values: np.ndarray, bits: int) -> bool:
    """An exact table: finite values, codes below 2**bits."""
    if codes.size == 0:
        return True
    if codes.size <= _SMALL_TABLE:
        return all(map(math.isfinite, values.tolist())) and max(codes.tolist()) < (1 << bits)
    return bool(np.isfinite(values).all() and (codes < (1 << bits)).all())


@functools.lru_cache(maxsize=17)
def _steps(q_bits: int) -> np.ndarray:
    """[2**q_bits] float64: 0, 1, 2, ... (read only)."""
    steps = np.arange(1 << q_bits, dtype=np.float64)
    steps.flags.writeable = False
    return steps


def decode_levels(codec: Compressor, packet: Packet, splits: tuple[int, int]) -> torch.Tensor:
    """``read_levels`` then ``lookup``, with ``splits`` (least, most) the codec's range of
    split: a CPU float32 or float64 tensor in one compiled call (``kernels.levels_decode``),
    which only says whether the payload is right; where it is not (or another tensor), the
    parse here words what is wrong and the codec's own check words a split outside
    ``splits``."""
    decoded = compiled_decode(packet, levels_decode, splits[0], splits[1])
    if decoded is not None:
        return decoded
    levels = read_levels(codec, packet)
    codec.expect_packet(packet, splits[0] <= levels.split <= splits[1],
                        f"split is {levels.split}; {codec.name} uses {splits[0]}"
                        + ("" if splits[0] == splits[1] else f"..{splits[1]}"))
    return lookup(levels, packet.shape.numel(), packet.dtype, packet.shape)


def lookup(levels: Levels, numel: int, dtype: torch.dtype, shape: Sequence[int] | None = None) -> torch.Tensor:
    """Decode: [numel] of ``dtype`` (or ``shape``), each code replaced by its level (or exact value)."""
    q = _steps(levels.bits - levels.split)
    if levels.split == 0:  # one bucket: the same float64 arithmetic on scalars
        table = q * float(levels.step[0]) + float(levels.lo[0])  # [2**bits]
    else:
        table = (levels.lo.astype(np.float64)[:, None]
                 + q * levels.step.astype(np.float64)[:, None]).reshape(-1)  # [2**bits]
    if levels.exact_codes.size:
        table[levels.exact_codes] = levels.exact_values
    device = levels.codes.device
    if compiled_on(numel, device):  # one compiled pass (most widths), rounded by numpy, as cast_levels does
        out = lookup_host(cast_levels(table, dtype), levels.codes.numpy(), levels.bits, numel)
        return out if shape is None else out.reshape(shape)
    table = cast_levels(table, dtype)
    if device.type != "cpu":
        table = table.to(device)
    out = gather_codes(table, levels.codes, levels.bits, numel)
    return out if shape is None else out.reshape(shape)

