"""``quantize``: uniform min-max quantization to ``bits`` bits.

Every element x of a tensor with range [min, max] becomes the code
``q = round((x - min) / step)``, ``step = (max - min) / (2**bits - 1)``, and decodes to
``min + q * step``: ``|x - y| <= step / 2`` plus float32 rounding. Min, max and repeated
values (``exact.py``) decode bit-exactly; an element sharing a code with one of them is
within one step. A CPU tensor of up to ``host.COMPILED_MAX`` elements is coded on the host
in two compiled passes (``kernels.min_max``, ``kernels.quantize_codes``) and two small
compiled calls (the repeated values' search, the payload's head): the same payload, bit
for bit. Payload: the levels format (``levels.py``) with one bucket, i.e.
``12 + 10 * E + ceil(N * bits / 8)`` bytes, E exact entries (usually 1: the max).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .base import Compressor, check_int
from .exact import exact_candidates
from .bitpack import pack_host
from .exact import host_values
from .host import compiled_on
from .kernels import min_max, quantize_codes
from .levels import (F32_OVERFLOW, decode_levels, f32, float32_code, host_levels_payload, host_work, levels_head,
                     new_payload, write_codes)
from .packet import Packet
from .registry import register_compressor

__all__ = ["Quantize", "encode_uniform", "uniform_codes"]


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
        return decode_levels(self, packet, (0, 0))


def encode_uniform(codec: Compressor, flat: torch.Tensor, bits: int) -> torch.Tensor:
    """flat: [N] float, N >= 1 -> levels payload with one bucket; checks finiteness for codec.

    Scalars live on the host: one read of (min, max), a sampled search for repeated
    values, then one fused pass per chunk ``round((x - lo) * scale)`` (on the host path,
    ``host.py``, the same arithmetic compiled: the same codes).
    """
    host = host_values(flat) if compiled_on(flat.numel(), flat.device) else None
    if host is None:
        lo, hi = torch.stack(torch.aminmax(flat)).tolist()
    else:
        lo, hi = min_max(host)
    span = hi - lo
    codec.raise_if_nonfinite(flat, probe=span)
    top = (1 << bits) - 1
    lo_w = lo if flat.dtype == torch.float64 else f32(lo)  # exact in the work dtype
    scale = f32(top / span) if span > 0 else 0.0
    if not math.isfinite(scale):  # a span so small that 1 / span overflows float32
        scale = 0.0
    exact = exact_candidates(lo, hi, flat if host is None else host)
    codes = uniform_codes(exact, lo_w, scale, top, flat.dtype)
    # With a range finite in the work dtype, every rounded code is in 0..top already
    # (x - lo <= span, times top / span, each rounded once in the work dtype): no clamp
    # pass needed. A span past float32's max (finite values near +-3e38) makes x - lo
    # Inf for the top elements: clamped, they take the top code (the max's).
    finite = math.isfinite(span) and (flat.dtype == torch.float64 or span < F32_OVERFLOW)
    if host is not None:  # one compiled pass, straight into the payload up to 8 bits
        payload, segment = host_levels_payload(bits, 0, np.array([lo]), np.array([span / top]), codes, exact,
                                               flat.dtype, host.size)
        codes = segment if bits == 8 else np.empty(host.size, dtype=np.uint8 if bits < 8 else np.int32)
        work = np.float64 if host.dtype == np.float64 else np.float32  # work_dtype's
        quantize_codes(host, work(lo_w), work(scale), work(top), codes)  # Inf clamps to top
        if codes is not segment:
            pack_host(codes, bits, segment)
        return torch.from_numpy(payload)
    head = levels_head(bits, 0, [lo], [span / top], list(zip(codes.tolist(), exact.tolist())), flat.dtype)
    payload, segment = new_payload(flat.numel(), bits, head, flat.device)
    write_codes(flat, bits, lambda chunk: torch.sub(chunk, lo_w).mul_(scale), segment,
                clamp=not finite)
    return payload


def uniform_codes(values: np.ndarray, lo: float, scale: float, top: int,
                  dtype: torch.dtype) -> np.ndarray:
    """The codes ``encode_uniform`` gives elements equal to ``values``: [n] -> [n] int64.

    The same operations in the same dtype (``work_dtype``), each rounded once (no fused
    multiply-add anywhere), so a value's code here is bit for bit its elements' code. A few
    values (an exact table's) take Python floats: a float32 sum or product computed in
    float64 and rounded once to float32 is the float32 result (float64 carries more than
    twice float32's 24 bits), and ``round`` rounds half to even as ``np.rint`` does.
    """
    if values.size <= _SCALAR_VALUES:
        codes = [_uniform_code(v, lo, scale, top, dtype) for v in values.tolist()]
        if None not in codes:
            return np.asarray(codes, dtype=np.int64)
    with np.errstate(over="ignore"):  # a span past float32's max: Inf, clipped to top
        pos = (host_work(values, dtype) - host_work(lo, dtype)) * host_work(scale, dtype)
    return np.clip(np.rint(pos), 0, top).astype(np.int64)


#: Values up to which ``uniform_codes`` computes in Python floats instead of numpy.
_SCALAR_VALUES = 8


def _uniform_code(value: float, lo: float, scale: float, top: int, dtype: torch.dtype) -> int | None:
    """One value's code in Python floats, or None where the work dtype would overflow (or NaN):
    the numpy path handles those."""
    if dtype != torch.float64:
        return float32_code(value, lo, scale, top)
    pos = (value - lo) * scale
    return min(max(round(pos), 0), top) if abs(pos) < math.inf else None
