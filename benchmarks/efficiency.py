"""Pipeline efficiency: measured throughput vs the ideal m/(m+K-1) of a balanced GPipe.

    python benchmarks/efficiency.py            # quick: chunks 1, 2, 4, 8 over 2 and 3 processes
    python benchmarks/efficiency.py --full

The balanced MLP, uncompressed, chain placement (K = processes = stages). Efficiency measured
= samples/s of the pipeline / (K x samples/s of the whole model in one process on the whole
batch), both with one torch thread per process: 1.0 would be a perfect K-fold speed-up.
The ideal is ``lightning_epipe.strategy.engine.schedule.ideal_efficiency(m, K)``. "busy" is the
monitor's own 1 - bubble (compute time over wall time, averaged over ranks). The same
schedule in ``torch.distributed.pipelining`` is measured next to it. With more processes
than cores (3 on this 2-core machine) the measured efficiency cannot exceed cores/K.
Writes ``benchmarks/results/efficiency.{png,json}``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import axes, finish, fmt, markdown_table, run, write_json  # noqa: E402
from lightning_epipe.strategy.engine.schedule import ideal_efficiency  # noqa: E402


def measure(base: dict, devices: list[int], chunks: list[int]) -> tuple[dict, list[dict]]:
    single = run({**base, "kind": "single", "devices": 1, "chunks": 1})
    print(f"  single process: {single.get('samples_per_s') or single.get('error')}", flush=True)
    rows = []
    for n in devices:
        for m in chunks:
            for kind in ("epipe", "pipelining"):
                result = run({**base, "kind": kind, "devices": n, "chunks": m})
                print(f"  {kind} K={n} m={m}: {result.get('samples_per_s') or result.get('error')}", flush=True)
                rows.append({"kind": kind, "stages": n, "chunks": m, **result})
    return single, rows


def efficiency(row: dict, single: dict):
    if row.get("samples_per_s") and single.get("samples_per_s"):
        return row["samples_per_s"] / (row["stages"] * single["samples_per_s"])
    return None


def table(single: dict, rows: list[dict]) -> str:
    body = []
    for r in rows:
        bubble = r.get("bubble")
        body.append([r["kind"], r["stages"], r["chunks"],
                     fmt(r.get("samples_per_s"), ".0f") if r.get("samples_per_s") else f"failed: {r.get('error')}",
                     fmt(efficiency(r, single), ".2f"), fmt(ideal_efficiency(r["chunks"], r["stages"]), ".2f"),
                     fmt(None if bubble is None else 1 - bubble, ".2f"),
                     fmt(min(1.0, (os.cpu_count() or 1) / r["stages"]), ".2f")])
    head = f"single process (whole batch, 1 thread): {fmt(single.get('samples_per_s'), '.0f')} samples/s\n\n"
    return head + markdown_table(["runtime", "K", "chunks m", "samples/s", "efficiency measured",
                                  "ideal m/(m+K-1)", "busy (monitor)", "core cap"], body)


def plot(single: dict, rows: list[dict]) -> Path:
    fig, ax = axes()
    for k in sorted({r["stages"] for r in rows}):
        ms = sorted({r["chunks"] for r in rows if r["stages"] == k})
        line, = ax.plot(ms, [ideal_efficiency(m, k) for m in ms], ls="--", label=f"ideal K={k}")
        for kind, marker in (("epipe", "o"), ("pipelining", "s")):
            pts = [(r["chunks"], efficiency(r, single)) for r in rows if r["stages"] == k and r["kind"] == kind]
            pts = [p for p in pts if p[1] is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=line.get_color(),
                    ls="-" if kind == "epipe" else ":", label=f"{'EPipe' if kind == 'epipe' else 'torch pipelining'} K={k}")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    return finish(fig, ax, "efficiency.png", "micro-batches m (chunks)", "throughput / (K x single process)",
                  "GPipe efficiency, balanced MLP, uncompressed", legend=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--devices", nargs="+", type=int)
    parser.add_argument("--chunks", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--batch", type=int, default=192)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--steps", type=int)
    args = parser.parse_args()
    steps = args.steps or (50 if args.full else 12)
    base = dict(model=args.model, batch=args.batch, steps=steps, warmup=max(2, steps // 4), full=args.full)
    single, rows = measure(base, args.devices or ([2, 3, 4] if args.full else [2, 3]), args.chunks)
    write_json("efficiency.json", {"single": single, "rows": rows})
    print(table(single, rows))
    print("plot:", plot(single, rows))


if __name__ == "__main__":
    main()
