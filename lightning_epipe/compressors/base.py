"""The ``Compressor`` interface, its errors and the argument checks codecs share."""

from __future__ import annotations

import abc
import cmath
import copy
import inspect
from typing import ClassVar

import torch

from .packet import Packet, PacketError

__all__ = ["Compressor", "NonFiniteError", "FLOAT_DTYPES"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class NonFiniteError(ValueError):
    """NaN or Inf in a tensor given to ``encode`` (or produced by a narrowing cast)."""


class Compressor(abc.ABC):
    """One stream of tensors through one codec: ``encode(x) -> Packet``, ``decode(p) -> x``.

    The strategy makes one instance per (cut, direction, micro-batch slot), so a stateful
    codec keeps its stream state (e.g. a warm start) on the instance; ``decode`` works on
    any instance of the same class because the payload carries everything it needs.

    To add a codec, subclass, set ``name`` and a unique ``codec_id`` (0..255), take
    keyword-only constructor arguments stored under attributes of the same names, implement
    ``_encode`` and ``_decode``, and decorate the class with ``register_compressor``.

    Example:
        >>> from lightning_epipe.compressors import get_compressor
        >>> c = get_compressor("quantize", bits=8)
        >>> x = torch.randn(64, 64)
        >>> y = c.decode(c.encode(x))
        >>> y.shape == x.shape and round(c.ratio(x), 2)
        0.25
    """

    name: ClassVar[str]
    codec_id: ClassVar[int]
    #: False for codecs that carry any dtype (``none``); lossy codecs take floats only.
    floats_only: ClassVar[bool] = True

    def __init__(self, *, check_finite: bool = True) -> None:
        if not isinstance(check_finite, bool):
            raise ValueError(f"{self.name}: check_finite must be True or False, "
                             f"got {check_finite!r}")
        self.check_finite = check_finite

    # -- the interface --------------------------------------------------------------------

    def encode(self, x: torch.Tensor) -> Packet:
        """Compress ``x`` (any shape, including empty and 0-d) into a packet on x's device."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self.name}: encode takes a torch.Tensor, got {type(x).__name__}")
        if self.floats_only and x.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{self.name} encodes floating tensors {list(FLOAT_DTYPES)}, got "
                            f"{x.dtype}; send integer and bool tensors with 'none'")
        x = x.detach()
        if x.numel() == 0:
            payload = torch.empty(0, dtype=torch.uint8, device=x.device)
        else:
            payload = self._encode(x)
        return Packet(self.codec_id, x.dtype, x.shape, payload)

    def decode(self, packet: Packet) -> torch.Tensor:
        """Rebuild the tensor: same shape and dtype as encoded, on the payload's device."""
        if not isinstance(packet, Packet):
            raise TypeError(f"{self.name}: decode takes a Packet, got {type(packet).__name__}")
        if packet.codec != self.codec_id:
            raise PacketError(f"{self.name} (codec {self.codec_id}) cannot decode a packet "
                              f"of codec {packet.codec}")
        if self.floats_only and packet.dtype not in FLOAT_DTYPES:
            raise PacketError(f"{self.name} packets hold floating tensors, this one says "
                              f"{packet.dtype}")
        if packet.shape.numel() == 0:
            self.expect_packet(packet, packet.payload.numel() == 0, "an empty tensor has no payload")
            return torch.empty(packet.shape, dtype=packet.dtype, device=packet.payload.device)
        return self._decode(packet)

    def ratio(self, x: torch.Tensor) -> float:
        """``encode(x).nbytes`` over the raw bytes of ``x``; 1.0 for an empty ``x``.

        Encodes on a copy, so the stream state of this instance does not move.
        """
        if x.numel() == 0:
            return 1.0
        return copy.deepcopy(self).encode(x).nbytes / (x.numel() * x.element_size())

    @property
    def lossless(self) -> bool:
        """Whether ``decode(encode(x))`` equals ``x`` bit for bit for every input."""
        return False

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Stream state to checkpoint; ``{}`` for stateless codecs."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what ``state_dict`` returned."""
        if state:
            raise ValueError(f"{self.name} is stateless; got state keys {sorted(state)}")

    def reset(self) -> None:
        """Forget the stream state (a no-op for stateless codecs)."""

    def __repr__(self) -> str:
        names = [n for n in inspect.signature(type(self).__init__).parameters if n != "self"]
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    # -- for subclasses -------------------------------------------------------------------

    @abc.abstractmethod
    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        """x: non-empty, detached, accepted dtype -> payload [nbytes] uint8 on x.device."""

    @abc.abstractmethod
    def _decode(self, packet: Packet) -> torch.Tensor:
        """A non-empty packet of this codec -> tensor of packet.shape and packet.dtype."""

    def raise_if_nonfinite(self, x: torch.Tensor, probe: torch.Tensor | float | None = None) -> None:
        """Raise NonFiniteError if ``x`` holds NaN or Inf (unless ``check_finite=False``).

        probe: a cheap 0-d tensor or host float that is non-finite whenever x is (default:
        the sum of x, one read of x; a finite x whose sum overflows only costs an exact
        count).
        """
        if not self.check_finite:
            return
        if probe is None:
            probe = x.sum(dtype=torch.float32)
        if isinstance(probe, torch.Tensor):  # one read to the host: cheaper than isfinite
            probe = probe.item()
        if cmath.isfinite(probe):  # complex tensors pass through "none" too
            return
        nan = int(torch.isnan(x).sum())
        inf = int(torch.isinf(x).sum())
        if nan or inf:
            raise NonFiniteError(
                f"{self.name}: {nan + inf} of {x.numel()} values are not finite ({nan} NaN, "
                f"{inf} Inf) in a tensor of shape {list(x.shape)}; pass check_finite=False "
                "to send them unchecked")

    def expect_packet(self, packet: Packet, ok: bool, what: str) -> None:
        """Raise PacketError saying ``what`` unless ``ok``."""
        if not ok:
            raise PacketError(f"{self.name} packet of shape {list(packet.shape)} and "
                              f"{packet.payload.numel()} payload bytes: {what}")


def check_int(codec: str, name: str, value: object, lo: int, hi: int, why: str = "") -> int:
    """``value`` as an int in ``lo..hi``, else ValueError saying what is allowed."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{codec}: {name} must be an integer in {lo}..{hi}{why}, "
                         f"got {value!r}")
    return value
