"""``hadamard``: randomized Hadamard rotation per block, per-block scales, Lloyd-Max levels.

Pretrained transformers carry outlier channels (kurtosis 9-16, single values 13-20
standard deviations out): a min-max code spends its levels on them and rounds the rest to
a few values. Rotating first spreads each outlier over a whole block, so what is coded is
close to normal whatever the input (QuaRot, TAH-Quant); then 4 bits keep ~0.1 relative
L2 error where ``quantize`` 4 loses half the signal.

Encode, for N elements cut into R = ceil(N / n) blocks of n = ``block`` (zero padded):

0. Normalize: ``float32(x * 2**-e)`` with ``max |x| < 2**e`` (the exact product, rounded
   once; ``e >= MIN_EXPONENT``), so no sum can overflow.
1. Rotate: ``z = H (s * x)`` per block, H the orthonormal n x n Walsh-Hadamard matrix as
   ``log2(n)`` float32 butterfly stages and one product by ``1 / sqrt(n)``
   (:func:`hadamard_transform`), s random signs of a seed that the packet carries (bit 63 of
   splitmix64 of ``seed * 2**32 + position``: the same on every device, machine and torch
   version); a new seed per encode (``seed`` + the stream's encode count), so errors do not repeat.
2. Scale: each block by its RMS ``sigma_r``, the float32 sum of its squares by halves, rounded
   to bfloat16 (so the decoder multiplies by exactly what the encoder divided by); an
   all-zero block keeps scale 0.
3. Levels: ``2**bits`` Lloyd-Max levels fitted to a strided sample of ``z / sigma`` by
   ``iterations`` Lloyd steps, from the optimal levels of a standard normal.
4. Code: the index of the nearest level, packed exactly (``bitpack``).

Decode: ``x = 2**e * s * H (sigma_r * level[code])`` (H is its own inverse), cropped to N,
the product by ``2**e`` in float64 and clamped to the dtype's finite range.

Every step is a float32 operation whose result is correctly rounded on every device (sums,
differences, products by one constant, a square root), in one order, so the paths agree bit
for bit: the levels are fitted on the host, compiled, on every path (``fit_levels_host``); a
finite CPU tensor of at most ``host.COMPILED_MAX`` elements (one core; up to 4 MiB faster than
torch's ops on every core) is encoded in two compiled calls
around numpy's sort of the fit sample (``kernels.hadamard_rotate``: steps 0-2;
``kernels.hadamard_payload``: 3-4 and the payload), and a CPU packet of at most ``host.COMPILED_MAX``
elements is checked and decoded in one (``kernels.hadamard_decode``); other tensors take
torch's ops.

Payload (little-endian)::

    [seed i32][log2(block) i32][bits i32][e i32] | L float32 levels, sorted |
    R bfloat16 scales | R * n codes of ``bits`` bits

i.e. ``16 + 4 * 2**bits + 2 * R + ceil(R * n * bits / 8)`` bytes: at 4 bits and block 256
that is 4.06 bits a value plus 80 bytes (header not counted).

Measured at an earlier revision, whose signs came from torch's generator and whose
transform was a matrix product: the same rotation in distribution (``python
benchmarks/docstrings.py --errors-only``: pretrained all-MiniLM-L6-v2, 64 docstrings x 64
tokens, hidden states [64, 64, 384] after the embeddings and each of the 6 layers, kurtosis
17-38, max |z| 13-20): relative L2 error 0.095-0.096 at 4 bits, ratio 0.127
with the header; ``quantize`` 4: 0.47-0.68, ``sortquant`` 4: 0.47-0.61, ``lloydmax`` 4:
0.14-0.16 (ratio 0.125). 3 bits: 0.18 (ratio 0.096). An encode and decode take 19 us at 1 KiB,
429 us at 256 KiB and 6.3 ms at 4 MiB on a CPU (``benchmarks/README.md``, section 5:
``results/compressors_overhead_hadamard_compiled.json``).

Shape legend: N elements, R blocks, n block size, L levels, M sampled values.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from . import host
from .base import Compressor, check_int
from .bitpack import pack, packed_nbytes, unpack
from .exact import host_values
from .kernels import (exponent_factors, fwht_rows, hadamard_decode, hadamard_payload, hadamard_rotate, hadamard_signs,
                      sort_values, transform_scale, unweighted_lloyd)
from .kernels.rotation import HEAD_NBYTES as _META, MAX_EXPONENT, MAX_LOG2_BLOCK, NONFINITE
from .packet import Packet, bytes_as, host_bytes
from .registry import register_compressor
from .sampling import fit_sample_size

__all__ = ["HadamardQuant", "hadamard_transform", "random_signs", "hadamard_nbytes"]

#: Values of z / sigma sampled for the Lloyd fit at most (``256 L``; all of them for smaller tensors).
SAMPLE = 1 << 16
#: The smallest normalizing exponent: a float64 tensor whose largest value is under ``2**-1000``
#: is scaled by ``2**1000`` (its values stay under 1, and the factor is finite).
MIN_EXPONENT = -1000


def hadamard_nbytes(numel: int, block: int, bits: int) -> int:
    """Payload bytes for ``numel`` elements (see the module doc)."""
    rows = -(-numel // block)
    return _META + 4 * (1 << bits) + 2 * rows + packed_nbytes(rows * block, bits)


@register_compressor
class HadamardQuant(Compressor):
    """Random-sign Hadamard rotation per block, RMS scale per block, Lloyd-Max codes.

    Args:
        bits: code width, 2..8 (``2**bits`` levels).
        block: rotation block, a power of two in 2..65536; larger spreads outliers further
            and costs less scale overhead (16 bits a block), smaller bounds the spread.
        seed: base of the per-encode sign seeds (any int in 0..2**31-1).
        iterations: Lloyd steps of the level fit, 0..100 (0: normal-optimal levels).

    Example:
        >>> c = HadamardQuant(bits=4)
        >>> x = torch.randn(64, 384, generator=torch.Generator().manual_seed(0))
        >>> x[:, 7] *= 30                                # an outlier channel
        >>> y = c.decode(c.encode(x))
        >>> float((y - x).norm() / x.norm()) < 0.1, round(c.ratio(x), 3)
        (True, 0.128)
    """

    name = "hadamard"
    codec_id = 11

    def __init__(self, *, bits: int = 4, block: int = 256, seed: int = 0, iterations: int = 8,
                 check_finite: bool = True) -> None:
        super().__init__(check_finite=check_finite)
        self.bits = check_int(self.name, "bits", bits, 2, 8)
        self.block = check_int(self.name, "block", block, 2, 1 << MAX_LOG2_BLOCK)
        if self.block & (self.block - 1):
            raise ValueError(f"{self.name}: block must be a power of two, got {block}; "
                             f"e.g. {1 << (self.block.bit_length() - 1)} or {1 << self.block.bit_length()}")
        self.seed = check_int(self.name, "seed", seed, 0, (1 << 31) - 1)
        self.iterations = check_int(self.name, "iterations", iterations, 0, 100)
        self._encodes = 0

    # -- stream state: the encode count that moves the seed -------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"encodes": torch.tensor(self._encodes, dtype=torch.int64)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != {"encodes"}:
            raise ValueError(f"{self.name} state has the key 'encodes', got {sorted(state)}")
        self._encodes = int(state["encodes"])

    def reset(self) -> None:
        self._encodes = 0

    # -- codec ----------------------------------------------------------------------------

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        flat = x.reshape(-1).to(work)
        seed = (self.seed + self._encodes) % (1 << 31)
        n, levels_n = self.block, 1 << self.bits
        if host.compiled_on(flat.numel(), x.device):  # finite: the host path; else the checks below
            payload = _encode_host(seed, flat.numpy(), n, self.bits, self.iterations)
            if payload is not None:
                self._encodes += 1
                return payload
        top = float(flat.abs().max())                                             # NaN or Inf if any is
        self.raise_if_nonfinite(flat, probe=top)
        exponent = max(math.frexp(top)[1], MIN_EXPONENT)                          # max |x| < 2**exponent
        self._encodes += 1
        rows = -(-flat.numel() // n)
        meta = (seed, n.bit_length() - 1, self.bits, exponent)
        blocks = torch.zeros(rows * n, dtype=torch.float32, device=x.device)
        blocks[: flat.numel()] = _normalized(flat, 2.0 ** -exponent)              # |.| < 1
        z = hadamard_transform(blocks.view(rows, n) * random_signs(seed, n, x.device))  # [R, n]
        sigma = _block_rms(z).to(torch.bfloat16)                                  # [R], <= 1
        safe = torch.where(sigma > 0, sigma, 1).float()
        u = (z / safe[:, None]).view(-1)                                          # [R * n]
        sample = host_values(_sample(u, fit_sample_size(levels_n, SAMPLE)))       # [M], one read
        levels = torch.from_numpy(fit_levels_host(sample, levels_n, self.iterations)).to(u.device)  # [L]
        codes = _nearest(u, levels)
        return torch.cat([
            torch.tensor(meta, dtype=torch.int32).view(torch.uint8).to(x.device),
            levels.float().view(torch.uint8),
            sigma.view(torch.uint8),
            pack(codes, self.bits),
        ])

    def _decode(self, packet: Packet) -> torch.Tensor:
        decoded = _decode_host(packet)
        if decoded is not None:
            return decoded
        payload, numel = packet.payload, packet.shape.numel()
        self.expect_packet(packet, payload.numel() >= _META, f"payload shorter than its {_META}-byte prefix")
        seed, log2_block, bits, exponent = host_bytes(payload, _META).view("<i4").tolist()
        self.expect_packet(packet, 2 <= bits <= 8 and 1 <= log2_block <= MAX_LOG2_BLOCK and seed >= 0
                     and abs(exponent) <= MAX_EXPONENT, f"bad prefix (seed {seed}, log2 block {log2_block}, "
                     f"bits {bits}, exponent {exponent})")
        n, levels_n = 1 << log2_block, 1 << bits
        rows = -(-numel // n)
        expected = hadamard_nbytes(numel, n, bits)
        self.expect_packet(packet, payload.numel() == expected,
                     f"{bits}-bit codes in blocks of {n} take {expected} payload bytes")
        at = _META + 4 * levels_n
        sigma = bytes_as(payload[at: at + 2 * rows], torch.bfloat16).float()
        levels = bytes_as(payload[_META:at], torch.float32)
        valid = bool(torch.isfinite(levels).all() and (sigma >= 0).all() and (sigma <= 1).all())
        self.expect_packet(packet, valid, "levels not finite or scales outside [0, 1]")
        codes = unpack(payload[at + 2 * rows:], bits, rows * n).long()
        z = levels[codes].view(rows, n) * sigma[:, None]
        x = (hadamard_transform(z) * random_signs(seed, n, payload.device)).view(-1)[:numel]
        top = torch.finfo(packet.dtype).max  # rounding must not turn a finite input into Inf
        return _denormalized(x, exponent, packet.dtype).clamp_(-top, top).to(packet.dtype).reshape(packet.shape)


def hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """x: [R, n] float, n a power of two -> H x per row, H orthonormal (its own inverse).

    ``log2(n)`` butterfly stages, ``(a + b, a - b)`` of elements ``h`` apart within each ``2h``
    for h = 1, 2, ..., n / 2, then a product by ``1 / sqrt(n)`` (float32 for float32 x): a CPU
    float32 tensor in one compiled call (``kernels.fwht_rows``: one core, each block in cache,
    several times faster than torch's ops on every core), others in torch ops; the same values
    bit for bit.
    """
    rows, n = x.shape
    if _transforms_compiled(x):
        z = x.reshape(-1).numpy().copy()
        fwht_rows(z, n, transform_scale(n))
        return torch.from_numpy(z).view(rows, n)
    h = 1
    while h < n:
        pairs = x.reshape(rows, n // (2 * h), 2, h)
        first, second = pairs[:, :, 0], pairs[:, :, 1]
        x = torch.stack((first + second, first - second), dim=2)
        h *= 2
    return x.reshape(rows, n) * (float(transform_scale(n)) if x.dtype == torch.float32 else 1 / math.sqrt(n))


def _transforms_compiled(x: torch.Tensor) -> bool:
    """Whether :func:`hadamard_transform` runs the compiled loops on x (CPU float32)."""
    return x.device.type == "cpu" and x.dtype == torch.float32


def _normalized(flat: torch.Tensor, factor: float) -> torch.Tensor:
    """flat [N] float32/float64 -> [N] float32 ``flat * factor`` (a power of two), rounded once
    from the exact product, as ``kernels.hadamard_rotate`` computes it."""
    if flat.dtype == torch.float32 and factor <= 2.0 ** 126:
        return flat * factor  # a float32 factor: the float32 product is the exact one rounded
    return (flat.double() * factor).float()


def _denormalized(x: torch.Tensor, exponent: int, dtype: torch.dtype) -> torch.Tensor:
    """x [N] float32 -> ``x * 2**exponent``: in float64 as ``x * 2**(e // 2) * 2**(e - e // 2)``
    (``kernels.hadamard_decode``'s), or in float32 for a float32 result where ``2**e`` is a
    float32 (the exact product rounded once to float32 either way)."""
    if dtype == torch.float32 and -149 <= exponent <= 127:
        return x * math.ldexp(1.0, exponent)
    first, second = exponent_factors(exponent)
    return x.double() * first * second


def _block_rms(z: torch.Tensor) -> torch.Tensor:
    """z: [R, n] float32 -> [R] float32 ``sqrt(s / n)``, ``s`` the sum of squares by halves (a
    row's first half plus its second, again, down to one): ``kernels.hadamard_rotate``'s order."""
    squares = z.square()
    while squares.shape[1] > 1:
        half = squares.shape[1] // 2
        squares = squares[:, :half] + squares[:, half:]
    return (squares[:, 0] / z.shape[1]).sqrt()


def _nearest(u: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """u: [K] -> [K] index of the nearest of the sorted ``levels`` (ties to the lower one)."""
    cuts = (levels[1:] + levels[:-1]) / 2
    if cuts.numel() > 15:
        return torch.bucketize(u, cuts, out_int32=True)
    codes = torch.zeros(u.shape, dtype=torch.uint8, device=u.device)
    for cut in cuts:  # 15 compares beat a binary search over 15 cuts
        codes += u > cut
    return codes


def random_signs(seed: int, n: int, device: torch.device) -> torch.Tensor:
    """[n] float32 of +-1 from ``seed``, drawn on the host by a counter hash
    (``kernels.hadamard_signs``): equal on every device, machine and torch version."""
    signs = np.empty(n, dtype=np.float32)
    hadamard_signs(seed, signs)
    return torch.from_numpy(signs).to(device)


def _encode_host(seed: int, x: np.ndarray, n: int, bits: int, iterations: int) -> torch.Tensor | None:
    """The host path's encode (``host.COMPILED_MAX``), bit for bit the torch path's: the exponent,
    rotation and scales in one compiled call (``kernels.hadamard_rotate``), numpy's sort of the
    fit sample, the fit, codes and payload in another (``kernels.hadamard_payload``).
    x: [N] float32/float64 -> uint8 payload, or None where x holds NaN or Inf."""
    levels_n, rows = 1 << bits, -(-x.size // n)
    u = np.empty(rows * n, dtype=np.float32)                                      # [R * n] z / sigma
    sigma = np.empty(rows, dtype=np.uint16)                                       # [R] bfloat16 bits
    exponent = hadamard_rotate(x, seed, n, MIN_EXPONENT, u, sigma)
    if exponent == NONFINITE:
        return None
    values = sort_values(_sample(u, fit_sample_size(levels_n, SAMPLE)))            # [M]
    head = np.array((seed, n.bit_length() - 1, bits, exponent), dtype=np.int32)
    payload = np.empty(hadamard_nbytes(x.size, n, bits), dtype=np.uint8)
    hadamard_payload(u, values, normal_levels(levels_n).numpy(), iterations, head, sigma, bits, payload)
    return torch.from_numpy(payload)


def _decode_host(packet: Packet) -> torch.Tensor | None:
    """A CPU packet of up to ``host.COMPILED_MAX`` elements checked and decoded in one compiled
    call (``kernels.hadamard_decode``), the torch path's values bit for bit; None where it does
    not apply or the payload is wrong (the torch path's checks then word what is wrong)."""
    numel, dtype = packet.shape.numel(), packet.dtype
    if not host.compiled_on(numel, packet.payload.device):
        return None
    out = np.empty(numel, dtype=np.float32 if dtype == torch.float32 else np.float64)
    top = float(torch.finfo(dtype).max)
    if hadamard_decode(packet.payload.numpy(), numel, -top, top, out) != 0:
        return None
    return torch.from_numpy(out).to(dtype).reshape(packet.shape)


def fit_levels_host(sample: np.ndarray, levels_n: int, iterations: int) -> np.ndarray:
    """sample: [M] float32 (about unit RMS) -> [L] float32 sorted levels after Lloyd steps, from
    the normal's (each level moves to the mean of the values nearest it; it stops early when none
    moves; a level without values stays): compiled, ``kernels.unweighted_lloyd``."""
    return unweighted_lloyd(sort_values(sample), normal_levels(levels_n).numpy(), iterations)


@functools.lru_cache(maxsize=None)
def normal_levels(levels_n: int) -> torch.Tensor:
    """[L] Lloyd-Max levels of a standard normal (Max 1960: 0.1284 ... 2.7326 for L = 16).

    Lloyd steps on the exact normal: a level is the mean of the normal between its cuts,
    ``(pdf(a) - pdf(b)) / (cdf(b) - cdf(a))``; started at the Panter-Dite point density.
    """
    levels = math.sqrt(3) * torch.distributions.Normal(0.0, 1.0).icdf(
        (torch.arange(levels_n, dtype=torch.float64) + 0.5) / levels_n)
    edge = torch.tensor([math.inf], dtype=torch.float64)
    for _ in range(5000):
        cuts = torch.cat([-edge, (levels[1:] + levels[:-1]) / 2, edge])
        cdf = 0.5 * torch.erfc(-cuts / math.sqrt(2))
        pdf = torch.exp(-cuts.square() / 2) / math.sqrt(2 * math.pi)
        moved = (pdf[:-1] - pdf[1:]) / (cdf[1:] - cdf[:-1])
        if float((moved - levels).abs().max()) < 1e-10:
            break
        levels = moved
    return moved.float()


def _sample(u: torch.Tensor | np.ndarray, size: int) -> torch.Tensor | np.ndarray:
    """u: [K] -> at most ``size`` values at an even stride (all of them when K <= size)."""
    if len(u) <= size:
        return u
    return u[:: -(-len(u) // size)]
