"""benchmarks/split_cost.py: every way of running a step's backward runs (no timings asserted)."""

from benchmarks.split_cost import MODES, measure


def test_every_way_runs_and_is_timed():
    timed = measure(width=16, rows=4, m=3, steps=1)
    assert set(timed) == set(MODES)
    assert all(ms > 0 for ms in timed.values())
