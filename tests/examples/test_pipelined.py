"""Each example's CLI config trains pipelined across real processes (digits on its real data,
the others on generated data)."""

from __future__ import annotations

import csv

import pytest

from tests.helpers import ROOT, run_ranks

QUICK = ["--trainer.max_steps=3", "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2",
         "--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false"]


def test_digits_config_pipelined_learns_and_logs_the_ratio(tmp_path):
    """2 epochs of the config as it is (the monitor comes from it), logged to a CSVLogger."""
    run_ranks(ROOT / "examples/digits/main.py", "fit", "--config", "examples/digits/configs/digits_sortquant8.yaml",
              f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=2", "--trainer.log_every_n_steps=5",
              "--trainer.logger=CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
              "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false", timeout=300)
    with open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    accuracy = [float(r["val_acc"]) for r in rows if r["val_acc"]]
    assert len(accuracy) == 2 and accuracy[1] > accuracy[0] and accuracy[1] > 0.7, accuracy  # 10 classes: chance 0.1
    ratios = [float(r[key]) for r in rows for key in ("epipe/ratio", "epipe_epoch/ratio") if r[key]]
    # 8 of 32 bits + headers; an epoch's smaller last batch (45 rows) travels in padded frames
    assert len(ratios) >= 2 + 2 and all(0.25 < ratio < 0.28 for ratio in ratios), ratios
    assert all(float(r["epipe/throughput_samples_per_s"]) > 0 for r in rows if r["epipe/ratio"])


@pytest.mark.slow
def test_mobilenet_config_pipelined(tmp_path):
    run_ranks(ROOT / "examples/mobilenet/main.py", "fit", "--config", "examples/mobilenet/configs/cifar10_sortquant8.yaml",
              f"--trainer.default_root_dir={tmp_path}",
              "--model.pretrained=false", "--data.synthetic=true", "--data.synthetic_size=64", "--data.image_size=64",
              "--data.batch_size=32", "--data.num_workers=0", "--trainer.accelerator=cpu", *QUICK, timeout=600)


@pytest.mark.slow
def test_roberta_config_pipelined(tmp_path):
    run_ranks(ROOT / "examples/roberta/main.py", "fit", "--config", "examples/roberta/configs/rte_sortquant8.yaml",
              f"--trainer.default_root_dir={tmp_path}",
              "--model.tiny=true", "--data.synthetic=true", "--data.num_workers=0", "--trainer.accelerator=cpu",
              "--trainer.strategy.init_args.balance=[2, 2, 2]", *QUICK, timeout=600)
