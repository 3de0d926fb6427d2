"""A short pipelined training with EPipeMonitor in real processes (not collected by pytest).

    python tests/callbacks/monitored_run.py --out DIR --placement client-server

Lightning's launcher re-runs this script once per rank. The cuts carry activations of
different widths (256, 128, 64 columns), so every link has its own known message size.
Rank 0 writes to ``DIR/result.json`` the monitor's summary, its own raw link counters and
the progress-bar metrics; the CSVLogger writes ``DIR/csv/version_0/metrics.csv``, the
TensorBoardLogger ``DIR/tb`` and the offline WandbLogger ``DIR/wandb/offline-run-*``.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BATCH, CHUNKS, STEPS = 32, 2, 4  # 3 batches an epoch: 4 steps cross an epoch boundary
BALANCE = {"client-server": [1, 2, 2, 2], "chain": [2, 2, 3]}


class WideNet(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(
            nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 128), nn.Tanh(), nn.Linear(128, 64), nn.Tanh(), nn.Linear(64, 4)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.layers(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.layers(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3 * BATCH, 32, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=BATCH)


def main() -> None:
    from lightning_epipe import EPipeStrategy
    from lightning_epipe.callbacks import EPipeMonitor
    from lightning_epipe.compressors import get_compressor

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--placement", default="client-server")
    p.add_argument("--validate", action="store_true", help="one validation batch at each epoch end")
    p.add_argument("--wandb", action="store_true", help="a WandbLogger too, offline, under DIR/wandb")
    args = p.parse_args()
    out = Path(args.out)

    if args.placement == "client-server":  # a codec per cut: none, sortquant 8 bits, none
        compressor = [get_compressor("none"), get_compressor("sortquant", bits=8), get_compressor("none")]
        strategy = EPipeStrategy(chunks=CHUNKS, compressor=compressor, balance=BALANCE[args.placement], timeout=timedelta(seconds=60))
    else:
        strategy = EPipeStrategy(
            chunks=CHUNKS, compressor="sortquant", bits=8, placement="chain", balance=BALANCE[args.placement],
            timeout=timedelta(seconds=60),
        )
    monitor = EPipeMonitor()
    loggers = [CSVLogger(out, name="csv")]
    if args.validate:
        loggers.append(TensorBoardLogger(out, name="tb"))
    if args.wandb:
        loggers.append(WandbLogger(project="epipe-tests", save_dir=out, offline=True))
    trainer = L.Trainer(
        accelerator="cpu", devices=3, strategy=strategy, max_steps=STEPS, log_every_n_steps=2, logger=loggers,
        callbacks=[monitor], enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=1 if args.validate else 0,
    )
    trainer.fit(WideNet(), loader(), loader() if args.validate else None)
    if trainer.is_global_zero:
        result = {
            "summary": monitor.summary(),
            "table": monitor.format_summary(),
            "client_links": {k.label(0): v.as_list() for k, v in strategy.stats.links.items()},
            "progress_bar": {k: float(v) for k, v in trainer.progress_bar_metrics.items()},
        }
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
