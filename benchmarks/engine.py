"""The engine against ``torch.distributed.pipelining`` on the same model, split and micro-batches.

    python benchmarks/engine.py                  # the grid below, 3 repetitions
    python benchmarks/engine.py --repeats 1 --widths 512 --chunks 8
    python benchmarks/engine.py --slow-link      # a shaped link: codecs against the bound

The model: 8 blocks of ``Linear(w, w) + ReLU`` (MSE on a random target), batch 256, one torch
thread per process, chain placement (rank i runs stage i; EPipe puts the last stage on rank
0, the same topology). Split ``[5, 3]`` for K = 2 (after block 5), ``[3, 3, 2]`` for K = 3.
Both read each batch as one slice of in-memory tensors (``models.loader``; no per-sample
collation), and neither logs; EPipe runs its monitor, as a user would.
Every cell runs EPipe, then torch's ``ScheduleGPipe`` (``Schedule1F1B`` for 1F1B) right after
it, and the repetitions go round the whole grid, so each ratio compares runs made side by
side. A run's throughput is its samples over the timed span (the rate of its median step
is kept in the JSON as ``*_median_step``). Reported: the median samples/s of each over the
repetitions, the median of the per-repetition ratios and their spread (min-max), and the efficiency: samples/s over K
times one process's (the whole model in one Lightning process), next to the ideal
``m / (m + K - 1)`` scaled by the split's balance (8 / (K x the largest stage)). And per
cell the step time EPipe takes beyond torch's (``BATCH`` over each median rate), next to
Lightning's own per-step cost on that width: one Lightning process on the whole model
against the same model in a plain loop (``plain``: no Trainer, gradients zeroed after the
forward as Lightning's closure does), both per repetition; the JSON also keeps the plain
loop in torch's idiom (``plain_zero_first``: ``zero_grad`` first, the order of the torch
pipelining loop), whose allocation pattern runs large widths slower in one process. And per
cell the ratio of the two median steps (per repetition, median over them: the throughput
ratio without the runs' stalls) beside how many stalls each side's runs had in all (steps
longer than ``worker.STALL`` times their run's median); a run of few short steps may miss a
stall that a longer one catches, so narrow widths want more ``--steps``.

``--slow-link``: ``none``, ``sortquant`` 8 bits and ``lloydmax`` 4 bits; client-server, 2
processes, width 1024, chunks 8, both ranks in a network
namespace whose loopback is shaped by ``tc tbf`` (20 and 100 Mbit/s, burst 1 Mbit); the
bound of a codec is ``min(its unlimited samples/s, link bytes/s / its wire bytes per sample)``
(the loopback carries both directions, so the bytes per sample are both directions').
The machine's load average is printed with each table. Writes
``benchmarks/results/engine.{json,png}`` (``--out NAME``: ``NAME`` and the plot beside it)
and, with ``--slow-link``, ``engine_slow_link.json``.
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
    axes, finish, fmt, load_average, markdown_table, netns_available, run, slow_loopback, write_json,
)
from lightning_epipe.strategy.engine.schedule import ideal_efficiency  # noqa: E402

SPLITS = {2: [5, 3], 3: [3, 3, 2]}
#: the grid's throughput: samples over the timed span (the median step's rate is kept as ``*_median_step``:
#: a pipelined loop's steps need not take equal times, so the median step is no throughput)
RATE = "samples_per_s"
BATCH = 256
SLOW_CODECS = {"none": {"compressor": "none"}, "sortquant-8": {"compressor": "sortquant", "bits": 8},
               "lloydmax-4": {"compressor": "lloydmax", "bits": 4}}



def cells(widths: list[int], chunks: list[int], stages: list[int], one_f_one_b: list[int],
          no_checksum: list[int], widths3: list[int]) -> list[dict]:
    """The grid: GPipe everywhere (K = 3 at ``widths3`` only), 1F1B at the chunk counts in
    ``one_f_one_b``, and GPipe without checksums at the widths in ``no_checksum`` (K = 2, the
    most chunks)."""
    out = []
    for k in stages:
        for w in (widths if k == 2 else widths3):
            for m in chunks:
                out.append(dict(stages=k, width=w, chunks=m, schedule="gpipe", checksum=True))
                if m in one_f_one_b:
                    out.append(dict(stages=k, width=w, chunks=m, schedule="1f1b", checksum=True))
                if k == 2 and m == max(chunks) and w in no_checksum:
                    out.append(dict(stages=k, width=w, chunks=m, schedule="gpipe", checksum=False))
    return out


def base(cell: dict, steps: int) -> dict:
    return dict(model="mlp", layers={"width": cell["width"]}, devices=cell["stages"], batch=BATCH, chunks=cell["chunks"],
                steps=steps, warmup=2, balance=SPLITS[cell["stages"]], timeout=600)


def measure(grid: list[dict], repeats: int, steps: int) -> list[dict]:
    rows = [dict(cell, epipe=[], torch=[], epipe_median_step=[], torch_median_step=[], epipe_stalls_ms=[],
                 torch_stalls_ms=[], errors=[]) for cell in grid]
    singles: dict[tuple[str, int], list[float]] = {}  # (kind, width) -> samples/s per repetition
    for rep in range(repeats):
        for width in sorted({c["width"] for c in grid}):
            for label, kind, extra in (("single", "single", {}), ("plain", "plain", {}),
                                       ("plain_zero_first", "plain", {"zero_grad": "first"})):
                one = run({**base(dict(stages=2, width=width, chunks=1), steps), "kind": kind, "devices": 1, **extra})
                if one.get(RATE):
                    singles.setdefault((label, width), []).append(one[RATE])
        for row in rows:
            cfg = base(row, steps)
            mine = run({**cfg, "kind": "epipe", "strategy": {"schedule": row["schedule"], "verify_checksum": row["checksum"]}})
            peer = run({**cfg, "kind": "pipelining", "schedule": row["schedule"]})
            for name, result in (("epipe", mine), ("torch", peer)):
                if result.get(RATE):
                    row[name].append(result[RATE])
                    row[f"{name}_median_step"].append(result["median_step_samples_per_s"])
                    row[f"{name}_stalls_ms"].append(result["stalls_ms"])
                else:
                    row["errors"].append(f"{name}: {result.get('error')}")
            print(f"  rep {rep + 1} K={row['stages']} w={row['width']} m={row['chunks']} {row['schedule']}:"
                  f" epipe {mine.get(RATE) or mine.get('error')}, torch {peer.get(RATE) or peer.get('error')}",
                  flush=True)
    for row in rows:
        row["single"] = singles.get(("single", row["width"]), [])
        row["plain"] = singles.get(("plain", row["width"]), [])
        row["plain_zero_first"] = singles.get(("plain_zero_first", row["width"]), [])
    return rows


def summary(row: dict) -> dict:
    """The cell's medians over its repetitions. ``step_ratio``: the median per-repetition ratio of
    the two median steps' rates, what the throughput ratio is without the runs' stalls
    (``worker.STALL``), counted over every repetition in ``stalls``."""
    ratios = [a / b for a, b in zip(row["epipe"], row["torch"])]
    step_ratios = [a / b for a, b in zip(row.get("epipe_median_step", []), row.get("torch_median_step", []))]
    single = statistics.median(row["single"]) if row["single"] else None
    k, m = row["stages"], row["chunks"]
    balance = 8 / (k * max(SPLITS[k]))

    def eff(values: list[float]) -> Optional[float]:
        return statistics.median(values) / (k * single) if values and single else None

    def step_ms(values: list[float]) -> Optional[float]:
        return 1000 * BATCH / statistics.median(values) if values else None

    def beyond(a: list[float], b: list[float]) -> Optional[float]:
        """Step time of ``a`` minus that of ``b`` (ms)."""
        return step_ms(a) - step_ms(b) if a and b else None

    return dict(
        epipe=statistics.median(row["epipe"]) if row["epipe"] else None,
        torch=statistics.median(row["torch"]) if row["torch"] else None,
        ratio=statistics.median(ratios) if ratios else None,
        spread=(min(ratios), max(ratios)) if ratios else None,
        eff_epipe=eff(row["epipe"]), eff_torch=eff(row["torch"]), ideal=ideal_efficiency(m, k) * balance,
        beyond_torch_ms=beyond(row["epipe"], row["torch"]), lightning_ms=beyond(row["single"], row.get("plain", [])),
        step_ratio=statistics.median(step_ratios) if step_ratios else None,
        stalls={name: sum(len(run) for run in row[f"{name}_stalls_ms"]) for name in ("epipe", "torch")
                if row.get(f"{name}_stalls_ms")},
    )


def table(rows: list[dict]) -> str:
    body = []
    for row in rows:
        s = summary(row)
        spread = "-" if s["spread"] is None else f"{s['spread'][0]:.2f}-{s['spread'][1]:.2f}"
        schedule = row["schedule"] + ("" if row["checksum"] else ", no CRC")
        body.append([row["stages"], row["width"], row["chunks"], schedule, fmt(s["epipe"], ".0f"),
                     fmt(s["torch"], ".0f"), fmt(s["ratio"], ".2f", "x"), spread, fmt(s["eff_epipe"], ".2f"),
                     fmt(s["eff_torch"], ".2f"), fmt(s["ideal"], ".2f"), fmt(s["beyond_torch_ms"], ".2f"),
                     fmt(s["lightning_ms"], ".2f"), fmt(s["step_ratio"], ".2f", "x"), stall_counts(s["stalls"]),
                     "; ".join(row["errors"])[:80]])
    return markdown_table(["K", "width", "chunks", "schedule", "EPipe samples/s", "torch samples/s", "ratio (median)",
                           "ratio spread", "efficiency EPipe", "efficiency torch", "ideal x balance",
                           "EPipe - torch ms/step", "Lightning ms/step", "median steps' ratio", "stalls EPipe / torch",
                           "errors"], body)


def stall_counts(stalls: dict) -> str:
    """``"EPipe / torch"`` stalls over a cell's repetitions; ``-`` where the runs did not count them."""
    return f"{stalls['epipe']} / {stalls['torch']}" if {"epipe", "torch"} <= set(stalls) else "-"


def plot(rows: list[dict], name: str = "engine.png") -> Path:
    """The ratio per width, a line per (K, schedule, chunks), saved as ``results/name``."""
    fig, ax = axes()
    for (k, schedule) in sorted({(r["stages"], r["schedule"]) for r in rows}):
        for m in sorted({r["chunks"] for r in rows}):
            sel = [r for r in rows if r["stages"] == k and r["schedule"] == schedule and r["chunks"] == m and r["checksum"]]
            points = [(r["width"], summary(r)["ratio"]) for r in sel if summary(r)["ratio"]]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"K={k} {schedule} m={m}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    return finish(fig, ax, name, "width", "EPipe samples/s / torch.distributed.pipelining",
                  "EPipe (compressor='none') vs torch pipelining, same model and split")


def slow_link(rates: list[float], repeats: int, steps: int) -> list[dict]:
    cfg = dict(model="mlp", layers={"width": 1024}, devices=2, batch=BATCH, chunks=8, steps=steps, warmup=2,
               placement="client-server", timeout=900, kind="epipe")
    rows = []
    for rate in [None, *rates]:
        name = f"epipe-engine-{os.getpid()}-{rate or 'inf'}"
        with slow_loopback(name, rate) as ns:
            for label, codec in SLOW_CODECS.items():
                results = [run({**cfg, "codec": codec}, netns=ns) for _ in range(repeats)]
                ok = [r for r in results if r.get("samples_per_s")]
                row = dict(rate_mbit=rate, codec=label, samples_per_s=[r["samples_per_s"] for r in ok],
                           bytes_per_sample=statistics.median([r["bytes"] / (r["steps"] * BATCH) for r in ok]) if ok else None,
                           errors=[r.get("error") for r in results if not r.get("samples_per_s")])
                print(f"  {rate or 'unlimited'} Mbit/s {label}: {row['samples_per_s'] or row['errors']}", flush=True)
                rows.append(row)
    return rows


def slow_table(rows: list[dict]) -> str:
    unlimited = {r["codec"]: statistics.median(r["samples_per_s"]) for r in rows if r["rate_mbit"] is None and r["samples_per_s"]}
    body = []
    for r in rows:
        sps = statistics.median(r["samples_per_s"]) if r["samples_per_s"] else None
        bound = None
        if r["rate_mbit"] and r["bytes_per_sample"] and r["codec"] in unlimited:
            bound = min(unlimited[r["codec"]], r["rate_mbit"] * 1e6 / 8 / r["bytes_per_sample"])
        spread = f"{min(r['samples_per_s']):.0f}-{max(r['samples_per_s']):.0f}" if r["samples_per_s"] else "-"
        body.append([fmt(r["rate_mbit"], "g") if r["rate_mbit"] else "unlimited", r["codec"], fmt(sps, ".0f"), spread,
                     fmt(r["bytes_per_sample"], ".0f"), fmt(bound, ".0f"), fmt(sps / bound if sps and bound else None, ".2f"),
                     "; ".join(map(str, r["errors"]))[:60]])
    return markdown_table(["link (Mbit/s)", "codec", "samples/s (median)", "spread", "wire bytes/sample", "bound",
                           "of bound", "errors"], body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", nargs="+", type=int, default=[128, 512, 1024, 2048])
    parser.add_argument("--chunks", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument("--stages", nargs="+", type=int, default=[2, 3])
    parser.add_argument("--widths3", nargs="+", type=int, default=[1024], help="widths run with K = 3")
    parser.add_argument("--one-f-one-b", nargs="*", type=int, default=[8], help="chunk counts also run as 1F1B")
    parser.add_argument("--no-checksum", nargs="*", type=int, default=[128, 1024],
                        help="widths also run with verify_checksum=False (K=2, the most chunks)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--slow-link", action="store_true", help="the shaped-link table instead of the grid")
    parser.add_argument("--rates", nargs="+", type=float, default=[20, 100])
    parser.add_argument("--out", default=None, help="file name under benchmarks/results (the plot: the same name, .png)")
    args = parser.parse_args()
    load_before = load_average()
    print(load_before, flush=True)
    if args.slow_link:
        reason = netns_available()
        if reason:
            print(f"SKIPPED: {reason}")
            return
        rows = slow_link(args.rates, args.repeats, args.steps)
        text = slow_table(rows)
        write_json(args.out or "engine_slow_link.json", {"load_before": load_before, "load_after": load_average(),
                                                                "rows": rows, "table": text})
    else:
        grid = cells(args.widths, args.chunks, args.stages, args.one_f_one_b, args.no_checksum, args.widths3)
        rows = measure(grid, args.repeats, args.steps)
        text = table(rows)
        out = args.out or "engine.json"
        write_json(out, {"load_before": load_before, "load_after": load_average(), "rows": rows,
                         "summary": [summary(r) for r in rows], "table": text})
        print("plot:", plot(rows, str(Path(out).with_suffix(".png"))))  # beside the JSON
    print(text)
    print(load_average())


if __name__ == "__main__":
    main()
