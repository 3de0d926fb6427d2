"""Codecs by name: ``get_compressor("sortquant", bits=8)`` makes a new stream."""

from __future__ import annotations

import inspect

from . import packet
from .base import Compressor

__all__ = ["register_compressor", "get_compressor", "available_compressors"]

_by_name: dict[str, type[Compressor]] = {}


def register_compressor(cls: type[Compressor]) -> type[Compressor]:
    """Class decorator: make ``cls`` known to ``get_compressor`` and to ``Packet.from_bytes``.

    ``cls.name`` and ``cls.codec_id`` (an int in 0..255) must be unused.

    Example:
        >>> import torch
        >>> @register_compressor
        ... class Halve(Compressor):
        ...     name, codec_id = "halve-example", 200
        ...     def _encode(self, x):
        ...         return (x.reshape(-1) / 2).float().view(torch.uint8)
        ...     def _decode(self, p):
        ...         return (p.payload.view(torch.float32) * 2).to(p.dtype).reshape(p.shape)
        >>> "halve-example" in available_compressors()
        True
    """
    if not (isinstance(cls, type) and issubclass(cls, Compressor)):
        raise TypeError(f"register_compressor takes a Compressor subclass, got {cls!r}")
    name, codec_id = getattr(cls, "name", None), getattr(cls, "codec_id", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__qualname__}.name must be a non-empty str, got {name!r}")
    if isinstance(codec_id, bool) or not isinstance(codec_id, int) or not 0 <= codec_id <= 255:
        raise ValueError(f"{cls.__qualname__}.codec_id must be an int in 0..255, "
                         f"got {codec_id!r}")
    for other in _by_name.values():
        if other is not cls and (other.name == name or other.codec_id == codec_id):
            raise ValueError(f"{cls.__qualname__} (name {name!r}, codec id {codec_id}) "
                             f"clashes with {other.__qualname__} (name {other.name!r}, codec "
                             f"id {other.codec_id}); used ids: {sorted(packet.KNOWN_CODEC_IDS)}")
    _by_name[name] = cls
    packet.KNOWN_CODEC_IDS.add(codec_id)
    return cls


def available_compressors() -> list[str]:
    """Registered codec names, in codec-id order."""
    return [c.name for c in sorted(_by_name.values(), key=lambda c: c.codec_id)]


def get_compressor(name: str, **kwargs: object) -> Compressor:
    """A new instance (a new stream) of the codec called ``name``.

    Raises ValueError for an unknown name (listing the known ones), for a keyword the
    codec does not take (listing the ones it does) and for a bad value.

    Example:
        >>> get_compressor("sortquant", bits=12)
        SortQuant(bits=12, split=3, boundaries='estimated', check_finite=True)
    """
    cls = _by_name.get(name)
    if cls is None:
        raise ValueError(f"unknown compressor {name!r}; available: {available_compressors()}")
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p, v in params.items() if p != "self" and v.kind != inspect.Parameter.VAR_KEYWORD]
    open_ended = any(v.kind == inspect.Parameter.VAR_KEYWORD for v in params.values())  # a wrapper's inner codec
    unexpected = [] if open_ended else sorted(set(kwargs) - set(accepted))
    if unexpected:
        raise ValueError(f"{name} takes the keywords {accepted}, got unexpected {unexpected}")
    return cls(**kwargs)
