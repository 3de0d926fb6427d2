"""Measure codecs on one tensor: wire ratio, relative error and encode/decode seconds.

``profile_codecs(x)`` runs every candidate codec on a sample tensor ``x`` (any shape, e.g. a
[batch, features] activation of one cut) and returns one :class:`CodecProfile` per codec
that accepts it. ``lightning_epipe.strategy.compression.auto_choice`` turns these numbers and a measured
link bandwidth into a choice of codec per cut and direction.

    >>> x = torch.relu(torch.randn(64, 256))
    >>> [(p.label, round(p.ratio, 2)) for p in profile_codecs(x, [("none", {}), ("fp16", {})])]
    [('none', 1.0), ('fp16', 0.5)]

Pure tensor math: no process group, no sockets. Times are wall-clock seconds from
``time.perf_counter`` (after a CUDA synchronize when ``x`` is on a GPU), best of ``repeats``
calls, on a fresh codec instance per candidate, so they describe this tensor's size on this
machine under its current load.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .base import Compressor
from .packet import Packet
from .registry import available_compressors, get_compressor

__all__ = ["CodecProfile", "DEFAULT_CANDIDATES", "profile_codecs", "codec_label"]

log = logging.getLogger(__name__)

#: What ``compressor="auto"`` tries, as ``(name, kwargs)``: lossless, the two half-precision
#: casts, the 8-bit scalar quantizers, Lloyd-Max at 8/6/4 bits, the rotated 4-bit code
#: (``hadamard``: the same error, ~0.1, whatever a tensor's tails, where Lloyd-Max's 4 bits
#: pass the error budget on a light-tailed tensor and not on a heavy-tailed gradient), and
#: the two codecs that trade a large error for a small ratio (sparse and low rank).
#: Candidates whose name is not registered are skipped by ``profile_codecs``.
DEFAULT_CANDIDATES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("none", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("quantize", {"bits": 8}),
    ("sortquant", {"bits": 8}),
    ("lloydmax", {"bits": 8}),
    ("lloydmax", {"bits": 6}),
    ("lloydmax", {"bits": 4}),
    ("hadamard", {"bits": 4}),
    ("topk", {"fraction": 0.1, "bits": 8}),
    ("powersgd", {"rank": 4}),
)

#: Encodes before timing: a stateful codec (powersgd's warm start) settles, and the first
#: call's one-off costs (allocator, kernel selection) are not counted.
WARMUP = 3


@dataclass(frozen=True)
class CodecProfile:
    """One codec measured on one tensor.

    label: e.g. ``"sortquant(bits=8)"``; name and kwargs rebuild the codec with
    ``get_compressor(name, **kwargs)``. ratio: packet bytes (headers included) / raw bytes.
    error: ``||decode(encode(x)) - x|| / ||x||`` (L2 over all elements; 0 for an exact
    codec; for an all-zero x, 0 if exact else inf). encode_s, decode_s: best-of-repeats
    seconds for one call on this tensor.
    """

    label: str
    name: str
    kwargs: dict[str, Any] = field(hash=False)
    ratio: float
    error: float
    encode_s: float
    decode_s: float


def codec_label(name: str, kwargs: Mapping[str, Any]) -> str:
    """``"name(k=v, ...)"`` in the kwargs' order, or just ``"name"`` without kwargs."""
    if not kwargs:
        return name
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def profile_codecs(
    x: torch.Tensor,
    candidates: Iterable[tuple[str, Mapping[str, Any]]] = DEFAULT_CANDIDATES,
    repeats: int = 3,
    *,
    warmup: int = WARMUP,
    skipped: list[tuple[str, str]] | None = None,
) -> list[CodecProfile]:
    """Profile each ``(name, kwargs)`` candidate on ``x``, in the candidates' order.

    x: a non-empty tensor with finite values (any shape, dtype and device), e.g. a sample
    activation [batch, features] of the cut being tuned.

    Each candidate gets a fresh instance, ``warmup`` encode+decode rounds, then ``repeats``
    timed encodes and decodes (best of each kept). Ratio and error come from the last timed
    encode, i.e. after the warm-up, so a warm-started codec (powersgd) is judged in its
    steady state.

    A candidate whose name is not registered, or whose encode/decode raises TypeError or
    ValueError for this tensor (e.g. a float-only codec given an integer tensor), is left
    out: the reason is logged and, when ``skipped`` is a list, appended to it as
    ``(label, reason)``. A candidate the codec's constructor rejects (a bad keyword or
    value) is a configuration mistake and raises ValueError.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"profile_codecs takes a torch.Tensor sample, got {type(x).__name__}")
    if x.numel() == 0:
        raise ValueError(f"profile_codecs needs a non-empty sample tensor, got shape "
                         f"{list(x.shape)}; profile on a real activation or gradient")
    if (x.is_floating_point() or x.is_complex()) and not bool(torch.isfinite(x).all()):
        raise ValueError("profile_codecs needs a finite sample tensor, this one holds NaN or "
                         "Inf; profile on a sample from a healthy step")
    _check_count("repeats", repeats, 1)
    _check_count("warmup", warmup, 0)
    x = x.detach()
    known = set(available_compressors())
    profiles: list[CodecProfile] = []
    for candidate in candidates:
        name, kwargs = _check_candidate(candidate)
        label = codec_label(name, kwargs)
        if name not in known:
            _skip(skipped, label, f"codec {name!r} is not registered (available: "
                                  f"{sorted(known)})")
            continue
        try:
            codec = get_compressor(name, **kwargs)
        except (TypeError, ValueError) as error:
            raise ValueError(f"candidate {label}: {error}; fix or remove this candidate") \
                from error
        try:
            profiles.append(_profile_one(codec, label, name, kwargs, x, repeats, warmup))
        except (TypeError, ValueError) as error:
            _skip(skipped, label, f"{type(error).__name__}: {error}")
    return profiles


def _profile_one(codec: Compressor, label: str, name: str, kwargs: dict[str, Any],
                 x: torch.Tensor, repeats: int, warmup: int) -> CodecProfile:
    """Warm up, time ``repeats`` encodes and decodes, measure the last packet."""
    for _ in range(warmup):
        codec.decode(codec.encode(x))
    encode_s = decode_s = math.inf
    packet: Packet | None = None
    for _ in range(repeats):
        seconds, packet = _timed(codec.encode, x)
        encode_s = min(encode_s, seconds)
    assert packet is not None  # repeats >= 1 was checked
    y = None
    for _ in range(repeats):
        seconds, y = _timed(codec.decode, packet)
        decode_s = min(decode_s, seconds)
    if y.shape != x.shape:
        raise ValueError(f"{label} decoded shape {list(y.shape)} for a tensor of shape "
                         f"{list(x.shape)}")
    ratio = packet.nbytes / (x.numel() * x.element_size())
    return CodecProfile(label=label, name=name, kwargs=dict(kwargs), ratio=ratio,
                        error=relative_error(x, y), encode_s=encode_s, decode_s=decode_s)


def relative_error(x: torch.Tensor, y: torch.Tensor) -> float:
    """``||y - x|| / ||x||`` in float64 (x, y: same shape); 0 or inf when x is all zero."""
    x64, y64 = x.to(torch.float64), y.to(device=x.device, dtype=torch.float64)
    diff = float(torch.linalg.vector_norm(y64 - x64))
    norm = float(torch.linalg.vector_norm(x64))
    if norm == 0:
        return 0.0 if diff == 0 else math.inf
    return diff / norm


def _timed(fn, arg):
    """(seconds, fn(arg)), synchronizing the GPU so queued kernels are counted."""
    device = arg.device if isinstance(arg, torch.Tensor) else arg.payload.device
    _sync(device)
    start = time.perf_counter()
    out = fn(arg)
    _sync(device)
    return time.perf_counter() - start, out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_count(what: str, value: object, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"profile_codecs: {what} must be an integer >= {lo}, got {value!r}")


def _check_candidate(candidate: object) -> tuple[str, dict[str, Any]]:
    """``(name, kwargs)`` with a str name and a mapping of str keys, else ValueError."""
    if (not isinstance(candidate, (tuple, list)) or len(candidate) != 2
            or not isinstance(candidate[0], str) or not isinstance(candidate[1], Mapping)
            or not all(isinstance(k, str) for k in candidate[1])):
        raise ValueError(f"a candidate is a (name, kwargs) pair such as ('sortquant', "
                         f"{{'bits': 8}}), got {candidate!r}")
    return candidate[0], dict(candidate[1])


def _skip(skipped: list[tuple[str, str]] | None, label: str, reason: str) -> None:
    log.info("profile_codecs: skipping %s: %s", label, reason)
    if skipped is not None:
        skipped.append((label, reason))
