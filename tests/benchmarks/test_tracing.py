"""The step tracer's pure analysis, and that every function it wraps still exists."""

import importlib

import pytest

from benchmarks.step_trace import header, ordered_labels, side_by_side, table
from benchmarks.tracing import BETWEEN, STEP, TRACED, median_ms, self_times, step_windows


def test_a_calls_own_time_leaves_out_its_traced_callees():
    events = [("a", 0.0, 10.0), ("b", 1.0, 4.0), ("c", 2.0, 3.0), ("d", 5.0, 6.0), ("e", 11.0, 12.0)]
    own = {label: seconds for label, _, seconds in self_times(events)}
    assert own == pytest.approx({"a": 10 - 3 - 1, "b": 3 - 1, "c": 1, "d": 1, "e": 1})


def test_a_callee_that_starts_with_its_caller_is_still_its_callee():
    own = {label: seconds for label, _, seconds in self_times([("inner", 0.0, 2.0), ("outer", 0.0, 5.0)])}
    assert own == pytest.approx({"outer": 3.0, "inner": 2.0})


def test_steps_run_from_one_advance_to_the_next_and_count_the_gaps_between():
    events = [
        (STEP, 0.0, 8.0), ("forward compute", 1.0, 3.0), ("wait", 4.0, 5.0),
        (STEP, 10.0, 17.0), ("forward compute", 11.0, 14.0),
        (STEP, 20.0, 21.0),
    ]
    windows = step_windows(events)
    assert len(windows) == 2  # the last advance opens no window
    assert windows[0] == pytest.approx({STEP: 5.0, "forward compute": 2.0, "wait": 1.0, BETWEEN: 2.0, "step": 10.0})
    assert windows[1] == pytest.approx({STEP: 4.0, "forward compute": 3.0, BETWEEN: 3.0, "step": 10.0})
    assert step_windows(events, warmup=1) == windows[1:]


def test_median_ms_counts_a_missing_label_as_zero():
    ms = median_ms([{"a": 0.001, "step": 0.01}, {"step": 0.02}, {"a": 0.003, "step": 0.03}])
    assert ms == pytest.approx({"a": 1.0, "step": 20.0})


def test_the_table_puts_labels_by_their_largest_time_and_sums_the_small_ones():
    row = {"ms": {"0": {"step": 10.0, BETWEEN: 0.5, "wait": 1.0, "forward compute": 8.0, "hash": 0.01, "tiny": 0.02},
                  "1": {"step": 10.0, BETWEEN: 0.2, "wait": 6.0, "forward compute": 3.0, "hash": 0.03}}}
    assert ordered_labels(row["ms"])[:2] == ["forward compute", "wait"]
    lines = table(row).splitlines()
    assert lines[2:] == [
        "| forward compute | 8.00 | 3.00 |",
        "| wait | 1.00 | 6.00 |",
        "| other (labels under 0.05 ms) | 0.03 | 0.03 |",
        f"| {BETWEEN} | 0.50 | 0.20 |",
        "| step | 10.00 | 10.00 |",
    ]


def test_codec_rows_sit_side_by_side_rank_by_rank():
    rows = [{"codec": "none", "untraced": [100.0], "traced": [101.0],
             "ms": {"1": {"step": 100.0, BETWEEN: 1.0, "encode": 1.0, "wait": 7.0},
                    "0": {"step": 100.0, BETWEEN: 1.0, "encode": 1.5, "wait": 20.0, "hash": 0.01}}},
            {"codec": "sortquant-8", "untraced": [120.0], "traced": [122.0],
             "ms": {"0": {"step": 120.0, BETWEEN: 1.0, "encode": 7.0, "wait": 30.0, "hash": 0.02},
                    "1": {"step": 120.0, BETWEEN: 1.0, "encode": 9.0, "wait": 8.0}}}]
    lines = side_by_side(rows).splitlines()
    assert lines[0] == "| ms per step (median) | none rank 0 | none rank 1 | sortquant-8 rank 0 | sortquant-8 rank 1 |"
    assert lines[2:] == [
        "| wait | 20.00 | 7.00 | 30.00 | 8.00 |",
        "| encode | 1.50 | 1.00 | 7.00 | 9.00 |",
        "| other (labels under 0.05 ms) | 0.01 | 0.00 | 0.02 | 0.00 |",
        f"| {BETWEEN} | 1.00 | 1.00 | 1.00 | 1.00 |",
        "| step | 100.00 | 100.00 | 120.00 | 120.00 |",
    ]
    assert header(rows[1]).startswith("sortquant-8, client-server, width 1024, chunks 8: step ms")


@pytest.mark.parametrize("module, attribute, label", TRACED, ids=[t[1] for t in TRACED])
def test_every_traced_function_exists(module, attribute, label):
    owner = importlib.import_module(module)
    for name in attribute.split("."):
        owner = getattr(owner, name)
    assert callable(owner), f"{module}.{attribute} ({label}) is not callable: update benchmarks/tracing.TRACED"
