"""AutoTuner's decisions in one process: the collectives are stand-ins (and a probe, which
auto no longer runs, would be recorded); the codecs are profiled for real on small tensors
(ratio and error), their seconds fixed (``CODEC_SECONDS``) so that no decision follows the
timer's noise on a busy machine."""

from __future__ import annotations

import dataclasses
import json
from unittest import mock

import pytest
import torch

from lightning_epipe.compressors import profile as codec_profile
from lightning_epipe.strategy import plan_pipeline
from lightning_epipe.strategy.compression.codec_book import CodecBook, resolve_specs
from lightning_epipe.strategy.comm.linkrate import Arrivals, Transfer, TransferWindow
from lightning_epipe.strategy.compression.auto_choice import LinkChoice, choices_from_json, choices_to_json
from lightning_epipe.strategy.compression.auto_trial import (
    TRIAL_STEPS, Trial, median_step_seconds, slowest_step_seconds,
)
from lightning_epipe.strategy.compression.auto_tuner import AutoTuner, hidden_seconds, messages_per_microbatch

PLAN = plan_pipeline(4, 2, [1, 2, 1])  # stage ranks (0, 1, 0): rank 0 sends activation/cut0 and gradient/cut1 to rank 1
CANDIDATES = (("none", {}), ("fp16", {}), ("quantize", {"bits": 8}))
CPU = torch.device("cpu")
MB = 1_000_000
#: encode and decode seconds of one call on the 64 x 256 samples, in the order they measure here
CODEC_SECONDS = {"none": 1e-5, "fp16": 2e-5, "quantize": 5e-5}


@pytest.fixture(autouse=True)
def fixed_codec_seconds(monkeypatch):
    real = codec_profile.profile_codecs

    def profile_codecs(x, candidates, *args, **kwargs):
        return [dataclasses.replace(p, encode_s=CODEC_SECONDS[p.name], decode_s=CODEC_SECONDS[p.name])
                for p in real(x, candidates, *args, **kwargs)]

    monkeypatch.setattr("lightning_epipe.strategy.compression.auto_tuner.profile_codecs", profile_codecs)


def book() -> CodecBook:
    return CodecBook(resolve_specs("auto", {}, 2, "compressor"), resolve_specs("auto", {}, 2, "compressor"))


def window(bandwidth: float, nbytes: int = 4 * MB, queued: bool = True) -> TransferWindow:
    """``nbytes`` in 1 MB messages back to back at ``bandwidth`` bytes/s."""
    w = TransferWindow(window_bytes=16 * MB, min_bytes=2 * MB)
    for i in range(nbytes // MB):
        w.add(Transfer(i * MB / bandwidth, (i + 1) * MB / bandwidth, MB, queued=queued))
    return w


class World:
    """Rank 0 of two: rank 1's reports and choices are canned (by default rank 1 waited for every
    frame from rank 0: the link, not rank 1, set the pace); a probe would be recorded; rank 0's
    reports are kept."""

    def __init__(self, ready: int = 0, total: int = 16) -> None:
        self.peer_report = {"rates": {}, "compute_s": 0.0, "microbatches": 0,
                            "arrivals": {f"{d}/0": {"ready": ready, "total": total} for d in ("activation", "gradient")}}
        self.probes: list[tuple[int, int]] = []
        self.reports: list[dict] = []
        self.peer_choices: list = []  # LinkChoices rank 1 announces at every check
        self.now = 0.0  # rank 0's clock (time.perf_counter)
        self._phase = "report"

    def broadcast_json(self, value, device, src):
        if src == 0:  # rank 0 goes first: its report (a dict), then its choices (a list)
            self._phase = "report" if isinstance(value, dict) else "choices"
            if self._phase == "report":
                self.reports.append(value)
            return json.loads(json.dumps(value, allow_nan=False))  # what crosses the wire is strict JSON
        return self.peer_report if self._phase == "report" else choices_to_json(self.peer_choices)

    def probe(self, src, dst, nbytes, rank, device):
        self.probes.append((src, dst))
        return 1e12 if rank == src else None

    def check(self, tuner, step, codecs, rates=None, compute=(0.0, 0), arrivals=None):
        samples = {("activation", 0): torch.randn(64, 256), ("gradient", 1): torch.randn(64, 256)}
        with mock.patch("lightning_epipe.strategy.compression.auto_tuner.broadcast_json", self.broadcast_json), \
                mock.patch("lightning_epipe.strategy.comm.collectives.probe_bandwidth", self.probe), \
                mock.patch("lightning_epipe.strategy.compression.auto_tuner.time.perf_counter", lambda: self.now):
            return tuner.maybe_retune(step, PLAN, 0, codecs, samples, CPU, 0, rates or {}, compute, arrivals)


def test_measured_traffic_decides_without_a_probe():
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES), book()
    made = world.check(tuner, 1, codecs, {1: window(1 * MB)})
    assert world.probes == []
    assert sorted((c.direction, c.cut) for c in made) == [("activation", 0), ("gradient", 1)]
    for choice in made:
        assert choice.bandwidth == pytest.approx(1 * MB) and choice.label == "quantize(bits=8)"
        assert "link rate: 1 MB/s sustained over 4 msgs" in choice.reason
    assert codecs.specs["activation"][0].name == "quantize" and codecs.specs["gradient"][1].name == "quantize"
    assert codecs.specs["activation"][1].name == "none"  # rank 1's link: rank 1 (canned) chose nothing


def test_a_link_waits_uncompressed_until_it_has_carried_enough():
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES), book()
    assert world.check(tuner, 1, codecs, {1: window(1 * MB, nbytes=MB)}) == []  # 1 MB: below min_bytes
    assert tuner.choices == {} and codecs.specs["activation"][0].name == "none" and world.probes == []
    assert not tuner.due(1) and tuner.due(2)
    made = world.check(tuner, 2, codecs, {1: window(1 * MB)})
    assert {c.label for c in made} == {"quantize(bits=8)"} and world.probes == []
    assert AutoTuner(min_bytes=1000, window_bytes=1000).min_bytes == 1000


def test_drift_beyond_the_tolerance_decides_again_a_lower_bound_only_upward():
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES, tolerance=0.5), book()
    world.check(tuner, 1, codecs, {1: window(1 * MB)})
    assert world.check(tuner, 2, codecs, {1: window(0.6 * MB)}) == []
    assert world.check(tuner, 4, codecs, {1: window(0.01 * MB, queued=False)}) == []  # not saturated: says nothing
    made = world.check(tuner, 8, codecs, {1: window(1e10, queued=False)})  # carried far more than 1.5 MB/s
    assert {c.label for c in made} == {"none"} and all("not saturated" in c.reason for c in made)
    made = world.check(tuner, 16, codecs, {1: window(0.4 * MB)})
    assert {c.label for c in made} == {"quantize(bits=8)"}
    assert [step for step, _ in tuner.history] == [1, 1, 8, 8, 16, 16]


def test_uncompressed_traffic_that_never_queued_stays_uncompressed():
    """A fast link reads slow when the messages, not the link, set the pace: that is no reason to compress."""
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES), book()
    made = world.check(tuner, 1, codecs, {1: window(0.01 * MB, queued=False)})
    assert {c.label for c in made} == {"none"}
    assert all("did not queue" in c.reason and c.bandwidth == pytest.approx(0.01 * MB) for c in made)
    made = world.check(tuner, 2, codecs, {1: window(0.004 * MB)})  # now queued, and slower: a real slow link
    assert {c.label for c in made} == {"quantize(bits=8)"} and not any("did not queue" in c.reason for c in made)


def test_a_link_whose_frames_were_at_the_receiver_in_time_stays_uncompressed():
    """On gloo a fast link between busy stages reads slow and queued from the sender: every send
    waits for the receiver. The receiver found most frames there before it needed them: keep none."""
    world, tuner, codecs = World(ready=10, total=16), AutoTuner(candidates=CANDIDATES), book()
    made = world.check(tuner, 1, codecs, {1: window(1 * MB)})  # 1 MB/s sustained, as the sender sees it
    assert {c.label for c in made} == {"none"}
    assert all("10 of 16 frames were at the receiver before it needed them: the link keeps pace" in c.reason
               for c in made)
    slow = World(ready=6, total=16)  # 37.5%: as a 100 Mbit/s link read (9 of 24), the link set the pace
    made = slow.check(AutoTuner(candidates=CANDIDATES), 1, book(), {1: window(1 * MB)})
    assert {c.label for c in made} == {"quantize(bits=8)"} and all("6 of 16 frames" in c.reason for c in made)


def test_a_link_waits_uncompressed_until_its_receiver_counted_enough_frames():
    world, tuner, codecs = World(ready=0, total=15), AutoTuner(candidates=CANDIDATES), book()
    assert world.check(tuner, 1, codecs, {1: window(1 * MB)}) == [] and codecs.specs["activation"][0].name == "none"
    world.peer_report["arrivals"] = {f"{d}/0": {"ready": 0, "total": 16} for d in ("activation", "gradient")}
    assert {c.label for c in world.check(tuner, 2, codecs, {1: window(1 * MB)})} == {"quantize(bits=8)"}
    assert {c.label for c in World(total=2).check(AutoTuner(candidates=CANDIDATES, min_frames=2), 1, book(),
                                                       {1: window(1 * MB)})} == {"quantize(bits=8)"}


def test_reported_arrivals_leave_out_the_first_step_and_restart_when_a_codec_changes():
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES), book()
    first = {("activation", 1): Arrivals(1, 8), ("gradient", 1): Arrivals(0, 8)}  # what rank 0 received from rank 1
    world.check(tuner, 1, codecs, {}, arrivals=first)
    assert world.reports[-1]["arrivals"] == {"activation/1": {"ready": 0, "total": 0}, "gradient/1": {"ready": 0, "total": 0}}
    later = {("activation", 1): Arrivals(9, 24), ("gradient", 1): Arrivals(4, 24)}
    world.check(tuner, 2, codecs, {}, arrivals=later)
    assert world.reports[-1]["arrivals"] == {"activation/1": {"ready": 8, "total": 16}, "gradient/1": {"ready": 4, "total": 16}}
    # rank 1 switches its link activation/cut1 (1 -> 0) at step 4: rank 0 counts that link's frames afresh
    choice = next(c for c in World().check(AutoTuner(candidates=CANDIDATES), 1, book(), {1: window(1 * MB)})
                  if c.direction == "activation")
    world.peer_choices = [dataclasses.replace(choice, cut=1)]
    world.check(tuner, 4, codecs, {}, arrivals=later)
    assert codecs.specs["activation"][1].name == "quantize"
    world.peer_choices = []
    world.check(tuner, 8, codecs, {}, arrivals={("activation", 1): Arrivals(10, 26), ("gradient", 1): Arrivals(5, 26)})
    assert world.reports[-1]["arrivals"] == {"activation/1": {"ready": 1, "total": 2}, "gradient/1": {"ready": 5, "total": 18}}


def test_compute_hides_a_slow_transfer():
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES), book()
    world.peer_report |= {"compute_s": 100.0, "microbatches": 10}  # rank 1: 10 s per micro-batch
    made = world.check(tuner, 1, codecs, {1: window(1 * MB)}, compute=(1.0, 10))
    assert {c.label for c in made} == {"none"}
    # rank 0 -> 1 carries two messages per micro-batch (activation/cut0, gradient/cut1): 5 s each
    assert all("5e+03 ms of compute hides a transfer" in c.reason for c in made)


def test_one_stretched_compute_window_does_not_hide_a_transfer():
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES), book()
    made = world.check(tuner, 1, codecs, {1: window(1 * MB)}, compute=(0.01, 10))  # 1 ms per micro-batch
    assert {c.label for c in made} == {"quantize(bits=8)"}
    # the rate halves (decided again) while one window's compute reads 10 s per micro-batch
    made = world.check(tuner, 2, codecs, {1: window(0.4 * MB)}, compute=(100.01, 20))
    assert {c.label for c in made} == {"quantize(bits=8)"}  # not "none": the smallest of the last checks
    assert tuner.state_dict()["hidden_s"] == pytest.approx([0.001, 10.0])
    for step, seconds, microbatches in ((4, 200.01, 30), (8, 300.01, 40)):
        world.check(tuner, step, codecs, {}, compute=(seconds, microbatches))
    assert tuner.state_dict()["hidden_s"] == pytest.approx([10.0, 10.0, 10.0])  # HIDDEN_CHECKS = 3 kept
    fresh = AutoTuner(candidates=CANDIDATES)
    fresh.load_state_dict(json.loads(json.dumps(tuner.state_dict())), book())
    assert fresh.state_dict() == tuner.state_dict()


def test_messages_per_microbatch_counts_both_kinds_on_one_direction():
    assert messages_per_microbatch(PLAN, 0, 1) == 2 and messages_per_microbatch(PLAN, 1, 0) == 2
    chain = plan_pipeline(4, 3, [2, 1, 1], "chain")  # stages on ranks 1, 2, 0: cuts 1 -> 2, 2 -> 0
    assert [messages_per_microbatch(chain, *pair) for pair in ((1, 2), (2, 1), (0, 2), (0, 1))] == [1, 1, 1, 1]


def test_hidden_seconds_is_the_slowest_ranks_compute_per_microbatch():
    assert hidden_seconds({0: {"compute_s": 1.0, "microbatches": 10}, 1: {"compute_s": 3.0, "microbatches": 10}}) == 0.3
    assert hidden_seconds({0: {"compute_s": 1.0, "microbatches": 0}}) == 0.0


def test_state_round_trips_through_json_with_the_choices_in_force():
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES), book()
    world.check(tuner, 1, codecs, {1: window(1 * MB)})
    state = json.loads(json.dumps(tuner.state_dict(), allow_nan=False))
    fresh, fresh_codecs = AutoTuner(candidates=CANDIDATES), book()
    fresh.load_state_dict(state, fresh_codecs)
    assert fresh.choices == tuner.choices and fresh.describe() == tuner.describe()
    assert fresh.state_dict() == state and not fresh.due(1) and fresh.due(2)
    assert fresh_codecs.describe() == codecs.describe() and fresh_codecs.specs["activation"][0].name == "quantize"
    assert World().check(fresh, 2, fresh_codecs, {1: window(1.2 * MB)}) == []  # the rates it chose for came back
    assert len(World().check(fresh, 4, fresh_codecs, {1: window(1e12)})) == 2


def test_the_schedule_checks_early_then_every_retune_every_steps():
    tuner = AutoTuner(retune_every=5)
    due = []
    for step in range(0, 30):
        if tuner.due(step):
            tuner.mark(step)
            due.append(step)
    assert due == [1, 2, 4, 8, 13, 18, 23, 28]


@pytest.mark.parametrize("candidates, match", [
    ((("none", {}), ("bottleneck", {})), "a learned bottleneck is not a candidate"),
    ((("none", {}), ("nope", {})), "'nope' is not a registered codec"),
    ((("fp16", {}),), "must include \\('none', \\{\\}\\)"),
    ((("none",),), "a candidate is a \\(name, kwargs\\) pair"),
])
def test_bad_candidates_raise(candidates, match):
    with pytest.raises(ValueError, match=match):
        AutoTuner(candidates=candidates)


@pytest.mark.parametrize("kwargs, match", [
    ({"tolerance": -1}, "tolerance must be a number >= 0"),
    ({"retune_every": 0}, "retune_every must be a positive"),
    ({"window_bytes": 10, "min_bytes": 20}, "must not exceed window_bytes"),
])
def test_bad_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AutoTuner(**kwargs)


def test_the_default_candidates_are_bottleneck_free_codecs():
    names = {name for name, _ in AutoTuner().candidates}
    assert "bottleneck" not in names and {"none", "fp16", "sortquant", "lloydmax"} <= names


def test_a_bottleneck_the_user_asked_for_stays_beside_auto_gradients():
    from lightning_epipe import EPipeStrategy
    from lightning_epipe.compressors.bottleneck import Bottleneck

    strategy = EPipeStrategy(activation_compressor="bottleneck", gradient_compressor="auto",
                             compressor_kwargs={"ratio": 0.25})
    codecs = strategy.config.codec_book(2)
    assert codecs.auto_links() == [("gradient", 0), ("gradient", 1)]
    assert all(s.bottleneck is not None and not s.auto for s in codecs.specs["activation"])
    with pytest.raises(ValueError, match="wire='auto' is not supported"):
        Bottleneck(wire="auto")


def run_steps(world, tuner, codecs, steps, step_s, rates, compute_per_step=(10.0, 10)):
    """Call the tuner at the start of every step in ``steps`` (as the strategy does), each step
    ``step_s`` long on both ranks; rank 1 computes 10 s per micro-batch (every transfer hides)."""
    made = []
    for step in steps:
        world.peer_report |= {"step_s": step_s, "compute_s": compute_per_step[0] * step * 10,
                              "microbatches": compute_per_step[1] * step}
        made += [(step, c) for c in world.check(tuner, step, codecs, rates, compute=(0.001 * step, 10 * step))]
        world.now += step_s
    return made


def test_a_late_link_the_model_keeps_uncompressed_is_tried_and_kept_when_steps_get_shorter():
    """The model hides every transfer behind rank 1's compute, but rank 1 waited for every frame
    (0 of 16 in time): the exposed model's codec runs TRIAL_STEPS steps and stays, the steps shorter."""
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES), book()
    rates = {1: window(1 * MB)}
    made = run_steps(world, tuner, codecs, range(1, 8), 0.2, rates)
    assert {c.label for _, c in made} == {"none"} and all("ms of compute hides a transfer" in c.reason for _, c in made)
    made = run_steps(world, tuner, codecs, [8], 0.2, rates)  # four steps timed since the check at 4: a trial
    assert {(s, c.label, c.trial) for s, c in made} == {(8, "quantize(bits=8)", True)} and len(made) == 2
    assert all(f"trial for {TRIAL_STEPS} steps: the model picks none (none: " in c.reason and "0 of 16 frames were"
               in c.reason and "with no transfer hidden quantize(bits=8): 16.5 ms/msg" in c.reason for _, c in made)
    assert codecs.specs["activation"][0].name == "quantize" and not tuner.due(12) and tuner.due(8 + TRIAL_STEPS)
    made = run_steps(world, tuner, codecs, range(9, 9 + TRIAL_STEPS), 0.1, {1: window(4 * MB)})
    assert {(s, c.label, c.trial) for s, c in made} == {(8 + TRIAL_STEPS, "quantize(bits=8)", False)}
    assert all(c.reason.startswith("kept after its trial: 100 ms a step against 200 ms before it") for _, c in made)
    assert all(c.bandwidth == pytest.approx(4 * MB) for _, c in made)  # drift is measured from the codec's traffic
    assert codecs.specs["activation"][0].name == "quantize" and codecs.specs["gradient"][1].name == "quantize"
    # the rate drifts: a kept link is decided with no transfer hidden (the model alone would pick none here)
    made = run_steps(world, tuner, codecs, range(9 + TRIAL_STEPS, 29), 0.1, {1: window(0.4 * MB)})
    assert {(s, c.label, c.trial) for s, c in made} == {(28, "quantize(bits=8)", False)}
    assert all("a trial kept a codec here, so no transfer is taken as hidden" in c.reason for _, c in made)
    state = json.loads(json.dumps(tuner.state_dict()))
    assert state["kept"] == [[0, "activation"], [1, "gradient"]]
    fresh = AutoTuner(candidates=CANDIDATES)
    fresh.load_state_dict(state, book())
    assert fresh.state_dict() == state


def test_a_late_link_where_the_model_picks_a_weaker_codec_tries_the_exposed_one():
    """40 ms of compute hides a message's transfer: the model's cheapest is fp16 (its 33 ms hide);
    with none hidden it is 8-bit codes, and the receiver waited for every frame: a trial of those."""
    world, tuner, codecs = World(total=15), AutoTuner(candidates=CANDIDATES), book()  # too few frames to judge yet
    assert run_steps(world, tuner, codecs, range(1, 8), 0.2, {1: window(1 * MB)}, compute_per_step=(0.08, 10)) == []
    world.peer_report["arrivals"] = {f"{d}/0": {"ready": 0, "total": 16} for d in ("activation", "gradient")}
    made = run_steps(world, tuner, codecs, [8], 0.2, {1: window(1 * MB)}, compute_per_step=(0.08, 10))
    assert [(s, c.label, c.trial) for s, c in made] == [(8, "quantize(bits=8)", True)] * 2
    assert all("the model picks fp16 (fp16: " in c.reason for _, c in made)


def test_a_trial_that_does_not_shorten_the_steps_goes_back_and_is_not_tried_again_at_that_rate():
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES), book()
    rates = {1: window(1 * MB)}
    run_steps(world, tuner, codecs, range(1, 9), 0.2, rates)
    assert codecs.specs["activation"][0].name == "quantize"  # on trial
    made = run_steps(world, tuner, codecs, range(9, 9 + TRIAL_STEPS), 0.19, rates)  # 5% shorter: noise
    assert {c.label for _, c in made} == {"none"} and len(made) == 2
    assert all(c.reason.startswith("back from a trial of quantize(bits=8): 190 ms a step against 200 ms") for _, c in made)
    assert codecs.specs["activation"][0].name == "none" and codecs.specs["gradient"][1].name == "none"
    assert run_steps(world, tuner, codecs, range(9 + TRIAL_STEPS, 29), 0.2, {1: window(1.2 * MB)}) == []  # tried at this rate
    made = run_steps(world, tuner, codecs, range(29, 57), 0.2, {1: window(0.3 * MB)})  # the rate fell: try again
    assert {(s, c.label, c.trial) for s, c in made} == {(56, "quantize(bits=8)", True)}


def test_a_trial_survives_a_checkpoint_and_ends_at_its_step():
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES), book()
    run_steps(world, tuner, codecs, range(1, 9), 0.2, {1: window(1 * MB)})
    state = json.loads(json.dumps(tuner.state_dict(), allow_nan=False))
    assert state["trial"]["start"] == 8 and state["trial"]["previous"][0]["label"] == "none"
    fresh, fresh_codecs = AutoTuner(candidates=CANDIDATES), book()
    fresh.load_state_dict(state, fresh_codecs)
    assert fresh.state_dict() == state and fresh_codecs.specs["gradient"][1].name == "quantize"
    assert not fresh.due(8 + TRIAL_STEPS - 1) and fresh.due(8 + TRIAL_STEPS)
    # resumed at the verdict's step with no step timed yet: the trial runs on
    assert run_steps(world, fresh, fresh_codecs, [8 + TRIAL_STEPS], 0.1, {1: window(1 * MB)}) == []
    made = run_steps(world, fresh, fresh_codecs, range(9 + TRIAL_STEPS, 9 + 2 * TRIAL_STEPS), 0.1, {1: window(1 * MB)})
    assert {(s, c.label) for s, c in made} == {(8 + 2 * TRIAL_STEPS, "quantize(bits=8)")}
    assert all(c.reason.startswith("kept after its trial") for _, c in made)


def test_no_trial_where_the_receiver_found_the_frames_in_time_or_the_model_compresses():
    world, tuner, codecs = World(ready=16, total=16), AutoTuner(candidates=CANDIDATES), book()
    assert {c.trial for _, c in run_steps(world, tuner, codecs, range(1, 20), 0.2, {1: window(1 * MB)})} == {False}
    world, tuner, codecs = World(), AutoTuner(candidates=CANDIDATES), book()
    made = run_steps(world, tuner, codecs, range(1, 20), 0.2, {1: window(1 * MB)}, compute_per_step=(0.0, 10))
    assert [(s, c.label, c.trial) for s, c in made] == [(1, "quantize(bits=8)", False)] * 2


def test_a_trial_choice_round_trips_and_a_bad_trial_flag_raises():
    choice = LinkChoice(0, "activation", "fp16", "fp16", {}, 1e-3, 2e-3, 1e-4, "why", trial=True)
    assert choices_from_json(json.dumps(choices_to_json([choice]))) == [choice]
    entry = choices_to_json([choice])[0]
    del entry["trial"]
    assert choices_from_json([entry])[0].trial is False  # written before trials existed
    with pytest.raises(ValueError, match="trial must be true or false"):
        choices_from_json([entry | {"trial": "yes"}])


def test_trial_verdicts_and_step_times():
    trial = Trial(start=4, end=10, baseline_s=0.2, previous={(0, "activation"): None})
    assert trial.keeps(0.17) and not trial.keeps(0.185) and Trial.from_json(trial.to_json()) == trial
    assert median_step_seconds([0.0, 0.1, 0.2, 0.3]) is None  # MIN_TIMED_STEPS = 4
    assert median_step_seconds([0.0, 1.0, 1.1, 1.2, 1.3]) == pytest.approx(0.1)
    assert slowest_step_seconds({0: {"step_s": 0.1}, 1: {"step_s": None}}) is None
