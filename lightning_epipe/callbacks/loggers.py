"""What :class:`~lightning_epipe.callbacks.EPipeMonitor` hands the loggers besides metrics.

The pipeline plan goes to every logger as hyperparameters (W&B's run config, TensorBoard's
hparams, the CSVLogger's ``hparams.yaml``) under ``epipe``. A
:class:`~lightning.pytorch.loggers.WandbLogger` also gets the axes of the metrics
(``define_metric``: per-step metrics over ``trainer/global_step``, per-epoch ones over
``epoch``) and, at the end of fit, the per-link table as a ``wandb.Table``.

``compressor="auto"``'s decisions go to every logger as scalars (:func:`auto_metrics`: the
chosen codec's compression ratio and the link rate it was chosen for, per direction and
cut) and to W&B also as a table with the reasons (:func:`log_auto_table`).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from lightning.pytorch.loggers import Logger, WandbLogger

from lightning_epipe.strategy.compression.auto_choice import LinkChoice
from lightning_epipe.strategy.planning.partition import PipelinePlan

__all__ = ["LINK_COLUMNS", "AUTO_COLUMNS", "pipeline_config", "link_rows", "log_pipeline_config", "define_wandb_axes",
           "log_link_table", "auto_metrics", "auto_rows", "log_auto_table"]

LINK_COLUMNS = (
    "link", "codec", "cuts", "messages", "bytes_sent", "raw_bytes", "ratio",
    "bandwidth_avg", "bandwidth_wall", "bandwidth_peak",
)

AUTO_COLUMNS = ("step", "link", "codec", "ratio", "bandwidth", "predicted_ms", "baseline_ms", "error", "reason")


def pipeline_config(
    plan: PipelinePlan, codecs: Mapping[str, Sequence[str]], chunks: int, schedule: str, replicas: int = 1
) -> dict[str, Any]:
    """The plan as plain data: placement, balance, stage ranks, codecs per cut, chunks, schedule.

    Example:
        >>> from lightning_epipe.strategy import plan_pipeline
        >>> config = pipeline_config(plan_pipeline(4, 2, [1, 2, 1]), {"activation": ["none", "fp16"]}, 4, "gpipe")
        >>> config["balance"], config["stage_ranks"], config["codecs"]
        ([1, 2, 1], [0, 1, 0], {'activation': ['none', 'fp16']})
    """
    return {
        "placement": plan.placement,
        "ranks": plan.num_ranks,
        "balance": list(plan.balance),
        "stage_ranks": list(plan.stage_ranks),
        "codecs": {kind: list(names) for kind, names in codecs.items()},
        "chunks": chunks,
        "schedule": schedule,
        "replicas": replicas,
    }


def link_rows(summary: Mapping[str, Any]) -> list[list[Any]]:
    """One row per link of :meth:`EPipeMonitor.summary`, in :data:`LINK_COLUMNS` order."""
    rows = []
    for label, link in summary["links"].items():
        values = {**link, "link": label, "cuts": ",".join(map(str, link["cuts"])), "codec": link.get("codec", "?")}
        rows.append([values[column] for column in LINK_COLUMNS])
    return rows


def log_pipeline_config(loggers: Sequence[Logger], config: Mapping[str, Any]) -> None:
    """``config`` as the hyperparameters ``epipe`` of every logger."""
    for logger in loggers:
        logger.log_hyperparams({"epipe": dict(config)})


def define_wandb_axes(loggers: Sequence[Logger], prefix: str, epoch_prefix: str) -> None:
    """Per-step metrics over ``trainer/global_step``, per-epoch ones over ``epoch`` (W&B only)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            run = logger.experiment
            run.define_metric("trainer/global_step")
            run.define_metric("epoch")
            run.define_metric(f"{prefix}/*", step_metric="trainer/global_step")
            run.define_metric(f"{epoch_prefix}/*", step_metric="epoch")


def log_link_table(loggers: Sequence[Logger], key: str, summary: Mapping[str, Any]) -> None:
    """The per-link table of ``summary`` as a ``wandb.Table`` named ``key`` (W&B only)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.log_table(key, columns=list(LINK_COLUMNS), data=link_rows(summary))


def auto_metrics(decisions: Iterable[tuple[int, LinkChoice]]) -> dict[str, float]:
    """Scalars of ``compressor="auto"`` decisions (the latest per link wins): ``auto/<direction>/cut<i>``
    the chosen codec's wire/raw ratio, ``auto/<direction>/cut<i>/bandwidth`` the link's bytes/s it
    was chosen for (left out when unlimited: loggers take finite numbers).

    Example:
        >>> from lightning_epipe.strategy.compression.auto_choice import LinkChoice
        >>> c = LinkChoice(0, "activation", "fp16", "fp16", {}, 1e-3, 2e-3, 1e-4, "why", ratio=0.5, bandwidth=2.5e6)
        >>> auto_metrics([(1, c)])
        {'auto/activation/cut0': 0.5, 'auto/activation/cut0/bandwidth': 2500000.0}
    """
    metrics: dict[str, float] = {}
    for _, choice in decisions:
        name = f"auto/{choice.direction}/cut{choice.cut}"
        metrics[name] = float(choice.ratio)
        if math.isfinite(choice.bandwidth):
            metrics[f"{name}/bandwidth"] = float(choice.bandwidth)
        else:
            metrics.pop(f"{name}/bandwidth", None)
    return metrics


def auto_rows(decisions: Iterable[tuple[int, LinkChoice]]) -> list[list[Any]]:
    """One row per decision, in :data:`AUTO_COLUMNS` order (bandwidth ``None`` when unlimited)."""
    return [[step, f"{c.direction}/cut{c.cut}", c.label, c.ratio, c.bandwidth if math.isfinite(c.bandwidth) else None,
             c.seconds * 1e3, c.baseline_seconds * 1e3, c.error, c.reason] for step, c in decisions]


def log_auto_table(loggers: Sequence[Logger], key: str, decisions: Sequence[tuple[int, LinkChoice]]) -> None:
    """Every ``compressor="auto"`` decision and its reason as a ``wandb.Table`` named ``key`` (W&B only)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger) and decisions:
            logger.log_table(key, columns=list(AUTO_COLUMNS), data=auto_rows(decisions))
