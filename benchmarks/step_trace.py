"""Where a pipeline step's time goes, per rank, next to torch.distributed.pipelining's step.

    python benchmarks/step_trace.py                      # the cells below, 3 repetitions
    python benchmarks/step_trace.py --cells 2:512:1 --repeats 1

A cell ``K:width:chunks`` is one of section 0's (``benchmarks/engine.py``: 8 x (Linear(w, w) +
ReLU), batch 256, split [5, 3] or [3, 3, 2], chain placement, one torch thread per process).
Every repetition runs EPipe traced (:mod:`benchmarks.tracing`: the engine's and Lightning's
calls wrapped and timed in every rank), EPipe untraced and torch's ``ScheduleGPipe``, side by
side. Per rank and label: the median over the timed steps of all traced runs of the time that
code took itself (its traced callees' taken out), in ms per step; a rank's labels add up to its
step. "EPipe untraced" and "torch" are 256 / the run's median-step rate, in ms, median and
spread over the repetitions. Writes ``benchmarks/results/step_trace.{json,png}``.

``--codecs none sortquant-8 ...``: section 7's setting instead (``benchmarks/slow_link_auto.py``:
client-server, 2 processes, width 1024, chunks 8, an unlimited loopback), one row per codec,
traced and untraced, no torch; one table puts every codec's ranks side by side, so what a
codec adds to each label (its encode and decode, the waits, the compute of the rank beside
it) reads off one line. Writes ``results/step_trace_codecs.{json,png}`` (``--out``: another name).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import axes, finish, fmt, load_average, markdown_table, median_spread, run, write_json  # noqa: E402
from benchmarks.engine import BATCH, base  # noqa: E402
from benchmarks.slow_link_auto import METHODS, config as codec_config  # noqa: E402
from benchmarks.tracing import BETWEEN, median_ms, step_windows  # noqa: E402

DEFAULT_CELLS = ["2:128:1", "2:512:1", "2:512:8", "3:1024:1"]
SMALL_MS = 0.05  # labels under this many ms per step on every rank are summed into "other"


def parse_cell(text: str) -> dict:
    stages, width, chunks = (int(x) for x in text.split(":"))
    return dict(stages=stages, width=width, chunks=chunks)


def step_ms(result: dict) -> float | None:
    rate = result.get("median_step_samples_per_s")
    return 1e3 * BATCH / rate if rate else None


def measure(cells: list[dict], repeats: int, steps: int, warmup: int) -> list[dict]:
    """Section 0's cells: EPipe traced, untraced and torch's step, per repetition."""
    def runs(row: dict) -> dict[str, dict]:
        cfg = {**base(row, steps), "warmup": warmup, "kind": "epipe"}
        return {"traced": traced_run(cfg, row, warmup), "untraced": run(cfg), "torch": run({**cfg, "kind": "pipelining"})}

    return repeated([dict(cell, torch=[]) for cell in cells], repeats, runs)


def measure_codecs(codecs: list[str], repeats: int, steps: int, warmup: int) -> list[dict]:
    """Section 7's setting, unlimited: EPipe traced and untraced per codec, per repetition."""
    def runs(row: dict) -> dict[str, dict]:
        cfg = codec_config(row["codec"], steps, warmup)
        return {"traced": traced_run(cfg, row, warmup), "untraced": run(cfg)}

    return repeated([dict(codec=codec, stages=codec_config(codec, steps, warmup)["devices"]) for codec in codecs], repeats, runs)


def repeated(rows: list[dict], repeats: int, runs) -> list[dict]:
    """Every row's ``runs(row)`` (name -> result) ``repeats`` times, the rows taking turns; each
    run's step ms under its name, the traced windows as the median ms per rank and label (``ms``)."""
    for row in rows:
        row.update(windows={}, traced=[], untraced=[], errors=[])
    for rep in range(repeats):
        for row in rows:
            results = runs(row)
            keep(row, results)
            print(f"  rep {rep + 1} {row_name(row)}: step ms "
                  + ", ".join(f"{name} {fmt(step_ms(result))}" for name, result in results.items()), flush=True)
    for row in rows:
        row["ms"] = {rank: median_ms(windows) for rank, windows in row.pop("windows").items()}
    return rows


def traced_run(cfg: dict, row: dict, warmup: int) -> dict:
    """One traced run of ``cfg``; each rank's step windows after ``warmup`` go to ``row["windows"]``."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = str(Path(tmp) / "trace.rank{rank}.json")
        result = run({**cfg, "trace": trace})
        for rank in range(row["stages"]):
            path = Path(trace.format(rank=rank))
            if path.exists():
                windows = step_windows(json.loads(path.read_text()), warmup=warmup)
                row["windows"].setdefault(str(rank), []).extend(windows)
    return result


def keep(row: dict, results: dict[str, dict]) -> None:
    """Each run's step ms under its name in ``row`` (its error under ``errors``)."""
    for name, result in results.items():
        ms = step_ms(result)
        if ms is None:
            row["errors"].append(f"{name}: {result.get('error')}")
        else:
            row[name].append(ms)


def ordered_labels(ms: dict[str, dict[str, float]]) -> list[str]:
    """Labels by their largest time on any rank, the step and the untraced rest last."""
    labels = {label for per_rank in ms.values() for label in per_rank} - {"step", BETWEEN}
    return sorted(labels, key=lambda label: -max(per_rank.get(label, 0.0) for per_rank in ms.values())) + [BETWEEN, "step"]


def table(row: dict) -> str:
    """One row's ranks, a column each."""
    return label_table([(f"rank {rank}", row["ms"][rank]) for rank in sorted(row["ms"], key=int)])


def side_by_side(rows: list[dict]) -> str:
    """Every row's ranks in one table (``--codecs``: a column per codec and rank)."""
    return label_table([(f"{row['codec']} rank {rank}", row["ms"][rank]) for row in rows
                        for rank in sorted(row["ms"], key=int)])


def label_table(columns: list[tuple[str, dict[str, float]]]) -> str:
    """Labels (rows) by their largest time in any column, those under ``SMALL_MS`` in every
    column summed into one line; ``columns``: (name, ms by label)."""
    body, other = [], [0.0] * len(columns)
    for label in ordered_labels(dict(columns)):
        values = [ms.get(label, 0.0) for _, ms in columns]
        if label not in ("step", BETWEEN) and max(values) < SMALL_MS:
            other = [a + b for a, b in zip(other, values)]
            continue
        if label == BETWEEN:
            body.append([f"other (labels under {SMALL_MS} ms)"] + [fmt(v) for v in other])
        body.append([label] + [fmt(v) for v in values])
    return markdown_table(["ms per step (median)"] + [name for name, _ in columns], body)


def header(row: dict) -> str:
    def ms(values: list[float]) -> str:
        median, spread = median_spread(values)
        return f"{median} ({spread})" if values else "-"

    if "codec" in row:  # section 7's setting, as slow_link_auto.config sets it
        cfg = codec_config(row["codec"], 0, 0)
        return (f"{row['codec']}, {cfg['placement']}, width {cfg['layers']['width']}, chunks {cfg['chunks']}: step ms, median (min-max) over"
                f" {len(row['untraced'])} repetitions: EPipe untraced {ms(row['untraced'])}, EPipe traced {ms(row['traced'])}")
    return (f"K = {row['stages']}, width {row['width']}, chunks {row['chunks']}: step ms, median (min-max) over"
            f" {len(row['untraced'])} repetitions: EPipe untraced {ms(row['untraced'])}, EPipe traced"
            f" {ms(row['traced'])}, torch pipelining {ms(row['torch'])}")


def row_name(row: dict) -> str:
    return row["codec"] if "codec" in row else f"K={row['stages']} w={row['width']} m={row['chunks']}"


def plot(rows: list[dict], name: str = "step_trace.png") -> Path:
    fig, ax = axes((9, 1.2 + 0.45 * sum(len(r["ms"]) for r in rows)))
    bars = [(f"{row_name(r)} rank {rank}", r["ms"][rank]) for r in rows for rank in sorted(r["ms"], key=int)]
    labels = []
    for row in rows:
        labels += [label for label in ordered_labels(row["ms"])[:6] if label not in labels and label != "step"]
    left = [0.0] * len(bars)
    for label in labels + ["other"]:
        widths = [ms.get(label, 0.0) if label != "other" else
                  ms.get("step", 0.0) - sum(ms.get(x, 0.0) for x in labels) for _, ms in bars]
        ax.barh(range(len(bars)), widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(bars)), [name for name, _ in bars], fontsize=7)
    ax.invert_yaxis()
    return finish(fig, ax, name, "ms per step (median over timed steps)", "",
                  "Where an EPipe step's time goes, per rank", legend=6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", default=DEFAULT_CELLS, help="K:width:chunks")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--codecs", nargs="+", choices=list(METHODS), help="section 7's setting, one row per codec")
    parser.add_argument("--out", help="file name under benchmarks/results (default step_trace.json, "
                                      "step_trace_codecs.json with --codecs)")
    args = parser.parse_args()
    out = args.out or ("step_trace_codecs.json" if args.codecs else "step_trace.json")
    load_before = load_average()
    print(load_before, flush=True)
    if args.codecs:  # one table: every codec's ranks side by side
        rows = measure_codecs(args.codecs, args.repeats, args.steps, args.warmup)
        tables = ["\n".join(header(row) for row in rows) + "\n\n" + side_by_side(rows)]
    else:
        rows = measure([parse_cell(c) for c in args.cells], args.repeats, args.steps, args.warmup)
        tables = [f"{header(row)}\n\n{table(row)}" for row in rows]
    write_json(out, {"load_before": load_before, "load_after": load_average(), "rows": rows, "table": tables})
    print("\n\n".join(tables))
    print("plot:", plot(rows, str(Path(out).with_suffix(".png").name)))
    print(load_average())


if __name__ == "__main__":
    main()
