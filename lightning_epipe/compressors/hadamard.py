"""``hadamard``: randomized Hadamard rotation per block, per-block scales, Lloyd-Max levels.

Pretrained transformers carry outlier channels (kurtosis 9-16, single values 13-20
standard deviations out): a min-max code spends its levels on them and rounds the rest to
a few values. Rotating first spreads each outlier over a whole block, so what is coded is
close to normal whatever the input (QuaRot, TAH-Quant); then 4 bits keep ~0.1 relative
L2 error where ``quantize`` 4 loses half the signal.

Encode, for N elements cut into R = ceil(N / n) blocks of n = ``block`` (zero padded):

1. Rotate: ``z = H (s * x)`` per block, H the orthonormal n x n Walsh-Hadamard matrix
   (as Kronecker factors of at most 64 x 64), s random signs drawn from a seed that the packet carries;
   a new seed per encode (``seed`` + the stream's encode count), so errors do not repeat.
0. Normalize: ``x * 2**-e`` with ``max |x| < 2**e`` (exact), so no sum can overflow.
2. Scale: each block by its RMS ``sigma_r`` (rounded to bfloat16 first, so the decoder
   multiplies by exactly what the encoder divided by); an all-zero block keeps scale 0.
3. Levels: ``2**bits`` Lloyd-Max levels fitted to a strided sample of ``z / sigma`` by
   ``iterations`` Lloyd steps, from the optimal levels of a standard normal.
4. Code: the index of the nearest level, packed exactly (``bitpack``).

Decode: ``x = 2**e * s * H (sigma_r * level[code])`` (H is its own inverse), cropped to N
and clamped to the dtype's finite range.

The levels are fitted on the host, compiled, on every path (``fit_levels_host``: the fit
sample is read there once, not a few kernels and a synchronization per Lloyd step on an
accelerator). A finite CPU tensor of at most ``host.HOST_MAX`` elements also finds its codes
on the host (``host.py``), the fit and codes in one compiled call past numpy's sort of the
sample (``kernels.hadamard_codes``): the same payload bit for bit, in a few calls instead of a
few dozen; the rotation stays a torch product on every path.

Payload (little-endian)::

    [seed i32][log2(block) i32][bits i32][e i32] | L float32 levels, sorted |
    R bfloat16 scales | R * n codes of ``bits`` bits

i.e. ``16 + 4 * 2**bits + 2 * R + ceil(R * n * bits / 8)`` bytes: at 4 bits and block 256
that is 4.06 bits a value plus 80 bytes (header not counted).

Measured (``python benchmarks/docstrings.py --errors-only``: pretrained all-MiniLM-L6-v2, 64
docstrings x 64 tokens, hidden states [64, 64, 384] after the embeddings and each of the 6
layers, kurtosis 17-38, max |z| 13-20): relative L2 error 0.095-0.096 at 4 bits, ratio 0.127
with the header; ``quantize`` 4: 0.47-0.68, ``sortquant`` 4: 0.47-0.61, ``lloydmax`` 4:
0.14-0.16 (ratio 0.125). 3 bits: 0.18 (ratio 0.096). Encode ~40 ms, decode ~20 ms for
[32, 64, 384] on one CPU thread (``quantize`` 4: ~8 / ~20 ms).

Shape legend: N elements, R blocks, n block size, L levels, M sampled values.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from .base import Compressor, check_int
from .bitpack import pack, packed_nbytes, unpack, unpack_host
from .exact import host_values
from .host import host_payload, on_host
from .kernels import hadamard_codes, unweighted_lloyd
from .packet import Packet, bytes_as, host_bytes
from .registry import register_compressor
from .sampling import fit_sample_size

__all__ = ["HadamardQuant", "hadamard_transform", "random_signs", "hadamard_nbytes"]

_META = 16
#: Values of z / sigma sampled for the Lloyd fit at most (``256 L``; all of them for smaller tensors).
SAMPLE = 1 << 16
MAX_LOG2_BLOCK = 16
_FACTOR = 64


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
        top = float(flat.abs().max())                                             # NaN or Inf if any is
        self.raise_if_nonfinite(flat, probe=top)
        exponent = math.frexp(top)[1]                                             # max |x| < 2**exponent
        seed = (self.seed + self._encodes) % (1 << 31)
        self._encodes += 1
        n, levels_n = self.block, 1 << self.bits
        rows = -(-flat.numel() // n)
        blocks = torch.zeros(rows * n, dtype=torch.float32, device=x.device)
        blocks[: flat.numel()] = torch.ldexp(flat, flat.new_tensor(-exponent))  # exact, |.| < 1
        blocks = blocks.view(rows, n) * random_signs(seed, n, x.device)
        z = hadamard_transform(blocks)                                            # [R, n]
        sigma = z.square().mean(dim=1).sqrt().to(torch.bfloat16)                  # [R], <= 1
        safe = torch.where(sigma > 0, sigma, 1).float()
        u = (z / safe[:, None]).view(-1)                                          # [R * n]
        meta = (seed, n.bit_length() - 1, self.bits, exponent)
        if on_host(flat.numel(), x.device) and math.isfinite(top):
            return _codes_host(meta, u.numpy(), sigma, self.bits, self.iterations)
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
        payload, numel = packet.payload, packet.shape.numel()
        self.expect_packet(packet, payload.numel() >= _META, f"payload shorter than its {_META}-byte prefix")
        seed, log2_block, bits, exponent = host_bytes(payload, _META).view("<i4").tolist()
        self.expect_packet(packet, 2 <= bits <= 8 and 1 <= log2_block <= MAX_LOG2_BLOCK and seed >= 0
                     and abs(exponent) <= 1100, f"bad prefix (seed {seed}, log2 block {log2_block}, "
                     f"bits {bits}, exponent {exponent})")
        n, levels_n = 1 << log2_block, 1 << bits
        rows = -(-numel // n)
        expected = hadamard_nbytes(numel, n, bits)
        self.expect_packet(packet, payload.numel() == expected,
                     f"{bits}-bit codes in blocks of {n} take {expected} payload bytes")
        at = _META + 4 * levels_n
        sigma = bytes_as(payload[at: at + 2 * rows], torch.bfloat16).float()
        if on_host(numel, payload.device):  # numpy checks and gather: a few calls, not a few dozen
            raw = payload.numpy()
            levels, scales = raw[_META:at].view("<f4"), sigma.numpy()
            valid = bool(np.isfinite(levels).all() and (scales >= 0).all() and (scales <= 1).all())
            codes = unpack_host(raw[at + 2 * rows:], bits, rows * n)
            z = torch.from_numpy(np.take(levels, codes, mode="clip").reshape(rows, n) * scales[:, None])
        else:
            levels = bytes_as(payload[_META:at], torch.float32)
            valid = bool(torch.isfinite(levels).all() and (sigma >= 0).all() and (sigma <= 1).all())
            codes = unpack(payload[at + 2 * rows:], bits, rows * n).long()
            z = levels[codes].view(rows, n) * sigma[:, None]
        self.expect_packet(packet, valid, "levels not finite or scales outside [0, 1]")
        x = (hadamard_transform(z) * random_signs(seed, n, payload.device)).view(-1)[:numel]
        work = torch.float64 if packet.dtype == torch.float64 else torch.float32
        x = torch.ldexp(x.to(work), torch.tensor(exponent, dtype=work, device=x.device))
        top = torch.finfo(packet.dtype).max  # rounding must not turn a finite input into Inf
        return x.clamp_(-top, top).to(packet.dtype).reshape(packet.shape)


def hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """x: [R, n] float, n a power of two -> H x per row, H orthonormal (its own inverse).

    ``H_n = H_a (x) H_b`` (Sylvester): a matrix product with H of at most 64 x 64 per factor,
    fast axis first, so n = 256 costs two small products, not eight passes of adds.
    """
    rows, n = x.shape
    inner = 1
    while inner < n:
        f = min(_FACTOR, n // inner)
        h = _matrix(f, x.dtype, x.device)
        if inner == 1:
            x = (x.reshape(-1, f) @ h).reshape(rows, n)
        else:
            x = (h @ x.reshape(-1, f, inner)).reshape(rows, n)
        inner *= f
    return x


@functools.lru_cache(maxsize=64)
def _matrix(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The orthonormal Sylvester-Hadamard matrix [n, n] (symmetric)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).to(dtype=dtype, device=device)


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
    """[n] float32 of +-1 from ``seed``, drawn on the CPU: equal on every device and machine."""
    generator = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 2, (n,), generator=generator, dtype=torch.int64)
    return (1 - 2 * bits).float().to(device)


def _codes_host(meta: tuple[int, ...], u: np.ndarray, sigma: torch.Tensor, bits: int, iterations: int) -> torch.Tensor:
    """The host path's levels, codes and payload (``host.py``), bit for bit the torch path's:
    past numpy's sort of the fit sample, one compiled call (``kernels.hadamard_codes``).
    u: [R * n] float32, finite; sigma: [R] bfloat16 -> uint8 payload."""
    levels_n = 1 << bits
    values = np.sort(_sample(u, fit_sample_size(levels_n, SAMPLE)))               # [M]
    codes = np.empty(u.size, dtype=np.uint8)                                      # [R * n] _nearest's codes
    levels = hadamard_codes(u, values, normal_levels(levels_n).numpy(), iterations, codes)  # [L]
    head = np.array(meta, dtype="<i4").tobytes() + levels.tobytes() + sigma.view(torch.uint8).numpy().tobytes()
    return host_payload(head, codes, bits)


def fit_levels_host(sample: np.ndarray, levels_n: int, iterations: int) -> np.ndarray:
    """sample: [M] float32 (about unit RMS) -> [L] float32 sorted levels after Lloyd steps, from
    the normal's (each level moves to the mean of the values nearest it; it stops early when none
    moves; a level without values stays): compiled, ``kernels.unweighted_lloyd``."""
    return unweighted_lloyd(np.sort(sample), normal_levels(levels_n).numpy(), iterations)


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
