"""``sortquant``: the report's sort quantization, bit-packed exactly.

The values are cut into ``K = 2**split`` buckets of equal count (by rank), and each bucket
is quantized uniformly with ``Q = bits - split`` bits between its own ends; the code is
``bucket * 2**Q + q``. Dense regions get fine steps, outliers cost one bucket, not the
resolution of all the others. Payload: the levels format (``levels.py``), i.e.
``4 + 8 * K`` bytes of tables, ``10 * E`` bytes of exact values (``exact.py``: the max and
repeated values, where their level is not already exact; with exact boundaries the
repeated values are counted in the sorted tensor, every element) plus ``ceil(N * bits / 8)``
bytes of codes. Decoding is a table lookup, no sort. An element sharing a code with an
exact value is within a step of its bucket instead of half a step.

Two ways to find the buckets (``boundaries``):

- ``"exact"`` (also every CPU tensor of at most ``EXACT_BELOW`` elements): a stable sort,
  on the host for CPU tensors of up to ``EXACT_HOST_MAX`` elements (a sort of the values,
  then each element's rank bucket by comparison with the bucket starts, compiled); bucket k
  holds ranks ``[ceil(k N / K), ceil((k+1) N / K))``, so counts differ by at most one
  even with ties, and bucket k spans ``[min_k, max_k]`` with ``2**Q`` levels:
  ``|x - y| <= step_k / 2``. On the torch path 60-130x the time of uniform quantization
  on 2 CPU cores (the sort; ``benchmarks/compressors.py``).
- ``"estimated"`` (default): no sort. A uniform grid of ``GRID`` cells spans
  [min, max]; each of the K-1 boundaries goes on the grid line nearest to its quantile
  in a strided sample of ``SAMPLE`` elements (a partial sort of the sample, O(M)). Each
  element then finds its bucket and code by one multiply-add, a lookup in two per-cell
  tables and one more multiply-add: 2-4x the time of uniform quantization, with
  relative error within a few percent of exact (often below). Buckets are contiguous
  here: bucket k spans ``[edge_k, edge_{k+1}]`` with ``2**Q`` steps (the last with
  ``2**Q - 1``, ending on max), so an element rounding up lands on code 0 of the next
  bucket, which has its value: ``|x - y| <= step / 2`` of the bucket it lies in. Counts
  are equal up to sampling error and the grid; ties fall in one bucket.

Shape legend: N elements, K buckets, G grid cells, M sampled elements.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import torch

from .base import Compressor, check_int
from .bitpack import pack, pack_host
from .exact import MAX_SPIKES, exact_candidates, host_values, repeated_run
from .kernels import CHAIN_BUCKETS, sort_values, sortquant_codes, sortquant_payload, sortquant_tables
from .levels import (compiled_head, decode_levels, f32, host_levels_payload, host_work, levels_head, new_payload,
                     work_dtype, write_codes)
from .sampling import strided_sample
from .packet import Packet
from .registry import register_compressor

__all__ = ["SortQuant", "default_split", "GRID", "SAMPLE", "EXACT_BELOW", "EXACT_BELOW_OTHERWISE", "EXACT_HOST_MAX"]

#: Cells of the uniform grid that estimated boundaries are snapped to.
GRID = 1 << 16
#: Elements sampled for the boundaries' quantiles (all of them for smaller tensors): a
#: quantile's rank is then off by ~0.5% of N (1 / sqrt(SAMPLE)), which moves the
#: relative error of 8 bits by under 1% of itself (randn, ReLU, Student-t 3).
SAMPLE = 1 << 13
#: CPU tensors of at most this many elements take exact boundaries, found on the host
#: (``_encode_small``), where the estimated path's fixed cost (its two per-cell tables of
#: ``GRID`` cells, the sample's partial sort) is more than a sort: 8 bits at 32768 ReLU or
#: normal values ~0.5-0.6x its time; the two cross between 65536 and 131072 elements.
EXACT_BELOW = 1 << 15
#: The same for tensors on an accelerator (copied to the host and back) and for more than
#: 8 buckets (found by a binary search per element, slower than the estimated path above).
EXACT_BELOW_OTHERWISE = 1 << 12
#: ``boundaries="exact"`` on a CPU tensor of at most this many elements (and at most 8
#: buckets) takes the host path too: the same payload as the torch path's stable sort, bit for
#: bit, in 1/6-1/7 of its time (8 bits, ReLU values, 2 torch threads: 1.0 against 6.1 ms at
#: 2**16 elements, 3.0 against 21.8 at 2**18, 16.6 against 108 at 2**20).
EXACT_HOST_MAX = 1 << 20
BOUNDARIES = ("estimated", "exact")


def default_split(bits: int) -> int:
    """The report's 3:1 split of bits into S bucket bits: 8 -> 2, 12 -> 3, 16 -> 4, 4 -> 1."""
    return max(1, round(bits / 4))


@register_compressor
class SortQuant(Compressor):
    """Equal-count buckets, each quantized uniformly; ``bits`` in 2..16, ``split`` S bits.

    Example:
        >>> c = SortQuant(bits=8)   # split=2: 4 buckets of 64 levels
        >>> x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
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
        if self._small(flat):
            return self._encode_small(flat)
        if self.boundaries == "exact":
            return self._encode_exact(flat)
        return self._encode_estimated(flat)

    def _small(self, flat: torch.Tensor) -> bool:
        """Whether ``flat`` takes exact boundaries on the host (``EXACT_BELOW``, and
        ``EXACT_HOST_MAX`` where exact boundaries were asked for)."""
        if flat.device.type != "cpu" or (1 << self.split) > CHAIN_BUCKETS:
            return flat.numel() <= EXACT_BELOW_OTHERWISE
        return flat.numel() <= (EXACT_HOST_MAX if self.boundaries == "exact" else EXACT_BELOW)

    def _decode(self, packet: Packet) -> torch.Tensor:
        return decode_levels(self, packet, (1, 15))  # split 0: a quantize payload

    def _encode_exact(self, flat: torch.Tensor) -> torch.Tensor:
        """Stable sort, rank buckets, per-bucket [min, max] with 2**Q - 1 steps."""
        self.raise_if_nonfinite(flat)
        count, buckets, q_bits = flat.numel(), 1 << self.split, self.bits - self.split
        values, order = torch.sort(flat, stable=True)                           # [N]
        starts = _starts(count, buckets)
        lo, step = _bucket_tables(host_values(values[torch.tensor(_ends(starts),
                                                                   device=flat.device)]),
                                  starts, q_bits)
        tables = torch.from_numpy(np.stack([lo, np.where(step > 0, step, 1.0)])).float()
        bucket = _bucket_of_rank(count, buckets, flat.device)                    # [N]
        tables = tables.to(flat.device)[:, bucket]                               # [2, N]
        q = torch.sub(values.float(), tables[0]).div_(tables[1]).round_().clamp_(
            0, (1 << q_bits) - 1)
        sorted_codes = q.int().add_(bucket.int() << q_bits)                      # [N]
        codes = torch.empty_like(sorted_codes)
        codes[order] = sorted_codes
        first, last = float(values[0]), float(values[-1])
        exact = exact_candidates(first, last, flat, ordered=values)
        probe = torch.from_numpy(exact).to(device=flat.device, dtype=values.dtype)
        runs = zip(torch.searchsorted(values, probe).tolist(),
                   torch.searchsorted(values, probe, right=True).tolist())
        pairs = _exact_in_runs(exact.tolist(), runs, starts, lambda at: sorted_codes[
            torch.tensor(at, device=flat.device)].tolist())
        head = levels_head(self.bits, self.split, lo, step, pairs, flat.dtype)
        payload, segment = new_payload(count, self.bits, head, flat.device)
        pack(codes, self.bits, out=segment)
        return payload

    def _encode_small(self, flat: torch.Tensor) -> torch.Tensor:
        """``_encode_exact`` on the host: a sort of the values (``kernels.sort_values``, a
        radix sort for float32), then one compiled call (``kernels.sortquant_payload``: the
        exact values, the bucket tables, the head and every element's code, its bucket by
        comparison with the values at the bucket starts, no argsort; the ties across a start
        take the buckets of their ranks), written straight into the payload at 8 bits. The
        16-bit dtypes, whose levels ``levels_head`` rounds, take the same compiled steps one
        call at a time. Same payload as the torch path, bit for bit."""
        count, buckets, q_bits = flat.numel(), 1 << self.split, self.bits - self.split
        x = host_values(flat)                                                    # [N]
        values = sort_values(x)                                                  # [N]
        first, last = float(values[0]), float(values[-1])
        self.raise_if_nonfinite(flat, probe=last - first)  # NaN sorts last
        starts = _starts_array(count, buckets)                                   # [K+1]
        run = repeated_run(count)
        if compiled_head(flat.dtype):
            payload, head, codes = sortquant_payload(x, values, starts, self.bits, self.split, run, MAX_SPIKES,
                                                     flat.dtype == torch.float32)
            segment = payload[head:]
        else:
            exact = exact_candidates(first, last, x, ordered=values)
            lo, step, lo32, step32, pair_codes, pair_values = sortquant_tables(values, starts, q_bits, exact)
            payload, segment = host_levels_payload(self.bits, self.split, lo, step, pair_codes, pair_values,
                                                   flat.dtype, count)
            codes = segment if self.bits == 8 else np.empty(count, dtype=np.int32)  # [N]
            sortquant_codes(x, values, starts, lo32, step32, q_bits, codes)
        if self.bits != 8:
            pack_host(codes, self.bits, segment)
        return torch.from_numpy(payload).to(flat.device)

    def _encode_estimated(self, flat: torch.Tensor) -> torch.Tensor:
        """Boundaries from a sample's quantiles, snapped to a uniform grid; a per-cell affine map."""
        count, buckets, q_bits = flat.numel(), 1 << self.split, self.bits - self.split
        lo, hi = torch.stack(torch.aminmax(flat)).tolist()
        span = hi - lo
        self.raise_if_nonfinite(flat, probe=span)
        lo_w = lo if flat.dtype == torch.float64 else f32(lo)  # exact in the work dtype
        scale = f32(GRID / span) if span > 0 else 0.0
        if not math.isfinite(scale) or scale == 0.0:  # constant, or a span below ~1e-34
            head = levels_head(self.bits, self.split, [lo] * buckets, [0.0] * buckets,
                               [(0, lo)], flat.dtype)
            payload, segment = new_payload(count, self.bits, head, flat.device)
            segment.zero_()
            return payload

        def grid_position(chunk: torch.Tensor) -> torch.Tensor:
            return torch.sub(chunk, lo_w).mul_(scale)  # two roundings, as uniform_codes

        sample = strided_sample(flat, SAMPLE).to(work_dtype(flat.dtype))
        edges = _sampled_edges(grid_position(sample), buckets)
        width = np.diff(edges)                                                   # [K]
        # Bucket k maps cells [edge_k, edge_k+1] onto codes [k 2**Q, (k+1) 2**Q] (the top
        # bucket onto 2**Q - 1 steps, ending on the last code at max): per cell, the
        # code is u * slope + intercept for grid position u.
        steps_in = np.full(buckets, float(1 << q_bits))
        steps_in[-1] -= 1
        slope = np.where(width > 0, steps_in / np.maximum(width, 1), 0.0).astype(np.float32)
        intercept = (np.arange(buckets) * float(1 << q_bits) - edges[:-1] * slope.astype(
            np.float64)).astype(np.float32)
        # Per cell slope and intercept; one more cell for u = G exactly (the max): u is in
        # [0, G (1 + 3 eps)], so the cell needs no clamp.
        cells_of = np.append(width[:-1], width[-1] + 1)
        slope_of = _per_cell(slope, cells_of, flat.device)                       # [G + 1]
        intercept_of = _per_cell(intercept, cells_of, flat.device)               # [G + 1]

        def code_of(chunk: torch.Tensor) -> torch.Tensor:
            u = grid_position(chunk)                                 # grid position in [0, G]
            cells = u.to(torch.int32)
            # mul then add, two roundings (no fused addcmul): the host's codes of exact values match
            return u.mul_(slope_of.index_select(0, cells)).add_(intercept_of.index_select(0, cells))

        exact = exact_candidates(lo, hi, flat)
        u = (host_work(exact, flat.dtype) - host_work(lo_w, flat.dtype)) * host_work(
            scale, flat.dtype)
        k = np.minimum(np.searchsorted(edges, u.astype(np.int64), "right") - 1, buckets - 1)
        codes = np.clip(np.rint(u * slope[k] + intercept[k]), 0, (1 << self.bits) - 1)
        cell_size = 1 / scale
        lo_k = lo + edges[:-1] * cell_size
        step_k = np.where(width > 0, width * cell_size / steps_in, 0.0)
        head = levels_head(self.bits, self.split, lo_k, step_k,
                           list(zip(codes.astype(np.int64).tolist(), exact.tolist())),
                           flat.dtype)
        payload, segment = new_payload(count, self.bits, head, flat.device)
        write_codes(flat, self.bits, code_of, segment)
        return payload


def _sampled_edges(position: torch.Tensor, buckets: int) -> np.ndarray:
    """Bucket edges in grid cells: the grid lines nearest to the quantiles k / K of a
    sample (ranks ``ceil(k M / K)``, found by a partial sort on the host).
    position: [M] grid positions in [0, GRID] -> [K+1] int64 from 0 to GRID, non-decreasing.
    """
    m = position.numel()
    ranks = [min((k * m + buckets - 1) // buckets, m - 1) for k in range(1, buckets)]
    quantiles = np.partition(position.cpu().numpy(), ranks)[ranks]              # [K-1]
    inner = np.clip(np.rint(quantiles), 0, GRID).astype(np.int64)
    return np.concatenate([[0], inner, [GRID]])


def _per_cell(values: np.ndarray, cells_of: np.ndarray, device: torch.device) -> torch.Tensor:
    """Value k repeated ``cells_of[k]`` times: [K] float32 -> [sum(cells_of)] on device.

    numpy's repeat on CPU (about 20x faster there than ``repeat_interleave`` for a grid of
    65537 cells), ``repeat_interleave`` on the device elsewhere.
    """
    if device.type == "cpu":
        return torch.from_numpy(np.repeat(values, cells_of))
    return torch.from_numpy(values).to(device).repeat_interleave(
        torch.from_numpy(cells_of).to(device), output_size=int(cells_of.sum()))


@functools.lru_cache(maxsize=16)
def _bucket_of_rank(count: int, buckets: int, device: torch.device) -> torch.Tensor:
    """[count] int64: the bucket of each rank (ranks ``[ceil(k N / K), ceil((k+1) N / K))``
    are bucket k); cached: a stream sends one shape over and over."""
    rank = torch.arange(count, device=device)
    return (rank * buckets) // count


@functools.lru_cache(maxsize=16)
def _starts(count: int, buckets: int) -> tuple[int, ...]:
    """[K+1] first ranks of the buckets: bucket k holds ranks [ceil(k N / K), ceil((k+1) N / K));
    cached: a stream sends one shape over and over."""
    return tuple((k * count + buckets - 1) // buckets for k in range(buckets + 1))


def _ends(starts: tuple[int, ...]) -> list[int]:
    """[2K] ranks of each bucket's first element, then of each bucket's last."""
    count = starts[-1]
    return [min(s, count - 1) for s in starts[:-1]] + [max(s - 1, 0) for s in starts[1:]]


@functools.lru_cache(maxsize=16)
def _starts_array(count: int, buckets: int) -> np.ndarray:
    """``_starts`` as a read-only int64 array [K+1]; cached."""
    starts = np.asarray(_starts(count, buckets), dtype=np.int64)
    starts.flags.writeable = False
    return starts


def _bucket_tables(ends: np.ndarray, starts: tuple[int, ...],
                   q_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(lo [K], step [K]) float64 from the sorted values at ``_ends(starts)`` [2K]; an empty
    bucket (fewer elements than buckets) gets lo 0 and step 0."""
    k, top = len(starts) - 1, (1 << q_bits) - 1
    ends = ends.astype(np.float64)
    lo, step = ends[:k], (ends[k:] - ends[:k]) / top
    if starts[-1] < k:
        empty = np.diff(starts) == 0
        lo[empty], step[empty] = 0.0, 0.0
    return lo, step


def _exact_in_runs(exact: list[float], runs, starts: tuple[int, ...],
                   codes_at: Callable[[list[int]], list[int]]) -> list[tuple[int, float]]:
    """(code, value) pairs for exact values of a sorted tensor.

    The elements equal to v are a run [a, b) of the sorted values; within a bucket they
    share one code, so the run's codes are those at a and at each bucket start inside it.
    runs: (a, b) per value; codes_at: ranks -> codes of the sorted elements there.
    """
    at, of = [], []
    for v, (a, b) in zip(exact, runs):
        for rank in [a, *(s for s in starts if a < s < b)]:
            at.append(rank)
            of.append(v)
    return list(zip(codes_at(at), of)) if at else []
