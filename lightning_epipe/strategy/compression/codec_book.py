"""Which compressor encodes which stream.

A *stream* is one tensor position of one micro-batch slot crossing one cut in one
direction; stateful compressors (power-iteration warm starts, error feedback) keep their
state per stream, so every stream gets its own instance, made on first use.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor

from lightning_epipe.compressors import Compressor, ErrorFeedback, available_compressors, get_compressor
from lightning_epipe.compressors.bottleneck import BOTTLENECK_KEYS, Bottleneck
from lightning_epipe.compressors.delta import DeltaCompressor, SampleCache
from lightning_epipe.compressors.profile import DEFAULT_CANDIDATES

__all__ = ["CodecSpec", "CodecBook", "DeltaConfig", "resolve_specs", "AUTO_KEYS"]

SpecLike = Union[str, Compressor, Bottleneck]
#: ``compressor_kwargs`` keys of ``compressor="auto"`` (not passed to any codec).
AUTO_KEYS = ("error_budget", "retune_every", "tolerance", "window_bytes", "min_bytes", "min_frames")
_NOT_CODEC_KEYS = BOTTLENECK_KEYS + AUTO_KEYS


@dataclass(frozen=True)
class CodecSpec:
    """A compressor by name and keyword arguments, or a prototype instance to copy.

    ``feedback`` wraps every stream in :class:`ErrorFeedback`; ``bottleneck`` (activation
    specs only) puts a learned encoder/decoder pair at the cut, and the codec then carries
    its code ``z`` (both directions, unless the gradient codec is given separately).
    """

    name: Optional[str] = None
    kwargs: dict = field(default_factory=dict)
    prototype: Optional[Compressor] = None
    feedback: bool = False
    bottleneck: Optional[Bottleneck] = None
    auto: bool = False  # compressor="auto": the codec is chosen (and changed) while training

    def make(self) -> Compressor:
        """A fresh codec of this spec, unwrapped (:meth:`CodecBook.get` wraps a stream's)."""
        if self.prototype is not None:
            fresh = copy.deepcopy(self.prototype)
            fresh.reset()
            return fresh
        return get_compressor(self.name, **self.kwargs)

    def describe(self) -> str:
        if self.prototype is not None:
            text = type(self.prototype).__name__
        else:
            args = ",".join(f"{k}={v}" for k, v in sorted(self.kwargs.items()) if k != "check_finite")
            text = f"{self.name}({args})" if args else str(self.name)
        if self.bottleneck is not None:
            text = f"{self.bottleneck.describe()}+{text}"
        if self.auto:
            text = f"auto:{text}"
        return f"errorfeedback({text})" if self.feedback else text


def _spec(value: SpecLike, kwargs: dict, feedback: bool) -> CodecSpec:
    if isinstance(value, str) and value == "auto":  # uncompressed until the first decision
        return CodecSpec("none", {"check_finite": False}, feedback=feedback, auto=True)
    if isinstance(value, str) and value == "bottleneck":
        value = Bottleneck(**{k: v for k, v in kwargs.items() if k in BOTTLENECK_KEYS},
                           **{k: v for k, v in kwargs.items() if k not in _NOT_CODEC_KEYS})
    if isinstance(value, Bottleneck):
        wire = _spec(value.wire, value.wire_kwargs, feedback)
        return CodecSpec(wire.name, wire.kwargs, feedback=feedback, bottleneck=value)
    if isinstance(value, Compressor):
        return CodecSpec(prototype=value, feedback=feedback)
    if isinstance(value, str):
        kwargs = {k: v for k, v in kwargs.items() if k not in _NOT_CODEC_KEYS}
        spec = CodecSpec(name=value, kwargs={**kwargs, "check_finite": False}, feedback=feedback)
        spec.make()  # unknown names and bad arguments fail here, before any process starts
        return spec
    raise TypeError(f"a compressor must be a name, a Compressor or a Bottleneck instance, got {type(value).__name__}")


def resolve_specs(
    value: Union[SpecLike, Sequence[SpecLike]], kwargs: dict, num_cuts: Optional[int], what: str,
    feedback: bool = False,
) -> list[CodecSpec]:
    """One :class:`CodecSpec` per cut from a single name/instance or a per-cut list
    (``num_cuts=None``: check the entries only, the pipeline's size is not known yet)."""
    if isinstance(value, (list, tuple)):
        if num_cuts is not None and len(value) != num_cuts:
            raise ValueError(f"{what} lists {len(value)} compressors but the pipeline has {num_cuts} cuts: give one per cut")
        return [_spec(v, kwargs, feedback) for v in value]
    spec = _spec(value, kwargs, feedback)
    return [spec] * (num_cuts or 1)


@dataclass(frozen=True)
class DeltaConfig:
    """Delta compression of activations: new samples go through ``first``; each cache
    (one per cut and tensor position, on each side) may hold ``cache_limit`` bytes."""

    first: str = "none"
    cache_limit: Optional[int] = None

    def __post_init__(self) -> None:
        get_compressor(self.first)  # an unknown name fails before any process starts
        if self.cache_limit is not None and (isinstance(self.cache_limit, bool) or not isinstance(self.cache_limit, int)
                                             or self.cache_limit <= 0):
            raise ValueError(f"delta_cache_limit must be a positive number of bytes or None, got {self.cache_limit!r}")


class CodecBook:
    """Compressor instances per stream, created lazily from per-cut specs."""

    def __init__(self, activation: list[CodecSpec], gradient: list[CodecSpec], delta: Optional[DeltaConfig] = None) -> None:
        self.specs = {"activation": activation, "gradient": gradient}
        self._streams: dict[tuple[str, int, int, int], Compressor] = {}
        self.raw = get_compressor("none", check_finite=False)
        self.delta = delta
        self.caches: dict[tuple[int, int], SampleCache] = {}

    def warm_up(self) -> None:
        """Encode and decode a small float32 tensor once with every codec this book makes
        (a stage's, the delta's first-crossing codec, and auto's candidates where a link is
        auto): their compiled loops (``compressors.kernels``) are compiled on a machine's
        first run, or loaded from numba's disk cache, here at setup and not in the first
        training steps (where they would stall the step and, under auto, its measurements)."""
        specs = [spec for per_cut in self.specs.values() for spec in per_cut]
        makers = {spec.describe(): spec.make for spec in specs if spec.prototype is None}  # a user's instance: as it is
        if self.delta is not None:
            makers[f"delta first {self.delta.first}"] = lambda: get_compressor(self.delta.first)
        if any(spec.auto for spec in specs):
            makers.update({f"auto {name} {sorted(kwargs.items())}": (lambda n=name, k=kwargs: get_compressor(n, **k))
                           for name, kwargs in DEFAULT_CANDIDATES if name in available_compressors()})
        sample = torch.linspace(-1.0, 1.0, 4096).relu_().reshape(64, 64)  # [64, 64], half of it zeros
        for make in makers.values():
            codec = make()
            codec.decode(codec.encode(sample))

    def get(self, direction: str, cut: int, slot: int, index: int, tensor: Optional[Tensor] = None) -> Compressor:
        """The compressor of a stream; integer/bool tensors always travel raw."""
        if tensor is not None and not tensor.is_floating_point():
            return self.raw
        key = (direction, cut, slot, index)
        codec = self._streams.get(key)
        if codec is None:
            codec = self._streams[key] = self._make_stream(direction, cut, index)
        return codec

    def _make_stream(self, direction: str, cut: int, index: int) -> Compressor:
        """A stream's codec, wrapped here and only here: error feedback around a lossy codec
        (``feedback`` specs), then delta compression around activations (``delta``)."""
        spec = self.specs[direction][cut]
        codec = spec.make()
        if spec.feedback and not codec.lossless and not isinstance(codec, ErrorFeedback):
            codec = ErrorFeedback(codec)
        if self.delta is not None and direction == "activation":
            codec = DeltaCompressor(inner=codec, first=get_compressor(self.delta.first, check_finite=False),
                                    cache=self._cache(cut, index), check_finite=False)
        return codec

    def _cache(self, cut: int, index: int) -> SampleCache:
        cache = self.caches.get((cut, index))
        if cache is None:
            name = f"the activation cache of cut {cut}" + (f", tensor {index}" if index else "")
            cache = self.caches[(cut, index)] = SampleCache(self.delta.cache_limit, name)
        return cache

    @property
    def cache_bytes(self) -> int:
        """Memory held by this rank's delta-compression caches."""
        return sum(c.nbytes for c in self.caches.values())

    def decoder(self, direction: str, cut: int, slot: int, index: int, codec_id: int) -> Compressor:
        """The compressor able to decode a packet with ``codec_id`` on this stream."""
        if codec_id == self.raw.codec_id:
            return self.raw
        return self.get(direction, cut, slot, index)

    def state_dict(self) -> dict[str, Any]:
        streams = {":".join(map(str, k)): c.state_dict() for k, c in self._streams.items() if c.state_dict()}
        caches = {f"cache:{cut}:{index}": c.state_dict() for (cut, index), c in self.caches.items() if c.state_dict()}
        return {**streams, **caches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            if name.startswith("cache:"):
                _, cut, index = name.split(":")
                if self.delta is None:
                    raise ValueError("the checkpoint holds delta-compression caches but delta_compression is off")
                self._cache(int(cut), int(index)).load_state_dict(value)
                continue
            direction, cut, slot, index = name.split(":")
            self.get(direction, int(cut), int(slot), int(index)).load_state_dict(value)

    def describe(self) -> dict[str, list[str]]:
        return {d: [s.describe() for s in specs] for d, specs in self.specs.items()}

    def auto_links(self) -> list[tuple[str, int]]:
        """``(direction, cut)`` of every stream family whose codec ``compressor="auto"`` chooses."""
        return [(d, c) for d in ("activation", "gradient") for c, s in enumerate(self.specs[d]) if s.auto]

    def is_auto(self, direction: str, cut: int) -> bool:
        return self.specs[direction][cut].auto

    def choose(self, direction: str, cut: int, name: str, kwargs: dict) -> None:
        """Switch an auto link to codec ``name``: its streams restart (their state is dropped)."""
        spec = self.specs[direction][cut]
        self.specs[direction] = list(self.specs[direction])
        self.specs[direction][cut] = dataclasses.replace(spec, name=name, kwargs={**kwargs, "check_finite": False})
        for key in [k for k in self._streams if k[0] == direction and k[1] == cut]:
            del self._streams[key]

    def bottlenecks(self) -> dict[int, Bottleneck]:
        """Cut -> the learned bottleneck to put there (cuts without one are left out)."""
        return {c: s.bottleneck for c, s in enumerate(self.specs["activation"]) if s.bottleneck is not None}
