"""A link's sustained rate from the training's own sends: bytes / busy time over a window.

``compressor="auto"`` decides from what the pipeline's messages actually took, not from a
short probe: on a token-bucket link (``tc ... tbf rate 20mbit burst 1mbit``) a probe that
fits in the burst, or in the sockets' buffers, measures the burst, not the rate.

What the sender knows of each message (:class:`Transfer`): when it posted the send, when it
*saw* the send complete, its bytes, and whether the message was *queued*: a later message to
the same peer was posted while this one was still in flight. Where a backend reports
completions as they happen (NCCL, the in-memory fabric of the tests) the transport polls its
pending sends before every send and around every receive, so a completion is seen at most one
micro-batch's compute late and the queued flag is exact; gloo reports a send complete only
once it is waited on, so there every completion is seen at the flush that ends the step and
every message counts as queued (the window then measures how long the step's traffic took to
drain: the link's rate where the link is the bottleneck, the pace of the messages where it is
not; the receiver's :class:`Arrivals` tell the two apart). The queued flag separates two
regimes:

- **saturated** (most messages queued): the link is the bottleneck and is busy from the
  first post of a busy stretch to its last completion, so

      rate = window bytes / busy seconds,   busy = length of the union of [posted, done]

  is its sustained rate. The union (not a per-message sum) counts a queued message's wait
  behind the one before it once; a burst or a socket buffer only shortens the first
  message(s) of the window, so the window holds many times more bytes than any burst
  (``window_bytes``, 16 MiB by default). A completion seen late lengthens only the end of
  each busy stretch.
- **not saturated**: transfers finish before the next message is posted. Their
  post->completion times then mix the transfer, the polling delay and buffered sends that
  return before the bytes arrive, so they say little about capacity; what they prove is that
  the link carries the offered load, ``rate >= window bytes / window span`` (span: first
  post to last completion). The estimate is that lower bound, flagged ``lower_bound``.

Why not the fastest messages, or per-message rates: those are exactly what a burst or a
socket buffer inflates (the probe's failure). Why not sum post->completion times: a send that
waits behind another, or for a late receiver, would count that wait as transfer time. A
receiver that posts its receive late (a slower next stage) still makes a saturated estimate
low (on gloo, any receiver does: see above, and :class:`Arrivals`); the cost model (:func:`~lightning_epipe.strategy.compression.auto_choice.predicted_seconds`) hides
transfers behind the slowest stage's compute, which is also what such a wait lasts.

Pure: numbers in, numbers out; no torch, no process group.

    >>> w = TransferWindow(window_bytes=3_000_000, min_bytes=2_000_000)
    >>> for i in range(4):  # 1 MB messages back to back, 0.1 s each; the last one not queued
    ...     w.add(Transfer(posted=0.1 * i, done=0.1 * (i + 1), nbytes=1_000_000, queued=i < 3))
    >>> r = w.estimate()
    >>> round(r.bandwidth), r.lower_bound, r.nbytes
    (10000000, False, 3000000)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["Transfer", "LinkRate", "TransferWindow", "Arrivals", "busy_seconds", "estimate_rate",
           "WINDOW_BYTES", "MIN_BYTES", "MIN_FRAMES", "SATURATED", "KEEPS_PACE"]

#: Bytes of the latest transfers a window keeps (16 MiB: many times a ``tbf`` burst of a
#: few Mbit and Linux's default TCP socket buffers of a few MiB).
WINDOW_BYTES = 16 << 20
#: Bytes a window needs before it gives an estimate (before that the probe stands in).
MIN_BYTES = 2 << 20
#: Share of the window's messages that must be queued for the link to count as saturated.
SATURATED = 0.5
#: Share of a link's frames that must have landed before their receiver came to them for the
#: link to count as keeping pace (:class:`Arrivals`). Measured on the 1024-wide MLP, client-server,
#: chunks 8, 24 frames per link (benchmarks/slow_link_auto.py): 0.46-0.92 on unlimited, 1000 and
#: 500 Mbit/s loopbacks, where uncompressed ran as fast as any codec; 0-0.42 at 100 Mbit/s, where
#: it ran at 0.4x of 8-bit codes. The two ranges nearly meet and a share of 24 frames is good to
#: about +-0.1, so no share separates them reliably, and the two mistakes cost unequally: a slow
#: link judged keeping pace stays uncompressed (at 0.3, one gradient link at 9 of 24 in every
#: repetition: auto at 0.87x of the best fixed codec at 100 Mbit/s), while a fast link judged
#: slow goes to the cost model, whose cheapest codec at the rates such a link reads (the
#: receiver's pace, 16-24 MB/s there) is a cast or none. Hence a share well above the slow range.
KEEPS_PACE = 0.6
#: Frames a link's receiver must have counted before it is judged (two steps of 8 micro-batches).
MIN_FRAMES = 16


@dataclass(frozen=True)
class Transfer:
    """One message as its sender saw it: posted and (seen) done, in ``time.perf_counter``
    seconds; nbytes on the wire; queued: a later message to the same peer was posted first."""

    posted: float
    done: float
    nbytes: int
    queued: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.posted) and math.isfinite(self.done)) or self.done < self.posted:
            raise ValueError(f"a transfer must be done after it is posted, got posted={self.posted!r}, "
                             f"done={self.done!r}")
        if isinstance(self.nbytes, bool) or not isinstance(self.nbytes, int) or self.nbytes < 0:
            raise ValueError(f"nbytes must be an integer >= 0, got {self.nbytes!r}")


@dataclass(frozen=True)
class LinkRate:
    """A window's estimate: bandwidth in bytes/s (``inf`` when no time was measured);
    lower_bound: the link was not saturated, so this is the load it carried, not its
    capacity; nbytes, busy_s, span_s, messages, queued: what it was computed from."""

    bandwidth: float
    lower_bound: bool
    nbytes: int
    busy_s: float
    span_s: float
    messages: int
    queued: int

    def to_json(self) -> dict[str, Any]:
        """Plain numbers (``bandwidth`` inf as the string ``"inf"``: strict JSON has no inf)."""
        return {"bandwidth": "inf" if math.isinf(self.bandwidth) else self.bandwidth,
                "lower_bound": self.lower_bound, "nbytes": self.nbytes, "busy_s": self.busy_s,
                "span_s": self.span_s, "messages": self.messages, "queued": self.queued}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LinkRate":
        bandwidth = data["bandwidth"]
        return cls(bandwidth=math.inf if bandwidth == "inf" else float(bandwidth),
                   lower_bound=bool(data["lower_bound"]), nbytes=int(data["nbytes"]),
                   busy_s=float(data["busy_s"]), span_s=float(data["span_s"]),
                   messages=int(data["messages"]), queued=int(data["queued"]))

    def describe(self) -> str:
        """``"19.8 MB/s sustained over 12 msgs, 8.4 MB"`` or ``">= 3.1 MB/s (not saturated) ..."``."""
        rate = "unlimited" if math.isinf(self.bandwidth) else f"{self.bandwidth / 1e6:.3g} MB/s"
        how = f">= {rate} (link not saturated)" if self.lower_bound else f"{rate} sustained"
        return f"{how} over {self.messages} msgs, {self.nbytes / 1e6:.3g} MB"


def busy_seconds(transfers: Iterable[Transfer]) -> float:
    """Length of the union of the ``[posted, done]`` intervals (overlaps counted once)."""
    total, end = 0.0, -math.inf
    for t in sorted(transfers, key=lambda t: t.posted):
        if t.done <= end:
            continue
        total += t.done - max(t.posted, end)
        end = t.done
    return total


def estimate_rate(transfers: Iterable[Transfer], saturated: float = SATURATED) -> Optional[LinkRate]:
    """The rate of a link over ``transfers`` (see the module docstring); None for none.

    Saturated (at least ``saturated`` of the messages queued): bytes / busy seconds.
    Otherwise a lower bound: bytes / span, the load the link carried without queuing.
    ``inf`` when the time measured is 0.
    """
    transfers = list(transfers)
    if not transfers:
        return None
    nbytes = sum(t.nbytes for t in transfers)
    busy = busy_seconds(transfers)
    span = max(t.done for t in transfers) - min(t.posted for t in transfers)
    queued = sum(t.queued for t in transfers)
    lower_bound = queued < saturated * len(transfers)
    seconds = span if lower_bound else busy
    bandwidth = nbytes / seconds if seconds > 0 else math.inf
    return LinkRate(bandwidth, lower_bound, nbytes, busy, span, len(transfers), queued)


class TransferWindow:
    """The latest transfers to one peer: at least ``window_bytes`` of them once there are.

    :meth:`add` drops the oldest transfers while the rest still hold ``window_bytes``;
    :meth:`estimate` is :func:`estimate_rate` of what is kept, or None below ``min_bytes``.
    """

    def __init__(self, window_bytes: int = WINDOW_BYTES, min_bytes: int = MIN_BYTES) -> None:
        for name, value in (("window_bytes", window_bytes), ("min_bytes", min_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive number of bytes, got {value!r}")
        if min_bytes > window_bytes:
            raise ValueError(f"min_bytes ({min_bytes}) must not exceed window_bytes ({window_bytes}): the "
                             "window would never hold enough to estimate")
        self.window_bytes = window_bytes
        self.min_bytes = min_bytes
        self._transfers: deque[Transfer] = deque()
        self._nbytes = 0

    def __len__(self) -> int:
        return len(self._transfers)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        """What is kept, oldest first."""
        return tuple(self._transfers)

    def add(self, transfer: Transfer) -> None:
        self._transfers.append(transfer)
        self._nbytes += transfer.nbytes
        while self._transfers and self._nbytes - self._transfers[0].nbytes >= self.window_bytes:
            self._nbytes -= self._transfers.popleft().nbytes

    def estimate(self) -> Optional[LinkRate]:
        if self._nbytes < self.min_bytes:
            return None
        return estimate_rate(self._transfers)

    def clear(self) -> None:
        self._transfers.clear()
        self._nbytes = 0


@dataclass
class Arrivals:
    """What a receiver saw of one link's data frames: how many it received (``total``) and how
    many had already landed when it came to them (``ready``: its wait found them complete).

    The sender's view cannot tell a slow link from a busy receiver: gloo delivers a frame only
    into a posted receive, and a receiver posts the next one when it has read the last, so on
    a fast link between two busy stages every send waits for the receiver and the link's
    measured rate is the receiver's pace. The receiver's view settles it: frames that were
    there before they were needed cost the pipeline no time, whatever the link's rate, and a
    codec there can only add its own. Under GPipe a stage's first micro-batch of each phase
    waits for the stage before it to compute, not for the link, so even an infinitely fast link
    shows some frames not ready; :data:`KEEPS_PACE` is the share that counts as keeping pace.

        >>> a = Arrivals()
        >>> for ready in (False, True, True, True):
        ...     a.add(ready)
        >>> a.ready, a.total, a.keeps_pace(min_frames=4)
        (3, 4, True)
        >>> (a - Arrivals(3, 3)).keeps_pace(min_frames=1)  # since a mark: 0 of 1 ready
        False
    """

    ready: int = 0
    total: int = 0

    def add(self, ready: bool) -> None:
        self.ready += bool(ready)
        self.total += 1

    def __sub__(self, other: "Arrivals") -> "Arrivals":
        return Arrivals(self.ready - other.ready, self.total - other.total)

    def keeps_pace(self, min_frames: int = MIN_FRAMES, share: float = KEEPS_PACE) -> bool:
        """At least ``min_frames`` frames, and at least ``share`` of them ready when needed."""
        return self.total >= min_frames and self.ready >= share * self.total

    def to_json(self) -> dict[str, int]:
        return {"ready": self.ready, "total": self.total}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Arrivals":
        return cls(int(data["ready"]), int(data["total"]))
