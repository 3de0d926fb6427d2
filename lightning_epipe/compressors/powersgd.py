"""``powersgd``: a low-rank approximation by warm-started power iteration.

The tensor is read as a batch of matrices M [B, m, n]: [B, C, H, W] -> [B, C, H*W]
(any ndim >= 4 as [B, C, rest]), [B, T, D] as is, [M, N] -> [1, M, N], [N] -> [1, 1, N],
a scalar -> [1, 1, 1]. With Q [B, n, r] carried over from the previous call of the stream
(a fixed-seed random start on the first):

    1. P = M Q              [B, m, r]
    2. P = orthonormalize(P) (reduced QR)
    3. Q = M^T P            [B, n, r]

repeated ``iterations`` times; the receiver rebuilds ``M ~ P Q^T``, the projection of M on
the column space of P. Q is kept for the next call: with inputs that change slowly from
call to call, one iteration per call converges like many.

Tuning: ``rank`` sets the ratio, ``r (m + n) / (m n)``; the error falls as rank grows,
fast for activations whose channels are correlated. ``iterations`` 1-2 with the warm start;
more help only for inputs that change a lot between calls.

A finite CPU tensor of at most ``COMPILED_MAX`` elements runs the iterations in one compiled
call (``kernels.power_iteration``: float64 sums, a Householder QR with LAPACK's signs), and a
CPU packet of that size decodes in one (``kernels.low_rank_product``): the torch path's
factors up to rounding, column signs included, so a stream's warm start carries over between
the paths.

Payload: [wire dtype code u8][0 u8 x3][rank uint32] | P [B, m, r] | Q [B, n, r], in the
input dtype (float32 for a float16 input whose Q would overflow float16).
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch

from .base import Compressor, check_int
from .kernels import low_rank_product, power_iteration
from .packet import DTYPE_CODES, Packet, bytes_as, host_bytes
from .registry import register_compressor

__all__ = ["PowerSGD", "matrix_shape", "COMPILED_MAX"]

#: CPU tensors of at most this many elements encode and decode in compiled calls
#: (``kernels.power_iteration``, ``kernels.low_rank_product``), on one core: at rank 4 and one
#: torch thread, [32, 1024] encodes in ~130 us there against ~340 on the torch path (a QR and
#: two matmuls an iteration) and [64, 1024] in ~225 against ~570, each decode as fast or
#: faster; from ~2**17 elements some shapes decode faster in torch, and from 2**20 some
#: encode faster there (and torch's matmuls take every thread).
COMPILED_MAX = 1 << 16

_PREFIX = struct.Struct("<BBBBI")
_SEED = 0
_WIRES = {code: dtype for dtype, code in DTYPE_CODES.items()}  # wire dtype code -> dtype


def _compiled(numel: int, device: torch.device) -> bool:
    """Whether a tensor of ``numel`` elements on ``device`` takes the compiled calls."""
    return device.type == "cpu" and numel <= COMPILED_MAX


def matrix_shape(shape: torch.Size) -> tuple[int, int, int]:
    """The batch of matrices (B, m, n) a tensor of ``shape`` is compressed as."""
    dims = list(shape)
    if len(dims) >= 3:
        return dims[0], dims[1], math.prod(dims[2:])
    return (1, *([1] * (2 - len(dims))), *dims)


@register_compressor
class PowerSGD(Compressor):
    """Rank-``rank`` approximation, warm-started across the calls of one stream.

    Example:
        >>> c = PowerSGD(rank=2)
        >>> x = torch.randn(4, 8, 2) @ torch.randn(4, 2, 100)   # [B, C, HW] of rank 2
        >>> y = c.decode(c.encode(x))
        >>> float((y - x).norm() / x.norm()) < 1e-4, round(c.ratio(x), 2)
        (True, 0.27)
    """

    name = "powersgd"
    codec_id = 6

    def __init__(self, *, rank: int = 4, iterations: int = 2, check_finite: bool = True) -> None:
        super().__init__(check_finite=check_finite)
        self.rank = check_int(self.name, "rank", rank, 1, 2**31 - 1)
        self.iterations = check_int(self.name, "iterations", iterations, 1, 1000)
        self._q: torch.Tensor | None = None  # [B, n, r] warm start

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        b, m, n = matrix_shape(x.shape)
        # A small (e.g. the last) micro-batch can have fewer rows than the rank: then the
        # factors are full rank and exact; the rank used travels in the prefix.
        rank = min(self.rank, m, n)
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        matrix = x.reshape(b, m, n).to(work)
        q = self._q
        if q is not None and q.shape == (b, n, rank):
            q = q.to(device=x.device, dtype=work)
        else:
            generator = torch.Generator(device=x.device).manual_seed(_SEED)
            q = torch.randn(b, n, rank, generator=generator, device=x.device, dtype=work)
        if _compiled(x.numel(), x.device):  # one compiled call (kernels.power_iteration)
            q_host = q.contiguous().numpy().copy()                                # [B, n, r], overwritten
            p_host = np.empty((b, m, rank), dtype=q_host.dtype)                   # [B, m, r]
            probe = power_iteration(matrix.contiguous().numpy(), q_host, self.iterations, p_host)
            self.raise_if_nonfinite(x, probe=probe)
            p, q = torch.from_numpy(p_host), torch.from_numpy(q_host)
        else:
            self.raise_if_nonfinite(x)
            for _ in range(self.iterations):
                p = torch.linalg.qr(matrix @ q).Q      # [B, m, r], orthonormal columns
                q = matrix.transpose(1, 2) @ p         # [B, n, r]
        self._q = q
        wire = x.dtype
        if wire == torch.float16 and float(q.abs().max()) > torch.finfo(torch.float16).max:
            wire = torch.float32
        head = _PREFIX.pack(DTYPE_CODES[wire], 0, 0, 0, rank)
        return torch.cat([torch.frombuffer(bytearray(head), dtype=torch.uint8).to(x.device),
                          p.to(wire).reshape(-1).view(torch.uint8),
                          q.to(wire).reshape(-1).view(torch.uint8)])

    def _decode(self, packet: Packet) -> torch.Tensor:
        payload = packet.payload
        b, m, n = matrix_shape(packet.shape)
        if payload.numel() < _PREFIX.size:
            self.expect_packet(packet, False, f"shorter than the {_PREFIX.size}-byte prefix")
        code, pad0, pad1, pad2, rank = _PREFIX.unpack(host_bytes(payload, _PREFIX.size).tobytes())
        wire = _WIRES.get(code)
        if wire not in (packet.dtype, torch.float32) or pad0 or pad1 or pad2 or not 1 <= rank <= min(m, n):
            self.expect_packet(packet, False, f"prefix says wire dtype code {code}, rank {rank} (pad {pad0}, {pad1}, "
                                              f"{pad2}); expected the code of {packet.dtype} or float32, rank in "
                                              f"1..{min(m, n)}")
        p_nbytes, q_nbytes = (b * m * rank * wire.itemsize, b * n * rank * wire.itemsize)
        expected = _PREFIX.size + p_nbytes + q_nbytes
        if payload.numel() != expected:
            self.expect_packet(packet, False, f"P [{b}, {m}, {rank}] and Q [{b}, {n}, {rank}] of {wire} take "
                                              f"{expected} bytes with the prefix")
        work = torch.float64 if packet.dtype == torch.float64 else torch.float32
        if _compiled(packet.shape.numel(), payload.device) and wire in (torch.float32, torch.float64):
            raw = payload.numpy()
            factors = raw[_PREFIX.size:].view(np.float32 if wire == torch.float32 else np.float64)  # [B (m + n) r]
            out = np.empty((b, m, n), dtype=np.float64 if work == torch.float64 else np.float32)
            split = b * m * rank
            low_rank_product(factors[:split].reshape(b, m, rank), factors[split:].reshape(b, n, rank), out)
            return torch.from_numpy(out).to(packet.dtype).reshape(packet.shape)
        p = bytes_as(payload[_PREFIX.size:_PREFIX.size + p_nbytes], wire).view(b, m, rank)
        q = bytes_as(payload[_PREFIX.size + p_nbytes:], wire).view(b, n, rank)
        return (p.to(work) @ q.to(work).transpose(1, 2)).to(packet.dtype).reshape(packet.shape)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``{"q": Q [B, n, rank]}`` after the first call, else ``{}``."""
        return {} if self._q is None else {"q": self._q}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a warm start; ``{}`` resets."""
        unknown = sorted(set(state) - {"q"})
        q = state.get("q")
        if unknown or (q is not None and not (isinstance(q, torch.Tensor) and q.dim() == 3
                                              and q.shape[2] == self.rank
                                              and q.is_floating_point())):
            raise ValueError(f"{self.name}: state must be {{}} or {{'q': a float tensor "
                             f"[B, n, {self.rank}]}}, got keys {sorted(state)} "
                             f"{'' if q is None else list(getattr(q, 'shape', []))}")
        self._q = q

    def reset(self) -> None:
        self._q = None
