"""Values a quantizer reproduces bit for bit: the ends of the range and repeated values.

A quantizer's levels are computed (``lo + q * step``), so the tensor's max, and any value
repeated across a large share of the tensor (ReLU zeros, a 0 / -1e4 additive attention
mask, a clamp), would come back a rounding off. Code that tests ``mask == 0`` after a cut
then breaks. Each such value takes over the code its elements are given anyway, and a
small table in the payload sets that code's level to the exact value:

    exact table: E codes (uint16) | E values (float64, exact for every float dtype)

Only codes whose computed level differs from the value get an entry, so a value that is
already exact (a min on code 0, a bucket that holds one value) costs nothing. An element
that shares a code with an exact value ``v`` decodes to ``v``: its error is at most one
step instead of half a step (it lies within half a step of the code's level, and so does
``v``).

Repeated values are searched on the host in a strided sample of ``SPIKE_SAMPLE``
elements (a sort of 512 values, compiled), so the cost is the same for every tensor size;
where a codec sorts the whole tensor anyway (``sortquant``'s exact boundaries), in the
sorted tensor itself, every element counted (``repeated_in_sorted``: N / run binary
searches, no sample).
Shape legend: N elements, M sampled elements, E entries.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .kernels import repeated_sorted, sampled_frequent_values
from .sampling import sample_positions_host, strided_sample

__all__ = ["SPIKE_SAMPLE", "SPIKE_SHARE", "MAX_SPIKES", "MAX_ENTRIES", "repeated_values", "repeated_run",
           "repeated_in_sorted",
           "exact_candidates", "host_values", "exact_nbytes", "exact_bytes", "parse_exact"]

#: Elements of a tensor searched for repeated values.
SPIKE_SAMPLE = 512
#: A value is repeated if it holds at least this share of the sample.
SPIKE_SHARE = 1 / 64
#: The most frequent repeated values kept, besides the ends of the range.
MAX_SPIKES = 4
#: Entries an exact table holds at most (its count travels as one byte).
MAX_ENTRIES = 255
_ENTRY = 10  # uint16 code + float64 value


def host_values(t: torch.Tensor) -> np.ndarray:
    """A small tensor's values on the host: [n] any float dtype -> [n] float32 or float64
    numpy (exact: float16 and bfloat16 widen to float32 losslessly)."""
    if t.dtype in (torch.float32, torch.float64) and t.device.type == "cpu" and not t.requires_grad:
        return t.reshape(-1).numpy()  # a view where t is contiguous
    t = t.detach().reshape(-1)
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()
    return t.cpu().numpy()


def repeated_values(flat: torch.Tensor | np.ndarray, share: float = SPIKE_SHARE,
                    limit: int = MAX_SPIKES, sample_size: int = SPIKE_SAMPLE,
                    known: tuple[float, ...] = ()) -> list[float]:
    """Values holding at least ``share`` of a strided sample of ``flat`` (at least two
    elements), the ``limit`` most frequent, most frequent first; ``known`` values left
    out. flat: [N] float tensor, or its ``host_values``. The sample's gather, sort and scan
    of its runs are one compiled call (``kernels.sampled_frequent_values``).
    """
    if isinstance(flat, np.ndarray):
        sample = flat
        positions = sample_positions_host(flat.size, sample_size) if flat.size > sample_size else _ALL
    else:
        sample, positions = host_values(strided_sample(flat, sample_size)), _ALL
    m = positions.size or sample.size
    run = repeated_run(m, share)
    if m < run:
        return []
    return sampled_frequent_values(sample, positions, run, np.asarray(known, dtype=np.float64), limit).tolist()


#: ``sampled_frequent_values``'s positions for "every element".
_ALL = np.empty(0, dtype=np.int64)
_ALL.flags.writeable = False


def repeated_run(count: int, share: float = SPIKE_SHARE) -> int:
    """Elements a value of a sorted tensor of ``count`` elements holds at least to be
    repeated (``repeated_in_sorted``): ``share`` of them, at least two."""
    return max(2, math.ceil(share * count))


def repeated_in_sorted(values: torch.Tensor | np.ndarray, share: float = SPIKE_SHARE,
                       limit: int = MAX_SPIKES) -> list[float]:
    """``repeated_values`` where the caller sorted the whole tensor anyway (``sortquant``'s
    exact boundaries): every element counts, no sample. values: [N] sorted, N >= 1, a
    tensor or its host values.

    The finite values holding at least ``repeated_run(N, share)`` elements, the first and
    the last value left out, the ``limit`` most frequent, most frequent first (ties in
    ascending order); a run of zeros is +0.0 where it holds one. A run that long holds one
    of the elements at ``run - 1, 2 run - 1, ...``: N / run binary searches on the
    tensor's device, or one compiled call on the host (``kernels.repeated_sorted``, the
    same values).
    """
    if isinstance(values, np.ndarray):
        return repeated_sorted(values, repeated_run(values.size, share), limit).tolist()
    run = repeated_run(values.numel(), share)
    probes = values[run - 1::run].contiguous()                                  # [<= 1 / share]
    left = torch.searchsorted(values, probes).tolist()
    right = torch.searchsorted(values, probes, right=True).tolist()
    first, last = float(values[0]), float(values[-1])
    found: dict[int, tuple[float, int]] = {}
    for v, a, b in zip(probes.tolist(), left, right):
        if b - a >= run and math.isfinite(v) and v not in (first, last) and a not in found:
            if v == 0:
                v = 0.0 if bool((~torch.signbit(values[a:b])).any()) else -0.0
            found[a] = (v, b - a)
    ranked = sorted(found.values(), key=lambda pair: -pair[1])  # stable: ties stay ascending
    return [v for v, _ in ranked[:limit]]


def exact_candidates(lo: float, hi: float, flat: torch.Tensor | np.ndarray,
                     ordered: torch.Tensor | np.ndarray | None = None) -> np.ndarray:
    """The values to reproduce exactly, in order of priority: min, max, repeated values
    (``repeated_values``; ``repeated_in_sorted`` where the caller has ``flat`` sorted,
    ``ordered``); none if the range is not finite (``check_finite=False`` lets NaN and Inf
    through). -> [<= 6] float64.
    """
    if not math.isfinite(hi - lo):
        return np.empty(0)
    found = repeated_values(flat, known=(lo, hi)) if ordered is None else repeated_in_sorted(ordered)
    values = [lo, hi, *found]
    return np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)


def exact_nbytes(entries: int) -> int:
    """Bytes of an exact table of ``entries`` entries."""
    return _ENTRY * entries


def exact_bytes(codes: list[int], values: list[float]) -> bytes:
    """The wire form of a table: E uint16 codes then E float64 values, little-endian."""
    return (np.asarray(codes, dtype="<u2").tobytes()
            + np.asarray(values, dtype="<f8").tobytes())


def parse_exact(raw: np.ndarray, entries: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of ``exact_bytes``: [>= 10 E] uint8 -> (codes [E] int64, values [E] float64)."""
    codes = raw[:2 * entries].view("<u2").astype(np.int64)
    values = raw[2 * entries:10 * entries].view("<f8").astype(np.float64)
    return codes, values
