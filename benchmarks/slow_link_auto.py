"""``compressor="auto"`` against fixed codecs on token-bucket links, decided on its own traffic.

    python benchmarks/slow_link_auto.py                       # 5, 20, 100, 1000 Mbit/s and unlimited, 3 reps
    python benchmarks/slow_link_auto.py --rates 20 --repeats 1 --steps 8 --out smoke.json   # a smoke run

The setting of issue 13: client-server placement, 2 processes, the 8-block MLP of width 1024
(batch 256, chunks 8, one torch thread per process), GPipe. Methods: ``auto`` (defaults:
decided from the training's own traffic once a link has carried 2 MiB), ``none``,
``sortquant`` 8 bits and ``lloydmax`` 4 bits (``--methods``: any of ``METHODS``, every codec
among them). Each rate gets a network namespace whose
loopback is shaped by ``tc qdisc add dev lo root tbf rate R burst 1mbit latency 100ms``
("unlimited": a namespace without tc); every rank runs under ``ip netns exec``, and the
namespace is deleted afterwards whatever happens. The loopback carries both directions, so
the limit is on their sum. Repetitions go round the methods, so the methods of one
repetition run side by side. samples/s are timed after ``--warmup`` steps (auto's first
decisions come at steps 1, 2, 4, 8; a trial begun at step 8 ends at step 14: all inside the
default warm-up of 16 steps).

Reported per rate: the median samples/s of each method and its spread, auto's speed over the
best fixed codec's, and the codecs auto chose (with its reasons in the JSON); where ``none`` also
ran unlimited, how link-bound it is at each rate (``benchmarks/link_bound.py``). Run it on an
otherwise idle machine. Writes ``benchmarks/results/slow_link_auto.{json,png}`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    axes, finish, fmt, load_average, markdown_table, median_spread, netns_available, rep_ratios, run, slow_loopback,
    write_json,
)
from benchmarks.link_bound import median_per_step, with_link_bound  # noqa: E402

BATCH = 256
METHODS = {
    "auto": {"compressor": "auto"},
    "none": {"compressor": "none"},
    "sortquant-8": {"compressor": "sortquant", "bits": 8},
    "lloydmax-4": {"compressor": "lloydmax", "bits": 4},
    # the other codecs, for --methods (every codec against none on one link)
    "fp16": {"compressor": "fp16"},
    "bf16": {"compressor": "bf16"},
    "quantize-8": {"compressor": "quantize", "bits": 8},
    "quantize-4": {"compressor": "quantize", "bits": 4},
    "lloydmax-8": {"compressor": "lloydmax", "bits": 8},
    "topk-0.1": {"compressor": "topk", "compressor_kwargs": {"fraction": 0.1}},
    "topk-0.1-8": {"compressor": "topk", "bits": 8, "compressor_kwargs": {"fraction": 0.1}},
    "hadamard-4": {"compressor": "hadamard", "bits": 4},
    "powersgd-4": {"compressor": "powersgd", "compressor_kwargs": {"rank": 4}},
}
#: What a run without ``--methods`` compares: auto, none and the two codecs of issue 13.
DEFAULT_METHODS = ["auto", "none", "sortquant-8", "lloydmax-4"]
RATES: list[Optional[float]] = [5, 20, 100, 1000, None]  # Mbit/s; None: unlimited



def config(method: str, steps: int, warmup: int) -> dict:
    """One run of ``worker.py``: the issue's model and placement, ``method``'s codec."""
    return dict(kind="epipe", model="mlp", layers={"width": 1024}, devices=2, batch=BATCH, chunks=8, steps=steps,
                warmup=warmup, placement="client-server", timeout=1800, codec=METHODS[method])


def measure(rates: list[Optional[float]], methods: list[str], repeats: int, steps: int, warmup: int) -> list[dict]:
    """One row per (rate, method): samples/s of every repetition, wire bytes, auto's decisions."""
    rows = []
    for rate in rates:
        name = f"epipe-auto-{os.getpid()}-{rate or 'inf'}".replace(".", "_")
        with slow_loopback(name, rate) as ns:
            results: dict[str, list[dict]] = {m: [] for m in methods}
            for rep in range(repeats):
                for method in methods:
                    result = run(config(method, steps, warmup), netns=ns, timeout=1800)
                    results[method].append(result)
                    shown = result.get("samples_per_s") or result.get("error")
                    print(f"  {rate or 'unlimited'} Mbit/s {method} rep {rep + 1}: {shown} {result.get('auto', '')}",
                          flush=True)
            for method in methods:
                rows.append(row(rate, method, results[method]))
    return rows


def row(rate: Optional[float], method: str, results: list[dict]) -> dict:
    ok = [r for r in results if r.get("samples_per_s")]
    return dict(rate_mbit=rate, method=method, samples_per_s=[r["samples_per_s"] for r in ok],
                by_repetition=[r.get("samples_per_s") for r in results],
                **median_per_step(ok),
                ratio=statistics.median([r["ratio"] for r in ok]) if ok else None,
                auto=[r.get("auto") for r in ok] if method == "auto" else None,
                auto_decisions=ok[-1].get("auto_decisions") if method == "auto" and ok else None,
                errors=[r.get("error") for r in results if not r.get("samples_per_s")])


def paired_ratios(r: dict, none: Optional[dict]) -> list[float]:
    """r's samples/s over ``none``'s in each repetition both completed (they ran side by
    side: a drift of the machine moves both); empty without ``none`` or per-repetition data."""
    if none is None or "by_repetition" not in r or "by_repetition" not in none:
        return []
    return rep_ratios(r["by_repetition"], none["by_repetition"])


def table(rows: list[dict]) -> str:
    """Per rate and method: median samples/s, spread, the median of the per-repetition ratios to
    ``none`` and their spread, wire ratio, auto over the best fixed codec."""
    body = []
    for rate in dict.fromkeys(r["rate_mbit"] for r in rows):
        at = [r for r in rows if r["rate_mbit"] == rate]
        median = {r["method"]: statistics.median(r["samples_per_s"]) for r in at if r["samples_per_s"]}
        fixed = max((v for m, v in median.items() if m != "auto"), default=None)
        none = next((r for r in at if r["method"] == "none"), None)
        for r in at:
            sps = median.get(r["method"])
            spread = f"{min(r['samples_per_s']):.0f}-{max(r['samples_per_s']):.0f}" if r["samples_per_s"] else "-"
            paired = paired_ratios(r, none) if r is not none else []
            vs_none = "{} ({})".format(*median_spread(paired, ".3f", "x")) if paired else ""
            vs = fmt(sps / fixed, ".2f", "x") if r["method"] == "auto" and sps and fixed else ""
            chose = ", ".join(sorted({f"{k}: {v}" for a in (r["auto"] or []) if a for k, v in a.items()}))
            body.append([fmt(rate, "g") if rate else "unlimited", r["method"], fmt(sps, ".0f"), spread, vs_none,
                         fmt(r["ratio"], ".3f"), vs, chose[:120], "; ".join(map(str, r["errors"]))[:60]])
    return markdown_table(["link (Mbit/s)", "method", "samples/s (median)", "spread",
                           "/ none, same repetition (median, spread)", "wire/raw", "auto / best fixed",
                           "auto chose", "errors"], body)


def plot(rows: list[dict], name: str = "slow_link_auto.png") -> Path:
    """Median samples/s per method against the link's rate (the unlimited link drawn at 10 Gbit/s)."""
    fig, ax = axes()
    unlimited = 10_000.0
    for method in dict.fromkeys(r["method"] for r in rows):
        points = sorted((r["rate_mbit"] or unlimited, statistics.median(r["samples_per_s"]))
                        for r in rows if r["method"] == method and r["samples_per_s"])
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
    ax.set_xscale("log")
    ax.set_yscale("log")
    return finish(fig, ax, name, "link rate (Mbit/s; unlimited drawn at 10000)", "samples/s (median of repetitions)",
                  "compressor='auto' vs fixed codecs on token-bucket links")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", nargs="+", default=[str(r or "unlimited") for r in RATES],
                        help="Mbit/s, or 'unlimited'")
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=list(METHODS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=16, help="steps before timing starts")
    parser.add_argument("--out", default="slow_link_auto.json", help="file name under benchmarks/results (or a full path)")
    args = parser.parse_args()
    reason = netns_available()
    if reason:
        print(f"skipped: {reason}")
        return
    rates = [None if r == "unlimited" else float(r) for r in args.rates]
    before = load_average()
    print(before, flush=True)
    rows = measure(rates, args.methods, args.repeats, args.steps, args.warmup)
    text = with_link_bound(table(rows), rows, BATCH)
    print(text)
    path = write_json(args.out, {"load_before": before, "load_after": load_average(), "steps": args.steps, "warmup": args.warmup,
                                 "repeats": args.repeats, "rows": rows, "table": text})
    print(f"wrote {path}")
    print(f"plot: {plot(rows, Path(args.out).with_suffix('.png').name)}")


if __name__ == "__main__":
    main()
