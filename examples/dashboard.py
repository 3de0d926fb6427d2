"""Draw the W&B dashboard of an offline run as a PNG, from the run's own file (no account, no network).

    python examples/dashboard.py runs/wandb/latest-run --out dashboard.png

Four panels, what EPipeMonitor and the model logged: throughput, compression ratio (every byte
sent, and per direction), average bandwidth per link (bytes / computation time) with the
wall-clock rate dashed, and the validation metrics (accuracy, Matthews correlation if logged)
per epoch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

# Run as a script, Python puts only this folder on the path: add the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.common.wandb_offline import history  # noqa: E402

STEP = "trainer/global_step"


def series(rows: Sequence[dict[str, Any]], key: str, axis: str = STEP) -> tuple[list[float], list[float]]:
    """``(x, y)`` of ``key`` over ``axis``, from the rows that hold both."""
    points = [(row[axis], row[key]) for row in rows if key in row and axis in row]
    return [x for x, _ in points], [y for _, y in points]


def draw(rows: Sequence[dict[str, Any]], out: Path, prefix: str = "epipe", title: str = "") -> Path:
    """The four panels of ``rows`` (a run's history) into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({key for row in rows for key in row})
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    (speed, ratio), (bandwidth, quality) = axes
    speed.plot(*series(rows, f"{prefix}/throughput_samples_per_s"), marker=".")
    speed.set(title="throughput", xlabel="step", ylabel="samples/s")
    for name, label in (("ratio", "every byte sent"), ("ratio/activation", "activations"), ("ratio/gradient", "gradients")):
        ratio.plot(*series(rows, f"{prefix}/{name}"), marker=".", label=label)
    ratio.set(title="compression ratio (wire / raw)", xlabel="step", ylim=(0, 1.1))
    ratio.legend()
    for key in (k for k in keys if k.startswith(f"{prefix}/bandwidth_avg/")):
        link = key.split("/", 2)[2]
        (line,) = bandwidth.plot(*_mb(series(rows, key)), marker=".", label=link)
        bandwidth.plot(*_mb(series(rows, f"{prefix}/bandwidth_wall/{link}")), linestyle="--", color=line.get_color())
    bandwidth.set(title="average bandwidth per link (dashed: wall-clock rate)", xlabel="step", ylabel="MB/s")
    bandwidth.legend(fontsize="small")
    for key in (k for k in keys if k.startswith("val_") and k != "val_loss"):
        quality.plot(*series(rows, key, axis="epoch"), marker="o", label=key)
    quality.set(title="validation (torchmetrics)", xlabel="epoch", ylim=(None, 1))
    quality.legend()
    if title:
        fig.suptitle(title)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def _mb(xy: tuple[list[float], list[float]]) -> tuple[list[float], list[float]]:
    return xy[0], [y / 1e6 for y in xy[1]]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="an offline-run-* directory under <save_dir>/wandb")
    parser.add_argument("--out", type=Path, default=Path("dashboard.png"))
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    print(draw(history(args.run_dir), args.out, title=args.title))


if __name__ == "__main__":
    main()
