"""A bounded stress run: many short epochs, random batch sizes (some smaller than chunks),
every codec on some cut and direction, both placements; nothing leaks across epochs."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_ranks

SCRIPT = ROOT / "tests" / "strategy" / "stress.py"


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["client-server", "chain"])
def test_no_leak_of_memory_or_sockets(placement, tmp_path):
    run_ranks(SCRIPT, "--out", tmp_path, "--placement", placement, "--devices", 4, "--epochs", 15, timeout=900)
    for rank in range(4):
        rows = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(rows) == 15
        assert {r["fds"] for r in rows[1:]} == {rows[1]["fds"]}, f"rank {rank} opened descriptors: {rows}"
        growth_kb = rows[-1]["rss_kb"] - rows[2]["rss_kb"]
        assert growth_kb < 4096, f"rank {rank} grew {growth_kb} kB over 12 epochs"
