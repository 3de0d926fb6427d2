"""AQ-SGD-style delta compression: send how a sample's activation changed since last time.

Activations of the same training sample move slowly from epoch to epoch, so their change
compresses far better than the activation itself (Wang et al., "Fine-tuning language
models over slow networks using activation compression with guarantees", 2022). Both
sides of a cut keep a per-sample cache ``m`` of what the receiver reconstructed the last
time it saw each sample (rows ``[num_samples, *row_shape]``). For a micro-batch
``x [b, ...]`` with sample ids ``ids [b]``:

    seen rows:  send C(x - m[ids]);  both sides set m[ids] += decode(...)
    new rows:   send F(x) (``first``: uncompressed or high-bit); both set m[ids] = decode(...)

The sender updates its cache with the decode of its own packets, so the two caches stay
bit-identical and the error never accumulates: the receiver's value is always within one
compression error of the current activation. Without ids (evaluation), the whole tensor
goes through ``first``.

Payload (little-endian): ``[mode u8][0 u8 x3][n_new u32][n_seen u32][first_nbytes u64]``,
then the packet of the new rows (``first``) and the packet of the seen rows' deltas
(``inner``), each a full :class:`~lightning_epipe.compressors.Packet`; mode 0 (no ids) has
only the first packet. The receiver checks the counts against its own cache, so caches that
drifted apart (a lost step) are a :class:`PacketError`, not silent garbage.

Memory: one row per training sample per cut, on the sender *and* the receiver, in the
activation's dtype; :class:`SampleCache` refuses to grow past ``max_bytes`` and says how
much it would need.
"""

from __future__ import annotations

import struct
from typing import Optional, Union

import torch
from torch import Tensor

from .base import Compressor
from .packet import Packet
from .registry import get_compressor, register_compressor

__all__ = ["SampleCache", "DeltaCompressor", "CacheTooLarge"]

_PREFIX = struct.Struct("<B3xIIQ")


class CacheTooLarge(MemoryError):
    """A per-sample activation cache would exceed its memory limit."""


def _human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"  # pragma: no cover


class SampleCache:
    """The last reconstruction of every sample's row at one cut: ``rows [capacity, *row]``.

    ``capacity`` grows to the largest id seen (or ``reserve(num_samples)`` up front);
    ``seen [capacity]`` says which rows hold a value. ``name`` only serves error messages.
    """

    def __init__(self, max_bytes: Optional[int] = None, name: str = "cache") -> None:
        self.max_bytes = max_bytes
        self.name = name
        self.rows: Optional[Tensor] = None
        self.seen: Optional[Tensor] = None

    @property
    def nbytes(self) -> int:
        """Bytes held (rows and the seen mask)."""
        if self.rows is None:
            return 0
        return self.rows.numel() * self.rows.element_size() + self.seen.numel()

    def reserve(self, capacity: int, like: Tensor) -> None:
        """Room for ids ``0..capacity-1`` of rows shaped like ``like[0]`` (``like``: [b, ...])."""
        row_shape = tuple(like.shape[1:])
        if self.rows is not None and self.rows.device != like.device:  # e.g. restored from a checkpoint on the host
            self.rows, self.seen = self.rows.to(like.device), self.seen.to(like.device)
        if self.rows is not None and (tuple(self.rows.shape[1:]) != row_shape or self.rows.dtype != like.dtype):
            raise ValueError(
                f"{self.name}: rows of shape {list(row_shape)} {like.dtype} after {list(self.rows.shape[1:])}"
                f" {self.rows.dtype}: delta compression needs every sample's activation to keep its shape"
            )
        have = 0 if self.rows is None else self.rows.shape[0]
        if capacity <= have:
            return
        row_bytes = like[0].numel() * like.element_size() + 1
        need = capacity * row_bytes
        if self.max_bytes is not None and need > self.max_bytes:
            raise CacheTooLarge(
                f"{self.name}: delta compression caches every training sample's activation: {capacity} samples x"
                f" {list(row_shape)} {like.dtype} = {_human(need)} on this rank (and as much on the other side of"
                f" the cut), over the limit of {_human(self.max_bytes)}. Raise delta_cache_limit, cut the"
                " pipeline where activations are smaller, or use a codec without delta compression"
            )
        rows = torch.zeros((capacity, *row_shape), dtype=like.dtype, device=like.device)
        seen = torch.zeros(capacity, dtype=torch.bool, device=like.device)
        if self.rows is not None:
            rows[:have] = self.rows
            seen[:have] = self.seen
        self.rows, self.seen = rows, seen

    def state_dict(self) -> dict[str, Tensor]:
        return {} if self.rows is None else {"rows": self.rows, "seen": self.seen}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if not state:
            self.rows = self.seen = None
            return
        rows, seen = state.get("rows"), state.get("seen")
        if not (isinstance(rows, Tensor) and isinstance(seen, Tensor) and seen.dtype == torch.bool
                and seen.shape == rows.shape[:1] and set(state) == {"rows", "seen"}):
            raise ValueError(f"{self.name}: state must be {{'rows': [N, ...], 'seen': [N] bool}}, got {sorted(state)}")
        self.rows, self.seen = rows, seen


@register_compressor
class DeltaCompressor(Compressor):
    """Compress each sample's change since it last crossed (``inner``); new samples with ``first``.

    ``bind(ids)`` before every ``encode``/``decode`` of a training micro-batch gives the
    sample ids of its rows (``None``: evaluation, everything through ``first``). One
    :class:`SampleCache` is shared by all streams of one cut and side.

    Example:
        >>> sender = DeltaCompressor(inner="quantize", bits=2)
        >>> receiver = DeltaCompressor(inner="quantize", bits=2)
        >>> ids, x = torch.arange(4), torch.randn(4, 16)
        >>> for step in range(3):            # the same samples, slowly changing
        ...     x = x + 0.01 * torch.randn(4, 16)
        ...     sender.bind(ids); receiver.bind(ids)
        ...     y = receiver.decode(sender.encode(x))
        >>> bool((y - x).abs().max() < 0.02)  # 2-bit codes of small deltas (steps of ~0.02)
        True
    """

    name = "delta"
    codec_id = 9

    def __init__(self, *, inner: Union[str, Compressor] = "lloydmax", first: Union[str, Compressor] = "none",
                 cache: Optional[SampleCache] = None, check_finite: bool = True, **inner_kwargs: object) -> None:
        super().__init__(check_finite=check_finite)
        self.inner = get_compressor(inner, check_finite=check_finite, **inner_kwargs) if isinstance(inner, str) else inner
        self.first = get_compressor(first, check_finite=check_finite) if isinstance(first, str) else first
        self.inner_kwargs = inner_kwargs
        for role, codec in (("inner", self.inner), ("first", self.first)):
            if not isinstance(codec, Compressor) or isinstance(codec, DeltaCompressor):
                raise TypeError(f"{self.name}: {role} must be a codec name or a Compressor (not a delta one), got {codec!r}")
        self.cache = cache if cache is not None else SampleCache(name=self.name)
        self._ids: Optional[Tensor] = None
        self._reserve = 0

    def bind(self, ids: Optional[Tensor], num_samples: int = 0) -> None:
        """The sample ids ``[b]`` of the next tensor's rows (``None``: no delta); reserve
        room for ``num_samples`` ids up front, so a cache too large fails at the first step."""
        self._ids = ids
        self._reserve = num_samples

    def _encode(self, x: Tensor) -> Tensor:
        self.raise_if_nonfinite(x)
        ids = self._ids
        if ids is None or x.dim() == 0:
            return self._payload(0, 0, 0, self.first.encode(x), None)
        ids = self._check_ids(ids, x.shape[0], x.device)
        self.cache.reserve(max(self._reserve, int(ids.max()) + 1), x)
        seen = self.cache.seen[ids]
        new_ids, old_ids = ids[~seen], ids[seen]
        first = self.first.encode(x[~seen])
        delta = self.inner.encode(x[seen] - self.cache.rows[old_ids])
        self._update(new_ids, old_ids, first, delta)
        return self._payload(1, new_ids.numel(), old_ids.numel(), first, delta)

    def _decode(self, packet: Packet) -> Tensor:
        payload = packet.payload
        self.expect_packet(packet, payload.numel() >= _PREFIX.size, f"shorter than the {_PREFIX.size}-byte prefix")
        mode, n_new, n_seen, first_nbytes = _PREFIX.unpack(bytes(payload[:_PREFIX.size].tolist()))
        self.expect_packet(packet, mode in (0, 1) and _PREFIX.size + first_nbytes <= payload.numel(),
                     f"prefix says mode {mode}, first packet of {first_nbytes} bytes")
        first = Packet.from_bytes(payload[_PREFIX.size:_PREFIX.size + first_nbytes])
        rest = payload[_PREFIX.size + first_nbytes:]
        if mode == 0:
            self.expect_packet(packet, rest.numel() == 0 and first.shape == packet.shape, "mode 0 holds one packet of the full shape")
            return self.first.decode(first).to(packet.dtype)
        ids = self._ids
        self.expect_packet(packet, ids is not None, "a delta packet needs the sample ids of its rows (bind(ids))")
        ids = self._check_ids(ids, packet.shape[0], payload.device)
        like = torch.empty((1, *packet.shape[1:]), dtype=packet.dtype, device=payload.device)
        self.cache.reserve(max(self._reserve, int(ids.max()) + 1), like)
        seen = self.cache.seen[ids]
        self.expect_packet(packet, int(seen.sum()) == n_seen and ids.numel() - n_seen == n_new,
                     f"{n_seen} rows are deltas on the sender, {int(seen.sum())} here: the two caches of this cut"
                     " diverged (were steps lost or replayed?)")
        delta = Packet.from_bytes(rest)
        new_ids, old_ids = ids[~seen], ids[seen]
        self._update(new_ids, old_ids, first, delta)
        return self.cache.rows[ids].clone()

    def _update(self, new_ids: Tensor, old_ids: Tensor, first: Packet, delta: Packet) -> None:
        """Both sides: new rows take the decoded first packet, seen rows add the decoded delta."""
        rows = self.cache.rows
        if new_ids.numel():
            rows[new_ids] = self.first.decode(first).to(rows.dtype)
            self.cache.seen[new_ids] = True
        if old_ids.numel():
            rows[old_ids] += self.inner.decode(delta).to(rows.dtype)

    def _check_ids(self, ids: Tensor, rows: int, device: torch.device) -> Tensor:
        """``ids`` checked, as int64 on ``device`` (the stage's, where the cache lives)."""
        if ids.dim() != 1 or ids.numel() != rows or ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{self.name}: sample ids must be [b] integers for a tensor of {rows} rows, got "
                             f"{ids.dtype} {list(ids.shape)}")
        if ids.numel() and (int(ids.min()) < 0 or ids.unique().numel() != ids.numel()):
            raise ValueError(f"{self.name}: sample ids must be distinct and >= 0 within a micro-batch")
        return ids.long().to(device)

    def _payload(self, mode: int, n_new: int, n_seen: int, first: Packet, delta: Optional[Packet]) -> Tensor:
        first_bytes = first.to_bytes()
        parts = [torch.frombuffer(bytearray(_PREFIX.pack(mode, n_new, n_seen, first_bytes.numel())),
                                  dtype=torch.uint8).to(first_bytes.device), first_bytes]
        if delta is not None:
            parts.append(delta.to_bytes())
        return torch.cat(parts)

    def state_dict(self) -> dict[str, Tensor]:
        """The streams' own state is the inner codec's; the shared cache is saved by its owner."""
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.inner.load_state_dict(state)

    def reset(self) -> None:
        self.inner.reset()
        self._ids = None

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.inner_kwargs.items())
        return (f"DeltaCompressor(inner={self.inner.name!r}, first={self.first.name!r}, "
                f"check_finite={self.check_finite!r}{extra})")
