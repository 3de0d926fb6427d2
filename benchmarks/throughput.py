"""Pipeline vs the alternatives: samples/s, same model, global batch and process count.

    python benchmarks/throughput.py            # quick: 2 models x 2 and 3 processes, ~10 min on 2 cores
    python benchmarks/throughput.py --full     # more steps, bigger transformer, 2-4 processes

Side by side in one run, for each model and process count: EPipeStrategy with every codec of
``benchmarks/codecs.py`` (chain placement: one stage per process, like the others), Lightning's
DDPStrategy (CPU, gloo; the global batch split over the ranks) and PyTorch's
``torch.distributed.pipelining`` (PipelineStage + ScheduleGPipe, gloo, uncompressed). Every
process runs one torch thread. Samples/s are measured on rank 0 after ``--warmup`` steps;
the table gives the ratio to DDP and to uncompressed EPipe. Writes
``benchmarks/results/throughput.{png,json}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.codecs import CODECS  # noqa: E402
from benchmarks.common import axes, finish, fmt, markdown_table, run, write_json  # noqa: E402


def methods() -> dict[str, dict]:
    """label -> worker config fragment."""
    out = {f"epipe {label}": {"kind": "epipe", "codec": codec} for label, codec in CODECS.items()}
    out["ddp"] = {"kind": "ddp"}
    out["torch pipelining (GPipe)"] = {"kind": "pipelining"}
    return out


def measure(models, devices, batch, chunks, steps, warmup, full) -> list[dict]:
    rows = []
    for model in models:
        for n in devices:
            for label, extra in methods().items():
                cfg = dict(model=model, devices=n, batch=batch, chunks=chunks, steps=steps, warmup=warmup,
                           full=full, **extra)
                result = run(cfg)
                print(f"  {model} x{n} {label}: {result.get('samples_per_s') or result.get('error')}", flush=True)
                rows.append({"model": model, "devices": n, "method": label, **result})
    return rows


def table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        same = [x for x in rows if x["model"] == r["model"] and x["devices"] == r["devices"]]
        ddp = next((x.get("samples_per_s") for x in same if x["method"] == "ddp"), None)
        none = next((x.get("samples_per_s") for x in same if x["method"] == "epipe none"), None)
        sps = r.get("samples_per_s")
        out.append([r["model"], r["devices"], r["method"],
                    fmt(sps, ".0f") if sps else f"failed: {r.get('error')}",
                    fmt(sps / ddp if sps and ddp else None, ".2f", "x"),
                    fmt(sps / none if sps and none else None, ".2f", "x"),
                    fmt(r.get("ratio"), ".3f"), fmt(r.get("bubble"), ".2f")])
    return markdown_table(["model", "procs", "method", "samples/s", "vs DDP", "vs EPipe none", "wire ratio", "bubble"], out)


def plot(rows: list[dict]) -> Path:
    groups = sorted({(r["model"], r["devices"]) for r in rows})
    labels = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = axes((11, 4.5))
    width = 0.8 / len(labels)
    for j, label in enumerate(labels):
        ys = []
        for model, n in groups:
            same = {r["method"]: r.get("samples_per_s") for r in rows if (r["model"], r["devices"]) == (model, n)}
            ys.append(same[label] / same["ddp"] if same.get(label) and same.get("ddp") else 0)
        ax.bar([i + j * width for i in range(len(groups))], ys, width, label=label)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], [f"{m}\n{n} processes" for m, n in groups])
    return finish(fig, ax, "throughput.png", "", "samples/s relative to DDP",
                  "Throughput vs DDP (same model, global batch, processes; 1 thread each)", legend=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="more steps, the bigger transformer, up to 4 processes")
    parser.add_argument("--models", nargs="+", default=["mlp", "transformer"])
    parser.add_argument("--devices", nargs="+", type=int)
    parser.add_argument("--batch", type=int, default=192, help="global batch (divisible by chunks and processes)")
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--warmup", type=int)
    args = parser.parse_args()
    devices = args.devices or ([2, 3, 4] if args.full else [2, 3])
    steps, warmup = args.steps or (50 if args.full else 12), args.warmup or (10 if args.full else 3)
    rows = measure(args.models, devices, args.batch, args.chunks, steps, warmup, args.full)
    write_json("throughput.json", rows)
    print(table(rows))
    print("plot:", plot(rows))


if __name__ == "__main__":
    main()
