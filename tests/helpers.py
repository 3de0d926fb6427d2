"""Run a script as a real multi-process Lightning job and fail loudly if it hangs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_ranks(script: str | Path, *args: str, timeout: float = 180, expect_ok: bool = True, env: dict | None = None):
    """Run ``python script args`` (Lightning's launcher starts the other ranks) in its own
    process group; kill the whole group after ``timeout`` seconds."""
    cmd = [sys.executable, str(script), *map(str, args)]
    full_env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{script} {' '.join(map(str, args))} hung for {timeout}s:\n{out[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftover ranks
        except ProcessLookupError:
            pass
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"{script} exited {proc.returncode}:\n{out[-6000:]}")
    return proc.returncode, out
