"""``EPipeStrategy(bind_cores=True)`` against the same runs unbound, and torch pipelining both ways.

    python benchmarks/bind_cores.py                 # 3 repetitions
    python benchmarks/bind_cores.py --repeats 1

Runs, 2 processes on this machine (one per core on the 2-core guest):

- the main job's training: the digits MLP (``examples/digits``) client-server, chunks 4,
  batch 64, ``none`` and ``sortquant`` 8 bits, 3 epochs; throughput from ``EPipeMonitor``
  and the client's bubble;
- section 0's engine cells (``benchmarks/engine.py``: 8 x ``Linear(w, w) + ReLU``, batch 256,
  split ``[5, 3]``, chain placement, one torch thread per process): width 512 at chunks 1 and
  8, width 1024 at chunks 8, EPipe and torch's ``ScheduleGPipe``, each unbound and bound
  (torch's ranks bound by the same split of the cores, before its process group starts).

Every configuration runs once per repetition, the repetitions going round all of them, so
the ratios bound / unbound compare runs made side by side. The machine's load average is
printed with the table. Writes ``benchmarks/results/bind_cores.{json,png}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    axes, finish, load_average, markdown_table, median_spread, rep_ratios, repeat_round, run, write_json,
)
from benchmarks.engine import base  # noqa: E402

DIGITS_CODECS = {"none": {"compressor": "none"}, "sortquant-8": {"compressor": "sortquant", "bits": 8}}
ENGINE_CELLS = [dict(stages=2, width=512, chunks=1), dict(stages=2, width=512, chunks=8),
                dict(stages=2, width=1024, chunks=8)]


def configs(steps: int, epochs: int) -> dict[tuple[str, str, bool], dict]:
    """(run, engine, bound) -> the worker's config."""
    out = {}
    for name, codec in DIGITS_CODECS.items():
        for bound in (False, True):
            out[(f"digits {name}", "epipe", bound)] = dict(kind="digits", devices=2, chunks=4, epochs=epochs, codec=codec,
                                                           strategy={"bind_cores": bound}, timeout=300)
    for cell in ENGINE_CELLS:
        label = f"w{cell['width']} chunks {cell['chunks']}"
        for bound in (False, True):
            out[(label, "epipe", bound)] = {**base(cell, steps), "kind": "epipe", "strategy": {"bind_cores": bound}}
            out[(label, "torch", bound)] = {**base(cell, steps), "kind": "pipelining", "bind_cores": bound}
    return out


def _client_bubble(result: dict):
    """The client's bubble of a digits run (its monitor's per-rank table), else None."""
    bubble = result.get("bubble")
    return bubble.get("0") if isinstance(bubble, dict) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="steps of each engine run (the first 3 untimed)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each digits run")
    parser.add_argument("--out", default="bind_cores.json")
    args = parser.parse_args()
    before = load_average()
    print(before, flush=True)
    runs = configs(args.steps, args.epochs)

    def launch(key, rep):
        result = run(runs[key])
        print(rep, key, result.get("samples_per_s"), result.get("error") or "", flush=True)
        return result

    done = repeat_round(runs, args.repeats, launch)
    after = load_average()
    rows, table = [], []
    for (label, engine, bound), got in done.items():
        if bound:
            continue
        unbound_sps, bound_sps = got["samples_per_s"], done[(label, engine, True)]["samples_per_s"]
        ratio, spread = median_spread(rep_ratios(bound_sps, unbound_sps), ".2f", "x")
        bubble = [_client_bubble(done[(label, engine, b)]["last"]) for b in (False, True)]
        row = dict(run=label, engine=engine, unbound=unbound_sps, bound=bound_sps, ratio=ratio, spread=spread,
                   client_bubble_last=bubble, errors=got["errors"] + done[(label, engine, True)]["errors"])
        rows.append(row)
        table.append([label, engine, median_spread(unbound_sps, ".0f")[0], median_spread(bound_sps, ".0f")[0], ratio,
                      spread, "-" if bubble[0] is None else f"{bubble[0]:.2f} / {bubble[1]:.2f}",
                      "; ".join(e for e in row["errors"] if e)])
    header = ["run", "engine", "unbound samples/s", "bound samples/s", "bound / unbound (median)", "spread",
              "client bubble unbound / bound (last rep)", "errors"]
    print(f"\n{before} before, {after} after\n")
    text = markdown_table(header, table)
    print(text)
    write_json(args.out, {"load_average_before": before, "load_average_after": after, "repeats": args.repeats,
                          "steps": args.steps, "epochs": args.epochs, "rows": rows, "table": text})
    fig, ax = axes()
    labels = [f"{r['run']}\n{r['engine']}" for r in rows]
    ratios = [statistics.median(rep_ratios(r["bound"], r["unbound"]) or [0]) for r in rows]
    ax.bar(range(len(rows)), ratios, label="bound / unbound, median of the repetitions")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    finish(fig, ax, Path(args.out).stem, "", "bound / unbound samples/s (median)",
           "bind_cores=True against unbound, 2 processes on 2 cores")


if __name__ == "__main__":
    main()
