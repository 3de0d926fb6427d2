"""Smoke tests of the benchmarks' shared code (no timings asserted, no processes started)."""

import math

import pytest

from benchmarks.codecs import CODECS
from benchmarks.common import markdown_table, fmt
from benchmarks.models import StackRegressor, build_layers, make_data
from benchmarks.slow_link import break_even, speedups
from benchmarks.worker import median_step_rate, samples_per_second


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
        (50, "none", 10), (50, "q", 30), (1000, "none", 100), (1000, "q", 50), (None, "none", 1), (None, "q", 1)]]
    curves = speedups(rows)
    assert curves["q"][50] == 3 and curves["q"][1000] == 0.5
    crossing = float(break_even(curves["q"]).strip("~ Mbit/s"))
    assert 50 < crossing < 1000
    assert break_even({50: 2.0, 200: 1.5}).startswith("pays")
    assert break_even({50: 0.9}).startswith("never")


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_models_are_sequential_stacks(name):
    layers, shape = build_layers(name)
    data = make_data(shape, 4)
    out = StackRegressor(layers).layers(data.tensors[0])
    assert out.shape == data.tensors[1].shape and math.isfinite(float(out.sum()))


def test_codec_labels_are_strategy_arguments():
    from lightning_epipe import EPipeStrategy

    for codec in CODECS.values():
        EPipeStrategy(chunks=2, **codec)


def test_median_step_rate_ignores_one_slow_step():
    times = [0.0, 1.0, 1.5, 2.0, 4.5, 5.0]  # after warmup 1: steps of 0.5, 0.5, 2.5, 0.5 s
    assert median_step_rate(times, warmup=1, batch=8) == pytest.approx(8 / 0.5)
    assert samples_per_second(times, warmup=1, batch=8) == pytest.approx(4 * 8 / 4.0)
