"""``compressor="auto"`` across processes: measure the links, profile the codecs, agree, switch.

Runs between two training steps, on every rank at the same step (the strategy calls
:meth:`AutoTuner.maybe_retune` from ``on_train_batch_start``), at steps 1, 2, 4, 8, ... and
then every ``retune_every`` steps:

1. Every rank broadcasts (JSON) what it measured since the last check: per peer it sends
   to, the sustained rate of the training's own messages over the latest ``window_bytes``
   (:mod:`~lightning_epipe.strategy.comm.linkrate`: bytes / busy transfer time, or a lower
   bound where the link was not saturated), per stream and peer it receives from, how many
   uncompressed frames it counted and how many of them had landed before it came to them
   (:class:`~lightning_epipe.strategy.comm.linkrate.Arrivals`, since the link's codec last
   changed, the first step left out), and its compute seconds per micro-batch.
2. A link (a cut and a direction) whose sender has not yet sent ``min_bytes`` to that peer
   waits, uncompressed, for a later check. There is no probe: a ping-pong of one message
   (:func:`~lightning_epipe.strategy.comm.collectives.probe_bandwidth`, which ``balance="time"`` uses) fits in a token bucket's
   burst or a socket buffer and reads far too fast (on ``tbf rate 20mbit burst 1mbit`` it
   gave 3 of 4 links ~90x their rate and auto lost to a fixed codec), while a few steps of
   uncompressed traffic measure the link with the most bytes it will ever carry, and cost
   only those few steps; the checks at steps 1, 2, 4, 8, ... decide as soon as it is enough.
   An uncompressed link also waits until its receiver has counted ``min_frames`` frames;
   if at least :data:`~lightning_epipe.strategy.comm.linkrate.KEEPS_PACE` of them were
   there in time, the link keeps pace (on gloo the sender's rate cannot show it: a send
   completes at the receiver's pace and is seen complete only at the end of the step) and
   stays ``none``, as does one whose messages did not queue.
3. Where the rate moved by more than ``tolerance`` since the link's decision (a lower
   bound only when it rose above that), the sender profiles every candidate codec on the
   last tensor it sent there (the runtime's ``samples``) and picks the fastest within the
   error budget (:func:`~lightning_epipe.strategy.compression.auto_choice.choose_codec`), a transfer
   hidden behind its share of the slowest rank's compute per micro-batch: that compute
   divided by the messages the same sender -> receiver link carries per micro-batch (an
   activation and a gradient of two cuts, in the client-server placement) (the cost model
   of :mod:`~lightning_epipe.strategy.compression.auto_choice`). The compute is the
   smallest of the last :data:`HIDDEN_CHECKS` checks' measurements, so one window stretched
   by a stall does not count a transfer as hidden that is not (one did: 11.3 ms against
   5.97-6.50 in every other window of ``benchmarks/README.md`` section 7's runs, and auto
   put 2x casts on a 100 Mbit/s link, 0.81x of the best fixed codec).
4. Every rank broadcasts its choices (JSON, never pickles) and every rank applies all of
   them, so the two ends of a link switch codecs at the same step.
5. Where an uncompressed link's receiver found fewer than
   :data:`~lightning_epipe.strategy.comm.linkrate.KEEPS_PACE` of its frames there in time and
   the cost model picks another codec (``none``, a cast) than it would with no transfer
   hidden, the sender proposes a trial (:mod:`~lightning_epipe.strategy.compression.auto_trial`)
   of the codec picked with no transfer hidden, at the link's measured rate or at the lower
   rate at which the link's messages of one step would fill the step (what the link got where
   it shares a bottleneck). It runs ``TRIAL_STEPS`` steps; at the next check every rank
   compares the slowest rank's median step with the one before, from the same reports, so
   every rank keeps the codec or goes back alike. A link is tried once per rate (again when
   its rate drifts beyond ``tolerance``); proposals of one check are tried together, no link
   is decided while a trial runs, and a link whose codec a trial kept is decided again, when
   its rate drifts, with no transfer hidden.

Until a link's first decision it sends uncompressed. Candidates never include a
learned bottleneck (it changes the model; combine ``compressor="bottleneck"`` with a fixed
wire codec instead): they must be registered codec names.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Mapping, Optional

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor

from lightning_epipe.compressors.profile import DEFAULT_CANDIDATES, profile_codecs
from lightning_epipe.compressors.registry import available_compressors
from lightning_epipe.strategy.compression.auto_choice import (
    LinkChoice,
    choices_from_json,
    choices_to_json,
    choose_codec,
    default_error_budget,
    format_choices,
    needs_retune,
)
from lightning_epipe.strategy.compression.auto_trial import (
    TRIAL_MARGIN, TRIAL_STEPS, Trial, median_step_seconds, slowest_step_seconds,
)
from lightning_epipe.strategy.compression.codec_book import CodecBook
from lightning_epipe.strategy.comm.collectives import broadcast_json
from lightning_epipe.strategy.comm.linkrate import (
    MIN_BYTES, MIN_FRAMES, WINDOW_BYTES, Arrivals, LinkRate, TransferWindow, estimate_rate,
)
from lightning_epipe.strategy.planning.partition import PipelinePlan

__all__ = ["AutoTuner", "HIDDEN_CHECKS", "hidden_seconds", "messages_per_microbatch"]

#: Checks whose compute measurements (``hidden_seconds``) a decision takes the smallest of.
HIDDEN_CHECKS = 3


def hidden_seconds(reports: Mapping[int, Mapping[str, Any]]) -> float:
    """Compute seconds per message a transfer hides behind: the slowest rank's compute per
    micro-batch (forward + backward) since the last check; 0 when none was measured.

    ``reports``: rank -> ``{"compute_s": seconds, "microbatches": count, ...}``.

        >>> hidden_seconds({0: {"compute_s": 0.8, "microbatches": 8}, 1: {"compute_s": 1.6, "microbatches": 8}})
        0.2
    """
    per_mb = [r["compute_s"] / r["microbatches"] for r in reports.values() if r.get("microbatches", 0) > 0]
    return max(per_mb, default=0.0)


def messages_per_microbatch(plan: PipelinePlan, sender: int, receiver: int) -> int:
    """Messages rank ``sender`` sends rank ``receiver`` per micro-batch: the activations of the
    cuts from it to it and the gradients of the cuts from it back (one tensor each; at least 1).

        >>> from lightning_epipe.strategy import plan_pipeline
        >>> plan = plan_pipeline(4, 2, [1, 2, 1])  # client-server: stages on ranks 0, 1, 0
        >>> messages_per_microbatch(plan, 0, 1)  # activation of cut 0, gradient of cut 1
        2
    """
    cuts = [plan.cut_ranks(c) for c in range(plan.num_cuts)]
    return max(1, sum((s, r) == (sender, receiver) or (r, s) == (sender, receiver) for s, r in cuts))


class AutoTuner:
    """Chooses the codec of every auto link from the training's own traffic.

    Checks at steps 1, 2, 4, 8, ... then every ``retune_every`` steps (:meth:`due`); a
    link is decided again when its measured rate drifted by more than ``tolerance`` (0.5:
    below half or above 1.5x the rate it was decided for). ``window_bytes``: how much of the
    latest traffic per link the rate is measured over; ``min_bytes``: how much a link must
    have carried before it is decided (uncompressed until then). ``history`` lists every
    ``(step, LinkChoice)`` made, on every rank (the monitor logs it).

        >>> tuner = AutoTuner(retune_every=10)
        >>> [s for s in range(1, 40) if tuner.due(s) and tuner.mark(s) is None]
        [1, 2, 4, 8, 16, 26, 36]
    """

    def __init__(self, error_budget: Optional[float] = None, retune_every: int = 100, tolerance: float = 0.5,
                 candidates=DEFAULT_CANDIDATES, window_bytes: int = WINDOW_BYTES, min_bytes: int = MIN_BYTES,
                 min_frames: int = MIN_FRAMES) -> None:
        if error_budget is not None and (isinstance(error_budget, bool) or not isinstance(error_budget, (int, float))
                                         or error_budget < 0):
            raise ValueError(f"auto: error_budget must be a number >= 0 (relative L2 error), got {error_budget!r}")
        if isinstance(retune_every, bool) or not isinstance(retune_every, int) or retune_every < 1:
            raise ValueError(f"auto: retune_every must be a positive number of steps, got {retune_every!r}")
        if (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or math.isnan(tolerance)
                or tolerance < 0):
            raise ValueError(f"auto: tolerance must be a number >= 0 (a relative change of the link's rate, 0.5 = 50%),"
                             f" got {tolerance!r}")
        TransferWindow(window_bytes, min_bytes)  # validates both
        if isinstance(min_frames, bool) or not isinstance(min_frames, int) or min_frames < 1:
            raise ValueError(f"auto: min_frames must be a positive number of frames, got {min_frames!r}")
        self.error_budget = error_budget
        self.retune_every = retune_every
        self.tolerance = tolerance
        self.candidates = _check_candidates(candidates)
        self.window_bytes = window_bytes
        self.min_bytes = min_bytes
        self.min_frames = min_frames
        self.choices: dict[tuple[int, str], LinkChoice] = {}   # every rank: the choice of every auto link
        self.history: list[tuple[int, LinkChoice]] = []         # every rank: (step, choice) as made
        self._last_step: Optional[int] = None
        self._compute_mark = (0.0, 0)                           # this rank's (compute s, micro-batches) at the last check
        self._arrivals_now: dict[tuple[str, int], Arrivals] = {}  # this rank's arrivals per (stream, peer), at the last check
        self._arrival_marks: dict[tuple[str, int], Arrivals] = {}  # ... when the link's codec last changed
        self._first_check = True
        self._hidden: list[float] = []                          # the last HIDDEN_CHECKS checks' hidden_seconds
        self._step_starts: list[float] = []                     # this rank's step start times since the last check
        self._seen_step: Optional[int] = None
        self._trial: Optional[Trial] = None                     # every rank: the trial in force
        self._tried: dict[tuple[int, str], float] = {}          # every rank: link -> the rate it was last tried at
        self._kept: set[tuple[int, str]] = set()                # every rank: links whose codec a trial kept

    def due(self, step: int) -> bool:
        """Whether to check before training step ``step`` (global steps taken so far)."""
        if step < 1:
            return False
        if self._trial is not None:
            return step >= self._trial.end
        if self._last_step is None:
            return True
        return step - self._last_step >= min(self._last_step, self.retune_every)

    def mark(self, step: int) -> None:
        """Record a check at ``step`` (:meth:`maybe_retune` does)."""
        self._last_step = step

    def maybe_retune(self, step: int, plan: PipelinePlan, rank: int, codecs: CodecBook, samples: dict[tuple[str, int], Tensor],
                     device: torch.device, offset: int = 0, rates: Optional[Mapping[int, TransferWindow]] = None,
                     compute: tuple[float, int] = (0.0, 0),
                     arrivals: Optional[Mapping[tuple[str, int], Arrivals]] = None) -> list[LinkChoice]:
        """Collective over every rank: measure, decide and apply; the choices made now (may be empty).

        ``rank`` is the rank within the pipeline, ``offset`` the global rank of its client: with
        several replicas every replica applies replica 0's choices, made from replica 0's traffic.
        ``rates``: this rank's transfer windows per peer it sends to (``Transport.rates``);
        ``compute``: this rank's compute seconds and micro-batches so far (cumulative);
        ``arrivals``: this rank's data frames received per (stream, peer) so far, and how many
        were there when it came to them (``Transport.arrivals``, cumulative).
        """
        if step != self._seen_step:  # the first call of a step (not of each accumulated batch)
            self._seen_step = step
            self._step_starts.append(time.perf_counter())
        if not self.due(step):
            return []
        self.mark(step)
        reports = self._exchange(self._report(rates or {}, compute, arrivals or {}), plan, rank, offset, device)
        hidden_s = self._hidden_budget(hidden_seconds(reports))
        step_s = slowest_step_seconds(reports)
        if self._trial is not None:
            made = self._verdict(step, plan, reports, step_s)
        else:
            mine = []
            for direction, cut in codecs.auto_links():
                choice = self._decide(direction, cut, plan, rank, samples, reports, hidden_s, step_s)
                if choice is not None:
                    mine.append(choice)
            made = []
            for src in range(plan.num_ranks):  # replica 0's ranks: global rank == pipeline rank
                made += choices_from_json(broadcast_json(choices_to_json(mine) if src == offset + rank else None, device, src))
            self._start_trial(step, made, step_s)
        for choice in made:
            self._apply(choice, codecs)
            self._restart_arrivals(choice, plan, rank)
            self.history.append((step, choice))
        if made and offset + rank == 0:
            rank_zero_info(f"EPipeStrategy compressor='auto' at step {step}:\n{format_choices(made)}")
        return made

    def _hidden_budget(self, measured: float) -> float:
        """The compute a transfer hides behind: the smallest of the last ``HIDDEN_CHECKS``
        checks' measurements, ``measured`` (this check's; 0: none) among them."""
        if measured > 0:
            self._hidden = (self._hidden + [measured])[-HIDDEN_CHECKS:]
        return min(self._hidden, default=0.0)

    def _report(self, rates: Mapping[int, TransferWindow], compute: tuple[float, int],
                arrivals: Mapping[tuple[str, int], Arrivals]) -> dict[str, Any]:
        """What this rank tells the others since the last check: its rate per peer it sends to,
        its arrivals per stream and peer it receives from (``"activation/1"``), its compute per
        micro-batch."""
        seconds, microbatches = compute
        before_s, before_mb = self._compute_mark
        step_s = median_step_seconds(self._step_starts)
        steps = max(0, len(self._step_starts) - 1)
        self._step_starts = self._step_starts[-1:]
        self._compute_mark = (seconds, microbatches)
        self._arrivals_now = {key: Arrivals(a.ready, a.total) for key, a in arrivals.items()}
        if self._first_check:  # the first step's frames are announced by size notices and cold: not counted
            self._first_check = False
            self._arrival_marks = dict(self._arrivals_now)
        since = {f"{name}/{peer}": (a - self._arrival_marks.get((name, peer), Arrivals())).to_json()
                 for (name, peer), a in sorted(self._arrivals_now.items())}
        estimates = {str(peer): estimate_rate(window.transfers) for peer, window in sorted(rates.items())
                     if window.nbytes >= self.min_bytes}
        return {"rates": {peer: r.to_json() for peer, r in estimates.items() if r is not None}, "arrivals": since,
                "compute_s": max(0.0, seconds - before_s), "microbatches": max(0, microbatches - before_mb),
                "step_s": step_s, "steps": steps}

    @staticmethod
    def _exchange(report: dict[str, Any], plan: PipelinePlan, rank: int, offset: int,
                  device: torch.device) -> dict[int, dict[str, Any]]:
        """Every rank of replica 0 broadcasts its report; every rank gets all of them."""
        return {src: broadcast_json(report if src == offset + rank else None, device, src) for src in range(plan.num_ranks)}

    def _decide(self, direction: str, cut: int, plan: PipelinePlan, rank: int, samples: dict[tuple[str, int], Tensor],
                reports: dict[int, dict[str, Any]], hidden_s: float, step_s: Optional[float]) -> Optional[LinkChoice]:
        """The sender's choice for one link, or None (not the sender, too little traffic yet, no drift).

        ``step_s``: the slowest rank's median step (None: not known yet); where it is known, a
        trial may be proposed where the model keeps ``none`` but the receiver waited for the frames."""
        sender, receiver = plan.cut_ranks(cut, direction)
        sample = samples.get((direction, cut))
        raw = reports[sender]["rates"].get(str(receiver))
        if rank != sender or sample is None or raw is None:
            return None
        rate = LinkRate.from_json(raw)
        old = self.choices.get((cut, direction))
        # Uncompressed traffic that left the link idle between messages, or whose frames were at
        # the receiver before it needed them, already hides its transfers: a codec there can
        # only add its own time (the sender's measured rate is then the pace of the messages or
        # of the receiver, not the link's, so it cannot be compared with codecs).
        arrived = Arrivals.from_json(reports[receiver].get("arrivals", {}).get(f"{direction}/{sender}",
                                                                              {"ready": 0, "total": 0}))
        uncompressed = old is None or old.name == "none"
        judged = arrived.total >= self.min_frames
        late = uncompressed and judged and not arrived.keeps_pace(self.min_frames)
        tried = self._tried.get((cut, direction))
        untried = step_s is not None and late and (tried is None or needs_retune(tried, rate.bandwidth, self.tolerance,
                                                                      rate.lower_bound))
        drifted = old is None or needs_retune(old.bandwidth, rate.bandwidth, self.tolerance, rate.lower_bound)
        if not (drifted or untried):
            return None
        idle = uncompressed and rate.lower_bound
        if uncompressed and not idle and not judged:
            return None  # too few frames yet to tell a slow link from a busy receiver
        in_time = uncompressed and not idle and arrived.keeps_pace(self.min_frames)
        budget = self.error_budget if self.error_budget is not None else default_error_budget(direction)
        profiles = profile_codecs(sample.detach(), self.candidates)
        nbytes = sample.numel() * sample.element_size()
        hidden_s /= messages_per_microbatch(plan, sender, receiver)
        share = rate.bandwidth if step_s is None else _step_share(rate.bandwidth, nbytes, reports[sender], step_s)
        kept = (cut, direction) in self._kept  # a trial showed its transfers do not hide: none are hidden
        if kept:
            choice = choose_codec(profiles, nbytes, share, budget, cut, direction)
        else:
            choice = choose_codec(profiles, nbytes, math.inf if idle or in_time else rate.bandwidth, budget, cut,
                                  direction, hidden_s)
        if kept:
            why = "a trial kept a codec here, so no transfer is taken as hidden"
        elif idle:
            why = "uncompressed messages did not queue, so no codec can shorten the transfers"
        else:
            why = f"{arrived.ready} of {arrived.total} frames were at the receiver before it needed them"
            if in_time:
                why += ": the link keeps pace, so no codec can shorten the transfers"
        if untried:
            exposed = choose_codec(profiles, nbytes, share, budget, cut, direction)
            if exposed.name != "none" and exposed.label != choice.label:
                return dataclasses.replace(
                    exposed, bandwidth=rate.bandwidth, trial=True,
                    reason=f"trial for {TRIAL_STEPS} steps: the model picks {choice.label} ({choice.reason}; {why}), "
                           f"but with no transfer hidden {exposed.reason}; link rate: {rate.describe()}")
        if not drifted and choice.name == "none":
            return None
        return dataclasses.replace(choice, bandwidth=rate.bandwidth,
                                   reason=f"{choice.reason}; {why}; link rate: {rate.describe()}")

    def _start_trial(self, step: int, made: list[LinkChoice], step_s: Optional[float]) -> None:
        """Every rank: if ``made`` holds trial choices, remember what they replace and the step
        time before them (the proposing sender knew ``step_s``: every rank has the same)."""
        trials = [c for c in made if c.trial]
        if not trials or step_s is None:
            return
        previous = {(c.cut, c.direction): self.choices.get((c.cut, c.direction)) for c in trials}
        self._trial = Trial(start=step, end=step + TRIAL_STEPS, baseline_s=step_s, previous=previous)
        for c in trials:
            self._tried[(c.cut, c.direction)] = c.bandwidth

    def _verdict(self, step: int, plan: PipelinePlan, reports: dict[int, dict[str, Any]],
                 step_s: Optional[float]) -> list[LinkChoice]:
        """Every rank, from the same reports: keep the trial's codecs if the steps got shorter,
        else go back to what the links had; the choices this makes."""
        if step_s is None:  # too few steps timed since the trial began (a run resumed just before its end)
            self._trial.end = step + TRIAL_STEPS
            return []
        trial, self._trial = self._trial, None
        keep = trial.keeps(step_s)
        measured = (f"{_ms(step_s)} ms a step against {_ms(trial.baseline_s)} ms before it "
                    f"(steps {trial.start}-{step}, the slowest rank's median)")
        made = []
        for (cut, direction), before in sorted(trial.previous.items()):
            tried = self.choices[(cut, direction)]
            if keep:
                self._kept.add((cut, direction))
                sender, receiver = plan.cut_ranks(cut, direction)
                raw = reports[sender]["rates"].get(str(receiver))  # drift is measured from the codec's own traffic
                rate = tried.bandwidth if raw is None else LinkRate.from_json(raw).bandwidth
                made.append(dataclasses.replace(tried, trial=False, bandwidth=rate,
                                                reason=f"kept after its trial: {measured}; {tried.reason}"))
            else:
                back = before if before is not None else _uncompressed(tried)
                made.append(dataclasses.replace(back, trial=False, bandwidth=tried.bandwidth,
                                                reason=f"back from a trial of {tried.label}: {measured}, not "
                                                       f"{TRIAL_MARGIN:.0%} shorter; {back.reason}"))
        return made

    def _restart_arrivals(self, choice: LinkChoice, plan: PipelinePlan, rank: int) -> None:
        """On the receiver of ``choice``'s link: count its arrivals afresh (they were uncompressed)."""
        sender, receiver = plan.cut_ranks(choice.cut, choice.direction)
        if rank == receiver:
            key = (choice.direction, sender)
            self._arrival_marks[key] = self._arrivals_now.get(key, Arrivals())

    def _apply(self, choice: LinkChoice, codecs: CodecBook) -> None:
        self.choices[(choice.cut, choice.direction)] = choice
        if choice.name == "none":
            self._kept.discard((choice.cut, choice.direction))
        codecs.choose(choice.direction, choice.cut, choice.name, choice.kwargs)

    def state_dict(self) -> dict:
        """JSON-able: the choices in force (with the rates they were made for), the step of
        the last check and the compute measured at the last checks (for checkpoints)."""
        return {"choices": choices_to_json(self.choices.values()), "last_step": self._last_step,
                "hidden_s": list(self._hidden), "trial": None if self._trial is None else self._trial.to_json(),
                "tried": [[cut, direction, "inf" if math.isinf(rate) else rate]
                          for (cut, direction), rate in sorted(self._tried.items())],
                "kept": [[cut, direction] for cut, direction in sorted(self._kept)]}

    def load_state_dict(self, state: dict, codecs: CodecBook) -> None:
        """Put a checkpoint's choices back in force on this rank (every rank reads the checkpoint)."""
        self._last_step = state.get("last_step")
        self._hidden = [float(h) for h in state.get("hidden_s", [])][-HIDDEN_CHECKS:]
        self._trial = None if state.get("trial") is None else Trial.from_json(state["trial"])
        self._tried = {(int(cut), str(direction)): float(rate) for cut, direction, rate in state.get("tried", [])}
        self._kept = {(int(cut), str(direction)) for cut, direction in state.get("kept", [])}
        for choice in choices_from_json(state.get("choices", [])):
            self._apply(choice, codecs)

    def describe(self) -> dict[str, str]:
        """``{"activation/cut0": "sortquant(bits=8)", ...}`` for the links decided so far."""
        return {f"{d}/cut{c}": choice.label for (c, d), choice in sorted(self.choices.items())}


def _step_share(bandwidth: float, nbytes: int, sender_report: Mapping[str, Any], step_s: float) -> float:
    """The rate a trial's codec is picked for: the link's measured ``bandwidth``, or less, the
    rate at which the link's messages of one step (one per micro-batch, ``nbytes`` each) would
    fill the whole step ``step_s``. Where the link shares its bottleneck or a socket buffer
    hides its pace, the measured rate reads too fast; the step says what the link got.

        >>> _step_share(22e6, 196_608, {"microbatches": 40, "steps": 10}, 0.196)  # 0.79 MB a step
        4012408.163265306
    """
    steps = sender_report.get("steps", 0)
    if steps <= 0 or sender_report.get("microbatches", 0) <= 0 or step_s <= 0:
        return bandwidth
    return min(bandwidth, nbytes * sender_report["microbatches"] / steps / step_s)


def _uncompressed(tried: LinkChoice) -> LinkChoice:
    """``none`` on ``tried``'s link (a link's first decision was a trial: nothing to go back to)."""
    return dataclasses.replace(tried, label="none", name="none", kwargs={}, seconds=tried.baseline_seconds, error=0.0,
                               ratio=1.0, reason="none: uncompressed")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"


def _check_candidates(candidates: Any) -> tuple[tuple[str, dict], ...]:
    """``(name, kwargs)`` pairs of registered codecs; a bottleneck is not a codec (it is a learned
    part of the model) and never a candidate."""
    known = set(available_compressors())
    out = []
    for candidate in candidates:
        if not (isinstance(candidate, (tuple, list)) and len(candidate) == 2 and isinstance(candidate[0], str)
                and isinstance(candidate[1], Mapping)):
            raise ValueError(f"auto: a candidate is a (name, kwargs) pair, e.g. ('sortquant', {{'bits': 8}}), "
                             f"got {candidate!r}")
        name, kwargs = candidate
        if name not in known:
            hint = (" (a learned bottleneck is not a candidate: use compressor='bottleneck' with a fixed wire codec)"
                    if name == "bottleneck" else "")
            raise ValueError(f"auto: candidate {name!r} is not a registered codec{hint}; known: {sorted(known)}")
        out.append((name, dict(kwargs)))
    if not any(name == "none" for name, _ in out):
        raise ValueError("auto: the candidates must include ('none', {}) (always within any error budget)")
    return tuple(out)
