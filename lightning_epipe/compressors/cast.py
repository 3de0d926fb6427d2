"""``none``, ``fp16``, ``bf16``: raw bytes, or a cast to a 16-bit float on the wire.

Payload: the tensor's elements in C order as raw little-endian bytes of the wire dtype.
``encode`` may return a payload that shares memory with a contiguous input (no copy);
``decode`` returns fresh memory, so a receive buffer can be reused, unless the packet is
``owned`` (a received frame nobody reads again): then the tensor is a view of it.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from .base import Compressor, NonFiniteError
from .packet import Packet, bytes_as
from .registry import register_compressor

__all__ = ["NoCompression", "Fp16", "Bf16"]


@register_compressor
class NoCompression(Compressor):
    """The tensor's own bytes, any dtype (bool, integer, float, complex).

    Example:
        >>> c = NoCompression()
        >>> mask = torch.tensor([[True, False]])
        >>> torch.equal(c.decode(c.encode(mask)), mask)
        True
    """

    name = "none"
    codec_id = 0
    floats_only = False

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_complex():
            self.raise_if_nonfinite(x, probe=x.sum())
        elif x.is_floating_point():
            self.raise_if_nonfinite(x)
        return x.reshape(-1).view(torch.uint8)

    def _decode(self, packet: Packet) -> torch.Tensor:
        numel, itemsize = packet.shape.numel(), packet.dtype.itemsize
        self.expect_packet(packet, packet.payload.numel() == numel * itemsize,
                     f"{numel} values of {packet.dtype} take {numel * itemsize} bytes")
        values = bytes_as(packet.payload, packet.dtype)
        return (values if packet.owned else values.clone()).reshape(packet.shape)

    @property
    def lossless(self) -> bool:
        return True


class _Cast(Compressor):
    """A float tensor cast to ``wire`` for the trip and back to its dtype after.

    A finite value past the wire dtype's range would arrive as Inf: that raises
    :class:`NonFiniteError` whatever ``check_finite`` says (it governs the input's own
    NaN/Inf; the pipeline applies its ``nonfinite`` policy to either).
    """

    wire: ClassVar[torch.dtype]

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        self.raise_if_nonfinite(x)
        y = x.to(self.wire)
        if y.dtype != x.dtype and not bool(torch.isfinite(y.sum(dtype=torch.float32))):
            over = int((torch.isinf(y) & torch.isfinite(x)).sum())  # unchecked NaN/Inf of x stay as they are
            if over:
                raise NonFiniteError(
                    f"{self.name}: {over} of {x.numel()} values exceed the {self.wire} range "
                    f"(|x| > {torch.finfo(self.wire).max:g}; max |x| is "
                    f"{float(x.abs().max()):g}); use bf16, or quantize/sortquant")
        return y.reshape(-1).view(torch.uint8)

    def _decode(self, packet: Packet) -> torch.Tensor:
        numel, itemsize = packet.shape.numel(), self.wire.itemsize
        self.expect_packet(packet, packet.payload.numel() == numel * itemsize,
                     f"{numel} values of {self.wire} take {numel * itemsize} bytes")
        y = bytes_as(packet.payload, self.wire)
        if packet.dtype != self.wire:
            y = y.to(packet.dtype)
        elif not packet.owned:
            y = y.clone()
        return y.reshape(packet.shape)


@register_compressor
class Fp16(_Cast):
    """float16 on the wire (half of float32); values beyond +-65504 raise NonFiniteError.

    Example:
        >>> c = Fp16()
        >>> c.ratio(torch.ones(1000))
        0.506
    """

    name = "fp16"
    codec_id = 1
    wire = torch.float16


@register_compressor
class Bf16(_Cast):
    """bfloat16 on the wire: float32's range, 8 bits of mantissa.

    Example:
        >>> c = Bf16()
        >>> float(c.decode(c.encode(torch.tensor(1.0 + 2 ** -9))))
        1.0
    """

    name = "bf16"
    codec_id = 2
    wire = torch.bfloat16
