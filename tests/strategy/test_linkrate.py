"""The sustained rate of a link from the training's own transfers: hand-made timings only."""

import doctest
import json
import math

import pytest

from lightning_epipe.strategy.comm import linkrate
from lightning_epipe.strategy.comm.linkrate import LinkRate, Transfer, TransferWindow, busy_seconds, estimate_rate

MB = 1_000_000


def test_doctests():
    assert doctest.testmod(linkrate).failed == 0


def test_busy_time_is_the_union_of_the_intervals():
    ts = [Transfer(0.0, 1.0, 1), Transfer(0.5, 2.0, 1), Transfer(3.0, 4.0, 1), Transfer(3.2, 3.5, 1)]
    assert busy_seconds(ts) == pytest.approx(3.0)
    assert busy_seconds(reversed(ts)) == pytest.approx(3.0)  # order does not matter
    assert busy_seconds([]) == 0.0


def test_a_message_waiting_behind_another_counts_its_wait_once():
    # two 1 MB messages posted together on a 1 MB/s link: done at 1 s and 2 s
    ts = [Transfer(0.0, 1.0, MB, queued=True), Transfer(0.0, 2.0, MB)]
    rate = estimate_rate(ts)
    assert rate.bandwidth == pytest.approx(1 * MB) and not rate.lower_bound
    assert sum(t.done - t.posted for t in ts) == 3.0  # a per-message sum would say 0.67 MB/s


def test_a_burst_at_the_start_of_a_saturated_window_fades():
    # token bucket: the first 125 kB leave at once, then 2.5 MB/s (20 Mbit/s); 16 x 0.5 MB queued
    rate, burst, t, ts = 2.5 * MB, 125_000, 0.0, []
    for i in range(16):
        nbytes = 500_000
        seconds = (nbytes - burst) / rate if i == 0 else nbytes / rate
        ts.append(Transfer(0.0, t + seconds, nbytes, queued=i < 15))
        t += seconds
    got = estimate_rate(ts)
    assert not got.lower_bound
    assert got.bandwidth == pytest.approx(2.5 * MB, rel=0.02)
    first = ts[0].nbytes / (ts[0].done - ts[0].posted)
    assert first > 1.3 * rate  # what a one-message probe sees


def test_a_completion_seen_late_only_lengthens_the_end_of_a_busy_stretch():
    # 8 queued messages of 1 MB at 10 MB/s, the last completion seen 50 ms late
    ts = [Transfer(0.0, 0.1 * (i + 1) + (0.05 if i == 7 else 0.0), MB, queued=i < 7) for i in range(8)]
    assert estimate_rate(ts).bandwidth == pytest.approx(8 * MB / 0.85)


def test_an_unsaturated_link_gives_the_load_it_carried_as_a_lower_bound():
    # one 100 kB message every 100 ms, each done (or seen done) before the next is posted
    ts = [Transfer(0.1 * i, 0.1 * i + 0.09, 100_000) for i in range(10)]
    rate = estimate_rate(ts)
    assert rate.lower_bound and rate.queued == 0 and rate.messages == 10
    assert rate.bandwidth == pytest.approx(1 * MB / 0.99)
    assert "not saturated" in rate.describe()


def test_saturation_needs_half_the_messages_queued():
    ts = [Transfer(0.0, 1.0, 10, queued=q) for q in (True, True, False, False)]
    assert not estimate_rate(ts).lower_bound
    assert estimate_rate(ts[1:]).lower_bound
    assert estimate_rate(ts[1:], saturated=0.3).lower_bound is False


def test_no_time_measured_is_unlimited_and_nothing_is_none():
    assert estimate_rate([Transfer(1.0, 1.0, 10, queued=True)]).bandwidth == math.inf
    assert estimate_rate([]) is None


def test_the_window_keeps_the_latest_bytes_and_waits_for_enough():
    w = TransferWindow(window_bytes=3 * MB, min_bytes=2 * MB)
    w.add(Transfer(0.0, 1.0, MB, queued=True))
    assert w.estimate() is None and w.nbytes == MB  # below min_bytes: the probe stands in
    for i in range(1, 6):
        w.add(Transfer(float(i), float(i + 1), MB, queued=True))
    assert len(w) == 3 and w.nbytes == 3 * MB
    assert w.estimate().busy_s == pytest.approx(3.0)  # the three latest seconds
    w.clear()
    assert len(w) == 0 and w.estimate() is None


def test_one_message_larger_than_the_window_is_kept():
    w = TransferWindow(window_bytes=MB, min_bytes=MB)
    w.add(Transfer(0.0, 1.0, 5 * MB))
    assert w.nbytes == 5 * MB
    w.add(Transfer(1.0, 2.0, 5 * MB, queued=True))
    assert len(w) == 1 and w.estimate().nbytes == 5 * MB


@pytest.mark.parametrize("kwargs, match", [
    ({"window_bytes": 0}, "window_bytes must be a positive"),
    ({"min_bytes": -1}, "min_bytes must be a positive"),
    ({"window_bytes": 10, "min_bytes": 20}, "must not exceed window_bytes"),
    ({"window_bytes": True}, "window_bytes"),
])
def test_bad_window_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransferWindow(**kwargs)


@pytest.mark.parametrize("args, match", [
    ((1.0, 0.5, 1), "done after it is posted"),
    ((math.nan, 1.0, 1), "done after it is posted"),
    ((0.0, 1.0, -1), "nbytes must be an integer"),
    ((0.0, 1.0, 1.5), "nbytes must be an integer"),
])
def test_bad_transfer_raises(args, match):
    with pytest.raises(ValueError, match=match):
        Transfer(*args)


def test_rates_travel_as_strict_json():
    for rate in (estimate_rate([Transfer(0.0, 2.0, MB, queued=True)]), estimate_rate([Transfer(0.0, 0.0, 1)])):
        text = json.dumps(rate.to_json(), allow_nan=False)
        assert LinkRate.from_json(json.loads(text)) == rate


def test_the_transport_times_data_frames_per_peer_and_leaves_out_resized_ones():
    from datetime import timedelta

    import torch

    from lightning_epipe.strategy.comm.memory_backend import MemoryFabric
    from lightning_epipe.strategy.comm.transport import Transport
    from lightning_epipe.strategy.comm.wire import HEADER_NBYTES, Header, Kind

    fabric = MemoryFabric(2, rule="nccl")  # a send completes once its receive is posted
    ends = [Transport(r, torch.device("cpu"), timedelta(seconds=5), backend=fabric.backend(r)) for r in (0, 1)]
    payload = torch.zeros(1000, dtype=torch.uint8)
    for step in (1, 2):  # step 1: every frame is announced by a RESIZE notice; step 2: the sizes are known
        for mb in range(3):
            ends[0].send(1, Header(Kind.ACTIVATION, step, mb, 3, 0, 1, 0, 0, 0), payload)
        for mb in range(3):
            ends[1].recv(0, "test", kind=Kind.ACTIVATION, step=step, microbatch=mb)
        ends[0].flush()
    window = ends[0].rates[1]
    assert len(window) == 3 and window.nbytes == 3 * (HEADER_NBYTES + 1000)  # step 2's frames only
    assert [t.queued for t in window.transfers] == [True, True, False]  # posted before the previous completed
    assert 1 not in ends[1].rates  # the receiver sent nothing


def test_sends_that_complete_only_when_waited_are_timed_at_the_flush_not_polled():
    """gloo marks a send complete only in ``wait()``: polling it before every send and around every
    receive found nothing and cost a call per pending send each time; its sends are timed when flushed."""
    from datetime import timedelta

    import torch

    from lightning_epipe.strategy.comm.memory_backend import MemoryFabric
    from lightning_epipe.strategy.comm.transport import P2PBackend, Transport
    from lightning_epipe.strategy.comm.wire import Header, Kind

    fabric = MemoryFabric(2, rule="gloo")
    polled = []

    class Unpolled:
        def __init__(self, work):
            self.work = work

        def is_completed(self):
            polled.append(self)
            return False

        def wait(self, timeout=None):
            return self.work.wait(timeout)

    def gloo_like(rank: int) -> P2PBackend:
        inner = fabric.backend(rank)
        return P2PBackend(lambda t, dst, g, tag=0: Unpolled(inner.isend(t, dst, g, tag)), inner.irecv,
                          completes_unwaited=lambda device: False, tagged=inner.tagged)

    ends = [Transport(r, torch.device("cpu"), timedelta(seconds=5), backend=gloo_like(r)) for r in (0, 1)]
    payload = torch.zeros(1000, dtype=torch.uint8)
    for step in (1, 2):
        for mb in range(3):
            ends[0].send(1, Header(Kind.ACTIVATION, step, mb, 3, 0, 1, 0, 0, 0), payload)
            ends[1].recv(0, "test", kind=Kind.ACTIVATION, step=step, microbatch=mb)
        ends[0].flush()
    assert polled == []
    assert len(ends[0].rates[1]) == 3  # step 2's frames, timed when flushed (step 1's were announced)
