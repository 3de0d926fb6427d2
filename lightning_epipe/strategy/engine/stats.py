"""Plain counters of what crossed each link and how long each stage computed or waited.

The transport and the runtime update a :class:`PipelineStats`; the monitor callback reads
it. No Trainer, no process group: the arithmetic is testable alone.

Definitions (the report's): *compression ratio* = wire bytes / bytes of the uncompressed
tensors, headers included; *average bandwidth* = bytes / computation time (the busiest
rank's compute seconds; :mod:`lightning_epipe.callbacks.meter` gives bytes / wall time
beside it as the wall-clock rate); *peak bandwidth* = the largest bytes/seconds of one
transfer, timed at the sender from posting a frame to its completion (receivers post
ahead, so that is the transfer; a completion seen late only lowers the rate).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import NamedTuple

__all__ = ["LinkKey", "LinkCounter", "PipelineStats"]


class LinkKey(NamedTuple):
    """One direction of one link as seen from this rank: ``send`` to or ``recv`` from ``peer``
    (a named tuple: one is looked up for every message)."""

    direction: str  # "send" | "recv"
    peer: int
    kind: str  # "activation" | "gradient" | "input"

    def label(self, rank: int) -> str:
        src, dst = (rank, self.peer) if self.direction == "send" else (self.peer, rank)
        return f"{self.kind}/{src}->{dst}"


@dataclass
class LinkCounter:
    messages: int = 0
    bytes: int = 0
    raw_bytes: int = 0
    transfer_seconds: float = 0.0
    peak_bytes_per_second: float = 0.0

    def add(self, nbytes: int, raw_nbytes: int, seconds: float = 0.0) -> None:
        self.messages += 1
        self.bytes += nbytes
        self.raw_bytes += raw_nbytes
        if seconds > 0:
            self.transfer_seconds += seconds
            self.peak_bytes_per_second = max(self.peak_bytes_per_second, nbytes / seconds)

    def add_transfer(self, nbytes: int, seconds: float) -> None:
        """Time one transfer of ``nbytes`` already counted by :meth:`add`."""
        if seconds > 0:
            self.transfer_seconds += seconds
            self.peak_bytes_per_second = max(self.peak_bytes_per_second, nbytes / seconds)

    def merge(self, other: "LinkCounter") -> None:
        self.messages += other.messages
        self.bytes += other.bytes
        self.raw_bytes += other.raw_bytes
        self.transfer_seconds += other.transfer_seconds
        self.peak_bytes_per_second = max(self.peak_bytes_per_second, other.peak_bytes_per_second)

    @property
    def ratio(self) -> float:
        """Wire bytes / uncompressed bytes (1.0 when nothing was sent)."""
        return self.bytes / self.raw_bytes if self.raw_bytes else 1.0

    def as_list(self) -> list[float]:
        return [float(getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def from_list(cls, values: list[float]) -> "LinkCounter":
        ints = {"messages", "bytes", "raw_bytes"}
        return cls(*[int(v) if f.name in ints else float(v) for f, v in zip(fields(cls), values)])


@dataclass
class PipelineStats:
    """Everything one rank measured since the last :meth:`reset`."""

    links: dict[LinkKey, LinkCounter] = field(default_factory=dict)
    compute_seconds: dict[int, float] = field(default_factory=dict)  # per stage
    wait_seconds: float = 0.0
    steps: int = 0
    samples: int = 0
    cache_bytes: int = 0  # a gauge, not a counter: memory of the delta-compression caches now

    def link(self, key: LinkKey) -> LinkCounter:
        counter = self.links.get(key)
        if counter is None:
            counter = self.links[key] = LinkCounter()
        return counter

    def add_compute(self, stage: int, seconds: float) -> None:
        self.compute_seconds[stage] = self.compute_seconds.get(stage, 0.0) + seconds

    def reset(self) -> None:
        self.links.clear()
        self.compute_seconds.clear()
        self.wait_seconds = 0.0
        self.steps = 0
        self.samples = 0

    def total(self, direction: str | None = None, kind: str | None = None) -> LinkCounter:
        """All links matching ``direction``/``kind`` merged into one counter."""
        out = LinkCounter()
        for key, counter in self.links.items():
            if (direction is None or key.direction == direction) and (kind is None or key.kind == kind):
                out.merge(counter)
        return out

    @property
    def busy_seconds(self) -> float:
        return sum(self.compute_seconds.values())

    @property
    def bubble_fraction(self) -> float:
        """Share of pipeline time this rank spent waiting for a peer."""
        total = self.busy_seconds + self.wait_seconds
        return self.wait_seconds / total if total > 0 else 0.0
