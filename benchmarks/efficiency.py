"""Pipeline efficiency: measured throughput vs the ideal m/(m+K-1) of a balanced GPipe.

    python benchmarks/efficiency.py            # quick: chunks 1, 2, 4, 8 over 2 and 3 processes
    python benchmarks/efficiency.py --full

The balanced MLP, uncompressed, chain placement (K = processes = stages). Efficiency measured
= samples/s of the pipeline / (K x samples/s of the whole model in one process on the whole
batch), both with one torch thread per process: 1.0 would be a perfect K-fold speed-up.
The ideal is ``lightning_epipe.strategy.engine.schedule.ideal_efficiency(m, K)``. "busy" is the
monitor's own 1 - bubble (compute time over wall time, averaged over ranks). The same
schedule in ``torch.distributed.pipelining`` is measured next to it; ``--repeats`` rounds
(default 3) go round every configuration, the single process included, and efficiency is
taken per round (median and spread). With more processes
than cores (3 on this 2-core machine) the measured efficiency cannot exceed cores/K.
Writes ``benchmarks/results/efficiency.{png,json}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    axes, finish, fmt, load_average, markdown_table, median_spread, rep_ratios, repeat_round, run, write_json,
)
from lightning_epipe.strategy.engine.schedule import ideal_efficiency  # noqa: E402

RUNTIMES = ("epipe", "pipelining")


def measure(base: dict, devices: list[int], chunks: list[int], repeats: int) -> dict:
    """Per config key ``(kind, K, m)`` (the single process as ``("single", 1, 1)``) its
    samples/s per repetition; every repetition goes round all configs."""
    configs = {("single", 1, 1): {**base, "kind": "single", "devices": 1, "chunks": 1}}
    configs.update({(kind, n, m): {**base, "kind": kind, "devices": n, "chunks": m}
                    for n in devices for m in chunks for kind in RUNTIMES})

    def launch(key, rep):
        result = run(configs[key])
        print(f"  rep {rep + 1} {key}: {result.get('samples_per_s') or result.get('error')}", flush=True)
        return result

    return repeat_round(configs, repeats, launch)


def efficiencies(runs: dict, key: tuple) -> list[float]:
    """samples/s / (K x the single process's samples/s), per repetition."""
    return [r / key[1] for r in rep_ratios(runs[key]["samples_per_s"], runs[("single", 1, 1)]["samples_per_s"])]


def rows_of(runs: dict) -> list[dict]:
    rows = []
    for key, r in runs.items():
        if key[0] == "single":
            continue
        bubble = r["last"].get("bubble")
        rows.append({"kind": key[0], "stages": key[1], "chunks": key[2], "samples_per_s": r["samples_per_s"],
                     "efficiency": efficiencies(runs, key), "busy": None if bubble is None else 1 - bubble,
                     "errors": r["errors"]})
    return rows


def table(single: list, rows: list[dict]) -> str:
    body = []
    for r in rows:
        sps, sps_spread = median_spread(r["samples_per_s"], ".0f")
        eff, eff_spread = median_spread(r["efficiency"])
        body.append([r["kind"], r["stages"], r["chunks"], sps, sps_spread, eff, eff_spread,
                     fmt(ideal_efficiency(r["chunks"], r["stages"]), ".2f"), fmt(r["busy"], ".2f"),
                     fmt(min(1.0, (os.cpu_count() or 1) / r["stages"]), ".2f"), "; ".join(map(str, r["errors"]))])
    single_median, single_spread = median_spread(single, ".0f")
    head = f"single process (whole batch, 1 thread): {single_median} samples/s (spread {single_spread})\n\n"
    return head + markdown_table(["runtime", "K", "chunks m", "samples/s (median)", "spread", "efficiency (median)",
                                  "efficiency spread", "ideal m/(m+K-1)", "busy (monitor, last run)", "core cap",
                                  "errors"], body)


def plot(rows: list[dict]) -> Path:
    fig, ax = axes()
    for k in sorted({r["stages"] for r in rows}):
        ms = sorted({r["chunks"] for r in rows if r["stages"] == k})
        line, = ax.plot(ms, [ideal_efficiency(m, k) for m in ms], ls="--", label=f"ideal K={k}")
        for kind, marker in (("epipe", "o"), ("pipelining", "s")):
            pts = [(r["chunks"], statistics.median(r["efficiency"])) for r in rows
                   if r["stages"] == k and r["kind"] == kind and r["efficiency"]]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=line.get_color(),
                    ls="-" if kind == "epipe" else ":", label=f"{'EPipe' if kind == 'epipe' else 'torch pipelining'} K={k}")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1.05)
    return finish(fig, ax, "efficiency.png", "micro-batches m (chunks)", "throughput / (K x single process), median",
                  "GPipe efficiency, balanced MLP, uncompressed", legend=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--devices", nargs="+", type=int)
    parser.add_argument("--chunks", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--batch", type=int, default=192)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--repeats", type=int, default=3, help="repetitions round every config (median, spread)")
    args = parser.parse_args()
    steps = args.steps or (50 if args.full else 12)
    base = dict(model=args.model, batch=args.batch, steps=steps, warmup=max(2, steps // 4), full=args.full)
    load_before = load_average()
    print(load_before, flush=True)
    runs = measure(base, args.devices or ([2, 3, 4] if args.full else [2, 3]), args.chunks, args.repeats)
    single, rows = runs[("single", 1, 1)]["samples_per_s"], rows_of(runs)
    text = table(single, rows)
    write_json("efficiency.json", {"load_before": load_before, "load_after": load_average(), "steps": steps,
                                   "repeats": args.repeats, "single": single, "rows": rows, "table": text})
    print(text)
    print(load_average())
    print("plot:", plot(rows))


if __name__ == "__main__":
    main()
