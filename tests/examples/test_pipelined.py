"""Each example's CLI config trains pipelined across real processes on generated data."""

from __future__ import annotations

import pytest

from tests.helpers import ROOT, run_ranks

QUICK = ["--trainer.max_steps=3", "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2",
         "--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false"]


def test_digits_config_pipelined(tmp_path):
    run_ranks(ROOT / "examples/digits/main.py", "fit", "--config", "examples/digits/configs/digits_sortquant8.yaml",
              f"--trainer.default_root_dir={tmp_path}", *QUICK, timeout=300)


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
