"""Shared by the benchmark scripts: launch one run, read its JSON, tables, plots, namespaces.

A run is ``benchmarks/worker.py --config JSON``. Lightning runs are started once (Lightning's
launcher re-runs the script per rank); ``torch.distributed.pipelining`` runs are started once
per rank here, with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR=127.0.0.1``. A run that fails or
times out gives ``{"error": ...}`` instead of numbers, so one broken baseline does not stop a
benchmark.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "worker.py"
RESULTS = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cfg: dict, netns: Optional[str] = None, timeout: float = 600, root: Path = ROOT) -> dict:
    """Run ``cfg`` (see ``worker.py``) to completion; its rank-0 JSON, or ``{"error": ...}``.
    ``root``: the tree whose ``benchmarks/worker.py`` and package run (another revision's,
    :func:`exported_revision`)."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cfg = {**cfg, "out": str(out)}
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
               "PYTHONPATH": str(root), "OMP_NUM_THREADS": str(cfg.get("threads", 1))}
        worker = root / WORKER.relative_to(ROOT)
        cmd = prefix + [sys.executable, str(worker), "--config", json.dumps(cfg)]
        ranks = range(cfg["devices"]) if cfg["kind"] == "pipelining" else [None]
        procs = []
        for rank in ranks:
            rank_env = env if rank is None else {**env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                                                 "WORLD_SIZE": str(cfg["devices"])}
            procs.append(subprocess.Popen(cmd, cwd=root, env=rank_env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, start_new_session=True))
        logs, timed_out = [], False
        for p in procs:
            try:
                logs.append(p.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                timed_out = True
                for q in procs:  # the whole session of each rank: Lightning's children too
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(q.pid, 9)
                logs.append(p.communicate()[0])
        if out.exists():
            result = json.loads(out.read_text())
            if "error" not in result and all(p.returncode == 0 for p in procs):
                return result
            if "error" in result:
                return result
        tail = "\n".join(log[-1500:] for log in logs if log)
        if timed_out:
            return {"error": f"hung: no result after {timeout:.0f} s (killed)", "log": tail}
        return {"error": f"exit codes {[p.returncode for p in procs]}", "log": tail}


@contextlib.contextmanager
def exported_revision(rev: str) -> Iterator[Path]:
    """The package and the benchmarks at git revision ``rev`` (``git archive``) in a temporary
    directory, for :func:`run`'s ``root``; removed afterwards. Raises CalledProcessError
    (git's message in ``stderr``) for a revision this clone does not have."""
    target = Path(tempfile.mkdtemp(prefix="epipe-rev-"))
    try:
        unpack_revision(rev, target, ["lightning_epipe", "benchmarks"])
        yield target
    finally:
        shutil.rmtree(target, ignore_errors=True)


def unpack_revision(rev: str, target: Path, paths: Sequence[str]) -> None:
    """Write ``paths`` (directories of this repository) as they are at git revision ``rev``
    under ``target``. Raises CalledProcessError for a revision this clone does not have."""
    archive = subprocess.run(["git", "archive", rev, *paths], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")


def commit_of(rev: str) -> str:
    """The full hash of ``rev`` in this clone."""
    return subprocess.run(["git", "rev-parse", rev], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()


def this_tree() -> str:
    """This tree's commit, ``" + uncommitted changes"`` after it where the package's or the
    benchmarks' code differs from it (result files and READMEs do not count)."""
    changed = subprocess.run(["git", "status", "--porcelain", "--", "lightning_epipe", "benchmarks/*.py"], cwd=ROOT,
                             check=True, capture_output=True, text=True).stdout.strip()
    return commit_of("HEAD") + (" + uncommitted changes" if changed else "")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(x: Optional[float], spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def axes(figsize: tuple[float, float] = (7.5, 4.5)):
    """A new matplotlib figure and axes (headless backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)


def finish(fig, ax, name: str, xlabel: str, ylabel: str, title: str, legend: int = 8) -> Path:
    """Label ``ax``, save ``fig`` as ``results/name``; the path."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=legend)
    return save(fig, name)


def save(fig, name: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def write_json(name: str, data) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(data, indent=1, default=str))
    return path


def publish_table(results: dict, header: Sequence[str], rows: Sequence[Sequence[object]], name: str) -> Path:
    """Put the table of ``rows`` in ``results["table"]``, print it after the load averages in
    ``results["load_before"]`` and ``results["load_after"]``, and write ``results`` as ``name``."""
    results["table"] = markdown_table(header, rows)
    print(f"{results['load_before']} before, {results['load_after']} after\n")
    print(results["table"])
    return write_json(name, results)


def netns_available() -> Optional[str]:
    """``None`` if namespaces with ``tc`` work here, else why not (the skip message)."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is missing (apt-get install iproute2)"
    name = f"epipe-probe-{os.getpid()}"
    try:
        with slow_loopback(name, 1000):
            pass
    except (subprocess.CalledProcessError, OSError) as err:
        detail = getattr(err, "stderr", None) or err
        return f"network namespaces or tc are not permitted here: {str(detail).strip()}"
    return None


@contextlib.contextmanager
def slow_loopback(name: str, mbit: Optional[float]) -> Iterator[str]:
    """A network namespace ``name`` whose loopback is limited to ``mbit`` Mbit/s (tc tbf).

    ``mbit=None`` leaves the loopback unlimited. Only the namespace's own loopback is touched;
    the namespace is deleted on exit, whatever happens.
    """
    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "set", "lo", "up")
        if mbit is not None:
            ip("netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf",
               "rate", f"{mbit:g}mbit", "burst", "1mbit", "latency", "100ms")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def load_average() -> str:
    """``"load average 0.52 0.61 0.70 (2 cores)"``: printed with every table."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} cores)"


def rep_ratios(values: Sequence[Optional[float]], baseline: Sequence[Optional[float]]) -> list[float]:
    """``values[i] / baseline[i]`` for every repetition ``i`` in which both ran."""
    return [a / b for a, b in zip(values, baseline) if a and b]


def median_of(values: Sequence[Optional[float]]) -> Optional[float]:
    """The median of the values that exist (None and 0 are runs that failed); None if none do."""
    done = [v for v in values if v]
    return statistics.median(done) if done else None


def median_spread(values: Sequence[Optional[float]], spec: str = ".2f", suffix: str = "") -> tuple[str, str]:
    """``("1.02x", "0.98-1.05")``: the median of the values that exist and their range (``"-"`` if none)."""
    done = [v for v in values if v]
    if not done:
        return "-", "-"
    return fmt(median_of(done), spec, suffix), f"{min(done):{spec}}-{max(done):{spec}}"


def repeat_round(configs: dict, repeats: int, launch: Callable[[Any, int], dict]) -> dict:
    """Run every config ``repeats`` times, going round all of them each repetition (so one
    repetition's configs run side by side); ``launch(key, rep)`` runs one. Returns per key
    ``{"samples_per_s": [...one per repetition, None where it failed], "errors": [...],
    "last": the last successful result}``."""
    out = {key: {"samples_per_s": [], "errors": [], "last": {}} for key in configs}
    for rep in range(repeats):
        for key in configs:
            result = launch(key, rep)
            sps = result.get("samples_per_s")
            out[key]["samples_per_s"].append(sps or None)
            if sps:
                out[key]["last"] = result
            else:
                out[key]["errors"].append(result.get("error"))
    return out
