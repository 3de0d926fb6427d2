"""Which compressor encodes which stream.

A *stream* is one tensor position of one micro-batch slot crossing one cut in one
direction; stateful compressors (power-iteration warm starts, error feedback) keep their
state per stream, so every stream gets its own instance, made on first use.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

from torch import Tensor

from lightning_epipe.compressors import Compressor, get_compressor

__all__ = ["CodecSpec", "CodecBook", "resolve_specs"]

SpecLike = Union[str, Compressor]


@dataclass(frozen=True)
class CodecSpec:
    """A compressor by name and keyword arguments, or a prototype instance to copy."""

    name: Optional[str] = None
    kwargs: dict = field(default_factory=dict)
    prototype: Optional[Compressor] = None

    def make(self) -> Compressor:
        if self.prototype is not None:
            fresh = copy.deepcopy(self.prototype)
            fresh.reset()
            return fresh
        return get_compressor(self.name, **self.kwargs)

    def describe(self) -> str:
        if self.prototype is not None:
            return type(self.prototype).__name__
        args = ",".join(f"{k}={v}" for k, v in sorted(self.kwargs.items()) if k != "check_finite")
        return f"{self.name}({args})" if args else str(self.name)


def _spec(value: SpecLike, kwargs: dict) -> CodecSpec:
    if isinstance(value, Compressor):
        return CodecSpec(prototype=value)
    if isinstance(value, str):
        spec = CodecSpec(name=value, kwargs={**kwargs, "check_finite": False})
        spec.make()  # unknown names and bad arguments fail here, before any process starts
        return spec
    raise TypeError(f"a compressor must be a name or a Compressor instance, got {type(value).__name__}")


def resolve_specs(
    value: Union[SpecLike, Sequence[SpecLike]], kwargs: dict, num_cuts: Optional[int], what: str
) -> list[CodecSpec]:
    """One :class:`CodecSpec` per cut from a single name/instance or a per-cut list
    (``num_cuts=None``: check the entries only, the pipeline's size is not known yet)."""
    if isinstance(value, (list, tuple)):
        if num_cuts is not None and len(value) != num_cuts:
            raise ValueError(f"{what} lists {len(value)} compressors but the pipeline has {num_cuts} cuts: give one per cut")
        return [_spec(v, kwargs) for v in value]
    spec = _spec(value, kwargs)
    return [spec] * (num_cuts or 1)


class CodecBook:
    """Compressor instances per stream, created lazily from per-cut specs."""

    def __init__(self, activation: list[CodecSpec], gradient: list[CodecSpec]) -> None:
        self.specs = {"activation": activation, "gradient": gradient}
        self._streams: dict[tuple[str, int, int, int], Compressor] = {}
        self.raw = get_compressor("none", check_finite=False)

    def get(self, direction: str, cut: int, slot: int, index: int, tensor: Optional[Tensor] = None) -> Compressor:
        """The compressor of a stream; integer/bool tensors always travel raw."""
        if tensor is not None and not tensor.is_floating_point():
            return self.raw
        key = (direction, cut, slot, index)
        codec = self._streams.get(key)
        if codec is None:
            codec = self._streams[key] = self.specs[direction][cut].make()
        return codec

    def decoder(self, direction: str, cut: int, slot: int, index: int, codec_id: int) -> Compressor:
        """The compressor able to decode a packet with ``codec_id`` on this stream."""
        if codec_id == self.raw.codec_id:
            return self.raw
        return self.get(direction, cut, slot, index)

    def state_dict(self) -> dict[str, Any]:
        return {":".join(map(str, k)): c.state_dict() for k, c in self._streams.items() if c.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            direction, cut, slot, index = name.split(":")
            self.get(direction, int(cut), int(slot), int(index)).load_state_dict(value)

    def describe(self) -> dict[str, list[str]]:
        return {d: [s.describe() for s in specs] for d, specs in self.specs.items()}
