"""Many short epochs with random batch sizes through every codec (not collected by pytest).

    python tests/strategy/stress.py --out DIR --placement chain --devices 4 --epochs 15

Every rank records its resident memory and open file descriptors at each epoch end in
``DIR/rank{r}.json``; the test checks that neither grows.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.strategy.scenario import TinyNet, make_data  # noqa: E402

CODECS = ["sortquant", "quantize", "topk", "powersgd", "fp16", "bf16", "none"]


class RandomBatches(torch.utils.data.Sampler):
    """Batches of random sizes 1..max_size (a fixed seed per epoch), incl. ones smaller than chunks."""

    def __init__(self, n: int, max_size: int, seed: int = 0) -> None:
        self.n, self.max_size, self.seed, self.epoch = n, max_size, seed, 0

    def _sizes(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        sizes, left = [], self.n
        while left > 0:
            size = min(left, int(torch.randint(1, self.max_size + 1, (1,), generator=g)))
            sizes.append(size)
            left -= size
        return sizes

    def __iter__(self):
        start = 0
        for size in self._sizes():
            yield list(range(start, start + size))
            start += size
        self.epoch += 1

    def __len__(self) -> int:
        return len(self._sizes())


class Record(L.Callback):
    def __init__(self, out: Path) -> None:
        self.out, self.rows = out, []

    def on_train_epoch_end(self, trainer, pl_module):
        rss_kb = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() // 1024
        self.rows.append({"epoch": trainer.current_epoch, "rss_kb": rss_kb, "fds": len(os.listdir("/proc/self/fd"))})
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.rows))


def main() -> None:
    from lightning_epipe import EPipeStrategy

    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--placement", default="client-server")
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--epochs", type=int, default=15)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    cuts = args.devices if args.placement == "client-server" else args.devices - 1
    strategy = EPipeStrategy(
        chunks=4, placement=args.placement, timeout=timedelta(seconds=120),
        activation_compressor=[CODECS[c % len(CODECS)] for c in range(cuts)],
        gradient_compressor=[CODECS[(c + cuts) % len(CODECS)] for c in range(cuts)],
    )
    data = make_data(n=96)
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, strategy=strategy, max_epochs=args.epochs,
        callbacks=[Record(args.out)], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(data, batch_sampler=RandomBatches(len(data), max_size=20))
    trainer.fit(TinyNet(lr=0.02), loader, DataLoader(data, batch_size=7))


if __name__ == "__main__":
    main()
