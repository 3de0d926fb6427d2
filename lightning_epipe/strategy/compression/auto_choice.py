"""``compressor="auto"``: pick a codec per cut and direction from measured speeds.

Given, for one direction of one cut (activations forward, gradients backward), the raw
bytes of a message, the link's measured bandwidth (the training's own traffic,
:mod:`lightning_epipe.strategy.comm.linkrate`), the compute seconds a transfer can hide behind
and a :class:`CodecProfile` per candidate codec
(``lightning_epipe.compressors.profile.profile_codecs`` on a sample of that message),
:func:`choose_codec` picks the codec with the least predicted time per message among those
whose relative error is within the direction's error budget.

Cost model (what a message adds to a pipelined step):

    t = encode_s + decode_s + max(0, ratio * raw_nbytes / bandwidth - hidden_s)

- encode runs on the sender and decode on the receiver, on the compute path of their
  stages: they count in full;
- the transfer is asynchronous (sends are posted and not waited on; receives are posted
  ahead), so it overlaps compute. In steady state a pipeline advances one micro-batch per
  period of its slowest resource: a link's messages of one micro-batch that take no longer
  than the slowest rank's compute for it (forward and backward) keep pace and are hidden.
  ``hidden_s`` is a message's share of that compute (the tuner divides it by the messages
  the link carries per micro-batch); only a transfer's excess over it is paid.
  ``hidden_s=0`` (the default) counts every transfer in full.

Why the slowest rank's whole micro-batch: it is exact for 1F1B's steady state, and it also
hides what a sender measures as transfer time but is the receiver being busy (a send
completes only once the receiver has posted its receive, which it does one message ahead
on NCCL and a phase ahead on gloo; a slower next stage makes every send look that long, see
:mod:`~lightning_epipe.strategy.comm.linkrate`). Under GPipe, activations cross during the
forward phase only, so this hides more than GPipe does: a link whose transfers are a little
longer than the slowest forward but shorter than forward + backward stays uncompressed.
The tuner measures ``hidden_s`` (:class:`~lightning_epipe.strategy.compression.auto_tuner.AutoTuner`). With
an infinitely fast link, or one whose transfers all hide, every codec only costs its encode
and decode time and the cheapest one (normally ``none``) wins.

Profiles are taken on a tensor of the link's message size: their seconds are used as they
are, not rescaled to ``raw_nbytes``.

    >>> from lightning_epipe.compressors.profile import CodecProfile
    >>> profiles = [CodecProfile("none", "none", {}, 1.0, 0.0, 1e-5, 1e-5),
    ...             CodecProfile("fp16", "fp16", {}, 0.5, 2e-4, 1e-4, 1e-4)]
    >>> choose_codec(profiles, 4_000_000, 50e6, 0.02, cut=0, direction="activation").label
    'fp16'
    >>> choose_codec(profiles, 4_000_000, 50e6, 0.02, cut=0, direction="activation",
    ...              hidden_s=0.08).label  # the 80 ms transfer hides behind 80 ms of compute
    'none'

Pure: no processes, sockets or torch.distributed; choices travel to every rank as JSON
(:func:`choices_to_json`, :func:`choices_from_json`), never as pickles.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from lightning_epipe.compressors.profile import CodecProfile

__all__ = [
    "ACTIVATION_ERROR_BUDGET",
    "GRADIENT_ERROR_BUDGET",
    "DIRECTIONS",
    "LinkChoice",
    "LinkMeasurement",
    "predicted_seconds",
    "choose_codec",
    "choose_all",
    "needs_retune",
    "default_error_budget",
    "choices_to_json",
    "choices_from_json",
    "format_choices",
]

DIRECTIONS = ("activation", "gradient")

# Default budgets on the relative L2 error ||y - x|| / ||x|| of one message, from training
# runs (benchmarks/README.md sections 3, 6 and 10). On a pretrained MiniLM's hidden states
# (3 seeds, every message of both directions compressed), codecs whose activation error was
# <= 0.16 kept accuracy within 0.3 points of uncompressed (sortquant 8 ~0.04, hadamard 4
# ~0.095, lloydmax 4 0.136-0.162), while the 4-bit uniform codes, 0.47-0.63 on those
# outlier-heavy states, lost 2.2-3.8 points; on the digits MLP 4-bit codes trained like
# uncompressed. On a ReLU MLP's activations and gradients lloydmax 4 measures ~0.05 and
# ~0.12, the 4-bit uniform codes ~0.08-0.16 and ~0.22. 0.15 admits 4-bit Lloyd-Max where it
# is that accurate and keeps out any codec as lossy as the 4-bit codes that failed; a codec
# is judged on the link's own tensors, so the same codec may pass on one cut and not another.
ACTIVATION_ERROR_BUDGET = 0.15
GRADIENT_ERROR_BUDGET = 0.15

#: Predicted times within this relative distance are a tie (broken toward lower error).
TIE_RTOL = 1e-9

#: A lossy codec is chosen over ``none`` only if it saves more than this share of ``none``'s
#: predicted time: codec timings are best-of-3 measurements on a busy machine, and on an
#: unlimited link ``none`` and ``fp16`` cost about the same copy, so the choice would
#: otherwise follow the timer's noise and add error for nothing.
LOSSY_MARGIN = 0.1


def default_error_budget(direction: str) -> float:
    """The module's budget for ``"activation"`` or ``"gradient"``."""
    _check_direction(direction)
    return ACTIVATION_ERROR_BUDGET if direction == "activation" else GRADIENT_ERROR_BUDGET


@dataclass(frozen=True)
class LinkChoice:
    """The codec chosen for one direction of one cut, and why.

    seconds: predicted time per message of the chosen codec; baseline_seconds: that of
    ``none`` (the uncompressed message); error: the chosen codec's measured relative
    error; reason: one line for the log; ratio: its wire/raw bytes; bandwidth: the link's
    bytes/s it was chosen for (``inf``: unlimited); trial: in force for a trial, kept or undone
    by the step times it brings (:mod:`~lightning_epipe.strategy.compression.auto_trial`).
    Rebuild the codec with ``get_compressor(choice.name, **choice.kwargs)``.
    """

    cut: int
    direction: str
    label: str
    name: str
    kwargs: dict[str, Any] = field(hash=False)
    seconds: float
    baseline_seconds: float
    error: float
    reason: str
    ratio: float = 1.0
    bandwidth: float = math.inf
    trial: bool = False

    @property
    def speedup(self) -> float:
        """baseline_seconds / seconds (inf when the chosen codec is predicted free)."""
        return math.inf if self.seconds == 0 else self.baseline_seconds / self.seconds


@dataclass(frozen=True)
class LinkMeasurement:
    """What :func:`choose_codec` needs for one direction of one cut.

    raw_nbytes: bytes of one uncompressed message; bandwidth: bytes per second of the link
    (> 0, ``inf`` for unlimited); profiles: one per candidate codec, measured on such a
    message; error_budget: None takes :func:`default_error_budget` of the direction;
    hidden_s: compute seconds per message a transfer hides behind (>= 0).
    """

    cut: int
    direction: str
    raw_nbytes: int
    bandwidth: float
    profiles: tuple[CodecProfile, ...]
    error_budget: float | None = None
    hidden_s: float = 0.0

    def __post_init__(self) -> None:
        _check_hidden(self.hidden_s)
        _check_cut(self.cut)
        _check_direction(self.direction)
        _check_raw_nbytes(self.raw_nbytes)
        _check_bandwidth(self.bandwidth)
        object.__setattr__(self, "profiles", _check_profiles(self.profiles))
        if self.error_budget is not None:
            _check_budget(self.error_budget)

    @property
    def budget(self) -> float:
        """The error budget in force: the given one or the direction's default."""
        if self.error_budget is None:
            return default_error_budget(self.direction)
        return self.error_budget


def predicted_seconds(profile: CodecProfile, raw_nbytes: int, bandwidth: float,
                      hidden_s: float = 0.0) -> float:
    """``encode_s + decode_s + max(0, ratio * raw_nbytes / bandwidth - hidden_s)``: one
    message's cost to the step, its transfer hidden behind ``hidden_s`` of compute.

    raw_nbytes: uncompressed bytes (>= 0); bandwidth: bytes/s (> 0, may be ``inf``);
    hidden_s: seconds (>= 0).

        >>> from lightning_epipe.compressors.profile import CodecProfile
        >>> p = CodecProfile("fp16", "fp16", {}, 0.5, 2e-4, 1e-3, 1e-3)
        >>> round(predicted_seconds(p, 1_000_000, 1e6), 6), predicted_seconds(p, 1_000_000, 1e6, 0.6)
        (0.502, 0.002)
    """
    _check_raw_nbytes(raw_nbytes)
    _check_bandwidth(bandwidth)
    _check_hidden(hidden_s)
    transfer = profile.ratio * raw_nbytes / bandwidth
    return profile.encode_s + profile.decode_s + max(0.0, transfer - hidden_s)


def choose_codec(profiles: Sequence[CodecProfile], raw_nbytes: int, bandwidth: float,
                 error_budget: float, cut: int, direction: str, hidden_s: float = 0.0) -> LinkChoice:
    """The fastest codec whose error is within ``error_budget``.

    Among the profiles with ``error <= error_budget``, the least
    :func:`predicted_seconds` (transfers hidden behind ``hidden_s``); predicted times equal
    within ``TIE_RTOL`` go to the lower error, then to the earlier profile; a lossy codec
    must beat ``none`` by ``LOSSY_MARGIN``. ``none`` (error 0) is always eligible; the
    baseline is its predicted time, or the uncompressed transfer beyond ``hidden_s`` when no
    ``none`` profile is given.

    Raises ValueError for no profiles, a negative or NaN budget, a bad cut, direction,
    size or bandwidth, and when no profile is within the budget (give a ``none`` one).
    """
    profiles = _check_profiles(profiles)
    _check_budget(error_budget)
    _check_cut(cut)
    _check_direction(direction)
    _check_raw_nbytes(raw_nbytes)
    _check_bandwidth(bandwidth)
    _check_hidden(hidden_s)
    timed = [(predicted_seconds(p, raw_nbytes, bandwidth, hidden_s), p) for p in profiles]
    eligible = [(s, p) for s, p in timed if p.error <= error_budget]
    if not eligible:
        errors = ", ".join(f"{p.label} {p.error:.3g}" for p in profiles)
        raise ValueError(f"cut {cut} {direction}: no codec within error budget "
                         f"{error_budget:g} (errors: {errors}); add a 'none' candidate or "
                         "raise the budget")
    fastest = min(s for s, _ in eligible)
    tied = [(s, p) for s, p in eligible if math.isclose(s, fastest, rel_tol=TIE_RTOL)
            or s == fastest]
    seconds, best = min(tied, key=lambda sp: sp[1].error)  # min keeps the first on ties
    exact = [(s, p) for s, p in eligible if p.name == "none"]
    if best.error > 0 and exact and seconds > (1 - LOSSY_MARGIN) * exact[0][0]:
        seconds, best = exact[0]
    nones = [s for s, p in timed if p.name == "none"]
    baseline = min(nones) if nones else max(0.0, raw_nbytes / bandwidth - hidden_s)
    runner_up = [(s, p) for s, p in eligible if p is not best]
    over = len(timed) - len(eligible)
    reason = _reason(best, seconds, baseline, bool(nones), bandwidth, error_budget,
                     min(runner_up, key=lambda sp: sp[0]) if runner_up else None, over, hidden_s)
    return LinkChoice(cut=cut, direction=direction, label=best.label, name=best.name,
                      kwargs=dict(best.kwargs), seconds=seconds, baseline_seconds=baseline,
                      error=best.error, reason=reason, ratio=best.ratio, bandwidth=float(bandwidth))


def choose_all(measurements: Iterable[LinkMeasurement]) -> list[LinkChoice]:
    """:func:`choose_codec` for each measurement, in order; one per (cut, direction)."""
    choices: list[LinkChoice] = []
    seen: set[tuple[int, str]] = set()
    for m in measurements:
        if not isinstance(m, LinkMeasurement):
            raise ValueError(f"choose_all takes LinkMeasurement entries, got {m!r}")
        if (m.cut, m.direction) in seen:
            raise ValueError(f"cut {m.cut} {m.direction} is measured twice; give one "
                             "LinkMeasurement per (cut, direction)")
        seen.add((m.cut, m.direction))
        choices.append(choose_codec(m.profiles, m.raw_nbytes, m.bandwidth, m.budget,
                                    m.cut, m.direction, m.hidden_s))
    return choices


def needs_retune(old: LinkMeasurement | float, new_bandwidth: float,
                 tolerance: float = 0.5, lower_bound: bool = False) -> bool:
    """Whether the bandwidth drifted enough to choose again.

    True when ``|new - old| / old > tolerance`` (old: the bandwidth the choice was made
    for, or its LinkMeasurement). With the default 0.5, dropping to below half or rising
    above 1.5x retunes. An unlimited (inf) bandwidth changes only by becoming finite.
    ``lower_bound``: ``new`` is only a lower bound (a link that was not saturated carried
    that much): it retunes only by rising above ``old * (1 + tolerance)``.
    """
    old_bandwidth = old.bandwidth if isinstance(old, LinkMeasurement) else old
    _check_bandwidth(old_bandwidth, "old bandwidth")
    _check_bandwidth(new_bandwidth, "new bandwidth")
    if (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float))
            or math.isnan(tolerance) or tolerance < 0):
        raise ValueError(f"needs_retune: tolerance must be a number >= 0 (a relative "
                         f"change, 0.5 = 50%), got {tolerance!r}")
    if lower_bound and new_bandwidth <= old_bandwidth:
        return False
    if math.isinf(old_bandwidth) or math.isinf(new_bandwidth):
        return old_bandwidth != new_bandwidth
    return abs(new_bandwidth - old_bandwidth) / old_bandwidth > tolerance


# -- JSON (choices are broadcast to every rank as text) -------------------------------------

_FIELDS = tuple(f.name for f in fields(LinkChoice))
_OPTIONAL = ("ratio", "bandwidth", "trial")  # absent from checkpoints written before they existed
_REQUIRED = tuple(f for f in _FIELDS if f not in _OPTIONAL)
_JSON_SCALARS = (str, int, float, bool, type(None))


def choices_to_json(choices: Iterable[LinkChoice]) -> list[dict[str, Any]]:
    """Plain dicts (``json.dumps``-able) of the choices; :func:`choices_from_json` inverts.

    Raises ValueError for a kwargs value that is not a JSON scalar (it would not come
    back equal).
    """
    out = []
    for choice in choices:
        if not isinstance(choice, LinkChoice):
            raise ValueError(f"choices_to_json takes LinkChoice entries, got {choice!r}")
        for key, value in choice.kwargs.items():
            if not isinstance(value, _JSON_SCALARS):
                raise ValueError(f"{choice.label}: kwarg {key}={value!r} is not a JSON "
                                 "scalar (str, int, float, bool, None); it cannot be "
                                 "broadcast as JSON")
        entry = {name: getattr(choice, name) for name in _FIELDS} | {"kwargs": dict(choice.kwargs)}
        if math.isinf(choice.bandwidth):
            entry["bandwidth"] = "inf"  # strict JSON has no Infinity
        out.append(entry)
    return out


def choices_from_json(data: str | Sequence[Mapping[str, Any]]) -> list[LinkChoice]:
    """LinkChoices from :func:`choices_to_json`'s list, or from its ``json.dumps`` text."""
    if isinstance(data, (str, bytes)):
        data = json.loads(data)
    if not isinstance(data, list):
        raise ValueError(f"choices_from_json takes a list of dicts, got {type(data).__name__}")
    choices = []
    for i, entry in enumerate(data):
        if not isinstance(entry, Mapping) or not set(_REQUIRED) <= set(entry) <= set(_FIELDS):
            keys = sorted(entry) if isinstance(entry, Mapping) else type(entry).__name__
            raise ValueError(f"choice {i}: expected the keys {sorted(_FIELDS)} ({sorted(_OPTIONAL)} "
                             f"optional), got {keys}")
        _check_cut(entry["cut"])
        _check_direction(entry["direction"])
        for name in ("label", "name", "reason"):
            if not isinstance(entry[name], str):
                raise ValueError(f"choice {i}: {name} must be a str, got {entry[name]!r}")
        if not isinstance(entry["kwargs"], Mapping):
            raise ValueError(f"choice {i}: kwargs must be a dict, got {entry['kwargs']!r}")
        if not isinstance(entry.get("trial", False), bool):
            raise ValueError(f"choice {i}: trial must be true or false, got {entry['trial']!r}")
        numbers = {}
        for name in ("seconds", "baseline_seconds", "error", "ratio", "bandwidth"):
            if name not in entry:
                continue
            value = math.inf if name == "bandwidth" and entry[name] == "inf" else entry[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"choice {i}: {name} must be a number, got {value!r}")
            numbers[name] = float(value)
        choices.append(LinkChoice(cut=entry["cut"], direction=entry["direction"],
                                  label=entry["label"], name=entry["name"],
                                  kwargs=dict(entry["kwargs"]), reason=entry["reason"],
                                  trial=entry.get("trial", False), **numbers))
    return choices


def format_choices(choices: Iterable[LinkChoice]) -> str:
    """One log line per choice: ``cut 0 activation -> sortquant(bits=8): <reason>``."""
    return "\n".join(f"cut {c.cut} {c.direction} -> {c.label}: {c.reason}" for c in choices)


# -- helpers ---------------------------------------------------------------------------------

def _reason(best: CodecProfile, seconds: float, baseline: float, has_none: bool,
            bandwidth: float, budget: float, runner_up: tuple[float, CodecProfile] | None,
            over: int, hidden_s: float = 0.0) -> str:
    link = "unlimited bandwidth" if math.isinf(bandwidth) else f"{bandwidth / 1e6:.1f} MB/s"
    if hidden_s > 0:
        link += f", {_ms(hidden_s)} ms of compute hides a transfer"
    base = "none" if has_none else "uncompressed (no 'none' profile, codec cost 0)"
    parts = [f"{best.label}: {_ms(seconds)} ms/msg vs {base} {_ms(baseline)} ms/msg on {link}",
             f"error {best.error:.3g} <= budget {budget:g}"]
    if runner_up is None:
        parts.append("no other codec within budget")
    else:
        parts.append(f"next best {runner_up[1].label} {_ms(runner_up[0])} ms")
    if over:
        parts.append(f"{over} over budget")
    return "; ".join(parts)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def _check_profiles(profiles: object) -> tuple[CodecProfile, ...]:
    if isinstance(profiles, (str, bytes)) or not isinstance(profiles, Iterable):
        raise ValueError(f"profiles must be a sequence of CodecProfile, got {profiles!r}")
    profiles = tuple(profiles)
    if not profiles:
        raise ValueError("no codec profiles to choose from; profile at least 'none' "
                         "(profile_codecs(sample, [('none', {})]))")
    for p in profiles:
        if not isinstance(p, CodecProfile):
            raise ValueError(f"profiles must be CodecProfile entries, got {p!r}")
    return profiles


def _check_hidden(hidden_s: object) -> None:
    if (isinstance(hidden_s, bool) or not isinstance(hidden_s, (int, float))
            or not math.isfinite(hidden_s) or hidden_s < 0):
        raise ValueError(f"hidden_s must be a finite number of seconds >= 0 (compute a transfer "
                         f"hides behind; 0 charges every transfer in full), got {hidden_s!r}")


def _check_budget(budget: object) -> None:
    if (isinstance(budget, bool) or not isinstance(budget, (int, float))
            or math.isnan(budget) or budget < 0):
        raise ValueError(f"error budget must be a number >= 0 (a relative L2 error; 0 "
                         f"allows only lossless codecs), got {budget!r}")


def _check_cut(cut: object) -> None:
    if isinstance(cut, bool) or not isinstance(cut, int) or cut < 0:
        raise ValueError(f"cut must be an integer >= 0 (the index of the cut between two "
                         f"stages), got {cut!r}")


def _check_direction(direction: object) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def _check_raw_nbytes(raw_nbytes: object) -> None:
    if isinstance(raw_nbytes, bool) or not isinstance(raw_nbytes, int) or raw_nbytes < 0:
        raise ValueError(f"raw_nbytes must be an integer >= 0 (bytes of one uncompressed "
                         f"message), got {raw_nbytes!r}")


def _check_bandwidth(bandwidth: object, what: str = "bandwidth") -> None:
    if (isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float))
            or math.isnan(bandwidth) or bandwidth <= 0):
        raise ValueError(f"{what} must be a number of bytes/s > 0 (float('inf') for an "
                         f"unlimited link), got {bandwidth!r}")
