"""``lloydmax``: a 1-D k-means (Lloyd-Max) scalar quantizer fitted on a histogram.

``L = 2**bits`` levels minimize the squared error of a sample of the tensor; each element
is coded as (nearly always) its nearest level. Lower error than uniform min-max
(``quantize``) and equal-count buckets (``sortquant``) at the same bits, no sort of a
large tensor, and decoding is one table lookup per element.

Fit of a tensor above ``SORTED_FIT_MAX`` elements (cost independent of N from there; G
cells, ``SAMPLE`` elements, ``L`` levels):

1. ``lo, hi = aminmax(x)``; a uniform grid of G cells spans [lo, hi]: 4 per element,
   1024 to ``GRID`` (``grid.grid_size``), so a small tensor pays for a small grid.
2. Spikes: values repeated in at least ``1/(2L)`` of a ``SPIKE_SAMPLE``-element sample
   (ReLU zeros, a ReLU6 ceiling, a clamp, masked entries; the ``L/2`` most frequent at
   most) get a level pinned at exactly that value, which Lloyd never moves. So a tie
   costs one level, not several, and decodes exactly. From ``PIN_ENDS_FROM`` levels (4
   bits) the tensor's min and max are pinned too, so they decode exactly.
3. A histogram of a strided sample of ``256 L`` elements (at most ``SAMPLE``:
   ``sampling.fit_sample_size``) on the grid, without the
   spikes: per cell a count and the sum of the values, so a cell stands for its mean.
4. Initial free levels: equal-weight quantiles of the non-empty cells, each sampled value
   weighted by ``density**(-2/3)`` (the density from the ``NEIGHBOURS`` nearest non-empty
   cells on either side), i.e. at the high-resolution optimal point density ``p**(1/3)``
   (Panter-Dite). Plain equal-count quantiles leave the tails too coarse for Lloyd to
   repair in a few steps: normal data, 8 bits, 20 steps: 1.8e-2 relative error, worse
   than ``quantize``'s 1.1e-2; from this start, 8 steps: 6.8e-3. A cell heavier than a
   quantile step is hit by several quantiles; it keeps one level and the quantiles are
   recomputed with more targets until every free level has a cell of its own (or every
   cell has a level: then the levels are the cell means, exact for few distinct values).
5. ``iterations`` weighted Lloyd steps on the non-empty cells: boundaries at the
   midpoints of the sorted levels, each free level moves to the mean of the cells
   nearest to it (prefix sums and ``searchsorted``: O(L log E) per step; it stops early
   when no level moves). A level left without cells keeps its value (it stays sorted
   between its neighbours): after step 4 that only happens when there are fewer
   distinct cells than levels, and then every cell already has a level of its own.

CPU tensors of at most ``SORTED_FIT_MAX`` elements (an accelerator's up to
``DEVICE_SORTED_FIT_MAX``: one copy each way) take the host path: no grid, compiled
(``kernels``); each distinct value of the sorted fit sample is a cell of its own (steps
2-5 on the sorted values, ``kernels.fit_levels_sorted``) and each element is coded as its nearest
level. The fit sample
(``fit_sample``) is the whole tensor up to the torch path's sample size (``256 L``, at least
8192); above it, the torch path's strided sample for the bulk, each sampled value weighted
by the elements it stands for, and every value beyond the sample's ``TAIL_RANKS``-th from
either end. A 4-bit encode of 128 KiB of ReLU activations takes 0.64x of the time fitted
on every value (``benchmarks/README.md``, section 5), and the test suite holds Student-t
values (a heavy tail) within 3% of that fit's error at 2-6 bits. Same payload format, same
pinned values.
An accelerator's tensor is copied to the host and its payload back: on a GPU the grid fit
is hundreds of small kernels and dozens of synchronizations a call, milliseconds whatever
the size (``benchmarks/README.md``, section 5).

Encode: a table of G codes, for each grid cell the level nearest to the cell's
centre; an element costs a subtraction and a multiplication to find its cell and one
table lookup (the speed trick of ``sortquant``'s estimated mode). That is the nearest
level except for elements of a cell that a boundary between two levels cuts; there the
level nearest the centre is taken, so the error of any element is at most its distance
to the nearest level plus about one cell width ``(hi - lo) / G`` (on the benchmark
tensors 0.05-0.5% of elements, which changes the relative error by under 0.01%). The
grid cell of a pinned level codes that level, so a spike decodes exactly (the other
elements of that cell are within a cell width of it).

Payload (little-endian)::

    [bits u8][0 u8][0 u8][0 u8] | codebook: L float32, sorted | codes: N codes of
    ``bits`` bits, packed exactly (``bitpack``)

i.e. ``4 + 4 * 2**bits + ceil(N * bits / 8)`` bytes. ``bits`` is 1..8: the codebook is
``4 * 2**bits`` bytes (1 KiB at 8 bits, but 16 KiB at 12), and 256 levels are already
fitted on ~256 sampled values each; more levels would mostly fit sampling noise.

Measured (``python benchmarks/compressors.py --full``, 2 threads, idle machine;
``results/compressors.json``; relative L2 error, encode ms):

    tensor                     bits   quantize        sortquant       lloydmax
    relu6 [32, 32, 112, 112]   4      5.8e-2   8.4    1.2e-1  20.2    4.9e-2  13.6
    relu6 [32, 32, 112, 112]   8      3.4e-3   4.8    7.8e-3  17.0    2.9e-3  12.1
    its gradient               4      6.1e-1   8.3    5.9e-1  19.7    1.6e-1  13.7
    its gradient               8      3.9e-2   4.7    5.4e-2  16.8    1.2e-2  11.8
    gelu [8, 128, 768]         4      1.3e-1   0.7    2.1e-1   1.8    7.1e-2   2.3
    gelu [8, 128, 768]         8      8.5e-3   0.3    1.5e-2   1.4    4.4e-3   2.5

Encoding takes 1.6-7.6x the time of ``quantize`` (the fit costs about the same whatever
N, so the ratio is highest for small tensors); decoding about the time of ``quantize``.

Shape legend: N elements, L levels, G grid cells, M sampled elements, E non-empty cells,
P pinned levels.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import Compressor, check_int
from .bitpack import gather_codes, pack_host, pack_into, packed_nbytes
from .cache_blocks import cache_blocks
from .exact import host_values
from .grid import GRID, Grid, grid_size
from .host import compiled_decode, compiled_on, host_payload, lookup_host
from .kernels import codebook_decode, lloydmax_codes, sort_values, tail_fit_values
from .levels import F32_OVERFLOW
from .sampling import fit_sample_size, strided_sample
from .packet import Packet, bytes_as, host_bytes
from .registry import register_compressor

__all__ = ["LloydMax", "Grid", "fit_levels", "cell_codes", "lloydmax_nbytes", "GRID", "SAMPLE",
           "SPIKE_SAMPLE", "NEIGHBOURS"]

#: Elements sampled for the histogram at most (``256 L``; all of them for smaller tensors).
SAMPLE = 1 << 16
#: Elements of that sample searched for repeated values (spikes).
SPIKE_SAMPLE = 1 << 12
#: Non-empty cells on either side that the density for the initial levels is taken over.
NEIGHBOURS = 8
MIN_BITS, MAX_BITS = 1, 8
MAX_ITERATIONS = 100
#: Levels from which the min and max are pinned levels (decoded exactly); below, two
#: levels spent on two elements cost too much (Gaussian, relative error: 3 bits 1.3x,
#: 1 bit 6x; 4 bits 1.1x, 8 bits 1.0x).
PIN_ENDS_FROM = 16
#: CPU tensors up to this many elements (1 MiB of float32) take the host path: fitted on
#: sorted values on the host, which costs less than the grid's fixed cost up to here (the grid
#: is 4 cells per element; its histogram, code table and scans run over all of it). Encode +
#: decode of ReLU activations, one thread, against the grid fit
#: (``benchmarks/results/compressors_overhead_host_fit.json``): 4 bits 0.11x at 256 KiB and
#: 0.22x at 1 MiB, 8 bits 0.31x and 0.90x. Each element takes its nearest level, and the fit
#: sees every value beyond the sample's tails (the grid's cells are coarse in a heavy tail).
SORTED_FIT_MAX = 1 << 18
#: An accelerator's tensor takes the host path up to this many elements (128 KiB of float32):
#: one copy each way, then the host fit; above it the grid fit runs on the device.
DEVICE_SORTED_FIT_MAX = 1 << 15
_PREFIX = 4
#: The host fit's weights where every value is one element (``kernels.fit_levels_sorted``).
_EACH_ONE = np.empty(0)


def lloydmax_nbytes(numel: int, bits: int) -> int:
    """Payload bytes: prefix, ``2**bits`` float32 levels, ``numel`` packed codes."""
    return _PREFIX + 4 * (1 << bits) + packed_nbytes(numel, bits)


@register_compressor
class LloydMax(Compressor):
    """Lloyd-Max (1-D k-means) levels fitted on a sampled histogram; ``bits`` in 1..8.

    Example:
        >>> c = LloydMax(bits=4)   # 16 levels
        >>> x = torch.randn(10_000)
        >>> p = c.encode(x)
        >>> p.nbytes, float((c.decode(p) - x).norm() / x.norm()) < 0.12
        (5092, True)
        >>> r = torch.relu(x)        # half zeros: one level exactly at 0
        >>> bool((c.decode(c.encode(r))[r == 0] == 0).all())
        True
    """

    name = "lloydmax"
    codec_id = 7

    def __init__(self, *, bits: int = 4, iterations: int = 8,
                 check_finite: bool = True) -> None:
        super().__init__(check_finite=check_finite)
        self.bits = check_int(self.name, "bits", bits, MIN_BITS, MAX_BITS,
                              " (a codebook of 2**bits float32 levels travels with the "
                              "codes; use quantize or sortquant for more bits)")
        self.iterations = check_int(self.name, "iterations", iterations, 0, MAX_ITERATIONS,
                                    " (Lloyd steps after the initial levels)")

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1)
        if flat.numel() <= (SORTED_FIT_MAX if flat.device.type == "cpu" else DEVICE_SORTED_FIT_MAX):
            payload = self._encode_host(flat, host_values(flat))
            return payload if flat.device.type == "cpu" else payload.to(flat.device)
        count, bits, levels_n = flat.numel(), self.bits, 1 << self.bits
        low, high = torch.aminmax(flat)
        lo = low.double()
        span = high.double() - lo
        self.raise_if_nonfinite(flat, probe=span)
        grid = Grid.over(lo, span, grid_size(count))

        payload = torch.empty(lloydmax_nbytes(count, bits), dtype=torch.uint8,
                              device=flat.device)
        payload[:_PREFIX] = torch.tensor([bits, 0, 0, 0], dtype=torch.uint8)
        codes_out = payload[_PREFIX + 4 * levels_n:]
        if not bool(grid.scale64 > 0):  # constant (or a span below ~1e-34): one level, lo
            payload[_PREFIX:_PREFIX + 4 * levels_n] = lo.float().expand(levels_n).contiguous(
                ).view(torch.uint8)
            codes_out.zero_()
            return payload

        levels, pinned = fit_levels(strided_sample(flat, fit_sample_size(levels_n, SAMPLE)), grid, levels_n, self.iterations,
                                    torch.stack([low, high]).double())
        codebook = levels.float()                                                # [L]
        payload[_PREFIX:_PREFIX + 4 * levels_n] = codebook.view(torch.uint8)
        code_of_cell = cell_codes(codebook, pinned, grid)                        # [G] uint8

        for start, stop in cache_blocks(count, flat.device):
            cells = grid.cells(flat[start:stop].float(), torch.int32)
            if bits == 8:
                torch.index_select(code_of_cell, 0, cells, out=codes_out[start:stop])
            else:
                pack_into(code_of_cell.index_select(0, cells), bits, codes_out, start, count)
        return payload

    def _encode_host(self, flat: torch.Tensor, x: np.ndarray) -> torch.Tensor:
        """The host path (``host.py``): x [N] float32/float64 numpy of flat -> payload.

        No grid: the levels are fitted on sorted values themselves (``kernels.fit_levels_sorted``),
        those of the whole tensor or, above ``fit_sample_size`` elements, a weighted sample
        with every far value (``fit_sample``); each element takes its nearest level, so the
        error of an element is at most its distance to the nearest level.
        """
        count, levels_n = x.size, 1 << self.bits
        values, weights = fit_sample(x, fit_sample_size(levels_n, SAMPLE))       # [M] sorted
        lo, hi = float(values[0]), float(values[-1])
        span = hi - lo
        self.raise_if_nonfinite(flat, probe=span)
        head = bytes([self.bits, 0, 0, 0])
        # Constant, as on the torch path where the float32 grid scale is 0 or overflows.
        if not (span > 0 and grid_size(count) / span < F32_OVERFLOW):
            codebook = np.full(levels_n, lo, dtype=np.float32)
            return host_payload(head + codebook.tobytes(), np.zeros(count, np.uint8), self.bits)
        start = _PREFIX + 4 * levels_n
        payload = np.empty(start + packed_nbytes(count, self.bits), dtype=np.uint8)
        codes = payload[start:] if self.bits == 8 else np.empty(count, dtype=np.uint8)  # [N]
        codebook = lloydmax_codes(x, values, _EACH_ONE if weights is None else weights, levels_n,
                                  self.iterations, span / grid_size(count), PIN_ENDS_FROM, NEIGHBOURS, codes)  # [L]
        payload[:_PREFIX] = np.frombuffer(head, dtype=np.uint8)
        payload[_PREFIX:start] = codebook.astype("<f4").view(np.uint8)
        if self.bits != 8:
            pack_host(codes, self.bits, payload[start:])
        return torch.from_numpy(payload)

    def _decode(self, packet: Packet) -> torch.Tensor:
        """A CPU float32 or float64 tensor in one compiled call (``kernels.codebook_decode``),
        which only says whether the payload is right; where it is not (or another tensor),
        the checks below word what is wrong."""
        decoded = compiled_decode(packet, codebook_decode, MAX_BITS)
        if decoded is not None:
            return decoded
        payload, numel = packet.payload, packet.shape.numel()
        self.expect_packet(packet, payload.numel() >= _PREFIX,
                     f"shorter than the {_PREFIX}-byte prefix")
        bits, pad0, pad1, pad2 = host_bytes(payload, _PREFIX).tolist()
        self.expect_packet(packet, MIN_BITS <= bits <= MAX_BITS and pad0 == pad1 == pad2 == 0,
                     f"prefix says bits={bits} (pad {pad0}, {pad1}, {pad2}); expected bits in "
                     f"{MIN_BITS}..{MAX_BITS} and zero padding")
        expected = lloydmax_nbytes(numel, bits)
        self.expect_packet(packet, payload.numel() == expected,
                     f"{numel} codes of {bits} bits with a codebook of {1 << bits} levels "
                     f"take {expected} payload bytes")
        levels_n = 1 << bits
        codebook = bytes_as(payload[_PREFIX:_PREFIX + 4 * levels_n], torch.float32)
        self.expect_packet(packet, bool(np.isfinite(host_bytes(
            payload[_PREFIX:], 4 * levels_n).view("<f4")).all()),
                     "the codebook holds a non-finite value")
        table = codebook.to(packet.dtype)                                        # [L]
        codes = payload[_PREFIX + 4 * levels_n:]
        if compiled_on(numel, payload.device):  # one compiled pass
            return lookup_host(table, codes.numpy(), bits, numel).reshape(packet.shape)
        return gather_codes(table, codes, bits, numel).reshape(packet.shape)


def fit_levels(sample: torch.Tensor, grid: Grid, levels_n: int, iterations: int,
               ends: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd-Max levels for ``sample``: (levels [L] float64 sorted, pinned [L] bool).

    sample: [M] float of a tensor whose range the grid spans (with a non-zero scale).
    Pinned levels sit exactly on repeated values and never move.
    """
    device = sample.device
    values = sample.double()                                                     # [M]
    cells = grid.cells(sample.float(), torch.int64)                              # [M]

    # Spikes: values holding 1/(2L) of a sub-sample or more, the most frequent L/2 at most.
    sub = sample[:SPIKE_SAMPLE]
    distinct, freq = torch.unique(sub, return_counts=True)
    heavy = freq * (2 * levels_n) >= sub.numel()
    pin_ends = ends is not None and levels_n >= PIN_ENDS_FROM
    limit = min(levels_n // 2, levels_n - 2) if pin_ends else levels_n // 2
    spikes = distinct[heavy].double()
    if spikes.numel() > limit:
        spikes = spikes[freq[heavy].topk(limit).indices].sort().values
    if pin_ends:
        spikes = torch.unique(torch.cat([spikes, ends.to(spikes)]))
    spikes_n = spikes.numel()                                                     # P
    if spikes_n:
        at = torch.searchsorted(spikes, values).clamp_(max=spikes_n - 1)
        free = (spikes[at] != values).double()                                  # [M]
    else:
        free = torch.ones_like(values)

    # Histogram of the rest: count and sum per cell, compacted to the non-empty cells.
    count = torch.bincount(cells, weights=free, minlength=grid.size)             # [G]
    total = torch.bincount(cells, weights=values * free, minlength=grid.size)    # [G]
    cell_at = (count > 0).nonzero().squeeze(1)                                   # [E]
    weight = count[cell_at]                                                      # [E]
    mean = total[cell_at] / weight                                               # [E] sorted
    free_n = levels_n - spikes_n

    # Initial free levels: quantiles of the count weighted by density**(-2/3).
    chosen = _spread(weight * _density(mean, weight, grid).pow(-2.0 / 3.0), free_n)
    start = mean[chosen] if chosen.numel() else spikes[:1]
    start = start[:free_n]  # every level pinned: none free
    if start.numel() < free_n:  # fewer cells than free levels: repeat the top one (unused)
        start = torch.cat([start, start[-1:].expand(free_n - start.numel())])
    levels, order = torch.cat([spikes, start]).sort(stable=True)                 # [L]
    pinned = order < spikes_n

    if mean.numel() and iterations:
        zero = weight.new_zeros(1)
        weight_below = torch.cat([zero, weight.cumsum(0)])                       # [E+1]
        total_below = torch.cat([zero, (mean * weight).cumsum(0)])               # [E+1]
        ends = torch.tensor([0, mean.numel()], device=device)
        for _ in range(iterations):
            midpoints = (levels[1:] + levels[:-1]) / 2                           # [L-1]
            edges = torch.cat([ends[:1], torch.searchsorted(mean, midpoints), ends[1:]])
            n = weight_below[edges[1:]] - weight_below[edges[:-1]]               # [L]
            s = total_below[edges[1:]] - total_below[edges[:-1]]
            moved = torch.where((n > 0) & ~pinned, s / n.clamp(min=1e-300), levels)
            if torch.equal(moved, levels):
                break
            levels = moved
    return levels, pinned


def _density(mean: torch.Tensor, weight: torch.Tensor, grid: Grid) -> torch.Tensor:
    """[E] sampled values per unit around each non-empty cell: the count of the cells
    within ``NEIGHBOURS`` on either side over the span of their means (at least a cell).

    Adapts to the data where a fixed binning cannot: in a sparse tail the nearest
    neighbours are far apart, so isolated extreme values are seen as rare and, through
    ``density**(-2/3)``, attract levels of their own.
    """
    cells_n = mean.numel()
    if cells_n == 0:
        return weight
    at = torch.arange(cells_n, device=mean.device)
    first = (at - NEIGHBOURS).clamp_(min=0)
    last = (at + NEIGHBOURS).clamp_(max=cells_n - 1)
    below = torch.cat([weight.new_zeros(1), weight.cumsum(0)])                   # [E+1]
    span = (mean[last] - mean[first]).clamp_(min=float(1 / grid.scale64))
    return (below[last + 1] - below[first]) / span


def _spread(weight: torch.Tensor, n: int) -> torch.Tensor:
    """Indices (sorted, distinct) of ``min(n, E)`` cells at equal-weight quantiles.

    weight: [E] > 0. A cell heavier than a quantile step is hit by several quantiles; it
    is taken once and the quantiles are recomputed with more targets (a few rounds).
    """
    cells_n = weight.numel()
    if cells_n <= n:
        return torch.arange(cells_n, device=weight.device)
    below = weight.cumsum(0)                                                     # [E]
    targets_n = n
    for _ in range(8):
        targets = (torch.arange(targets_n, dtype=torch.float64, device=weight.device) + 0.5
                   ) * (below[-1] / targets_n)
        chosen = torch.unique(torch.searchsorted(below, targets).clamp_(max=cells_n - 1))
        got = chosen.numel()
        if got >= n:
            break
        targets_n = min(max(targets_n + 1, -(-targets_n * n // got)), 4 * cells_n)
    if chosen.numel() > n:  # overshot: keep n of them, evenly spread
        pick = torch.linspace(0, chosen.numel() - 1, n, device=weight.device).round().long()
        chosen = chosen[pick]
    return chosen


def cell_codes(codebook: torch.Tensor, pinned: torch.Tensor, grid: Grid) -> torch.Tensor:
    """The code of every grid cell: [G] uint8, the level nearest to the cell's centre.

    codebook: [L] float32 sorted; pinned: [L] bool. The grid cell of a pinned level (found
    the way elements find theirs, ``Grid.cells``) codes that level, so it decodes exactly.
    """
    levels = codebook.double()
    boundaries = (levels[1:] + levels[:-1]) / 2                                  # [L-1]
    # Boundary j lies above the centre of cells g <= t_j = (b_j - lo) * scale - 1/2, so
    # cells from floor(t_j) + 1 on are past it; the code is the count of boundaries passed.
    past_from = ((boundaries - grid.lo) * grid.scale64 - 0.5).floor_().add_(1)
    past_from = past_from.clamp_(0, grid.size).long()                            # [L-1]
    code = torch.bincount(past_from, minlength=grid.size + 1).cumsum(0)[:grid.size]  # [G]
    spike_cells = grid.cells(codebook[pinned], torch.int64)                      # [P]
    spike_code = torch.full_like(code, -1)
    spike_code.scatter_reduce_(0, spike_cells, pinned.nonzero().squeeze(1), "amax")
    return torch.where(spike_code >= 0, spike_code, code).to(torch.uint8)


#: Ranks at either end of the sorted fit sample past which a tensor's values all enter the
#: fit (``fit_sample``): ~0.2% of a tensor at each end for a sample of 8192.
TAIL_RANKS = 16


def fit_sample(x: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray | None]:
    """What the host path fits on: (values [M] sorted, weights [M] float64 or None).

    Up to ``size`` elements (or where x holds a NaN): all of x sorted, one element each.
    Above: the torch path's strided sample (``strided_sample``) for the bulk, each
    sampled value standing for an equal share of the elements it represents, and every
    value of x past the sample's ``TAIL_RANKS``-th from either end, one element each: a
    heavy tail's few far values set levels of their own, which a sample alone would miss.
    The min and max are among the tails.
    """
    if x.size <= size:
        return sort_values(x), None
    values, weights, nan = tail_fit_values(x, sort_values(strided_sample(x, size)), TAIL_RANKS)  # compiled, one pass
    return (sort_values(x), None) if nan else (values, weights)

