"""What splitting a stage's backward costs the CPU (``split_backward``, issue 12, section 0).

One stage of the engine grid's model (3 blocks of ``Linear(w, w) + ReLU``, the first stage of
the K = 3 split) runs a step's ``m`` micro-batches forward, then backward from a gradient per
micro-batch, in one process and one torch thread, four ways taking turns:

- ``whole``: one ``torch.autograd.backward`` per micro-batch (the engine unsplit);
- ``each``: ``input_pass`` then that micro-batch's weight pass at once (1F1B's order);
- ``after``: every micro-batch's ``input_pass``, then ``run_weight_passes`` for all of them
  (GPipe's order: one autograd call per group of weights for all micro-batches, where autograd
  sums each weight's gradients before it accumulates them);
- ``call by call``: the same, with one ``run_weight_passes`` per micro-batch (an autograd call
  per micro-batch and group of weights, each accumulating into ``.grad``: the engine's at
  12064cb).

Every step starts without gradients (``zero_grad(set_to_none=True)``, as training's do). Timed:
the backward loop alone, the median over ``--steps`` steps after two of warm-up, the
ways in a fresh random order every step (each leaves the allocator and the caches to the
next), in ``--rounds`` processes;
reported per cell: the milliseconds a step's backward takes each way and each split way over
``whole`` (median and min-max over the processes). This is
the split's work, not its effect on a pipeline: where a rank has cores to itself the split
moves the weights' work off the path to the stage before; where ranks share cores (K = 3 on
2), a stage's idle time is another's compute, and what counts is the work.

    python benchmarks/split_cost.py [--out NAME.json]

Writes ``results/split_cost.{json,png}`` (``--out``: another name).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import axes, finish, load_average, publish_table, this_tree  # noqa: E402

#: (width, rows per micro-batch, micro-batches): batch 256 in 8 and in 4
CELLS = [(512, 32, 8), (1024, 32, 8), (1024, 64, 4), (2048, 32, 8)]
MODES = ("whole", "each", "after", "call by call")
BLOCKS = 3


def measure(width: int, rows: int, m: int, steps: int) -> dict:
    """Median milliseconds of a step's backward, per mode, the modes in a random order each step."""
    import torch
    from torch import nn

    from lightning_epipe.strategy.engine.split_backward import input_pass, run_weight_passes

    torch.set_num_threads(1)
    torch.manual_seed(0)
    stage = nn.Sequential(*[layer for _ in range(BLOCKS) for layer in (nn.Linear(width, width), nn.ReLU())])
    inputs = [torch.randn(rows, width) for _ in range(m)]
    grads = [torch.randn(rows, width) for _ in range(m)]

    def backward(mode: str) -> float:
        stage.zero_grad(set_to_none=True)  # as every training step starts
        leaves = [x.clone().requires_grad_() for x in inputs]
        outputs = [stage(leaf) for leaf in leaves]
        start = time.perf_counter()
        passes = []
        for leaf, y, g in zip(leaves, outputs, grads):
            if mode == "whole":
                torch.autograd.backward([y], [g])
                continue
            _, weight_pass = input_pass([y], [g], [leaf])
            passes.append(weight_pass)
            if mode == "each":
                run_weight_passes(passes)
                passes = []
        if mode == "after":
            run_weight_passes(passes)
        elif mode == "call by call":
            for weight_pass in passes:
                run_weight_passes([weight_pass])
        return time.perf_counter() - start

    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    order, shuffle = list(MODES), random.Random(0).shuffle
    for step in range(steps + 2):
        shuffle(order)
        for mode in order:
            seconds = backward(mode)
            if step >= 2:
                times[mode].append(seconds)
    return {mode: statistics.median(t) * 1e3 for mode, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="processes per cell")
    p.add_argument("--steps", type=int, default=30, help="timed steps per mode and process")
    p.add_argument("--out", default="split_cost.json", help="file name under benchmarks/results (the plot: .png)")
    p.add_argument("--worker", nargs=3, type=int, metavar=("WIDTH", "ROWS", "M"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(measure(*args.worker, args.steps)))
        return

    results: dict = {"commit": this_tree(), "rounds": args.rounds, "steps": args.steps, "load_before": load_average(),
                     "runs": {}}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for width, rows, m in CELLS:
        cmd = [sys.executable, __file__, "--worker", str(width), str(rows), str(m), "--steps", str(args.steps)]
        results["runs"][f"{width}:{rows}x{m}"] = [
            json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            for _ in range(args.rounds)]
    results["load_after"] = load_average()

    header = ["stage (3 blocks)", "micro-batches"] + [f"{mode} ms" for mode in MODES]
    header += [text for mode in MODES[1:] for text in (f"{mode} / whole", "spread")]
    rows, ratios = [], {}
    for key, samples in results["runs"].items():
        width, shape = key.split(":")
        row: list = [f"width {width}", shape.replace("x", " rows x ")]
        row += [f"{statistics.median(s[mode] for s in samples):.2f}" for mode in MODES]
        for mode in MODES[1:]:
            r = [s[mode] / s["whole"] for s in samples]
            ratios.setdefault(mode, []).append(statistics.median(r))
            row += [f"{statistics.median(r):.3f}x", f"{min(r):.2f}-{max(r):.2f}"]
        rows.append(row)
    publish_table(results, header, rows, args.out)

    fig, ax = axes()
    keys = list(results["runs"])
    for offset, mode in enumerate(MODES[1:]):
        ax.barh([i + 0.27 * offset for i in range(len(keys))], ratios[mode], height=0.27,
                label={"each": "each weight pass at once (1F1B)", "after": "the weight passes after (GPipe)",
                       "call by call": "the weight passes after, call by call"}[mode])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks([i + 0.27 for i in range(len(keys))], keys, fontsize=8)
    finish(fig, ax, str(Path(args.out).with_suffix(".png")), "a step's backward split / whole (median over processes)",
           "width:rows x micro-batches", "The split backward's CPU work")


if __name__ == "__main__":
    main()
