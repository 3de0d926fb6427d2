"""Activation memory per stage: GPipe with and without recomputation, by micro-batch count.

    python benchmarks/memory.py            # quick: MLP, 2 processes, chunks 2, 4, 8
    python benchmarks/memory.py --full

EPipe (chain placement, one stage per process) on the balanced MLP, uncompressed. For every
rank: the peak bytes of the activations autograd keeps for backward during a step
(``SavedMemory`` in ``worker.py``: ``saved_tensors_hooks``, each storage counted once, the
weights that Linear layers also save and the batch itself left out) and the
process's peak RSS; with ``checkpoint="never"``, ``"except_last"`` and ``"always"``
(torchgpipe's recomputation policies), and ``schedule="1f1b"``. GPipe keeps every
micro-batch's activations until its backward, so the peak grows with the batch, not with
``chunks``; recomputation keeps only each stage's input per micro-batch (and, for
``except_last``, the last micro-batch whole); 1F1B keeps at most ``K - s`` micro-batches at
stage ``s``, so its peak falls as ``chunks`` grows. Throughput is measured in the same runs. Writes ``benchmarks/results/memory.{png,json}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import axes, finish, fmt, load_average, markdown_table, run, write_json  # noqa: E402

#: label -> EPipeStrategy arguments: GPipe with torchgpipe's recomputation policies, and 1F1B
POLICIES = {
    "never": {"checkpoint": "never"},
    "except_last": {"checkpoint": "except_last"},
    "always": {"checkpoint": "always"},
    "1f1b": {"schedule": "1f1b"},
}


def measure(base: dict, chunks: list[int]) -> list[dict]:
    rows = []
    for m in chunks:
        for policy, strategy in POLICIES.items():
            result = run({**base, "kind": "epipe", "chunks": m, "memory": True, "strategy": strategy})
            print(f"  chunks={m} {policy}: {result.get('memory') or result.get('error')}", flush=True)
            rows.append({"chunks": m, "checkpoint": policy, **result})
    return rows


def table(rows: list[dict]) -> str:
    body = []
    for r in rows:
        if "memory" not in r:
            body.append([r["chunks"], r["checkpoint"], f"failed: {r.get('error')}", "-", "-", "-"])
            continue
        never = next((x for x in rows if x["chunks"] == r["chunks"] and x["checkpoint"] == "never" and "memory" in x), None)
        for rank, mem in enumerate(r["memory"]):
            base = never["memory"][rank]["saved_peak_bytes"] if never else None
            body.append([r["chunks"], r["checkpoint"], rank, fmt(mem["saved_peak_bytes"] / 2**20, ".2f"),
                         fmt(mem["saved_peak_bytes"] / base if base else None, ".2f", "x"),
                         fmt(mem["max_rss_bytes"] / 2**20, ".0f"), fmt(r.get("samples_per_s"), ".0f")])
    return markdown_table(["chunks", "schedule / checkpoint", "rank", "saved for backward (MiB)", "vs never", "peak RSS (MiB)",
                           "samples/s"], body)


def rank_label(rank: int) -> str:
    """Chain placement: rank 0 runs the last stage and the loss, rank 1 the first stage."""
    role = {0: " (last stage + loss)", 1: " (first stage)"}.get(rank, "")
    return f"rank {rank}{role} MiB"


def bytes_table(rows: list[dict]) -> str:
    """Peak saved-for-backward MiB per rank, one row per configuration (the numbers that do not
    depend on the machine's load)."""
    ranks = max((len(r["memory"]) for r in rows if "memory" in r), default=0)
    body = []
    for r in rows:
        policy = r["checkpoint"] if r["checkpoint"] == "1f1b" else f"gpipe, {r['checkpoint']}"
        if "memory" not in r:
            body.append([r["chunks"], policy] + [f"failed: {r.get('error')}"] + ["-"] * (ranks - 1))
            continue
        body.append([r["chunks"], policy] + [fmt(m["saved_peak_bytes"] / 2**20, ".2f") for m in r["memory"]])
    return markdown_table(["chunks", "schedule / checkpoint"] + [rank_label(k) for k in range(ranks)], body)


def plot(rows: list[dict]) -> Path:
    fig, ax = axes()
    for policy, style in zip(POLICIES, ("o-", "s--", "^:", "D-.")):
        points = [(r["chunks"], max(m["saved_peak_bytes"] for m in r["memory"]) / 2**20)
                  for r in rows if r["checkpoint"] == policy and "memory" in r]
        label = "1F1B" if policy == "1f1b" else f"GPipe, checkpoint={policy}"
        ax.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
    ax.set_xscale("log", base=2)
    return finish(fig, ax, "memory.png", "micro-batches per batch (chunks)",
                  "peak saved-for-backward MiB (busiest rank)", "Activation memory per stage: GPipe, recomputation, 1F1B")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--chunks", nargs="+", type=int)
    args = parser.parse_args()
    steps = 12 if args.full else 6
    base = dict(model="mlp", devices=args.devices, batch=args.batch, steps=steps, warmup=2, full=args.full,
                placement="chain", timeout=600)
    load_before = load_average()
    rows = measure(base, args.chunks or [2, 4, 8])
    write_json("memory.json", {"load_before": load_before, "load_after": load_average(), "rows": rows,
                               "table": bytes_table(rows), "table_runs": table(rows)})
    print(table(rows))
    print(bytes_table(rows))
    print("plot:", plot(rows))


if __name__ == "__main__":
    main()
