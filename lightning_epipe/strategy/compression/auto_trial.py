"""``compressor="auto"``'s trials: where the cost model hides a link's transfers but its
receiver waited for the frames, run the codec that hides none for a few steps and keep it
only if the steps got shorter.

The cost model (:mod:`~lightning_epipe.strategy.compression.auto_choice`) prices one link at a
time from its sender's view. Two things it cannot see make it keep ``none`` (or a cast) on a
link that is the bottleneck:

- links that share one bottleneck: a loopback shaped by ``tc`` carries both directions, and a
  host's uplink carries every stream leaving it, the raw input a data-holding rank sends
  included (no codec touches that). Each link's transfers hide behind compute on their own;
  together they exceed the step (the chain placement at 100 Mbit/s: 2.36 MB a step on a
  12.5 MB/s loopback, ~190 ms of link against ~90 ms of compute);
- socket buffers: a stream that fits in them completes its sends at memory speed, and reads
  faster than the link (29.2 MB/s on that 12.5 MB/s link), or never queues at all.

The receiver's late frames (:class:`~lightning_epipe.strategy.comm.linkrate.Arrivals`) say the
link may be the bottleneck, but on their own they cannot tell a slow link from a slow sender
(under GPipe a stage waits for the compute before it, too). A trial settles it on what the
training sees: the median step time with the codec against the median step time before it.

    >>> trial = Trial(start=8, end=14, baseline_s=0.200, previous={})
    >>> trial.keeps(0.150), trial.keeps(0.195)  # 25% faster: keep; 2.5%: within the noise
    (True, False)

Pure: numbers in, numbers out; trials travel in checkpoints as JSON.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from lightning_epipe.strategy.compression.auto_choice import (
    LOSSY_MARGIN,
    LinkChoice,
    choices_from_json,
    choices_to_json,
)

__all__ = ["Trial", "TRIAL_STEPS", "TRIAL_MARGIN", "MIN_TIMED_STEPS", "median_step_seconds", "slowest_step_seconds"]

#: Steps a trial runs before its verdict: the median of 6 step times leaves out the first
#: (the switch and the check's own profiling) and one stall.
TRIAL_STEPS = 6
#: A trial's codec stays only if the median step got shorter by more than this share: the
#: margin a lossy codec must win by in the cost model too (steps on a busy machine vary by a
#: few percent; a codec kept by noise costs its encode and decode, a link's real bottleneck
#: saves 30% or more).
TRIAL_MARGIN = LOSSY_MARGIN
#: Steps a median step time needs: the steps between the checks at 2 and 4 are too few, and
#: slower than later ones (in ``benchmarks/results/slow_link_auto_trial.json`` a baseline of
#: those two read 138 and 143.5 ms where the steps after ran ~120, and a trial was kept that
#: gained nothing), so the first trial can begin at the check of step 8.
MIN_TIMED_STEPS = 4


def median_step_seconds(starts: Sequence[float]) -> Optional[float]:
    """The median time between consecutive step starts (``time.perf_counter`` seconds, in
    order); None with fewer than ``MIN_TIMED_STEPS`` steps.

        >>> median_step_seconds([0.0, 0.5, 0.75, 1.0, 1.25])  # the first step ran a check
        0.25
        >>> median_step_seconds([0.0, 0.5, 0.75]) is None
        True
    """
    if len(starts) < MIN_TIMED_STEPS + 1:
        return None
    return statistics.median(b - a for a, b in zip(starts, starts[1:]))


def slowest_step_seconds(reports: Mapping[int, Mapping[str, Any]]) -> Optional[float]:
    """The longest of the ranks' median step times (``"step_s"`` of each report); None when
    some rank had too few steps to tell (the ranks step together, so all or none do).

        >>> slowest_step_seconds({0: {"step_s": 0.2}, 1: {"step_s": 0.21}})
        0.21
    """
    times = [r.get("step_s") for r in reports.values()]
    if not times or any(t is None for t in times):
        return None
    return max(float(t) for t in times)


@dataclass
class Trial:
    """Trial codecs in force from step ``start``; the verdict at step ``end``.

    baseline_s: the median step seconds before the trial (the links uncompressed);
    previous: each tried link ``(cut, direction)`` -> the choice it had before (None: none
    yet), what a failed trial goes back to.
    """

    start: int
    end: int
    baseline_s: float
    previous: dict[tuple[int, str], Optional[LinkChoice]] = field(default_factory=dict)

    def keeps(self, trial_s: float) -> bool:
        """Whether the trial's median step ``trial_s`` beats the baseline by ``TRIAL_MARGIN``."""
        return trial_s < (1 - TRIAL_MARGIN) * self.baseline_s

    def to_json(self) -> dict[str, Any]:
        links = sorted(self.previous)
        return {"start": self.start, "end": self.end, "baseline_s": self.baseline_s,
                "links": [[cut, direction] for cut, direction in links],
                "previous": [None if self.previous[link] is None else choices_to_json([self.previous[link]])[0]
                             for link in links]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Trial":
        previous = {}
        for (cut, direction), before in zip(data["links"], data["previous"]):
            previous[(int(cut), str(direction))] = None if before is None else choices_from_json([before])[0]
        return cls(int(data["start"]), int(data["end"]), float(data["baseline_s"]), previous)
