"""benchmarks/link_bound.py: how link-bound ``none`` is, from a run's own rows."""

import pytest

from benchmarks.link_bound import link_bound_rows, link_bound_table, per_step


def test_per_step_splits_the_workers_bytes_by_kind():
    result = {"bytes": 3000, "steps": 10, "bytes_by_kind": {"activation": 1000, "gradient": 1000, "input": 1000}}
    assert per_step(result) == {"bytes_per_step": 300.0,
                                "bytes_per_step_by_kind": {"activation": 100.0, "gradient": 100.0, "input": 100.0}}
    assert per_step({"error": "hung"}) == {}


def rows():
    # none: 2.5 MB a step (0.5 MB of it raw inputs); unlimited 100 samples/s of batch 50 = 0.5 s a step
    kinds = {"activation": 1e6, "gradient": 1e6, "input": 0.5e6}
    none = {"method": "none", "bytes_per_step": 2.5e6, "bytes_per_step_by_kind": kinds}
    return [{**none, "rate_mbit": 20, "samples_per_s": [10.0, 12.5, 11.0]},
            {**none, "rate_mbit": None, "samples_per_s": [90.0, 100.0, 110.0]},
            {"method": "fp16", "rate_mbit": 20, "samples_per_s": [20.0], "bytes_per_step": 1.5e6}]


def test_link_bound_is_the_send_time_over_the_unlimited_step():
    (b,) = link_bound_rows(rows(), batch=50)
    assert b["rate_mbit"] == 20 and b["transfer_s"] == pytest.approx(2.5e6 * 8 / 20e6)  # 1.0 s at 2.5 MB/s
    assert b["unlimited_step_s"] == pytest.approx(0.5) and b["link_bound"] == pytest.approx(2.0)
    assert b["measured_step_s"] == pytest.approx(50 / 11.0) and b["raw_share"] == pytest.approx(0.2)
    line = "| 20 | 2.50 | 1.000 | 0.500 | 2.0x | 9.1x | 20% | 5.00x |"
    assert line in link_bound_table(rows(), batch=50).splitlines()


def test_no_table_without_an_unlimited_none_or_its_bytes():
    assert link_bound_table([r for r in rows() if r["rate_mbit"] is not None], batch=50) == ""
    old = [{k: v for k, v in r.items() if not k.startswith("bytes")} for r in rows()]  # a file from before bytes
    assert link_bound_rows(old, batch=50) == []
    no_kinds = [{k: v for k, v in r.items() if k != "bytes_per_step_by_kind"} for r in rows()]
    assert "| 20 | 2.50 | 1.000 | 0.500 | 2.0x | 9.1x | - | - |" in link_bound_table(no_kinds, batch=50)


def test_a_placement_with_no_raw_inputs_has_no_ceiling():
    only_cuts = [{**r, "bytes_per_step_by_kind": {"activation": 1.25e6, "gradient": 1.25e6}} for r in rows()]
    assert "| 20 | 2.50 | 1.000 | 0.500 | 2.0x | 9.1x | 0% | no limit |" in link_bound_table(only_cuts, batch=50)
