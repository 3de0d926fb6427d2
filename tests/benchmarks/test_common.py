"""Smoke tests of the benchmarks' shared code (no timings asserted, no processes started)."""

import math

import pytest

from benchmarks.codecs import CODECS, NAMED
from benchmarks.common import fmt, markdown_table, median_spread, rep_ratios, repeat_round
from benchmarks.models import StackRegressor, build_layers, make_data
from benchmarks.slow_link import break_even, median_speedups, speedups, tables
from benchmarks.worker import STALL, median_step_rate, samples_per_second, stalls


def test_samples_per_second_skips_warmup():
    times = [0.0, 10.0, 11.0, 12.0]
    assert samples_per_second(times, warmup=1, batch=8) == pytest.approx(2 * 8 / 2.0)
    with pytest.raises(ValueError):
        samples_per_second(times[:2], warmup=1, batch=8)


def test_markdown_table_and_fmt():
    text = markdown_table(["a", "b"], [[1, fmt(None)], [2, fmt(1.234, ".1f", "x")]])
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | - |", "| 2 | 1.2x |"]


def test_speedups_and_break_even():
    rows = [{"rate_mbit": r, "method": m, "samples_per_s": s} for r, m, s in [
        (50, "none", [10, 20, None]), (50, "q", [30, 40, 50]), (1000, "none", [100, 100, 100]),
        (1000, "q", [50, 60, 40]), (None, "none", [1]), (None, "q", [1])]]
    curves = speedups(rows)
    assert curves["q"][50] == [3, 2] and curves["q"][1000] == [0.5, 0.6, 0.4]  # repetition by repetition
    medians = median_speedups(rows)
    assert medians["q"][50] == 2.5 and medians["q"][1000] == 0.5
    crossing = float(break_even(medians["q"]).strip("~ Mbit/s"))
    assert 50 < crossing < 1000
    assert break_even({50: 2.0, 200: 1.5}).startswith("pays")
    assert break_even({50: 0.9}).startswith("never")
    assert "| 50 | q | 40 | 30-50 | 2.50x | 2.00-3.00 | - |" in tables([{**r, "errors": []} for r in rows], batch=8)


def test_repetitions_go_round_every_config():
    order = []

    def launch(key, rep):
        order.append((rep, key))
        return {"samples_per_s": None} if (rep, key) == (1, "b") else {"samples_per_s": 10.0 + rep, "error": None}

    out = repeat_round({"a": {}, "b": {}}, 2, launch)
    assert order == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    assert out["a"]["samples_per_s"] == [10.0, 11.0] and out["b"]["samples_per_s"] == [10.0, None]
    assert median_spread(out["a"]["samples_per_s"], ".1f") == ("10.5", "10.0-11.0")
    assert median_spread([None]) == ("-", "-") and rep_ratios([2, None, 3], [1, 1, None]) == [2]


@pytest.mark.parametrize("name", ["mlp", "transformer", "mobilenet"])
def test_models_are_sequential_stacks(name):
    layers, shape, target = build_layers(name)
    data = make_data(shape, 4, target_shape=target)
    out = StackRegressor(layers).layers(data.tensors[0])
    assert out.shape == data.tensors[1].shape and math.isfinite(float(out.sum()))


def test_codec_labels_are_strategy_arguments():
    from lightning_epipe import EPipeStrategy

    for codec in {**CODECS, **NAMED}.values():
        EPipeStrategy(chunks=2, **codec)


def test_median_step_rate_ignores_one_slow_step():
    times = [0.0, 1.0, 1.5, 2.0, 4.5, 5.0]  # after warmup 1: steps of 0.5, 0.5, 2.5, 0.5 s
    assert median_step_rate(times, warmup=1, batch=8) == pytest.approx(8 / 0.5)
    assert samples_per_second(times, warmup=1, batch=8) == pytest.approx(4 * 8 / 4.0)


def test_stalls_are_the_steps_far_beyond_the_median():
    steps = [0.5, 0.5, 0.5 * STALL, 0.5, 0.5 * STALL + 0.5, 0.5]  # one at the threshold, one past it
    times = [0.0, 9.0]  # the warmup step (9 s) is not timed
    for step in steps:
        times.append(times[-1] + step)
    assert stalls(times, warmup=1) == pytest.approx([1000 * (0.5 * STALL + 0.5)])
    assert stalls(times[:4], warmup=1) == []
