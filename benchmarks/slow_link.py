"""The pipeline over a rate-limited link: speed-up of every codec over ``none`` vs bandwidth.

    python benchmarks/slow_link.py             # quick: 50, 200, 1000 Mbit/s and unlimited, 2 processes
    python benchmarks/slow_link.py --full      # more steps, also 10 and 500 Mbit/s, and DDP
    python benchmarks/slow_link.py --model mobilenet --placement client-server --balance 1 18 1 \
        --batch 64 --rates 20 100 --methods sortquant-8 powersgd-4 bottleneck-0.1 \
        --out slow_link_mobilenet.json         # the report's set-up: a client holding the first
                                               # block and the head, a server the rest

Each rate gets its own network namespace (``ip netns add``) whose loopback is limited with
``tc qdisc add dev lo root tbf rate R burst 1mbit latency 100ms``; the whole launcher runs
under ``ip netns exec``, so every rank talks over that loopback (MASTER_ADDR=127.0.0.1).
"unlimited" is a namespace without tc, the same conditions otherwise. The namespaces are
deleted afterwards whatever happens; where ``ip netns``/``tc`` are not allowed the benchmark
is skipped with the reason. ``--repeats`` repetitions (default 3) go round the methods at
each rate; the table gives median samples/s and speed-up over ``none`` with their spread,
and the load average before and after, and how link-bound ``none`` is at each rate
(``benchmarks/link_bound.py``). Note the loopback carries both directions, so the limit is on
the sum of forward and backward traffic. Writes ``benchmarks/results/slow_link.{png,json}``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.codecs import CODECS, LEARNED, NAMED  # noqa: E402
from benchmarks.common import (  # noqa: E402
    axes, finish, fmt, load_average, markdown_table, median_spread, netns_available, rep_ratios, repeat_round, run,
    slow_loopback, write_json,
)
from benchmarks.link_bound import per_step, with_link_bound  # noqa: E402


def measure(rates: list[Optional[float]], base: dict, ddp: bool, methods: Optional[list[str]] = None,
            repeats: int = 3) -> list[dict]:
    """One row per (rate, method); at each rate ``repeats`` repetitions go round the methods."""
    rows = []
    for rate in rates:
        name = f"epipe-bench-{os.getpid()}-{rate or 'inf'}".replace(".", "_")
        with slow_loopback(name, rate) as ns:
            configs = {label: {"kind": "epipe", "codec": codec} for label, codec in CODECS.items()
                       if not methods or label in methods or label == "none"}
            configs.update({label: {"kind": "epipe", "codec": codec} for label, codec in {**NAMED, **LEARNED}.items()
                            if methods and label in methods})
            if ddp:
                configs["ddp"] = {"kind": "ddp"}

            def launch(label: str, rep: int) -> dict:
                result = run({**base, **configs[label]}, netns=ns)
                print(f"  rep {rep + 1} {rate or 'unlimited'} Mbit/s {label}: "
                      f"{result.get('samples_per_s') or result.get('error')}", flush=True)
                return result

            for label, runs in repeat_round(configs, repeats, launch).items():
                rows.append({"rate_mbit": rate, "method": label, "samples_per_s": runs["samples_per_s"],
                             "errors": runs["errors"], "ratio": runs["last"].get("ratio")} | per_step(runs["last"])
                            | ({"auto": runs["last"].get("auto"), "auto_decisions": runs["last"].get("auto_decisions")}
                               if label == "auto" else {}))
    return rows


def speedups(rows: list[dict]) -> dict[str, dict]:
    """method -> {rate: per-repetition samples/s relative to ``none`` at that rate}."""
    out: dict[str, dict] = {}
    for r in rows:
        none = next((x for x in rows if x["rate_mbit"] == r["rate_mbit"] and x["method"] == "none"), None)
        ratios = rep_ratios(r["samples_per_s"], none["samples_per_s"]) if none else []
        if ratios:
            out.setdefault(r["method"], {})[r["rate_mbit"]] = ratios
    return out


def median_speedups(rows: list[dict]) -> dict[str, dict]:
    """method -> {rate: median speed-up over ``none``}."""
    return {m: {rate: statistics.median(v) for rate, v in curve.items()} for m, curve in speedups(rows).items()}


def break_even(curve: dict) -> str:
    """Where the speed-up crosses 1, interpolated in log(bandwidth) between measured rates."""
    points = sorted((rate, s) for rate, s in curve.items() if rate is not None)
    if not points:
        return "-"
    if all(s >= 1 for _, s in points):
        return f"pays at every rate up to {points[-1][0]:g} Mbit/s"
    if all(s < 1 for _, s in points):
        return f"never pays (>= {points[0][0]:g} Mbit/s)"
    for (r0, s0), (r1, s1) in zip(points, points[1:]):
        if s0 >= 1 > s1:
            t = (s0 - 1) / (s0 - s1)
            return f"~{math.exp(math.log(r0) + t * (math.log(r1) - math.log(r0))):.0f} Mbit/s"
    return "mixed: " + ", ".join(f"{r:g}:{s:.2f}" for r, s in points)


def tables(rows: list[dict], batch: int) -> str:
    curves = speedups(rows)
    body = []
    for r in rows:
        sps, spread = median_spread(r["samples_per_s"], ".0f")
        vs, vs_spread = median_spread(curves.get(r["method"], {}).get(r["rate_mbit"], []), ".2f", "x")
        body.append([fmt(r["rate_mbit"], "g") if r["rate_mbit"] else "unlimited", r["method"],
                     sps if sps != "-" else f"failed: {r['errors'][:1]}", spread, vs, vs_spread, fmt(r.get("ratio"), ".3f")])
    first = markdown_table(["link (Mbit/s)", "method", "samples/s (median)", "spread", "vs none (median)",
                            "vs none spread", "wire ratio"], body)
    second = markdown_table(["method", "break-even (median speed-up over none falls below 1)"],
                            [[m, break_even(c)] for m, c in median_speedups(rows).items() if m != "none"])
    return with_link_bound(first + "\n\n" + second, rows, batch)


def plot(rows: list[dict], name: str = "slow_link.png") -> Path:
    curves = median_speedups(rows)
    fig, ax = axes()
    for method, curve in curves.items():
        points = sorted((r, s) for r, s in curve.items() if r is not None)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    return finish(fig, ax, name, "loopback rate limit (Mbit/s, tc tbf)",
                  "samples/s relative to uncompressed EPipe (median)", "Compressed cuts over a slow link")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--rates", nargs="+", type=float, help="Mbit/s (an unlimited namespace is always added)")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch", type=int, default=192)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--placement", default="chain", choices=["chain", "client-server"])
    parser.add_argument("--balance", nargs="+", type=int, help="layers per stage (default: by parameters)")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup", type=int, help="steps before timing starts (default: a fifth of --steps, >= 2; "
                                                   "auto's trials end at step 14 or later, see benchmarks/README.md)")
    parser.add_argument("--ddp", action="store_true", help="also DDP at every rate (slow: it all-reduces the weights)")
    parser.add_argument("--methods", nargs="+",
                        help=f"codecs to run (none always runs): {list(CODECS)}, or by name {list(NAMED)} and learned "
                             f"ones {list(LEARNED)}")
    parser.add_argument("--out", default="slow_link.json", help="file name under benchmarks/results")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions round the methods at each rate (median, spread)")
    args = parser.parse_args()
    reason = netns_available()
    if reason:
        print(f"SKIPPED: {reason}")
        return
    rates = args.rates or ([10, 50, 200, 500, 1000] if args.full else [50, 200, 1000])
    steps = args.steps or (40 if args.full else 10)
    warmup = args.warmup if args.warmup is not None else max(2, steps // 5)
    base = dict(model=args.model, devices=args.devices, batch=args.batch, chunks=args.chunks, steps=steps,
                warmup=warmup, full=args.full, timeout=600, placement=args.placement, balance=args.balance)
    load_before = load_average()
    print(load_before, flush=True)
    rows = measure(rates + [None], base, args.ddp or args.full, args.methods, args.repeats)
    text = tables(rows, args.batch)
    write_json(args.out, {"load_before": load_before, "load_after": load_average(), "steps": steps,
                          "repeats": args.repeats, "config": base, "rows": rows, "table": text})
    print(text)
    print(load_average())
    print("plot:", plot(rows, Path(args.out).with_suffix(".png").name))


if __name__ == "__main__":
    main()
