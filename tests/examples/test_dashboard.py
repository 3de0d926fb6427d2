"""An offline W&B run read back from its file and drawn as the dashboard PNG: no account, no network."""

from __future__ import annotations

import pytest

from examples.common import wandb_offline
from examples.dashboard import draw, series


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real offline run: a config too big for one 32 KiB block, axes, a few steps and epochs."""
    wandb = pytest.importorskip("wandb")
    save_dir = tmp_path_factory.mktemp("wandb")
    run = wandb.init(project="epipe-tests", dir=save_dir, mode="offline", config={"big": "x" * 80_000, "chunks": 4})
    run.define_metric("epipe/*", step_metric="trainer/global_step")
    for step in range(6):
        run.log({"epipe/throughput_samples_per_s": 100.0 + step, "epipe/ratio": 0.26, "epipe/ratio/activation": 0.25,
                 "epipe/ratio/gradient": 0.27, "epipe/bandwidth_avg/activation/0->1": 2e6,
                 "epipe/bandwidth_wall/activation/0->1": 1e6, "trainer/global_step": 5 * step, "epoch": step // 3})
    for epoch in range(2):
        run.log({"val_acc": 0.5 + 0.3 * epoch, "val_loss": 1.0, "epoch": epoch, "trainer/global_step": 15 * epoch + 14})
    run.finish()
    wandb.teardown()  # waits for W&B's service to close the run file: finish() alone can return before its last write
    (found,) = (save_dir / "wandb").glob("offline-run-*")
    return found


def test_history_config_and_axes_come_back_from_the_run_file(run_dir):
    rows = wandb_offline.history(run_dir)
    assert len(rows) == 8 and rows[0]["_step"] == 0
    assert series(rows, "epipe/throughput_samples_per_s") == ([0, 5, 10, 15, 20, 25], [100.0, 101.0, 102.0, 103.0, 104.0, 105.0])
    assert series(rows, "val_acc", axis="epoch") == ([0, 1], [0.5, 0.8])
    config = wandb_offline.config(run_dir)
    assert config["big"] == "x" * 80_000 and config["chunks"] == 4  # a record over several blocks
    assert wandb_offline.metric_axes(run_dir)["epipe/*"] == "trainer/global_step"


def test_dashboard_png_is_drawn_from_the_history(run_dir, tmp_path):
    out = draw(wandb_offline.history(run_dir), tmp_path / "dashboard.png", title="test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_a_directory_without_a_run_file_says_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="pass an offline-run-\\* directory"):
        wandb_offline.history(tmp_path)
