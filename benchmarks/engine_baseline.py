"""What an engine change buys: EPipe against itself at another revision, torch beside both.

    python benchmarks/engine_baseline.py --baseline 7a93515
    python benchmarks/engine_baseline.py --baseline HEAD~1 --cells 2:512:1 --steps 150 --repeats 7
    python benchmarks/engine_baseline.py --baseline HEAD --baseline-strategy '{"start_ahead": false}'

Default: 100 steps a run, 5 repetitions, the cells ``2:128:1 2:512:1 2:128:8 3:1024:1``.

Cells are section 0's (``engine.py``: 8 x (Linear(w, w) + ReLU), MSE, batch 256, split [5, 3]
or [3, 3, 2], chain placement, one torch thread per process), written ``K:width:chunks`` or
``K:width:chunks:1f1b``. Every repetition runs, per cell, EPipe (``compressor="none"``) from
revision ``REV`` (its package and its benchmark worker, ``git archive``), EPipe from this tree
and torch's ``ScheduleGPipe`` (``Schedule1F1B``), one after the other, the two EPipes' order
swapped every repetition; the repetitions go round all the cells. A run's throughput is its
samples over the timed span (from the end of step 3), as in ``engine.py``. Reported per cell:
each one's median samples/s over the repetitions, the median ratio this tree / ``REV`` of the
repetitions, its spread (min-max) and in how many repetitions this tree ran faster, and each
EPipe against torch (median ratio). Ratios of runs made side by side are what a change is
judged by here: samples/s of one configuration move between runs by more than most engine
changes move them. ``--baseline-strategy JSON``: strategy arguments of the baseline's runs
(a setting against its default, ``REV`` then usually ``HEAD``). The machine's load average is
printed with the table. Writes
``benchmarks/results/engine_baseline.{json,png}`` (``--out NAME``: ``NAME`` and the plot beside it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    ROOT, axes, commit_of, exported_revision, finish, fmt, load_average, markdown_table, median_of, rep_ratios, run,
    this_tree, write_json,
)
from benchmarks.engine import RATE, base  # noqa: E402

ENGINES = ("baseline", "current", "torch")
DEFAULT_CELLS = ("2:128:1", "2:512:1", "2:128:8", "3:1024:1")


def parse_cell(text: str) -> dict:
    """``"2:512:8"`` -> ``{"stages": 2, "width": 512, "chunks": 8, "schedule": "gpipe"}``
    (``"2:512:8:1f1b"``: 1F1B). Raises ValueError naming the expected form."""
    parts = text.split(":")
    schedule = parts.pop() if len(parts) == 4 else "gpipe"
    try:
        stages, width, chunks = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"cell {text!r}: expected K:width:chunks or K:width:chunks:1f1b, e.g. 2:512:8") from None
    if stages not in (2, 3) or schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"cell {text!r}: in K:width:chunks[:1f1b], K is 2 or 3 (section 0's splits)")
    return dict(stages=stages, width=width, chunks=chunks, schedule=schedule)


def order(rep: int) -> tuple[str, ...]:
    """The engines of repetition ``rep`` in the order they run: the two EPipes swap every
    repetition (a run after another may find the caches and the clock as it left them), torch last."""
    return ("baseline", "current", "torch") if rep % 2 == 0 else ("current", "baseline", "torch")


def config(cell: dict, engine: str, steps: int, baseline_strategy: Optional[dict] = None) -> dict:
    """The worker config of ``engine`` (an EPipe, either revision, or torch) on ``cell``;
    ``baseline_strategy``: the baseline EPipe's further strategy arguments."""
    cfg = base(cell, steps)
    if engine == "torch":
        return {**cfg, "kind": "pipelining", "schedule": cell["schedule"]}
    extra = (baseline_strategy or {}) if engine == "baseline" else {}
    return {**cfg, "kind": "epipe", "strategy": {"schedule": cell["schedule"], **extra}}


def label(rev: str, baseline_strategy: dict) -> str:
    """The baseline's name in the table: ``REV``, and its strategy arguments where given.

        >>> label("HEAD", {"start_ahead": False}), label("7a93515", {})
        ('HEAD start_ahead=False', '7a93515')
    """
    return " ".join([rev, *(f"{k}={v}" for k, v in baseline_strategy.items())])


def measure(cells: list[dict], rev_root: Path, repeats: int, steps: int,
            baseline_strategy: Optional[dict] = None) -> list[dict]:
    """Run every cell ``repeats`` times, each engine once per repetition (:func:`order`);
    samples/s per engine and repetition (None where a run failed) and the errors."""
    rows = [dict(cell, **{engine: [] for engine in ENGINES}, errors=[]) for cell in cells]
    for rep in range(repeats):
        for row in rows:
            for engine in order(rep):
                result = run(config(row, engine, steps, baseline_strategy), root=rev_root if engine == "baseline" else ROOT)
                row[engine].append(result.get(RATE) or None)
                if not result.get(RATE):
                    row["errors"].append(f"{engine}: {result.get('error')}")
            print(f"  rep {rep + 1} K={row['stages']} w={row['width']} m={row['chunks']} {row['schedule']}: "
                  + ", ".join(f"{e} {row[e][-1] or '-'}" for e in ENGINES), flush=True)
    return rows


def summary(row: dict) -> dict:
    """Medians, this tree / the baseline per repetition (median, spread, faster in how many),
    each EPipe / torch (median)."""
    ratios = rep_ratios(row["current"], row["baseline"])
    vs_torch = {e: median_of(rep_ratios(row[e], row["torch"])) for e in ("current", "baseline")}
    return dict(baseline=median_of(row["baseline"]), current=median_of(row["current"]), torch=median_of(row["torch"]),
                ratio=median_of(ratios),
                spread=(min(ratios), max(ratios)) if ratios else None,
                faster=sum(r > 1 for r in ratios), pairs=len(ratios),
                current_vs_torch=vs_torch["current"], baseline_vs_torch=vs_torch["baseline"])


def table(rows: list[dict], rev: str) -> str:
    body = []
    for row in rows:
        s = summary(row)
        spread = "-" if s["spread"] is None else f"{s['spread'][0]:.2f}-{s['spread'][1]:.2f}"
        body.append([row["stages"], row["width"], row["chunks"], row["schedule"], fmt(s["baseline"], ".0f"),
                     fmt(s["current"], ".0f"), fmt(s["torch"], ".0f"), fmt(s["ratio"], ".3f", "x"), spread,
                     f"{s['faster']} of {s['pairs']}", fmt(s["baseline_vs_torch"], ".2f", "x"),
                     fmt(s["current_vs_torch"], ".2f", "x"), "; ".join(row["errors"])[:80]])
    return markdown_table(["K", "width", "chunks", "schedule", f"EPipe {rev} samples/s", "EPipe samples/s",
                           "torch samples/s", f"EPipe / {rev} (median)", "spread", "faster in",
                           f"{rev} / torch", "EPipe / torch", "errors"], body)


def plot(rows: list[dict], rev: str, name: str) -> Path:
    """This tree / the baseline per cell, median with the spread as an error bar."""
    fig, ax = axes()
    labels, medians, low, high = [], [], [], []
    for row in rows:
        s = summary(row)
        if s["ratio"] is None:
            continue
        labels.append(f"K={row['stages']} w={row['width']}\nm={row['chunks']} {row['schedule']}")
        medians.append(s["ratio"])
        low.append(s["ratio"] - s["spread"][0])
        high.append(s["spread"][1] - s["ratio"])
    ax.errorbar(range(len(medians)), medians, yerr=[low, high], fmt="o", capsize=4, label=f"this tree / {rev}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    return finish(fig, ax, name, "cell", "samples/s ratio", f"EPipe (compressor='none'): this tree against {rev}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, metavar="REV", help="the git revision to compare with")
    parser.add_argument("--cells", nargs="+", default=list(DEFAULT_CELLS), help="K:width:chunks[:1f1b]")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default="engine_baseline.json", help="file name under benchmarks/results")
    parser.add_argument("--baseline-strategy", type=json.loads, default={}, metavar="JSON",
                        help="strategy arguments of the baseline's runs, e.g. '{\"start_ahead\": false}'")
    args = parser.parse_args()
    cells = [parse_cell(c) for c in args.cells]
    load_before, current = load_average(), this_tree()  # the code the runs run
    baseline_commit = commit_of(args.baseline)  # resolved once: the revision the runs run
    print(load_before, flush=True)
    with exported_revision(baseline_commit) as rev_root:
        rows = measure(cells, rev_root, args.repeats, args.steps, args.baseline_strategy)
    name = label(args.baseline, args.baseline_strategy)
    text = table(rows, name)
    write_json(args.out, {"baseline": args.baseline, "baseline_commit": baseline_commit,
                          "baseline_strategy": args.baseline_strategy,
                          "current": current, "steps": args.steps, "repeats": args.repeats,
                          "load_before": load_before, "load_after": load_average(), "rows": rows,
                          "summary": [summary(r) for r in rows], "table": text})
    print("plot:", plot(rows, name, str(Path(args.out).with_suffix(".png"))))
    print(text)
    print(load_average())


if __name__ == "__main__":
    main()
