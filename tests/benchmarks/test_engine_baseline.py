"""benchmarks/engine_baseline.py and the revision it runs, without timings."""

import subprocess

import pytest

from benchmarks.common import exported_revision, run
from benchmarks.engine_baseline import config, label, order, parse_cell, summary, table


def test_cells_read_as_section_0_writes_them():
    assert parse_cell("2:512:8") == dict(stages=2, width=512, chunks=8, schedule="gpipe")
    assert parse_cell("3:1024:8:1f1b") == dict(stages=3, width=1024, chunks=8, schedule="1f1b")
    for bad in ("2:512", "2:x:8", "4:512:8", "2:512:8:zb"):
        with pytest.raises(ValueError, match="K:width:chunks"):
            parse_cell(bad)


def test_the_two_revisions_swap_places_every_repetition():
    assert order(0) == ("baseline", "current", "torch")
    assert order(1) == ("current", "baseline", "torch")
    assert order(2) == order(0)


def test_baseline_strategy_arguments_reach_the_baseline_runs_only():
    """``--baseline HEAD --baseline-strategy '{"start_ahead": false}'``: a setting against its default."""
    cell = parse_cell("2:128:1")
    changed = {"start_ahead": False}
    assert config(cell, "baseline", 10, changed)["strategy"] == {"schedule": "gpipe", "start_ahead": False}
    assert config(cell, "current", 10, changed)["strategy"] == {"schedule": "gpipe"}
    assert config(cell, "baseline", 10)["strategy"] == {"schedule": "gpipe"}
    assert config(cell, "torch", 10, changed)["kind"] == "pipelining"
    assert label("HEAD", changed) == "HEAD start_ahead=False" and label("abc123", {}) == "abc123"


def test_summary_pairs_runs_of_one_repetition():
    row = dict(stages=2, width=512, chunks=1, schedule="gpipe", errors=["baseline: hung"],
               baseline=[100.0, 100.0, None], current=[110.0, 95.0, 120.0], torch=[100.0, 125.0, 100.0])
    s = summary(row)
    assert s["ratio"] == pytest.approx(1.025)  # the repetition whose baseline failed pairs with nothing
    assert s["spread"] == pytest.approx((0.95, 1.10))
    assert (s["faster"], s["pairs"]) == (1, 2)
    assert s["current_vs_torch"] == pytest.approx(1.1) and s["baseline_vs_torch"] == pytest.approx(0.9)
    line = table([row], "abc123").splitlines()[-1]
    assert line.startswith("| 2 | 512 | 1 | gpipe | 100 | 110 | 100 | 1.025x | 0.95-1.10 | 1 of 2 | 0.90x | 1.10x |")
    assert line.endswith("baseline: hung |")


def test_a_revision_is_exported_with_its_worker_and_removed_afterwards():
    with exported_revision("HEAD") as root:
        assert (root / "benchmarks" / "worker.py").is_file()
        assert (root / "lightning_epipe" / "__init__.py").is_file()
    assert not root.exists()
    with pytest.raises(subprocess.CalledProcessError):
        with exported_revision("no-such-revision"):
            pass


def test_a_run_takes_the_worker_and_the_package_of_its_root(tmp_path):
    """``root`` comes first on the path, before the installed package."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "lightning_epipe").mkdir()
    (tmp_path / "lightning_epipe" / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "worker.py").write_text(
        "import json, sys, lightning_epipe\n"
        "cfg = json.loads(sys.argv[2])\n"
        "json.dump({'samples_per_s': 1.0, 'package': lightning_epipe.__file__}, open(cfg['out'], 'w'))\n")
    result = run({"kind": "epipe", "devices": 1}, root=tmp_path, timeout=60)
    assert result["package"] == str(tmp_path / "lightning_epipe" / "__init__.py"), result
