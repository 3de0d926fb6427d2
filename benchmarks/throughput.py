"""Pipeline vs the alternatives: samples/s, same model, global batch and process count.

    python benchmarks/throughput.py            # quick: 2 models x 2 and 3 processes, ~10 min on 2 cores
    python benchmarks/throughput.py --full     # more steps, bigger transformer, 2-4 processes
    python benchmarks/throughput.py --models mobilenet --devices 2 --splits parameters time \
        --out throughput_mobilenet.json        # the report's MobileNetV2, both splits, ~15 min

Side by side in one run, for each model and process count: EPipeStrategy with every codec of
``benchmarks/codecs.py`` (chain placement: one stage per process, like the others), Lightning's
DDPStrategy (CPU, gloo; the global batch split over the ranks) and PyTorch's
``torch.distributed.pipelining`` (PipelineStage + ScheduleGPipe, gloo, uncompressed). Every
process runs one torch thread. Samples/s are measured on rank 0 after ``--warmup`` steps;
``--repeats`` repetitions go round every method; the table gives the median samples/s, the
medians of the per-repetition ratios to DDP (with their spread) and to uncompressed EPipe,
and the load average before and after. The pipelines' split (``--splits``): ``parameters``
(EPipe's default, and the same per-rank parameter balance for torch's stages) or ``time``
(each layer's forward+backward measured once in this process on one micro-batch, one torch
thread, then solved as EPipe's ``balance="time"`` does; both pipelines get the same list).
DDP runs once per model and process count. Writes the JSON and its plot under
``benchmarks/results/`` (``--out``: default ``throughput.json``, and ``throughput.png``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.codecs import CODECS  # noqa: E402
from benchmarks.common import axes, finish, fmt, load_average, markdown_table, rep_ratios, run, write_json  # noqa: E402
from benchmarks.models import build_layers, make_data  # noqa: E402
from lightning_epipe.strategy.planning.layer_costs import balance_by_time  # noqa: E402


def methods() -> dict[str, dict]:
    """label -> worker config fragment."""
    out = {f"epipe {label}": {"kind": "epipe", "codec": codec} for label, codec in CODECS.items()}
    out["ddp"] = {"kind": "ddp"}
    out["torch pipelining (GPipe)"] = {"kind": "pipelining"}
    return out


def time_balance(model: str, devices: int, batch: int, chunks: int, full: bool) -> list[int]:
    """Layers per stage from each layer's measured forward+backward time on one micro-batch
    (one torch thread), chain placement: EPipe's ``balance="time"``, measured once here so
    that both pipelines get the same split."""
    torch.set_num_threads(1)
    layers, shape, _ = build_layers(model, full)
    sample = make_data(shape, batch // chunks).tensors[0]
    return balance_by_time(layers, sample, devices, "chain")


def measure(models, devices, batch, chunks, steps, warmup, full, repeats, splits=("parameters",)) -> list[dict]:
    """One row per model, process count, split and method (DDP: one per model and process count);
    ``repeats`` repetitions go round them all."""
    balances = {(m, n, split): time_balance(m, n, batch, chunks, full) if split == "time" else None
                for m in models for n in devices for split in splits}
    rows = {(m, n, split, label): {"model": m, "devices": n, "split": split, "balance": balances[(m, n, split)],
                                   "method": label, "samples_per_s": [], "errors": []}
            for m in models for n in devices for split in splits for label in methods()
            if label != "ddp" or split == splits[0]}
    for rep in range(repeats):
        for (model, n, split, label), row in rows.items():
            cfg = dict(model=model, devices=n, batch=batch, chunks=chunks, steps=steps, warmup=warmup,
                       full=full, balance=row["balance"], **methods()[label])
            result = run(cfg)
            print(f"  rep {rep + 1} {model} x{n} {split} {label}: {result.get('samples_per_s') or result.get('error')}",
                  flush=True)
            if result.get("samples_per_s"):
                row["samples_per_s"].append(result["samples_per_s"])
                row.update(ratio=result.get("ratio"), bubble=result.get("bubble"))
            else:
                row["samples_per_s"].append(None)
                row["errors"].append(result.get("error"))
    return list(rows.values())


def _versus(row: dict, other: Optional[dict]) -> list[float]:
    """``row``'s samples/s over ``other``'s, repetition by repetition (where both ran)."""
    return rep_ratios(row["samples_per_s"], other["samples_per_s"]) if other else []


def _peers(rows: list[dict], r: dict) -> dict[str, dict]:
    """method -> the row of that method run beside ``r``: same model, process count and split
    (DDP: same model and process count)."""
    beside = [x for x in rows if (x["model"], x["devices"]) == (r["model"], r["devices"])]
    return {x["method"]: x for x in beside if x["method"] == "ddp" or x.get("split") == r.get("split")}


def table(rows: list[dict]) -> str:
    splits = len({r.get("split") for r in rows}) > 1
    out = []
    for r in rows:
        same = _peers(rows, r)
        done = [v for v in r["samples_per_s"] if v]
        vs_ddp, vs_none = _versus(r, same.get("ddp")), _versus(r, same.get("epipe none"))
        spread = f"{min(vs_ddp):.2f}-{max(vs_ddp):.2f}" if vs_ddp else "-"
        split = [f"{r['split']} {r['balance'] or ''}".strip() if r["method"] != "ddp" else "-"] if splits else []
        out.append([r["model"], r["devices"], *split, r["method"],
                    fmt(statistics.median(done), ".0f") if done else f"failed: {r['errors'][:1]}",
                    fmt(statistics.median(vs_ddp) if vs_ddp else None, ".2f", "x"), spread,
                    fmt(statistics.median(vs_none) if vs_none else None, ".2f", "x"),
                    fmt(r.get("ratio"), ".3f"), fmt(r.get("bubble"), ".2f")])
    return markdown_table(["model", "procs", *(["split"] if splits else []), "method", "samples/s (median)",
                           "vs DDP (median)", "vs DDP spread", "vs EPipe none", "wire ratio", "bubble"], out)


def plot(rows: list[dict], name: str = "throughput.png") -> Path:
    groups = list(dict.fromkeys((r["model"], r["devices"], r.get("split")) for r in rows if r["method"] != "ddp"))
    labels = list(dict.fromkeys(r["method"] for r in rows))
    fig, ax = axes((11, 4.5))
    width = 0.8 / len(labels)
    for j, label in enumerate(labels):
        ys = []
        for model, n, split in groups:
            same = _peers(rows, {"model": model, "devices": n, "split": split})
            ratios = _versus(same[label], same.get("ddp")) if label in same else []
            ys.append(statistics.median(ratios) if ratios else 0)
        ax.bar([i + j * width for i in range(len(groups))], ys, width, label=label)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))],
                  [f"{m}\n{n} processes" + (f"\n{s} split" if s else "") for m, n, s in groups])
    return finish(fig, ax, name, "", "samples/s relative to DDP",
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
    parser.add_argument("--repeats", type=int, default=3, help="repetitions round every method (median, spread)")
    parser.add_argument("--splits", nargs="+", default=["parameters"], choices=["parameters", "time"],
                        help="how the pipelines split the model (both pipelines get the same split)")
    parser.add_argument("--out", default="throughput.json", help="file name under benchmarks/results")
    args = parser.parse_args()
    load_before = load_average()
    print(load_before, flush=True)
    devices = args.devices or ([2, 3, 4] if args.full else [2, 3])
    steps, warmup = args.steps or (50 if args.full else 12), args.warmup or (10 if args.full else 3)
    rows = measure(args.models, devices, args.batch, args.chunks, steps, warmup, args.full, args.repeats, args.splits)
    text = table(rows)
    write_json(args.out, {"load_before": load_before, "load_after": load_average(), "batch": args.batch,
                          "chunks": args.chunks, "steps": steps, "warmup": warmup, "rows": rows, "table": text})
    print(text)
    print(load_average())
    print("plot:", plot(rows, Path(args.out).with_suffix(".png").name))


if __name__ == "__main__":
    main()
