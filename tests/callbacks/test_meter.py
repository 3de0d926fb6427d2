"""PipelineMeter's arithmetic on hand-built counters: ratios, bandwidths, bubble, windows."""

from __future__ import annotations

import json
from unittest import mock

import pytest

from lightning_epipe.callbacks.meter import (
    Measurement,
    PipelineMeter,
    Stopwatch,
    format_summary,
    pipeline_links,
    stats_delta,
)
from lightning_epipe.strategy import plan_pipeline
from lightning_epipe.strategy.engine.stats import LinkKey, PipelineStats

CLIENT_SERVER = plan_pipeline(4, 2, [1, 2, 1])  # stages on ranks (0, 1, 0): cut 0 is 0->1, cut 1 is 1->0


def send(stats: PipelineStats, peer: int, kind: str, nbytes: int, raw: int, times: int = 1) -> None:
    for _ in range(times):
        stats.link(LinkKey("send", peer, kind)).add(nbytes, raw)


def recv(stats: PipelineStats, peer: int, kind: str, nbytes: int, raw: int, seconds: float, times: int = 1) -> None:
    for _ in range(times):
        stats.link(LinkKey("recv", peer, kind)).add(nbytes, raw, seconds)


def two_ranks(act_bytes: int = 300, grad_bytes: int = 500, raw: int = 1000, times: int = 1) -> dict[int, PipelineStats]:
    """A 2-rank client-server step: activations 0->1 (cut 0) and 1->0 (cut 1), gradients back."""
    client, server = PipelineStats(), PipelineStats()
    send(client, 1, "activation", act_bytes, raw, times)
    recv(server, 0, "activation", act_bytes, raw, 0.01, times)
    send(server, 0, "activation", act_bytes, raw, times)
    recv(client, 1, "activation", act_bytes, raw, 0.02, times)
    send(client, 1, "gradient", grad_bytes, raw, times)
    recv(server, 0, "gradient", grad_bytes, raw, 0.05, times)
    send(server, 0, "gradient", grad_bytes, raw, times)
    recv(client, 1, "gradient", grad_bytes, raw, 0.1, times)
    return {0: client, 1: server}


def test_links_of_client_server_plan():
    links = pipeline_links(plan_pipeline(8, 3, [1, 3, 3, 1]))
    assert [(l.label, l.cuts) for l in links] == [
        ("activation/0->1", (0,)), ("activation/1->2", (1,)), ("activation/2->0", (2,)),
        ("gradient/1->0", (0,)), ("gradient/2->1", (1,)), ("gradient/0->2", (2,)),
    ]


def test_links_of_chain_plan_start_with_the_raw_inputs():
    links = pipeline_links(plan_pipeline(8, 3, [2, 3, 3], "chain"))
    assert [(l.label, l.cuts) for l in links] == [
        ("input/0->1", ()), ("activation/1->2", (0,)), ("activation/2->0", (1,)),
        ("gradient/2->1", (0,)), ("gradient/0->2", (1,)),
    ]
    assert links[0].send_key == LinkKey("send", 1, "input") and links[0].recv_key == LinkKey("recv", 0, "input")


def test_ratio_per_cut_direction_and_overall():
    meter = PipelineMeter(CLIENT_SERVER)
    ranks = two_ranks(act_bytes=250, grad_bytes=500, raw=1000)
    ranks[1].link(LinkKey("send", 0, "activation")).add(750, 1000)  # cut 1 now 1000 B over 2000 raw
    meter.update(Measurement(ranks=ranks))
    m = meter.compute()
    assert m["ratio/activation/cut0"] == pytest.approx(0.25)
    assert m["ratio/activation/cut1"] == pytest.approx(0.5)
    assert m["ratio/gradient/cut0"] == m["ratio/gradient/cut1"] == pytest.approx(0.5)
    assert m["ratio/activation"] == pytest.approx((250 + 1000) / 3000)
    assert m["ratio/gradient"] == pytest.approx(0.5)
    assert m["ratio"] == pytest.approx((250 + 1000 + 1000) / 5000)


def test_ratio_counts_every_byte_sent_raw_inputs_included():
    meter = PipelineMeter(plan_pipeline(4, 2, [1, 3], "chain"))
    client, server = PipelineStats(), PipelineStats()
    send(client, 1, "input", 1100, 1000)
    send(client, 1, "gradient", 500, 1000)
    send(server, 0, "activation", 300, 1000)
    meter.update(Measurement(ranks={0: client, 1: server}))
    m = meter.compute()
    assert m["ratio"] == pytest.approx((1100 + 500 + 300) / 3000)
    assert m["ratio/input"] == pytest.approx(1.1) and m["ratio/activation"] == pytest.approx(0.3)
    assert m["ratio/gradient"] == pytest.approx(0.5)
    assert m["rank0/ratio"] == pytest.approx((1100 + 500) / 2000) and m["rank1/ratio"] == pytest.approx(0.3)
    assert m["bytes/input/0->1"] == 1100 and m["rank0/bytes_sent"] == 1600


def test_average_bandwidth_is_bytes_over_computation_time_and_the_wall_rate_its_own():
    ranks = two_ranks(act_bytes=300, grad_bytes=500, times=4)
    ranks[0].add_compute(0, 0.25)
    ranks[0].add_compute(2, 0.25)
    ranks[1].add_compute(1, 0.75)  # the busiest rank: 0.75 s of computation
    meter = PipelineMeter(CLIENT_SERVER)
    meter.update(Measurement(time=1.5, wall=2.0, ranks=ranks))
    m = meter.compute()
    assert m["bytes/activation/0->1"] == 1200 and m["compute_s"] == 0.75
    assert m["bandwidth_avg/activation/0->1"] == pytest.approx(1200 / 0.75)
    assert m["bandwidth_wall/activation/0->1"] == pytest.approx(1200 / 2.0)
    assert m["bandwidth_peak/activation/0->1"] == pytest.approx(300 / 0.01)
    assert m["bandwidth_peak/gradient/1->0"] == pytest.approx(500 / 0.1)
    assert m["rank0/bytes_sent"] == m["rank0/bytes_received"] == 4 * (300 + 500)


def test_bytes_fall_back_to_the_receivers_counter():
    meter = PipelineMeter(CLIENT_SERVER)
    server = PipelineStats()
    recv(server, 0, "activation", 300, 1000, 0.01)
    meter.update(Measurement(ranks={1: server}))
    m = meter.compute()
    assert m["bytes/activation/0->1"] == 300 and m["ratio/activation/cut0"] == pytest.approx(0.3)


def test_bubble_per_rank_and_overall():
    ranks = two_ranks()
    ranks[0].add_compute(0, 1.0)
    ranks[0].add_compute(2, 2.0)
    ranks[0].wait_seconds = 1.0
    ranks[1].add_compute(1, 3.0)
    ranks[1].wait_seconds = 3.0
    meter = PipelineMeter(CLIENT_SERVER)
    meter.update(Measurement(ranks=ranks))
    m = meter.compute()
    assert (m["stage0/compute_s"], m["stage1/compute_s"], m["stage2/compute_s"]) == (1.0, 3.0, 2.0)
    assert m["rank0/wait_s"] == 1.0 and m["rank0/bubble"] == pytest.approx(0.25)
    assert m["rank1/bubble"] == pytest.approx(0.5)
    assert m["bubble"] == pytest.approx(4.0 / 10.0)


def test_throughput_over_training_time():
    meter = PipelineMeter(CLIENT_SERVER)
    meter.update(Measurement(time=2.0, wall=3.0, batches=4, samples=128, ranks=two_ranks()))
    m = meter.compute()
    assert m["throughput_samples_per_s"] == 64.0 and m["throughput_batches_per_s"] == 2.0


def test_windows_count_from_their_mark_and_peaks_stay_the_run_maximum():
    meter = PipelineMeter(CLIENT_SERVER)
    first = two_ranks(act_bytes=300, times=2)
    meter.update(Measurement(time=1.0, wall=1.0, batches=2, samples=64, ranks=first))
    meter.mark("step")
    later = two_ranks(act_bytes=300, times=2)
    recv(later[1], 0, "activation", 300, 1000, 0.1, times=3)  # slower transfers in the new window
    send(later[0], 1, "activation", 300, 1000, times=3)
    later[1].add_compute(1, 2.0)
    meter.update(Measurement(time=4.0, wall=5.0, batches=5, samples=160, ranks=later))
    window = meter.compute("step")
    assert window["bytes/activation/0->1"] == 900
    assert window["bandwidth_avg/activation/0->1"] == pytest.approx(900 / 2.0)
    assert window["bandwidth_wall/activation/0->1"] == pytest.approx(900 / 4.0)
    assert window["throughput_samples_per_s"] == pytest.approx(96 / 3.0)
    assert window["bandwidth_peak/activation/0->1"] == pytest.approx(300 / 0.01)  # the first window's transfer
    assert window["bytes/gradient/1->0"] == 0
    assert "ratio/gradient/cut0" not in window  # no gradient traffic in this window
    run = meter.compute()
    assert run["bytes/activation/0->1"] == 1500
    assert meter.compute("never-marked") == run


def test_empty_window_leaves_out_rates_and_ratios():
    meter = PipelineMeter(CLIENT_SERVER)
    meter.update(Measurement(ranks={0: PipelineStats(), 1: PipelineStats()}))
    m = meter.compute()
    assert not any(k.startswith(("ratio", "throughput", "bandwidth", "bubble")) for k in m)
    assert m["bytes/activation/0->1"] == 0 and m["rank1/bubble"] == 0.0


def test_update_rejects_totals_going_backwards():
    meter = PipelineMeter(CLIENT_SERVER)
    meter.update(Measurement(time=2.0, batches=3, samples=96))
    with pytest.raises(ValueError, match=r"samples went backwards \(96 -> 32\)"):
        meter.update(Measurement(time=3.0, batches=4, samples=32))


def test_stats_delta_subtracts_everything_but_the_peak():
    before, after = two_ranks(times=1)[1], two_ranks(times=3)[1]
    before.add_compute(1, 1.0)
    after.add_compute(1, 4.0)
    after.wait_seconds, after.steps, after.samples = 2.0, 3, 96
    d = stats_delta(after, before)
    counter = d.links[LinkKey("recv", 0, "activation")]
    assert (counter.messages, counter.bytes, counter.raw_bytes) == (2, 600, 2000)
    assert counter.transfer_seconds == pytest.approx(0.02)
    assert counter.peak_bytes_per_second == pytest.approx(300 / 0.01)
    assert d.compute_seconds == {1: 3.0} and (d.wait_seconds, d.steps, d.samples) == (2.0, 3, 96)


def test_stopwatch_leaves_out_paused_time():
    clock = iter([10.0, 12.0, 15.0, 16.0, 17.5])
    with mock.patch("lightning_epipe.callbacks.meter.time.perf_counter", side_effect=lambda: next(clock)):
        watch = Stopwatch()
        assert watch.elapsed == 0.0  # not started
        watch.start()  # 10
        watch.pause()  # 12
        assert watch.elapsed == 2.0  # paused: no clock read
        watch.pause()  # a second pause is ignored
        watch.resume()  # 15: 3 s paused
        assert watch.elapsed == 16.0 - 10.0 - 3.0
        assert watch.elapsed == 17.5 - 10.0 - 3.0


def test_summary_is_plain_data_and_formats_as_a_table():
    ranks = two_ranks(act_bytes=300, grad_bytes=500, times=4)
    ranks[0].add_compute(0, 1.0)
    ranks[0].wait_seconds = 1.0
    meter = PipelineMeter(CLIENT_SERVER)
    meter.update(Measurement(time=2.0, wall=2.0, batches=4, samples=64, ranks=ranks))
    summary = meter.summary()
    json.dumps(summary)
    link = summary["links"]["activation/0->1"]
    assert (link["messages"], link["bytes_sent"], link["bytes_received"], link["raw_bytes"]) == (4, 1200, 1200, 4000)
    assert link["ratio"] == pytest.approx(0.3) and link["bandwidth_avg"] == pytest.approx(1200 / 1.0)
    assert link["bandwidth_wall"] == pytest.approx(600) and summary["compute_seconds"] == 1.0
    assert summary["ranks"][0]["ratio"] == pytest.approx(0.4)
    assert summary["bytes"] == 4 * 2 * (300 + 500)
    assert summary["throughput_samples_per_s"] == 32.0 and summary["ranks"][0]["bubble"] == pytest.approx(0.5)
    assert summary["stages"][1] == {"rank": 1, "compute_s": 0.0}
    table = format_summary(summary)
    assert "activation/0->1" in table and "gradient/1->0" in table and "32.0 samples/s" in table
    assert "1.20 kB" in table
