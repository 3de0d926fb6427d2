"""Pipeline x data parallel against pure DDP and a pure pipeline on the same processes.

    python benchmarks/hybrid.py                 # quick: 4 processes, MLP and transformer
    python benchmarks/hybrid.py --full

Same global batch for every method, one torch thread per process: Lightning's DDP over all
processes; EPipe as one chain of all processes; EPipe with ``replicas=2`` (two chains of
half the processes, each on half the batch, gradients averaged per stage group); and
``replicas=processes/2`` when that differs. Uncompressed and with ``fp16`` cuts. On a
machine with fewer cores than processes the methods share cores: read the ratios, measured
side by side in one run, as relative costs (communication, bubble), not as scaling.
Writes ``benchmarks/results/hybrid.{png,json}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import axes, finish, fmt, markdown_table, run, write_json  # noqa: E402


def methods(devices: int) -> dict[str, dict]:
    out = {"ddp": {"kind": "ddp"}, f"pipeline x{devices}": {"kind": "epipe"}}
    for replicas in sorted({2, devices // 2}):
        if devices % replicas == 0 and devices // replicas >= 2:
            out[f"hybrid {replicas} x {devices // replicas}"] = {"kind": "epipe", "strategy": {"replicas": replicas}}
    for label in [k for k in out if k != "ddp"]:
        out[f"{label} fp16"] = {**out[label], "codec": {"compressor": "fp16"}}
    return out


def measure(base: dict, models: list[str]) -> list[dict]:
    rows = []
    for model in models:
        for label, extra in methods(base["devices"]).items():
            result = run({**base, "model": model, **extra})
            print(f"  {model} {label}: {result.get('samples_per_s') or result.get('error')}", flush=True)
            rows.append({"model": model, "method": label, **result})
    return rows


def table(rows: list[dict]) -> str:
    body = []
    for r in rows:
        ddp = next((x.get("samples_per_s") for x in rows if x["model"] == r["model"] and x["method"] == "ddp"), None)
        sps = r.get("samples_per_s")
        body.append([r["model"], r["method"], fmt(sps, ".0f") if sps else f"failed: {r.get('error')}",
                     fmt(sps / ddp if sps and ddp else None, ".2f", "x"), fmt(r.get("ratio"), ".3f"),
                     fmt(r.get("bubble"), ".2f")])
    return markdown_table(["model", "method", "samples/s", "vs DDP", "wire ratio", "bubble"], body)


def plot(rows: list[dict]) -> Path:
    fig, ax = axes()
    models = sorted({r["model"] for r in rows})
    labels = list(dict.fromkeys(r["method"] for r in rows))
    width = 0.8 / max(1, len(models))
    for j, model in enumerate(models):
        ddp = next((r.get("samples_per_s") for r in rows if r["model"] == model and r["method"] == "ddp"), None) or 1
        values = [next((r.get("samples_per_s") or 0 for r in rows if r["model"] == model and r["method"] == m), 0) / ddp
                  for m in labels]
        ax.bar([i + j * width for i in range(len(labels))], values, width, label=model)
    ax.set_xticks([i + width * (len(models) - 1) / 2 for i in range(len(labels))], labels, rotation=30, ha="right", fontsize=7)
    ax.axhline(1.0, color="k", lw=0.8)
    return finish(fig, ax, "hybrid.png", "method", "samples/s relative to DDP", "Pipeline x data parallel vs DDP")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--batch", type=int, default=192)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--models", nargs="+", default=["mlp", "transformer"])
    args = parser.parse_args()
    steps = 40 if args.full else 10
    base = dict(devices=args.devices, batch=args.batch, chunks=args.chunks, steps=steps, warmup=max(2, steps // 5),
                full=args.full, placement="chain", timeout=900)
    rows = measure(base, args.models)
    write_json("hybrid.json", rows)
    print(table(rows))
    print("plot:", plot(rows))


if __name__ == "__main__":
    main()
