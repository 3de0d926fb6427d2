"""The main job: the digits MLP pipelined over CPU processes, compressed, next to the same
training uncompressed. No download: scikit-learn ships the digits.

    python examples/digits/demo.py                 # both runs, then the comparison
    python examples/digits/demo.py --only sortquant
    python examples/digits/demo.py --devices 3     # three processes, whatever the cores

Each run is a real pipeline: Lightning's launcher starts one process per rank (rank 0 holds
the data, the first and the last layer; the other ranks the middle), and every activation
and gradient crossing a cut goes through the codec over gloo. By default one process per
core this job may use, 2 to 3: a rank that has to wait for a core stalls every rank after
it in the pipeline.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RUNS = {
    "sortquant": dict(compressor="sortquant", bits=8),
    "none": dict(compressor="none"),
}


def default_devices() -> int:
    """One process per core this process may run on, at least 2 (a pipeline) and at most 3."""
    from lightning_epipe.strategy.launch import usable_cores

    return min(3, max(2, usable_cores()))


def train(name: str, out: Path, epochs: int, devices: int) -> None:
    """One pipelined training; rank 0 writes its report to ``out`` (JSON)."""
    import lightning as L

    from examples.digits.data import DigitsDataModule
    from examples.digits.model import DigitsClassifier
    from lightning_epipe import EPipeStrategy
    from lightning_epipe.callbacks import EPipeMonitor

    L.seed_everything(0, verbose=False)
    monitor = EPipeMonitor()
    strategy = EPipeStrategy(chunks=4, timeout=timedelta(minutes=5), bind_cores=True, **RUNS[name])
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy=strategy, max_epochs=epochs, callbacks=[monitor],
        logger=False, enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
        log_every_n_steps=10,
    )
    model, data = DigitsClassifier(), DigitsDataModule(batch_size=64)
    trainer.fit(model, data)
    summary = monitor.summary() if trainer.is_global_zero else None
    results = trainer.test(model, data, verbose=False)
    if trainer.is_global_zero:
        report = {"name": name, "test_acc": results[0]["test_acc"], "summary": summary, "table": monitor.format_summary()}
        out.write_text(json.dumps(report, default=str))


def _row(report: dict, baseline: dict) -> list[str]:
    s, b = report["summary"], baseline["summary"]
    links = s["links"].values()
    return [
        report["name"],
        f"{report['test_acc']:.3f}",
        f"{s['throughput_samples_per_s']:.0f}",
        f"{s['throughput_samples_per_s'] / b['throughput_samples_per_s']:.2f}x",
        f"{s['ratio']:.3f}",
        f"{s['bytes'] / 1e6:.1f} MB",
        f"{max(l['bandwidth_avg'] or 0 for l in links) / 1e6:.1f} MB/s",
        f"{max(l['bandwidth_wall'] or 0 for l in links) / 1e6:.1f} MB/s",
        f"{max(l['bandwidth_peak'] or 0 for l in links) / 1e6:.1f} MB/s",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=list(RUNS), help="run one configuration")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--devices", type=int, default=default_devices(),
                        help="processes: the client and devices-1 servers (default: one per core, 2 to 3)")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # internal: one training, launched per rank
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        train(args.run, args.out, args.epochs, args.devices)
        return

    reports = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in [args.only] if args.only else list(RUNS):
            out = Path(tmp) / f"{name}.json"
            print(f"== training the digits MLP over {args.devices} processes, compressor: {RUNS[name]}", flush=True)
            cmd = [sys.executable, __file__, "--run", name, "--out", str(out), "--epochs", str(args.epochs),
                   "--devices", str(args.devices)]
            subprocess.run(cmd, check=True, cwd=ROOT)
            reports[name] = json.loads(out.read_text())
            print(reports[name]["table"], "\n", flush=True)

    baseline = reports.get("none", next(iter(reports.values())))
    header = ["codec", "test acc", "samples/s", "vs none", "ratio", "on the wire", "avg bw (max link)", "wall bw", "peak bw"]
    rows = [header] + [_row(r, baseline) for r in reports.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    print("== digits, pipelined over", args.devices, "processes:")
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)))


if __name__ == "__main__":
    main()
