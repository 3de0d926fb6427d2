"""What one message costs the engine on the host, apart from the network (issue 12, section 0).

A tensor's send (the NaN/Inf probe, the codec, the frame, the hash, the post, its share of the
flush) and its receive (the wait, the header, the hash check, the decode), timed on the
engine's own ``PipelineRuntime`` and ``Transport``: both ends of a 2-process chain's activation
stream in one thread, on a loopback backend that completes a send or receive (as gloo) only
when it is waited on, a receive by copying in the frame sent. Micro-batch i of 8 goes out and
comes back in turn (each receive posts the next one, as in training), and the sender flushes
its sends after the 8th, as a step's end does.

``--baseline REV``: that commit's package runs in the same process as the current one (a copy
from ``git archive``, imported as ``lightning_epipe_before``), the two taking turns batch by
batch (50 messages), so that the machine's drift, which moves separate processes' timings by
+-20% here, falls on both; each takes its best batch of ``--batches``. Every codec and tensor
runs in ``--rounds`` processes: median and spread over them. One torch thread.

    python benchmarks/message_cost.py --baseline REV [--out NAME.json]

Writes ``results/message_cost.{json,png}`` (``--out``: another name).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import axes, finish, load_average, publish_table, unpack_revision  # noqa: E402

CODECS = {"none": {}, "fp16": {}, "sortquant-8": {"bits": 8}}
SHAPES = [(8, 128), (32, 512), (32, 1024)]
PER_BATCH = 50
MICROBATCHES = 8
BEFORE = "lightning_epipe_before"


class _Work:
    """A send or receive on the loopback, complete (as gloo's) only once waited on; a receive
    copies its frame in then."""

    def __init__(self, fill=None) -> None:
        self.fill, self.done = fill, False

    def is_completed(self) -> bool:
        return self.done

    def wait(self, timeout=None) -> bool:
        if self.fill is not None:
            self.fill()
        self.done = True
        return True


class MessageLoop:
    """One revision's sender and receiver runtimes (package ``package``), sending ``x`` to itself."""

    def __init__(self, package: str, codec: str, x) -> None:
        import torch
        from torch import nn

        def mod(name: str):
            return importlib.import_module(f"{package}.{name}")

        transport, wire = mod("strategy.comm.transport"), mod("strategy.comm.wire")
        codec_book, partition = mod("strategy.compression.codec_book"), mod("strategy.planning.partition")
        self.wire = wire
        queue: collections.deque = collections.deque()

        def isend(frame, dst, group, tag=0):
            queue.append(frame)
            return _Work()

        def irecv(frame, src, group, tag=0):
            return _Work(lambda: frame.copy_(queue.popleft()))

        try:  # as gloo: a send reports completion only once waited on
            backend = transport.P2PBackend(isend, irecv, completes_unwaited=lambda device: False)
        except TypeError:  # a revision before P2PBackend.completes_unwaited polls every send
            backend = transport.P2PBackend(isend, irecv)
        name, kwargs = codec.split("-")[0], CODECS[codec]
        plan = partition.plan_pipeline(4, 2, [2, 2], "chain")
        layers = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])
        groups = {(s.name, s.src, s.dst): str(s) for s in mod("strategy.comm.streams").pipeline_streams("chain", 2)}

        def runtime(rank: int):
            link = transport.Transport(rank, torch.device("cpu"), timedelta(seconds=10), groups=groups, control_group="c",
                                       backend=backend)
            specs = [codec_book.resolve_specs(name, kwargs, plan.num_cuts, what) for what in ("a", "g")]
            return mod("strategy.engine.runtime").PipelineRuntime(plan, rank, layers, link, codec_book.CodecBook(*specs),
                                                                  mod("strategy.engine.stats").PipelineStats())

        self.sender, self.receiver = runtime(1), runtime(0)  # chain: rank 1 runs the first stage, rank 0 the last
        for r in (self.sender, self.receiver):
            r.begin_step(MICROBATCHES)
        self.x, self.sent = x, 0
        self.best_send = self.best_recv = float("inf")

    def batch(self, keep: bool) -> None:
        """Send and receive ``PER_BATCH`` messages; ``keep``: count the batch (else a warm-up)."""
        kind, flags = self.wire.Kind.ACTIVATION, self.wire.Flag.REQUIRES_GRAD
        send_s = recv_s = 0.0
        for _ in range(PER_BATCH):
            mb, self.sent = self.sent % MICROBATCHES, self.sent + 1
            a = time.perf_counter()
            self.sender._send_one(kind, 0, 0, mb, 0, 1, self.x, flags)
            b = time.perf_counter()
            self.receiver._recv(kind, 1, 0, mb, True)
            c = time.perf_counter()
            send_s, recv_s = send_s + b - a, recv_s + c - b
            if mb == MICROBATCHES - 1:  # a step's sends are flushed (and timed) at its end
                self.sender.transport.flush()
                send_s += time.perf_counter() - c
        if keep:
            self.best_send = min(self.best_send, send_s / PER_BATCH)
            self.best_recv = min(self.best_recv, recv_s / PER_BATCH)


def measure(codec: str, rows: int, width: int, batches: int, packages: list[str]) -> dict:
    """Best microseconds per message of the send and of the receive, per package, taking turns."""
    import torch

    torch.set_num_threads(1)
    x = torch.relu(torch.randn(rows, width))
    loops = {package: MessageLoop(package, codec, x) for package in packages}
    for batch in range(batches + 2):  # two batches of warm-up
        for loop in loops.values():
            loop.batch(keep=batch >= 2)
    return {package: {"send_us": loop.best_send * 1e6, "recv_us": loop.best_recv * 1e6} for package, loop in loops.items()}


def export(rev: str) -> Path:
    """The package at ``rev`` as ``lightning_epipe_before`` in a temporary directory (its own
    absolute imports renamed), for ``PYTHONPATH``."""
    target = Path(tempfile.mkdtemp(prefix="message-cost-"))
    unpack_revision(rev, target, ["lightning_epipe"])
    (target / "lightning_epipe").rename(target / BEFORE)
    for path in (target / BEFORE).rglob("*.py"):
        path.write_text(path.read_text().replace("lightning_epipe", BEFORE))
    return target


def run_worker(path: Path | None, codec: str, shape: tuple[int, int], batches: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, __file__, "--worker", codec, f"{shape[0]}x{shape[1]}", "--batches", str(batches)]
    if path is not None:
        cmd.append("--with-before")
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", metavar="REV", help="the revision to compare with, in the same processes")
    p.add_argument("--rounds", type=int, default=3, help="processes per codec and tensor")
    p.add_argument("--batches", type=int, default=60, help="batches of 50 messages per revision and process")
    p.add_argument("--out", default="message_cost.json", help="file name under benchmarks/results (the plot: .png)")
    p.add_argument("--worker", nargs=2, metavar=("CODEC", "ROWSxWIDTH"), help=argparse.SUPPRESS)
    p.add_argument("--with-before", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        rows, width = map(int, args.worker[1].split("x"))
        packages = [BEFORE, "lightning_epipe"] if args.with_before else ["lightning_epipe"]
        measured = measure(args.worker[0], rows, width, args.batches, packages)
        print(json.dumps({"current" if name == "lightning_epipe" else "before": value for name, value in measured.items()}))
        return

    labels = ["before", "current"] if args.baseline else ["current"]
    path = export(args.baseline) if args.baseline else None
    load_before = load_average()
    current = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(__file__).parent, capture_output=True,
                             text=True).stdout.strip()
    results: dict = {"baseline": args.baseline, "current": current, "rounds": args.rounds, "batches": args.batches,
                     "load_before": load_before, "runs": {}}
    for codec in CODECS:
        for shape in SHAPES:
            key = f"{codec} [{shape[0]}, {shape[1]}]"
            results["runs"][key] = [run_worker(path, codec, shape, args.batches) for _ in range(args.rounds)]
    results["load_after"] = load_average()

    header = ["tensor (float32)", "codec"]
    for label in labels:
        header += [f"send us ({label})", f"receive us ({label})"]
    if args.baseline:
        header += ["send + receive, current / before (median)", "spread"]
    rows = []
    for key, samples in results["runs"].items():
        codec, tensor = key.split(" ", 1)
        row: list = [tensor, codec]
        for label in labels:
            row += [f"{statistics.median(s[label]['send_us'] for s in samples):.1f}",
                    f"{statistics.median(s[label]['recv_us'] for s in samples):.1f}"]
        if args.baseline:
            ratios = [(s["current"]["send_us"] + s["current"]["recv_us"]) / (s["before"]["send_us"] + s["before"]["recv_us"])
                      for s in samples]
            row += [f"{statistics.median(ratios):.2f}", f"{min(ratios):.2f}-{max(ratios):.2f}"]
        rows.append(row)
    publish_table(results, header, rows, args.out)

    fig, ax = axes()
    keys = list(results["runs"])
    for offset, label in enumerate(labels):
        totals = [statistics.median(s[label]["send_us"] + s[label]["recv_us"] for s in results["runs"][k]) for k in keys]
        ax.barh([i + 0.4 * offset for i in range(len(keys))], totals, height=0.4, label=label)
    ax.set_yticks([i + 0.2 for i in range(len(keys))], keys, fontsize=7)
    finish(fig, ax, str(Path(args.out).with_suffix(".png")), "microseconds per message, send + receive (median over processes)", "",
           "One message through the engine, no network")

if __name__ == "__main__":
    main()
