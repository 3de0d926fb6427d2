"""Run a script as a real multi-process Lightning job, or a function in two gloo processes,
and fail loudly if it hangs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: str | Path, *args: str, timeout: float = 180, expect_ok: bool = True, env: dict | None = None):
    """Run ``python script args`` (Lightning's launcher starts the other ranks) in its own
    process group and wait for rank 0's exit (at most ``timeout`` s); then kill whatever
    rank is left, e.g. a stalled one. Returns ``(returncode, output)``."""
    cmd = [sys.executable, str(script), *map(str, args)]
    full_env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            hung = False
        except subprocess.TimeoutExpired:
            hung = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        log.seek(0)
        out = log.read()
    if hung:
        raise AssertionError(f"{script} {' '.join(map(str, args))} hung for {timeout}s:\n{out[-4000:]}")
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"{script} exited {proc.returncode}:\n{out[-6000:]}")
    return proc.returncode, out


def run_nodes(script: str | Path, out_dir: Path, *args: str, nodes: int = 2, timeout: float = 240) -> list[str]:
    """Start ``script args`` once per node on loopback, as a cluster launcher does (MASTER_ADDR,
    MASTER_PORT and NODE_RANK per command), node ``n`` writing ``out_dir / f"node{n}.pt"``;
    every node's output, once all have exited (each bounded as in :func:`run_ranks`)."""
    port = str(free_port())
    with ThreadPoolExecutor(nodes) as pool:
        runs = [pool.submit(run_ranks, script, "--out", out_dir / f"node{node}.pt", "--num-nodes", nodes, *args,
                            timeout=timeout, env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NODE_RANK": str(node)})
                for node in range(nodes)]
        return [run.result()[1] for run in runs]


def run_two_gloo_ranks(body: Callable[[int], Any], timeout: float = 120) -> dict[int, Any]:
    """``body(rank)`` in two spawned processes joined by a gloo process group on loopback
    (``body``: a module-level function; what it returns must pickle). Returns each rank's
    result; fails the test if they do not finish within ``timeout`` s."""
    import pytest
    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    context = mp.start_processes(_gloo_rank, args=(body, free_port(), results), nprocs=2, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail(f"the two gloo processes did not finish within {timeout} s")
    return dict(results)


def _gloo_rank(rank: int, body: Callable[[int], Any], port: int, results: dict) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))
    try:
        results[rank] = body(rank)
    finally:
        dist.destroy_process_group()
