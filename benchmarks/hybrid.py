"""Pipeline x data parallel against pure DDP and a pure pipeline on the same processes.

    python benchmarks/hybrid.py                 # quick: 4 processes, MLP and transformer
    python benchmarks/hybrid.py --full

Same global batch for every method, one torch thread per process: Lightning's DDP over all
processes; EPipe as one chain of all processes; EPipe with ``replicas=2`` (two chains of
half the processes, each on half the batch, gradients averaged per stage group); and
``replicas=processes/2`` when that differs. Uncompressed and with ``fp16`` cuts. On a
machine with fewer cores than processes the methods share cores: read the ratios, measured
side by side in one run, as relative costs (communication, bubble), not as scaling.
``--repeats`` repetitions (default 3) go round every method: median samples/s and ratio to
DDP with their spread, and the load average before and after.
Writes ``benchmarks/results/hybrid.{png,json}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    axes, finish, fmt, load_average, markdown_table, median_spread, rep_ratios, repeat_round, run, write_json,
)


def methods(devices: int) -> dict[str, dict]:
    out = {"ddp": {"kind": "ddp"}, f"pipeline x{devices}": {"kind": "epipe"}}
    for replicas in sorted({2, devices // 2}):
        if devices % replicas == 0 and devices // replicas >= 2:
            out[f"hybrid {replicas} x {devices // replicas}"] = {"kind": "epipe", "strategy": {"replicas": replicas}}
    for label in [k for k in out if k != "ddp"]:
        out[f"{label} fp16"] = {**out[label], "codec": {"compressor": "fp16"}}
    return out


def measure(base: dict, models: list[str], repeats: int = 3) -> list[dict]:
    """One row per model and method; ``repeats`` repetitions go round all of them."""
    configs = {(model, label): {**base, "model": model, **extra}
               for model in models for label, extra in methods(base["devices"]).items()}

    def launch(key: tuple[str, str], rep: int) -> dict:
        result = run(configs[key])
        print(f"  rep {rep + 1} {key[0]} {key[1]}: {result.get('samples_per_s') or result.get('error')}", flush=True)
        return result

    return [{"model": model, "method": label, "samples_per_s": runs["samples_per_s"], "errors": runs["errors"],
             "ratio": runs["last"].get("ratio"), "bubble": runs["last"].get("bubble")}
            for (model, label), runs in repeat_round(configs, repeats, launch).items()]


def _vs_ddp(rows: list[dict], r: dict) -> list[float]:
    ddp = next((x for x in rows if x["model"] == r["model"] and x["method"] == "ddp"), None)
    return rep_ratios(r["samples_per_s"], ddp["samples_per_s"]) if ddp else []


def table(rows: list[dict]) -> str:
    body = []
    for r in rows:
        sps, spread = median_spread(r["samples_per_s"], ".0f")
        vs, vs_spread = median_spread(_vs_ddp(rows, r), ".2f", "x")
        body.append([r["model"], r["method"], sps if sps != "-" else f"failed: {r['errors'][:1]}", spread, vs, vs_spread,
                     fmt(r.get("ratio"), ".3f"), fmt(r.get("bubble"), ".2f")])
    return markdown_table(["model", "method", "samples/s (median)", "spread", "vs DDP (median)", "vs DDP spread",
                           "wire ratio", "bubble"], body)


def plot(rows: list[dict]) -> Path:
    fig, ax = axes()
    models = sorted({r["model"] for r in rows})
    labels = list(dict.fromkeys(r["method"] for r in rows))
    width = 0.8 / max(1, len(models))
    for j, model in enumerate(models):
        values = []
        for m in labels:
            r = next((r for r in rows if r["model"] == model and r["method"] == m), None)
            ratios = _vs_ddp(rows, r) if r else []
            values.append(statistics.median(ratios) if ratios else 0)
        ax.bar([i + j * width for i in range(len(labels))], values, width, label=model)
    ax.set_xticks([i + width * (len(models) - 1) / 2 for i in range(len(labels))], labels, rotation=30, ha="right", fontsize=7)
    ax.axhline(1.0, color="k", lw=0.8)
    return finish(fig, ax, "hybrid.png", "method", "samples/s relative to DDP (median)", "Pipeline x data parallel vs DDP")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--batch", type=int, default=192)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=["mlp", "transformer"])
    parser.add_argument("--repeats", type=int, default=3, help="repetitions round every method (median, spread)")
    args = parser.parse_args()
    steps = 40 if args.full else 10
    base = dict(devices=args.devices, batch=args.batch, chunks=args.chunks, steps=steps, warmup=max(2, steps // 5),
                full=args.full, placement="chain", timeout=900)
    load_before = load_average()
    print(load_before, flush=True)
    rows = measure(base, args.models, args.repeats)
    text = table(rows)
    write_json("hybrid.json", {"load_before": load_before, "load_after": load_average(), "steps": steps,
                               "repeats": args.repeats, "rows": rows, "table": text})
    print(text)
    print(load_average())
    print("plot:", plot(rows))


if __name__ == "__main__":
    main()
