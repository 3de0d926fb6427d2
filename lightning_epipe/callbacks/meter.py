"""What the pipeline moved and how fast, as plain numbers: no Trainer, no process group.

:class:`PipelineMeter` turns cumulative :class:`~lightning_epipe.strategy.engine.stats.PipelineStats`
of every rank into metrics over a window (the pattern of Lightning's ``Throughput`` under
``ThroughputMonitor``): :class:`~lightning_epipe.callbacks.EPipeMonitor` feeds it, tests feed
it by hand. Definitions (the report's):

- *compression ratio* = wire bytes / raw bytes: the transport header and the codec packet
  over the bytes of the uncompressed tensors. ``ratio`` counts every byte the ranks send,
  the raw inputs of the chain placement included; per rank, per direction and per cut too;
- *bytes* of a link = what its sender put on the wire (its receiver counts the same);
- *computation time* of a window = the compute seconds of its busiest rank: how long the
  window's work takes if no rank ever waits for a link;
- *average bandwidth* (``bandwidth_avg``) = bytes of a link / computation time: the rate
  the link must carry for its transfers to hide behind the computation. The *wall-clock
  rate* (``bandwidth_wall``) = bytes / wall seconds of the window (validation and idle
  time included);
- *peak bandwidth* = the largest bytes/seconds of one transfer, timed at the sender from
  posting a frame to its completion (receivers post ahead, so that is the transfer; a
  completion seen late only lowers the rate). The counters keep a running maximum, so this is the
  peak of the run so far, not of the window;
- *bubble* of a rank = seconds it waited for a peer / (its compute seconds + those);
- *throughput* = samples (batches) / client training seconds (validation excluded).

Every counter includes every pipelined forward of the window, validation ones too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from lightning_epipe.strategy.planning.partition import PipelinePlan
from lightning_epipe.strategy.engine.stats import LinkCounter, LinkKey, PipelineStats

__all__ = ["PipelineLink", "pipeline_links", "Measurement", "PipelineMeter", "Stopwatch", "stats_delta", "format_summary"]


@dataclass(frozen=True)
class PipelineLink:
    """``kind`` messages from rank ``src`` to rank ``dst``; ``cuts`` lists the cuts they cross.

    Example:
        >>> link = PipelineLink("activation", 0, 1, cuts=(0,))
        >>> link.label, link.send_key, link.recv_key
        ('activation/0->1', LinkKey(direction='send', peer=1, kind='activation'), LinkKey(direction='recv', peer=0, kind='activation'))
    """

    kind: str  # "activation" | "gradient" | "input"
    src: int
    dst: int
    cuts: tuple[int, ...] = ()  # empty for the raw inputs of the chain placement

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.src}->{self.dst}"

    @property
    def send_key(self) -> LinkKey:
        """The key of this link in the sender's (``src``) stats."""
        return LinkKey("send", self.dst, self.kind)

    @property
    def recv_key(self) -> LinkKey:
        """The key of this link in the receiver's (``dst``) stats."""
        return LinkKey("recv", self.src, self.kind)


def pipeline_links(plan: PipelinePlan) -> tuple[PipelineLink, ...]:
    """Every link of ``plan``: raw inputs (chain placement), then activations and gradients by cut.

    Example:
        >>> from lightning_epipe.strategy import plan_pipeline
        >>> [l.label for l in pipeline_links(plan_pipeline(4, 2, [1, 3], "chain"))]
        ['input/0->1', 'activation/1->0', 'gradient/0->1']
    """
    cuts: dict[tuple[str, int, int], list[int]] = {}
    for cut in range(plan.num_cuts):
        src, dst = plan.cut_ranks(cut)
        cuts.setdefault(("activation", src, dst), []).append(cut)
    for cut in range(plan.num_cuts):
        cuts.setdefault(("gradient", *plan.cut_ranks(cut, "gradient")), []).append(cut)
    links = [PipelineLink("input", 0, plan.input_rank)] if plan.input_rank != 0 else []
    return tuple(links + [PipelineLink(k, s, d, tuple(c)) for (k, s, d), c in cuts.items()])


@dataclass(frozen=True)
class Measurement:
    """Cumulative totals at one instant, counted from the start of the run.

    ``ranks`` maps every rank to its counters (``wait_seconds`` filled in); ``time`` is the
    client's training time (validation excluded), ``wall`` the wall-clock time.
    """

    time: float = 0.0
    wall: float = 0.0
    batches: int = 0
    samples: int = 0
    ranks: Mapping[int, PipelineStats] = field(default_factory=dict)


def stats_delta(after: PipelineStats, before: PipelineStats) -> PipelineStats:
    """What ``after`` counted since ``before`` (peaks stay ``after``'s running maxima)."""
    out = PipelineStats(
        wait_seconds=after.wait_seconds - before.wait_seconds,
        steps=after.steps - before.steps,
        samples=after.samples - before.samples,
        cache_bytes=after.cache_bytes,
    )
    for key, counter in after.links.items():
        old = before.links.get(key, LinkCounter())
        out.links[key] = LinkCounter(
            counter.messages - old.messages,
            counter.bytes - old.bytes,
            counter.raw_bytes - old.raw_bytes,
            counter.transfer_seconds - old.transfer_seconds,
            counter.peak_bytes_per_second,
        )
    for stage, seconds in after.compute_seconds.items():
        out.compute_seconds[stage] = seconds - before.compute_seconds.get(stage, 0.0)
    return out


class Stopwatch:
    """Seconds since :meth:`start`, less the stretches between :meth:`pause` and :meth:`resume`.

    Example:
        >>> watch = Stopwatch(); watch.start(); watch.pause(); watch.resume()
        >>> watch.elapsed >= 0
        True
    """

    def __init__(self) -> None:
        self._start: Optional[float] = None
        self._paused_at: Optional[float] = None
        self._paused = 0.0

    @property
    def running(self) -> bool:
        return self._start is not None and self._paused_at is None

    def start(self) -> None:
        self._start, self._paused_at, self._paused = time.perf_counter(), None, 0.0

    def pause(self) -> None:
        if self.running:
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._paused += time.perf_counter() - self._paused_at
            self._paused_at = None

    @property
    def elapsed(self) -> float:
        if self._start is None:
            return 0.0
        now = self._paused_at if self._paused_at is not None else time.perf_counter()
        return now - self._start - self._paused


@dataclass
class _Window:
    """One window of a run: the per-rank deltas and the client's clocks."""

    time: float
    wall: float
    batches: int
    samples: int
    ranks: dict[int, PipelineStats]

    def sent(self, link: PipelineLink) -> LinkCounter:
        """The link's counter at its sender (or, missing that, at its receiver)."""
        for rank, key in ((link.src, link.send_key), (link.dst, link.recv_key)):
            counter = self.ranks.get(rank, PipelineStats()).links.get(key)
            if counter is not None:
                return counter
        return LinkCounter()

    def received(self, link: PipelineLink) -> LinkCounter:
        return self.ranks.get(link.dst, PipelineStats()).links.get(link.recv_key, LinkCounter())

    @property
    def compute_seconds(self) -> float:
        """The computation time: the busiest rank's compute seconds."""
        return max((stats.busy_seconds for stats in self.ranks.values()), default=0.0)

    def rates(self, nbytes: float) -> dict[str, float]:
        """``nbytes`` over the computation time (``avg``) and over the wall time (``wall``)."""
        seconds = {"avg": self.compute_seconds, "wall": self.wall}
        return {name: nbytes / s for name, s in seconds.items() if s > 0}


class PipelineMeter:
    """Throughput, compression ratios, bytes, bandwidth and bubble of a pipeline over windows.

    Feed it cumulative :class:`Measurement` s with :meth:`update`; :meth:`compute` gives the
    metrics since a named :meth:`mark` (or since the start), :meth:`summary` the whole run.

    Example:
        >>> from lightning_epipe.strategy import plan_pipeline
        >>> meter = PipelineMeter(plan_pipeline(4, 2, [1, 2, 1]))
        >>> client, server = PipelineStats(), PipelineStats()
        >>> client.link(LinkKey("send", 1, "activation")).add(1000, 4000)
        >>> server.link(LinkKey("recv", 0, "activation")).add(1000, 4000, seconds=0.001)
        >>> client.add_compute(0, 0.5); server.add_compute(1, 1.25)
        >>> meter.update(Measurement(time=2.0, wall=2.5, batches=4, samples=128, ranks={0: client, 1: server}))
        >>> m = meter.compute()
        >>> m["throughput_samples_per_s"], m["ratio/activation/cut0"], m["compute_s"]
        (64.0, 0.25, 1.25)
        >>> m["bandwidth_avg/activation/0->1"], m["bandwidth_wall/activation/0->1"]
        (800.0, 400.0)
        >>> meter.mark("step")   # the next compute("step") starts here
    """

    def __init__(self, plan: PipelinePlan) -> None:
        self.plan = plan
        self.links = pipeline_links(plan)
        self._start = Measurement()
        self._latest = self._start
        self._marks: dict[str, Measurement] = {}

    @property
    def latest(self) -> Measurement:
        return self._latest

    def update(self, measurement: Measurement) -> None:
        """Record the cumulative totals now; they may not go backwards."""
        last = self._latest
        for name in ("time", "wall", "batches", "samples"):
            if getattr(measurement, name) < getattr(last, name):
                raise ValueError(
                    f"PipelineMeter.update: {name} went backwards ({getattr(last, name)} -> {getattr(measurement, name)});"
                    " pass totals counted from the start of the run"
                )
        self._latest = measurement

    def mark(self, name: str) -> None:
        """Start window ``name`` at the latest measurement."""
        self._marks[name] = self._latest

    def _window(self, since: Optional[str]) -> _Window:
        before = self._marks.get(since, self._start) if since is not None else self._start
        after = self._latest
        ranks = {
            rank: stats_delta(stats, before.ranks.get(rank, PipelineStats())) for rank, stats in after.ranks.items()
        }
        return _Window(
            after.time - before.time, after.wall - before.wall, after.batches - before.batches,
            after.samples - before.samples, ranks,
        )

    def compute(self, since: Optional[str] = None) -> dict[str, float]:
        """Metrics of the window since mark ``since`` (the start if ``None`` or never marked).

        Keys (``B`` bytes, ``s`` seconds; ``<link>`` like ``activation/0->1``):
        ``throughput_samples_per_s``, ``throughput_batches_per_s``; ``ratio`` (every byte sent,
        raw inputs included), ``ratio/activation``, ``ratio/gradient``, ``ratio/input``,
        ``ratio/<kind>/cut<c>``, ``rank<r>/ratio`` (what rank ``r`` sends); ``bytes/<link>``;
        ``compute_s`` (the computation time), ``bandwidth_avg/<link>`` (B / computation time),
        ``bandwidth_wall/<link>`` (B / wall time), ``bandwidth_peak/<link>`` (B/s);
        ``rank<r>/bytes_sent``, ``rank<r>/bytes_received``; ``stage<s>/compute_s``;
        ``rank<r>/wait_s``, ``rank<r>/bubble``, ``bubble``; ``rank<r>/cache_bytes`` (memory of
        the delta-compression caches, where there are any). A ratio of a window without
        traffic and a rate of a window without time are left out.
        """
        w = self._window(since)
        out: dict[str, float] = {}
        if w.time > 0:
            out["throughput_samples_per_s"] = w.samples / w.time
            out["throughput_batches_per_s"] = w.batches / w.time
        out.update(self._ratios(w))
        if w.compute_seconds > 0:
            out["compute_s"] = w.compute_seconds
        for link in self.links:
            sent = w.sent(link)
            out[f"bytes/{link.label}"] = float(sent.bytes)
            for name, rate in w.rates(sent.bytes).items():
                out[f"bandwidth_{name}/{link.label}"] = rate
            peak = max(sent.peak_bytes_per_second, w.received(link).peak_bytes_per_second)
            if peak > 0:
                out[f"bandwidth_peak/{link.label}"] = peak
        for rank in sorted(w.ranks):
            stats = w.ranks[rank]
            out[f"rank{rank}/bytes_sent"] = float(stats.total("send").bytes)
            out[f"rank{rank}/bytes_received"] = float(stats.total("recv").bytes)
        for stage, rank in enumerate(self.plan.stage_ranks):
            if rank in w.ranks:
                out[f"stage{stage}/compute_s"] = w.ranks[rank].compute_seconds.get(stage, 0.0)
        for rank in sorted(w.ranks):
            out[f"rank{rank}/wait_s"] = w.ranks[rank].wait_seconds
            out[f"rank{rank}/bubble"] = w.ranks[rank].bubble_fraction
            if w.ranks[rank].cache_bytes:
                out[f"rank{rank}/cache_bytes"] = float(w.ranks[rank].cache_bytes)
        busy = sum(s.busy_seconds + s.wait_seconds for s in w.ranks.values())
        if busy > 0:
            out["bubble"] = sum(s.wait_seconds for s in w.ranks.values()) / busy
        return out

    def _ratios(self, w: _Window) -> dict[str, float]:
        """Wire bytes / raw bytes: per cut and direction, per kind, per sending rank and overall."""
        groups: dict[str, LinkCounter] = {}
        for link in self.links:
            sent = w.sent(link)
            for name in (f"ratio/{link.kind}", f"rank{link.src}/ratio", "ratio",
                         *(f"ratio/{link.kind}/cut{cut}" for cut in link.cuts)):
                groups.setdefault(name, LinkCounter()).merge(sent)
        return {name: counter.ratio for name, counter in sorted(groups.items()) if counter.raw_bytes}

    def summary(self) -> dict[str, Any]:
        """The whole run so far as plain data (JSON-serializable); see :func:`format_summary`."""
        w = self._window(None)
        metrics = self.compute(None)
        links = {}
        for link in self.links:
            sent, received = w.sent(link), w.received(link)
            links[link.label] = {
                "kind": link.kind, "src": link.src, "dst": link.dst, "cuts": list(link.cuts),
                "messages": sent.messages, "bytes_sent": sent.bytes, "bytes_received": received.bytes,
                "raw_bytes": sent.raw_bytes, "ratio": sent.ratio if sent.raw_bytes else None,
                **{f"bandwidth_{name}": w.rates(sent.bytes).get(name) for name in ("avg", "wall")},
                "bandwidth_peak": max(sent.peak_bytes_per_second, received.peak_bytes_per_second) or None,
            }
        ranks = {}
        for rank in sorted(w.ranks):
            stats = w.ranks[rank]
            ranks[rank] = {
                "stages": list(self.plan.stages_of(rank)), "ratio": metrics.get(f"rank{rank}/ratio"),
                "bytes_sent": stats.total("send").bytes, "bytes_received": stats.total("recv").bytes,
                "compute_s": stats.busy_seconds, "wait_s": stats.wait_seconds, "bubble": stats.bubble_fraction, "cache_bytes": stats.cache_bytes,
            }
        return {
            "placement": self.plan.placement,
            "stage_ranks": list(self.plan.stage_ranks),
            "batches": w.batches,
            "samples": w.samples,
            "train_seconds": w.time,
            "wall_seconds": w.wall,
            "compute_seconds": w.compute_seconds,
            "throughput_samples_per_s": metrics.get("throughput_samples_per_s"),
            "throughput_batches_per_s": metrics.get("throughput_batches_per_s"),
            "ratio": metrics.get("ratio"),
            "ratio_activation": metrics.get("ratio/activation"),
            "ratio_gradient": metrics.get("ratio/gradient"),
            "ratio_input": metrics.get("ratio/input"),
            "bytes": sum(link["bytes_sent"] for link in links.values()),
            "links": links,
            "stages": {
                stage: {"rank": rank, "compute_s": w.ranks.get(rank, PipelineStats()).compute_seconds.get(stage, 0.0)}
                for stage, rank in enumerate(self.plan.stage_ranks)
            },
            "ranks": ranks,
            "bubble": metrics.get("bubble"),
        }


def _bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _num(value: Optional[float], fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def format_summary(summary: Mapping[str, Any]) -> str:
    """A text table of :meth:`PipelineMeter.summary` (plus ``codec`` per link if present)."""
    lines = [
        f"pipeline {summary['placement']}, stage ranks {summary['stage_ranks']}: {summary['batches']} batches,"
        f" {summary['samples']} samples in {summary['train_seconds']:.2f} s of training"
        f" ({summary['wall_seconds']:.2f} s wall, {summary['compute_seconds']:.2f} s of computation on the busiest rank)",
        f"throughput {_num(summary['throughput_samples_per_s'], '.1f')} samples/s,"
        f" {_num(summary['throughput_batches_per_s'], '.2f')} batches/s",
        f"compression ratio {_num(summary['ratio'])} of every byte sent (activations {_num(summary['ratio_activation'])},"
        f" gradients {_num(summary['ratio_gradient'])}, raw inputs {_num(summary['ratio_input'])});"
        f" {_bytes(summary['bytes'])} on the wire",
        "",
    ]
    rows = [("link", "codec", "messages", "bytes", "ratio", "avg bw/s", "wall bw/s", "peak bw/s")]
    for label, link in summary["links"].items():
        rows.append((
            label, link.get("codec", "-"), str(link["messages"]), _bytes(link["bytes_sent"]), _num(link["ratio"]),
            _bytes(link["bandwidth_avg"]), _bytes(link["bandwidth_wall"]), _bytes(link["bandwidth_peak"]),
        ))
    rows.append(("",) * 8)
    rows.append(("rank", "stages", "compute s", "wait s", "bubble", "sent", "received", "ratio"))
    for rank, r in summary["ranks"].items():
        rows.append((
            str(rank), ",".join(map(str, r["stages"])), f"{r['compute_s']:.3f}", f"{r['wait_s']:.3f}",
            f"{r['bubble']:.3f}", _bytes(r["bytes_sent"]), _bytes(r["bytes_received"]), _num(r["ratio"]),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return "\n".join(lines)
