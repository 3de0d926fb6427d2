"""What the monitor hands the loggers besides metrics, with mocked loggers: no processes, no W&B run."""

from __future__ import annotations

from unittest import mock

from lightning.pytorch.loggers import CSVLogger, WandbLogger

from lightning_epipe.callbacks.loggers import (
    LINK_COLUMNS,
    define_wandb_axes,
    link_rows,
    log_link_table,
    log_pipeline_config,
    pipeline_config,
)
from lightning_epipe.strategy import plan_pipeline

SUMMARY = {"links": {"input/0->1": {
    "kind": "input", "src": 0, "dst": 1, "cuts": [], "codec": "raw", "messages": 8, "bytes_sent": 1100,
    "bytes_received": 1100, "raw_bytes": 1000, "ratio": 1.1, "bandwidth_avg": 2200.0, "bandwidth_wall": 550.0,
    "bandwidth_peak": None,
}}}


def test_plan_config_names_placement_balance_codecs_chunks_and_schedule():
    plan = plan_pipeline(8, 3, [2, 3, 3], "chain")
    config = pipeline_config(plan, {"activation": ["sortquant(bits=8)", "none"]}, chunks=4, schedule="1f1b", replicas=2)
    assert config == {
        "placement": "chain", "ranks": 3, "balance": [2, 3, 3], "stage_ranks": [1, 2, 0],
        "codecs": {"activation": ["sortquant(bits=8)", "none"]}, "chunks": 4, "schedule": "1f1b", "replicas": 2,
    }


def test_every_logger_gets_the_plan_only_wandb_the_axes_and_the_table():
    wandb, csv = mock.MagicMock(spec=WandbLogger), mock.MagicMock(spec=CSVLogger)
    log_pipeline_config([wandb, csv], {"chunks": 4})
    define_wandb_axes([wandb, csv], "epipe", "epipe_epoch")
    log_link_table([wandb, csv], "epipe/links", SUMMARY)
    for logger in (wandb, csv):
        logger.log_hyperparams.assert_called_once_with({"epipe": {"chunks": 4}})
    wandb.experiment.define_metric.assert_any_call("epipe/*", step_metric="trainer/global_step")
    wandb.experiment.define_metric.assert_any_call("epipe_epoch/*", step_metric="epoch")
    wandb.log_table.assert_called_once_with("epipe/links", columns=list(LINK_COLUMNS), data=link_rows(SUMMARY))
    assert [c[0] for c in csv.method_calls] == ["log_hyperparams"]  # nothing else


def test_link_rows_follow_the_columns():
    assert link_rows(SUMMARY) == [["input/0->1", "raw", "", 8, 1100, 1000, 1.1, 2200.0, 550.0, None]]
