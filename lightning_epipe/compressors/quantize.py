"""``quantize``: uniform min-max quantization to ``bits`` bits.

Every element x of a tensor with range [min, max] becomes the code
``q = round((x - min) / step)``, ``step = (max - min) / (2**bits - 1)``, and decodes to
``min + q * step``: ``|x - y| <= step / 2`` plus float32 rounding. Payload: the levels
format (``levels.py``) with one bucket, i.e. 12 bytes + ``ceil(N * bits / 8)``.
"""

from __future__ import annotations

import torch

from .base import Compressor, check_int
from .levels import affine_scale, lookup, new_payload, read_levels, write_codes
from .packet import Packet
from .registry import register_compressor

__all__ = ["Quantize", "encode_uniform"]


@register_compressor
class Quantize(Compressor):
    """Uniform min-max quantization, ``bits`` in 2..16.

    Example:
        >>> c = Quantize(bits=8)
        >>> x = torch.linspace(-1, 1, 1000)
        >>> bool((c.decode(c.encode(x)) - x).abs().max() <= 1 / 255 + 1e-6)
        True
    """

    name = "quantize"
    codec_id = 3

    def __init__(self, *, bits: int = 8, check_finite: bool = True) -> None:
        super().__init__(check_finite=check_finite)
        self.bits = check_int(self.name, "bits", bits, 2, 16)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        return encode_uniform(self, x.reshape(-1), self.bits)

    def _decode(self, packet: Packet) -> torch.Tensor:
        levels = read_levels(self, packet)
        self._expect(packet, levels.split == 0, f"split is {levels.split}, quantize uses 0")
        return lookup(levels, packet.shape.numel(), packet.dtype).reshape(packet.shape)


def encode_uniform(codec: Compressor, flat: torch.Tensor, bits: int) -> torch.Tensor:
    """flat: [N] float, N >= 1 -> levels payload with one bucket; checks finiteness for codec."""
    low, high = torch.aminmax(flat)
    lo = low.double()
    span = high.double() - lo
    codec._check_finite(flat, probe=span)
    top = (1 << bits) - 1
    _, scale, offset = affine_scale(lo, span, top)
    payload, codes = new_payload(flat.numel(), bits, 0, lo[None], (span / top)[None])
    write_codes(flat, bits, lambda chunk: torch.addcmul(offset, chunk, scale), codes)
    return payload
