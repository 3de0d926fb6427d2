"""benchmarks/message_cost.py: a baseline revision runs beside the current package (no timings asserted)."""

import shutil
import sys

from benchmarks.message_cost import BEFORE, export, measure


def test_a_baseline_revision_runs_beside_the_current_package():
    """HEAD exported as ``lightning_epipe_before`` imports only itself, and both send and receive."""
    root = export("HEAD")
    sys.path.insert(0, str(root))
    try:
        got = measure("none", 4, 16, batches=1, packages=[BEFORE, "lightning_epipe"])
        runtime = sys.modules[f"{BEFORE}.strategy.engine.runtime"]
        assert runtime.__file__.startswith(str(root))
        assert runtime.Transport.__module__ == f"{BEFORE}.strategy.comm.transport"  # its imports renamed too
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == BEFORE or n.startswith(BEFORE + ".")]:
            del sys.modules[name]
        shutil.rmtree(root)
    for package in (BEFORE, "lightning_epipe"):
        assert got[package]["send_us"] > 0 and got[package]["recv_us"] > 0
