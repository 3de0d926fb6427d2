"""The host path: a CPU tensor coded through numpy views and compiled loops, not torch ops.

Each torch op on a small CPU tensor costs a few microseconds of dispatch; an encode or
decode is a few dozen ops, so below a few thousand elements the fixed cost, not the data,
sets the time (a micro-batch of 8 x 256 floats crosses a cut hundreds of times a second). On
the host path a tensor is read through a zero-copy ``.numpy()`` view (float16 and bfloat16
widened to float32, exactly) and its payload written by numpy and the compiled loops of
``kernels``; the wire format is the one the torch path writes, and a codec's guarantees
hold on both paths. Every codec with a host path takes it up to ``HOST_MAX`` elements;
``quantize``'s and ``hadamard``'s encodes and the decodes of ``quantize``, ``sortquant``,
``lloydmax`` and ``hadamard`` up to ``COMPILED_MAX`` (a few compiled passes each, on one
core), ``powersgd``'s up to its ``COMPILED_MAX``; ``lloydmax`` and ``sortquant``, whose
host paths sort the values where their default torch paths build grids, encode on the host
up to their own limits (``lloydmax.SORTED_FIT_MAX``, ``sortquant.EXACT_BELOW``). CUDA
tensors, and larger ones, take the torch path.

Shape legend: N elements.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from .bitpack import pack_host, packed_nbytes, unpack_host
from .kernels import LOOKUP_WIDTHS, lookup_codes

if TYPE_CHECKING:
    from .packet import Packet

__all__ = ["HOST_MAX", "COMPILED_MAX", "on_host", "compiled_on", "host_payload",
           "new_host_payload", "lookup_host", "compiled_decode"]

#: Elements of a CPU tensor (16 KiB of float32) up to which codecs take the host path.
HOST_MAX = 1 << 12
#: Elements of a CPU tensor (4 MiB of float32) up to which a decode's lookup and the packing
#: of codes run in the compiled one-pass loops (``kernels``) at any size; above it,
#: torch's kernels, which use every thread torch is given.
COMPILED_MAX = 1 << 20


def on_host(numel: int, device: torch.device) -> bool:
    """Whether a tensor of ``numel`` elements on ``device`` takes the host path."""
    return device.type == "cpu" and numel <= HOST_MAX


def compiled_on(numel: int, device: torch.device) -> bool:
    """Whether codes of a tensor of ``numel`` elements on ``device`` are packed and looked
    up by the compiled loops (``COMPILED_MAX``)."""
    return device.type == "cpu" and numel <= COMPILED_MAX


def compiled_decode(packet: Packet, decode: Callable[..., int], *args: object) -> torch.Tensor | None:
    """A whole-payload compiled decode (``kernels.levels_decode``, ``kernels.codebook_decode``:
    ``decode(raw, count, *args, out) -> 0``, or 1 where the payload is wrong) of a CPU float32
    or float64 packet of up to ``COMPILED_MAX`` elements: the tensor, or None where it does
    not apply or the payload is wrong (the caller's own checks then word what is wrong)."""
    numel = packet.shape.numel()
    if not (compiled_on(numel, packet.payload.device) and packet.dtype in (torch.float32, torch.float64)):
        return None
    out = np.empty(numel, dtype=np.float32 if packet.dtype == torch.float32 else np.float64)
    if decode(packet.payload.numpy(), numel, *args, out) != 0:
        return None
    return torch.from_numpy(out).reshape(packet.shape)


def host_payload(head: bytes, codes: np.ndarray, bits: int) -> torch.Tensor:
    """``head`` followed by ``codes`` [N] packed at ``bits`` bits: a CPU uint8 payload."""
    payload, segment = new_host_payload(head, codes.size, bits)
    pack_host(codes, bits, segment)
    return torch.from_numpy(payload)


def new_host_payload(head: bytes, count: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """A payload with ``head`` written and room for ``count`` codes of ``bits`` bits:
    (payload, its codes segment), uint8 numpy arrays."""
    payload = np.empty(len(head) + packed_nbytes(count, bits), dtype=np.uint8)
    payload[:len(head)] = np.frombuffer(head, dtype=np.uint8)
    return payload, payload[len(head):]


def lookup_host(table: torch.Tensor, packed: np.ndarray, bits: int, count: int) -> torch.Tensor:
    """A decode's gather on the host: ``table[codes]`` for ``count`` codes of ``bits`` bits
    packed in ``packed`` (uint8 numpy). table: [2**bits] CPU tensor of the output dtype
    -> [count]. float32 and float64 at ``LOOKUP_WIDTHS`` bits: one compiled pass from the
    packed bytes (``kernels.lookup_codes``); else the codes unpacked, then gathered."""
    if table.dtype in (torch.float32, torch.float64) and bits in LOOKUP_WIDTHS:
        values = table.numpy()
        return torch.from_numpy(lookup_codes(values, packed, bits, count, np.empty(count, dtype=values.dtype)))
    return torch.index_select(table, 0, torch.from_numpy(unpack_host(packed, bits, count)))
