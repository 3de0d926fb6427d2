"""The wire format: one compressed tensor as a small fixed header plus a codec's payload.

Header layout (little-endian, ``16 + 8 * ndim`` bytes, always a multiple of 8 so that a
payload sliced out of a received buffer stays aligned for ``view(dtype)``):

    offset  size  field
    0       2     magic b"EP"
    2       1     format version (2; 2 added the exact-value table of levels payloads)
    3       1     codec id
    4       1     dtype code (see ``DTYPE_CODES``)
    5       1     ndim (at most ``MAX_NDIM``)
    6       2     reserved, zero
    8       8     payload byte count (unsigned)
    16      8*d   dims (signed, each >= 0)

No pickle: the header is parsed field by field and every field is checked.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Packet", "PacketError", "header_nbytes", "bytes_as", "host_bytes", "DTYPE_CODES", "MAX_NDIM",
           "KNOWN_CODEC_IDS"]

MAGIC = b"EP"
#: 2: levels payloads (quantize, sortquant, topk's values) carry an exact-value table.
VERSION = 2
MAX_NDIM = 32
_FIXED = struct.Struct("<2sBBBBHQ")  # magic, version, codec, dtype, ndim, reserved, payload bytes

# Append-only: a code, once used, keeps its meaning.
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.bool: 0,
    torch.uint8: 1,
    torch.int8: 2,
    torch.int16: 3,
    torch.int32: 4,
    torch.int64: 5,
    torch.float16: 6,
    torch.bfloat16: 7,
    torch.float32: 8,
    torch.float64: 9,
    torch.complex64: 10,
    torch.complex128: 11,
    torch.uint16: 12,
    torch.uint32: 13,
    torch.uint64: 14,
    torch.float8_e4m3fn: 15,
    torch.float8_e5m2: 16,
}
_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}

# Codec ids a packet may carry; filled by ``register_compressor``.
KNOWN_CODEC_IDS: set[int] = set()


class PacketError(ValueError):
    """Packet bytes that are corrupted, truncated, or do not match what decodes them."""


def header_nbytes(ndim: int) -> int:
    """Size of the header for a tensor of ``ndim`` dimensions."""
    return _FIXED.size + 8 * ndim


def bytes_as(segment: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret a 1-D uint8 ``segment`` as ``dtype`` (copying only if misaligned).

    segment: [k * itemsize] uint8 -> [k] dtype.
    """
    itemsize = dtype.itemsize
    if segment.numel() % itemsize:
        raise PacketError(f"{segment.numel()} bytes is not a whole number of {dtype} values")
    if segment.storage_offset() % itemsize:
        segment = segment.clone()
    return segment.view(dtype)


def host_bytes(payload: torch.Tensor, nbytes: int) -> np.ndarray:
    """The first ``nbytes`` of a uint8 payload on the host: a view on CPU, a copy else."""
    if payload.device.type == "cpu":
        return payload.numpy()[:nbytes]
    return payload[:nbytes].cpu().numpy()


@dataclass(frozen=True, eq=False)
class Packet:
    """One encoded tensor: what the codec needs to rebuild it, and nothing else.

    ``payload`` is a 1-D contiguous uint8 tensor on the device of the encoded tensor; any
    codebook, scale or index the codec needs lives in it. ``nbytes`` is the exact size on
    the wire. ``owned``: the payload's memory is the packet's alone (a received frame
    nobody reads again), so a codec may decode into a view of it instead of a copy.
    ``eq=False``: tensors do not compare to a single bool.

    Example:
        >>> p = Packet(codec=0, dtype=torch.float32, shape=torch.Size([2]),
        ...            payload=torch.zeros(8, dtype=torch.uint8))
        >>> p.nbytes, Packet.from_bytes(p.to_bytes()).shape
        (32, torch.Size([2]))
    """

    codec: int
    dtype: torch.dtype
    shape: torch.Size
    payload: torch.Tensor
    owned: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.codec, int) or not 0 <= self.codec <= 255:
            raise PacketError(f"codec id must be an int in 0..255, got {self.codec!r}")
        if self.dtype not in DTYPE_CODES:
            raise PacketError(f"dtype {self.dtype} has no wire code; known: {list(DTYPE_CODES)}")
        object.__setattr__(self, "shape", torch.Size(self.shape))
        if len(self.shape) > MAX_NDIM:
            raise PacketError(f"ndim {len(self.shape)} is more than the {MAX_NDIM} a header holds")
        p = self.payload
        if not (isinstance(p, torch.Tensor) and p.dtype == torch.uint8 and p.dim() == 1
                and p.is_contiguous()):
            raise PacketError("payload must be a 1-D contiguous uint8 tensor, got "
                              f"{type(p).__name__} {getattr(p, 'dtype', '')} "
                              f"{tuple(getattr(p, 'shape', ()))}")

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: header plus payload."""
        return header_nbytes(len(self.shape)) + self.payload.numel()

    def header(self) -> bytes:
        """The header as Python bytes."""
        fixed = _FIXED.pack(MAGIC, VERSION, self.codec, DTYPE_CODES[self.dtype],
                            len(self.shape), 0, self.payload.numel())
        return fixed + struct.pack(f"<{len(self.shape)}q", *self.shape)

    def to_bytes(self) -> torch.Tensor:
        """Header followed by payload: [nbytes] uint8 on the payload's device."""
        head = torch.frombuffer(bytearray(self.header()), dtype=torch.uint8)
        return torch.cat([head.to(self.payload.device), self.payload])

    @classmethod
    def from_bytes(cls, buf: torch.Tensor, owned: bool = False) -> Packet:
        """Parse ``to_bytes`` output; the payload is a view into ``buf`` (no copy). ``owned``:
        nothing else reads or reuses ``buf``, so the decoded tensor may share its memory.

        Raises PacketError naming the first field that does not check out.
        """
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 1:
            raise PacketError("a packet is a 1-D uint8 tensor, got "
                              f"{type(buf).__name__} {getattr(buf, 'dtype', '')} "
                              f"{tuple(getattr(buf, 'shape', ()))}")
        if buf.numel() < _FIXED.size:
            raise PacketError(f"packet of {buf.numel()} bytes is shorter than the "
                              f"{_FIXED.size}-byte fixed header")
        head_bytes = host_bytes(buf, _FIXED.size + 8 * MAX_NDIM)  # one view (one copy off an accelerator)
        magic, version, codec, dtype_code, ndim, reserved, payload_nbytes = _FIXED.unpack_from(head_bytes)
        if magic != MAGIC:
            raise PacketError(f"bad magic {magic!r}, expected {MAGIC!r}: not a packet")
        if version != VERSION:
            raise PacketError(f"packet format version {version}, this build reads {VERSION}")
        if codec not in KNOWN_CODEC_IDS:
            raise PacketError(f"unknown codec id {codec}; known ids: {sorted(KNOWN_CODEC_IDS)}")
        if dtype_code not in _DTYPES:
            raise PacketError(f"unknown dtype code {dtype_code}; known: 0..{max(_DTYPES)}")
        if ndim > MAX_NDIM:
            raise PacketError(f"ndim {ndim} is more than the maximum {MAX_NDIM}")
        if reserved:
            raise PacketError(f"reserved header bytes are {reserved:#06x}, expected 0")
        head = header_nbytes(ndim)
        if buf.numel() != head + payload_nbytes:
            raise PacketError(f"packet has {buf.numel()} bytes, header says {head} + "
                              f"{payload_nbytes} payload = {head + payload_nbytes}")
        dims = struct.unpack_from(f"<{ndim}q", head_bytes, _FIXED.size)
        if any(d < 0 for d in dims):
            raise PacketError(f"negative dimension in shape {list(dims)}")
        return cls._checked(codec, _DTYPES[dtype_code], torch.Size(dims), buf[head:], owned)

    @classmethod
    def _checked(cls, codec: int, dtype: torch.dtype, shape: torch.Size, payload: torch.Tensor,
                 owned: bool) -> Packet:
        """A packet of fields :meth:`from_bytes` has checked (the payload: a slice of a 1-D
        contiguous buffer), without checking them again: once per message received."""
        packet = object.__new__(cls)
        packet.__dict__.update(codec=codec, dtype=dtype, shape=shape, payload=payload, owned=owned)  # frozen: not setattr
        return packet
