"""benchmarks/engine.py without processes: the grid, a row's summary and the table."""

import pytest

from benchmarks.engine import BATCH, cells, summary, table


def test_the_grid_runs_1f1b_and_no_checksum_where_asked():
    grid = cells([512], [1, 8], [2, 3], one_f_one_b=[8], no_checksum=[512], widths3=[512])
    assert [(c["stages"], c["chunks"], c["schedule"], c["checksum"]) for c in grid] == [
        (2, 1, "gpipe", True), (2, 8, "gpipe", True), (2, 8, "1f1b", True), (2, 8, "gpipe", False),
        (3, 1, "gpipe", True), (3, 8, "gpipe", True), (3, 8, "1f1b", True)]


def test_summary_compares_step_times_with_lightnings_per_step_cost():
    row = dict(stages=2, width=128, chunks=1, schedule="gpipe", checksum=True, errors=[],
               epipe=[BATCH / 0.004, BATCH / 0.005, BATCH / 0.006], torch=[BATCH / 0.003] * 3,
               single=[BATCH / 0.010] * 3, plain=[BATCH / 0.0045] * 3)
    s = summary(row)
    assert s["ratio"] == pytest.approx(0.6) and s["spread"] == pytest.approx((0.5, 0.75))
    assert s["beyond_torch_ms"] == pytest.approx(2.0)  # the median EPipe step (5 ms) minus torch's (3 ms)
    assert s["lightning_ms"] == pytest.approx(5.5)  # one Lightning process (10 ms) minus a plain loop (4.5 ms)
    assert s["ideal"] == pytest.approx(0.5 * 8 / 10)
    assert s["step_ratio"] is None and s["stalls"] == {}
    line = table([row]).splitlines()[-1]
    assert line.startswith("| 2 | 128 | 1 | gpipe | 51200 | 85333 | 0.60x | 0.50-0.75 |")
    assert line.endswith("| 2.00 | 5.50 | - | - |  |")


def test_summary_compares_median_steps_and_counts_stalls():
    row = dict(stages=3, width=128, chunks=1, schedule="gpipe", checksum=True, errors=[],
               epipe=[BATCH / 0.007] * 3, torch=[BATCH / 0.008] * 3, single=[], plain=[],
               epipe_median_step=[BATCH / 0.007, BATCH / 0.0065, BATCH / 0.006], torch_median_step=[BATCH / 0.005] * 3,
               epipe_stalls_ms=[[], [], []], torch_stalls_ms=[[260.0], [], [280.0, 300.0]])
    s = summary(row)
    assert s["ratio"] == pytest.approx(8 / 7)  # the spans, each with torch's stalls in it
    assert s["step_ratio"] == pytest.approx(5 / 6.5)  # the steady steps: EPipe behind
    assert s["stalls"] == {"epipe": 0, "torch": 3}
    assert table([row]).splitlines()[-1].endswith("| 0.77x | 0 / 3 |  |")


def test_a_row_without_plain_runs_has_no_lightning_cost():
    row = dict(stages=2, width=128, chunks=1, epipe=[1.0], torch=[1.0], single=[1.0])
    assert summary(row)["lightning_ms"] is None
