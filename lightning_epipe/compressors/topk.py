"""``topk``: keep the largest-magnitude fraction, send their values and positions.

Payload (little-endian):

    [dense u8][value_bits u8][index_bits u8][0 u8][k uint32]
    | values: k raw values of the tensor's dtype, or (value_bits > 0) a one-bucket levels
      payload (``quantize``) of k codes
    | positions: k indices of ``index_bits = bit_length(N - 1)`` bits, packed (sparse only)

``k = ceil(fraction * N)``. When k values and positions would cost at least as much as
all N values sent the same way, all N are sent instead (``dense``, k = N, no positions),
with a warning once per stream: it is smaller and exact.

Which k: the largest magnitudes, NaN counted as large as infinity, and among magnitudes
equal to the k-th largest the lowest positions, so every device and path writes the same
payload. A CPU tensor of up to ``host.COMPILED_MAX`` elements is selected by a compiled
radix select (``kernels.largest_positions``: three passes over N, which also count any
NaN/Inf), its float32/float64 payloads decoded in one compiled call (``kernels.sparse_decode``);
other tensors by torch ops (``_largest``).
"""

from __future__ import annotations

import math
import struct
import warnings

import numpy as np
import torch

from .base import Compressor, check_int
from .bitpack import pack, packed_nbytes, unpack
from .exact import host_values
from .host import compiled_decode, compiled_on, host_payload
from .kernels import largest_positions, sparse_decode
from .levels import decode_levels, levels_nbytes, strided_sample
from .packet import Packet, bytes_as, host_bytes
from .quantize import encode_uniform
from .registry import register_compressor

__all__ = ["TopK"]

_PREFIX = struct.Struct("<BBBBI")
#: Magnitudes sampled to pick a candidate threshold before the exact top-k.
SAMPLE = 1 << 16


@register_compressor
class TopK(Compressor):
    """The ``fraction`` of entries largest in magnitude; the rest decode to zero.

    ``bits`` (2..16) quantizes the kept values uniformly (top-k then quantize, as in the
    report); None sends them in the tensor's dtype.

    Example:
        >>> c = TopK(fraction=0.25)
        >>> x = torch.tensor([0.1, -3.0, 0.2, 2.0, 0.0, 0.3, -0.1, 0.05])
        >>> c.decode(c.encode(x)).tolist()
        [0.0, -3.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]
    """

    name = "topk"
    codec_id = 5

    def __init__(self, *, fraction: float = 0.1, bits: int | None = None,
                 check_finite: bool = True) -> None:
        super().__init__(check_finite=check_finite)
        if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                or not 0 < fraction <= 1):
            raise ValueError(f"{self.name}: fraction must be a number in (0, 1], the share "
                             f"of entries kept, got {fraction!r}")
        self.fraction = fraction
        self.bits = None if bits is None else check_int(self.name, "bits", bits, 2, 16,
                                                        " or None (values unquantized)")
        self._warned_dense = False

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1)
        count = flat.numel()
        if count >= 1 << 32:
            raise ValueError(f"{self.name} sends positions as uint32: {count} elements is "
                             "too many; split the tensor")
        k = min(count, math.ceil(self.fraction * count))
        index_bits = max(1, (count - 1).bit_length())
        sparse_nbytes = self._values_nbytes(k, x.dtype) + packed_nbytes(k, index_bits)
        dense_nbytes = self._values_nbytes(count, x.dtype)
        if sparse_nbytes < dense_nbytes:
            if compiled_on(count, flat.device):
                return self._encode_host(flat, k, index_bits)
            self.raise_if_nonfinite(flat)
            positions = _largest(flat, k, finite=self.check_finite)
            return torch.cat([self._prefix(False, k, index_bits, x.device),
                              self._values(flat[positions]), pack(positions, index_bits)])
        self.raise_if_nonfinite(flat)
        if not self._warned_dense and k < count:
            warnings.warn(f"{self.name}(fraction={self.fraction}): {k} of {count} values with "
                          f"{index_bits}-bit positions cost {sparse_nbytes} bytes, no less "
                          f"than all {count} values ({dense_nbytes} bytes); sending all. "
                          "Lower the fraction to compress.", stacklevel=3)
            self._warned_dense = True
        return torch.cat([self._prefix(True, count, index_bits, x.device), self._values(flat)])

    def _decode(self, packet: Packet) -> torch.Tensor:
        """A CPU float32 or float64 tensor in one compiled call (``kernels.sparse_decode``),
        which only says whether the payload is right; where it is not (or another tensor), the
        checks below word what is wrong."""
        decoded = compiled_decode(packet, sparse_decode)
        if decoded is not None:
            return decoded
        payload, count, dtype = packet.payload, packet.shape.numel(), packet.dtype
        self.expect_packet(packet, payload.numel() >= _PREFIX.size,
                     f"shorter than the {_PREFIX.size}-byte prefix")
        dense, value_bits, index_bits, pad, k = _PREFIX.unpack(host_bytes(payload, _PREFIX.size).tobytes())
        expected_index_bits = max(1, (count - 1).bit_length())
        self.expect_packet(packet, dense in (0, 1) and pad == 0 and index_bits == expected_index_bits
                     and (value_bits == 0 or 2 <= value_bits <= 16)
                     and (k == count if dense else 1 <= k <= count),
                     f"prefix says dense={dense} value_bits={value_bits} "
                     f"index_bits={index_bits} k={k} (pad {pad}); expected index_bits="
                     f"{expected_index_bits}, value_bits 0 or 2..16, k in 1..{count}")
        values_nbytes = k * dtype.itemsize
        if value_bits:  # a levels payload: its exact-table size is in its prefix
            entries = payload[_PREFIX.size + 2:_PREFIX.size + 3]
            values_nbytes = levels_nbytes(k, value_bits, 0, int(entries) if entries.numel() else 0)
        index_nbytes = 0 if dense else packed_nbytes(k, index_bits)
        expected = _PREFIX.size + values_nbytes + index_nbytes
        self.expect_packet(packet, payload.numel() == expected,
                     f"{k} values and {0 if dense else k} positions take {expected} bytes")
        segment = payload[_PREFIX.size:_PREFIX.size + values_nbytes]
        if value_bits == 0:
            values = bytes_as(segment, dtype).clone()
        else:
            inner = Packet(self.codec_id, dtype, torch.Size([k]), segment)
            values = decode_levels(self, inner, (0, 0))  # a quantize payload: one compiled call on CPU
        if dense:
            return values.reshape(packet.shape)
        positions = unpack(payload[_PREFIX.size + values_nbytes:], index_bits, k).long()
        self.expect_packet(packet, int(positions.max()) < count,
                     f"a position is {int(positions.max())}, beyond {count} elements")
        out = torch.zeros(count, dtype=dtype, device=payload.device)
        out[positions] = values
        return out.reshape(packet.shape)

    def _encode_host(self, flat: torch.Tensor, k: int, index_bits: int) -> torch.Tensor:
        """A sparse payload of a CPU tensor [N] written on the host: the selection's positions
        (which also count NaN/Inf for the finiteness check), the values, the packed positions."""
        host = host_values(flat)                                                  # [N] float32/float64
        positions = np.empty(k, dtype=np.int64)                                   # [k] ascending
        if largest_positions(host, k, positions):
            self.raise_if_nonfinite(flat)  # a NaN or Inf: the check words it, unless told to send it
        exact = flat.dtype in (torch.float32, torch.float64)  # else host holds widened values
        kept = torch.from_numpy(host[positions]) if exact else flat[torch.from_numpy(positions)]
        head = _PREFIX.pack(False, self.bits or 0, index_bits, 0, k)
        return host_payload(head + self._values(kept).numpy().tobytes(), positions, index_bits)

    def _prefix(self, dense: bool, k: int, index_bits: int, device: torch.device) -> torch.Tensor:
        head = _PREFIX.pack(dense, self.bits or 0, index_bits, 0, k)
        return torch.frombuffer(bytearray(head), dtype=torch.uint8).to(device)

    def _values(self, values: torch.Tensor) -> torch.Tensor:
        """[k] values -> their bytes: raw, or a levels payload when ``bits`` is set."""
        if self.bits is None:
            return values.reshape(-1).view(torch.uint8)
        return encode_uniform(self, values, self.bits)

    def _values_nbytes(self, count: int, dtype: torch.dtype) -> int:
        return count * dtype.itemsize if self.bits is None else levels_nbytes(count, self.bits, 0)


def _largest(flat: torch.Tensor, k: int, finite: bool = False) -> torch.Tensor:
    """Positions of the k entries of largest magnitude: [N] -> [k] int64 ascending, by the
    module's rule (NaN as infinity; at the k-th largest magnitude, the lowest positions).
    ``finite``: flat is known to hold no NaN (one pass fewer).

    A threshold from a strided sample keeps a few more than k candidates (4 standard
    deviations of the sample count), among which the exact k-th largest is found: a few
    times cheaper than a selection over N. If sampling misjudged and fewer than k pass the
    threshold, or the tensor is no larger than the sample, the selection runs over all N.
    """
    magnitude = flat.abs()
    if not finite:  # ``finite``: the caller has checked that flat holds no NaN
        magnitude = torch.nan_to_num(magnitude, nan=math.inf, posinf=math.inf)
    count = flat.numel()
    if count > SAMPLE:
        sample = strided_sample(magnitude, SAMPLE)
        m = sample.numel()
        expected = k * m / count
        keep = min(m, math.ceil(expected + 4 * math.sqrt(expected) + 8))
        threshold = sample.kthvalue(m - keep + 1).values       # the keep-th largest of the sample
        candidates = (magnitude >= threshold).nonzero().squeeze(1)
        if candidates.numel() >= k:
            return candidates[_first_largest(magnitude[candidates], k)]
    return _first_largest(magnitude, k)


def _first_largest(magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """magnitude: [C] without NaN, k <= C -> [k] ascending indices of the k largest, the lowest
    indices among those equal to the k-th largest."""
    kth = magnitude.kthvalue(magnitude.numel() - k + 1).values
    above = magnitude > kth
    ties = magnitude == kth
    room = k - above.sum()
    return (above | (ties & (ties.cumsum(0) <= room))).nonzero().squeeze(1)
