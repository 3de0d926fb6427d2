"""``sortquant``: the report's sort quantization, bit-packed exactly.

The values are cut into ``K = 2**split`` buckets of equal count (by rank), and each bucket
is quantized uniformly with ``Q = bits - split`` bits between its own ends; the code is
``bucket * 2**Q + q``. Dense regions get fine steps, outliers cost one bucket, not the
resolution of all the others. Payload: the levels format (``levels.py``), i.e.
``4 + 8 * K`` bytes of tables plus ``ceil(N * bits / 8)`` bytes of codes. Decoding is a
table lookup, no sort.

Two ways to find the buckets (``boundaries``):

- ``"exact"``: a stable sort; bucket k holds ranks ``[ceil(k N / K), ceil((k+1) N / K))``,
  so counts differ by at most one even with ties, and bucket k spans
  ``[min_k, max_k]`` with ``2**Q`` levels: ``|x - y| <= step_k / 2``. 60-130x the time
  of uniform quantization on 2 CPU cores (the sort; ``benchmarks/compressors.py``).
- ``"estimated"`` (default): no sort. A uniform grid of ``GRID`` cells spans
  [min, max]; a histogram of a strided sample of ``SAMPLE`` elements on that grid puts
  each of the K-1 boundaries on the grid line nearest (in rank) to its quantile. Each
  element then finds its bucket and code by one multiply-add, a lookup in a per-cell
  table and one more multiply-add: 2-4x the time of uniform quantization, with
  relative error within a few percent of exact (often below). Buckets are contiguous
  here: bucket k spans ``[edge_k, edge_{k+1}]`` with ``2**Q`` steps (the last with
  ``2**Q - 1``, ending on max), so an element rounding up lands on code 0 of the next
  bucket, which has its value: ``|x - y| <= step / 2`` of the bucket it lies in. Counts
  are equal up to sampling error and the grid; ties fall in one bucket.

Shape legend: N elements, K buckets, G grid cells, M sampled elements.
"""

from __future__ import annotations

import torch

from .base import Compressor, check_int
from .bitpack import pack
from .levels import (affine_scale, lookup, new_payload, read_levels, strided_sample,
                     write_codes)
from .packet import Packet
from .registry import register_compressor

__all__ = ["SortQuant", "default_split", "GRID", "SAMPLE"]

#: Cells of the uniform grid that estimated boundaries are snapped to.
GRID = 1 << 16
#: Elements sampled for the boundary histogram (all of them for smaller tensors).
SAMPLE = 1 << 16
BOUNDARIES = ("estimated", "exact")


def default_split(bits: int) -> int:
    """The report's 3:1 split of bits into S bucket bits: 8 -> 2, 12 -> 3, 16 -> 4, 4 -> 1."""
    return max(1, round(bits / 4))


@register_compressor
class SortQuant(Compressor):
    """Equal-count buckets, each quantized uniformly; ``bits`` in 2..16, ``split`` S bits.

    Example:
        >>> c = SortQuant(bits=8)   # split=2: 4 buckets of 64 levels
        >>> x = torch.randn(10_000)
        >>> p = c.encode(x)
        >>> p.nbytes, float((c.decode(p) - x).norm() / x.norm()) < 0.02
        (10060, True)
    """

    name = "sortquant"
    codec_id = 4

    def __init__(self, *, bits: int = 8, split: int | None = None,
                 boundaries: str = "estimated", check_finite: bool = True) -> None:
        super().__init__(check_finite=check_finite)
        self.bits = check_int(self.name, "bits", bits, 2, 16)
        if split is None:
            split = default_split(bits)
        self.split = check_int(self.name, "split", split, 1, bits - 1,
                               f" for bits={bits} (2**split buckets of 2**(bits - split) "
                               "levels; the report's 3:1 is the default)")
        if boundaries not in BOUNDARIES:
            raise ValueError(f"{self.name}: boundaries must be one of {BOUNDARIES}, "
                             f"got {boundaries!r}")
        self.boundaries = boundaries

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1)
        if self.boundaries == "exact":
            return self._encode_exact(flat)
        return self._encode_estimated(flat)

    def _decode(self, packet: Packet) -> torch.Tensor:
        levels = read_levels(self, packet)
        self._expect(packet, levels.split >= 1, "split is 0; that is a quantize payload")
        return lookup(levels, packet.shape.numel(), packet.dtype).reshape(packet.shape)

    def _encode_exact(self, flat: torch.Tensor) -> torch.Tensor:
        """Stable sort, rank buckets, per-bucket [min, max] with 2**Q - 1 steps."""
        self._check_finite(flat)
        count, buckets, q_bits = flat.numel(), 1 << self.split, self.bits - self.split
        values, order = torch.sort(flat, stable=True)
        values = values.float()
        starts = torch.tensor([(k * count + buckets - 1) // buckets for k in range(buckets + 1)],
                              device=flat.device)                               # [K+1] ranks
        sizes = starts.diff()
        first, last = starts[:-1].clamp(max=count - 1), (starts[1:] - 1).clamp(min=0)
        filled = sizes > 0
        lo = torch.where(filled, values[first].double(), 0.0)                   # [K]
        step = torch.where(filled, values[last].double() - lo, 0.0) / ((1 << q_bits) - 1)
        bucket = torch.repeat_interleave(torch.arange(buckets, device=flat.device), sizes)
        safe_step = torch.where(step > 0, step, 1.0).float()
        q = ((values - lo.float()[bucket]) / safe_step[bucket]).round_().clamp_(
            0, (1 << q_bits) - 1)
        codes = torch.empty(count, dtype=torch.int32, device=flat.device)
        codes[order] = (bucket << q_bits).int() + q.int()
        payload, segment = new_payload(count, self.bits, self.split, lo, step)
        pack(codes, self.bits, out=segment)
        return payload

    def _encode_estimated(self, flat: torch.Tensor) -> torch.Tensor:
        """Boundaries from a sampled histogram on a uniform grid; a per-cell affine map."""
        count, buckets, q_bits = flat.numel(), 1 << self.split, self.bits - self.split
        low, high = torch.aminmax(flat)
        lo = low.double()
        span = high.double() - lo
        self._check_finite(flat, probe=span)
        scale64, scale, offset = affine_scale(lo, span, GRID)

        # Bucket edges in grid cells: the grid lines nearest, in rank, to the sample's
        # quantiles k / K. edges [K+1], from 0 to GRID.
        sample = strided_sample(flat, SAMPLE).float()                              # [M]
        sample_cells = torch.addcmul(offset, sample, scale).long().clamp_(0, GRID - 1)
        below = torch.bincount(sample_cells, minlength=GRID).cumsum(0)           # [G]
        m = sample.numel()
        ranks = torch.tensor([(k * m + buckets - 1) // buckets for k in range(1, buckets)],
                             device=flat.device)                                  # [K-1]
        cell = torch.searchsorted(below, ranks, right=True).clamp_(max=GRID - 1)
        before = torch.where(cell > 0, below[(cell - 1).clamp(min=0)], 0)
        nearer_end = (below[cell] - ranks) < (ranks - before)
        edges = torch.cat([cell.new_zeros(1), cell + nearer_end, cell.new_full((1,), GRID)])
        width = edges.diff()                                                       # [K]

        # Bucket k maps cells [edge_k, edge_k+1] onto codes [k 2**Q, (k+1) 2**Q] (the top
        # bucket onto 2**Q - 1 steps, ending on the last code at max): per cell, the
        # code is u * slope + intercept for grid position u.
        steps_in = torch.full((buckets,), float(1 << q_bits), dtype=torch.float64,
                              device=flat.device)
        steps_in[-1] -= 1
        slope = torch.where(width > 0, steps_in / width.clamp(min=1), 0.0)       # [K]
        first_code = torch.arange(buckets, device=flat.device) * float(1 << q_bits)
        intercept = first_code - edges[:-1] * slope
        table = torch.stack([slope, intercept], 1).float().repeat_interleave(
            width, dim=0, output_size=GRID)                                     # [G, 2]
        table = table.view(torch.float64).reshape(-1)  # [G] (slope, intercept) float32 pairs

        def code_of(chunk: torch.Tensor) -> torch.Tensor:
            u = torch.addcmul(offset, chunk, scale)                  # grid position in [0, G]
            cells = u.to(torch.int32).clamp_(0, GRID - 1)
            slope_intercept = table.index_select(0, cells).view(torch.float32).view(-1, 2)
            return torch.addcmul(slope_intercept[:, 1], u, slope_intercept[:, 0], out=u)

        cell_size = torch.where(scale64 > 0, 1 / scale64, 0.0)
        lo_k = lo + edges[:-1] * cell_size
        step_k = torch.where(width > 0, width * cell_size / steps_in, 0.0)
        payload, segment = new_payload(count, self.bits, self.split, lo_k, step_k)
        write_codes(flat, self.bits, code_of, segment)
        return payload
