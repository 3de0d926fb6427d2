"""EPipeMonitor: log what the pipeline moves and how fast, through any Lightning logger.

A thin callback over :class:`~lightning_epipe.callbacks.meter.PipelineMeter`: it times the
client's training steps, gathers every rank's counters to rank 0 when Lightning logs (every
``log_every_n_steps``) and at each epoch end, and logs the meter's metrics from rank 0.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Optional

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_epipe.callbacks.collect import gather_stats
from lightning_epipe.callbacks.loggers import (
    AUTO_COLUMNS,
    auto_metrics,
    auto_rows,
    define_wandb_axes,
    log_auto_table,
    log_link_table,
    log_pipeline_config,
    pipeline_config,
)
from lightning_epipe.callbacks.meter import Measurement, PipelineMeter, Stopwatch, format_summary, stats_delta
from lightning_epipe.strategy.epipe import EPipeStrategy
from lightning_epipe.strategy.engine.stats import PipelineStats

__all__ = ["EPipeMonitor"]


class EPipeMonitor(Callback):
    r"""Logs throughput, compression ratios, bytes and bandwidth per link, compute/wait/bubble.

    Every ``log_every_n_steps`` (the Trainer's setting) it logs the window since its previous
    log as ``epipe/<metric>``, and at each training epoch end the epoch as
    ``epipe_epoch/<metric>``; samples/s and the overall ratio also show in the progress
    bar. ``<metric>`` is a key of :meth:`PipelineMeter.compute`, e.g.
    ``epipe/throughput_samples_per_s``, ``epipe/ratio``, ``epipe/ratio/activation/cut0``,
    ``epipe/bytes/activation/0->1``, ``epipe/bandwidth_avg/gradient/1->0`` (bytes / computation
    time, the report's average bandwidth), ``epipe/bandwidth_wall/...`` (bytes / wall time),
    ``epipe/bandwidth_peak/...`` (the run's peak so far), ``epipe/stage0/compute_s``,
    ``epipe/rank1/wait_s``, ``epipe/rank1/bubble``, ``epipe/bubble``. :meth:`summary` and
    :meth:`format_summary` report the whole run.

    Every logger also gets the pipeline plan as the hyperparameters ``epipe`` (placement,
    balance, stage ranks, codecs per cut, chunks, schedule); a ``WandbLogger`` gets the axes
    of the metrics and, at the end of fit, the per-link table ``epipe/links``
    (see :mod:`lightning_epipe.callbacks.loggers`).

    With ``compressor="auto"``, each decision is logged at the step it takes effect:
    ``epipe/auto/<direction>/cut<i>`` (the chosen codec's wire/raw ratio) and
    ``epipe/auto/<direction>/cut<i>/bandwidth`` (the link's bytes/s it was chosen for); the
    reasons are printed by the strategy, kept in :meth:`summary` (``auto``) and, for a
    ``WandbLogger``, logged at the end of fit as the table ``epipe/auto``.

    Gathering the servers' counters is a collective at those hooks; every rank takes part,
    no other step costs anything.

    Args:
        batch_size_fn: samples in a training batch; by default the rows the training step
            fed through the pipelined ``nn.Sequential`` (counted by the strategy).
        prog_bar: show ``samples/s`` and ``wire/raw`` (the overall ratio) in the progress bar.
        prefix: prefix of the per-step metric names.
        epoch_prefix: prefix of the per-epoch metric names.

    Example::

        monitor = EPipeMonitor()
        trainer = L.Trainer(accelerator="cpu", devices=3, strategy=EPipeStrategy(compressor="sortquant", bits=8),
                            callbacks=[monitor], logger=CSVLogger("logs"), log_every_n_steps=10)
        trainer.fit(model)
        if trainer.is_global_zero:
            print(monitor.format_summary())
    """

    def __init__(
        self,
        batch_size_fn: Optional[Callable[[Any], int]] = None,
        prog_bar: bool = True,
        prefix: str = "epipe",
        epoch_prefix: str = "epipe_epoch",
    ) -> None:
        super().__init__()
        self.batch_size_fn = batch_size_fn
        self.prog_bar = prog_bar
        self.prefix = prefix
        self.epoch_prefix = epoch_prefix
        self._meter: Optional[PipelineMeter] = None
        self._codecs: dict[str, list[str]] = {}
        self._base = PipelineStats()
        self._watch = Stopwatch()
        self._wall_start = 0.0
        self._batches = 0
        self._samples = 0
        self._samples_before = 0
        self._auto_seen = 0  # decisions of compressor="auto" already logged
        self._auto: list = []  # (step, LinkChoice) of every decision (rank 0)

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _strategy(trainer: Trainer) -> EPipeStrategy:
        strategy = trainer.strategy
        if not isinstance(strategy, EPipeStrategy):
            raise MisconfigurationException(
                f"EPipeMonitor measures the links of EPipeStrategy's pipeline, but this Trainer uses"
                f" {type(strategy).__name__}: pass `Trainer(strategy=EPipeStrategy(...))`, or use Lightning's"
                " ThroughputMonitor without EPipeStrategy"
            )
        return strategy

    @staticmethod
    def _local_stats(strategy: EPipeStrategy) -> PipelineStats:
        """A copy of this rank's counters (the transport adds its blocked receives as wait)."""
        return copy.deepcopy(strategy.stats)

    @staticmethod
    def _should_log_step(trainer: Trainer, pl_module: LightningModule) -> bool:
        """Lightning's ``should_update_logs`` for a training step, without ``should_stop``
        (which one rank may set alone): the same answer on every rank."""
        if trainer.log_every_n_steps <= 0:
            return False
        if trainer.fit_loop._should_accumulate() and pl_module.automatic_optimization:
            return False
        step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1
        return step % trainer.log_every_n_steps == 0 or bool(trainer.fast_dev_run)

    def _collect(self, trainer: Trainer) -> None:
        """Gather every rank's counters since the run started; rank 0 updates the meter."""
        strategy = self._strategy(trainer)
        local = stats_delta(self._local_stats(strategy), self._base)
        ranks = gather_stats(
            local, self._meter.links, strategy.plan, strategy.pipeline_rank, strategy.world_size, strategy.root_device
        )
        if ranks is not None:
            self._meter.update(
                Measurement(self._watch.elapsed, time.perf_counter() - self._wall_start, self._batches, self._samples, ranks)
            )

    @staticmethod
    def _log(trainer: Trainer, metrics: dict[str, float], prefix: str) -> None:
        """To every logger at Lightning's current step, as ``ThroughputMonitor`` does. Not through
        ``self.log``, which would warn about ``sync_dist`` at epoch level on every metric."""
        trainer._logger_connector.log_metrics({f"{prefix}/{name}": value for name, value in metrics.items()})

    # ------------------------------------------------------------------ hooks

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._strategy(trainer)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        strategy = self._strategy(trainer)
        self._meter = PipelineMeter(strategy.plan)
        self._codecs = strategy.compressor_description()
        self._base = self._local_stats(strategy)
        self._batches = self._samples = 0
        if trainer.is_global_zero:
            config = pipeline_config(strategy.plan, self._codecs, strategy.chunks, strategy.schedule, strategy.replicas)
            log_pipeline_config(trainer.loggers, config)
            define_wandb_axes(trainer.loggers, self.prefix, self.epoch_prefix)
        self._wall_start = time.perf_counter()  # first: wall time >= training time
        self._watch.start()

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._samples_before = self._strategy(trainer).stats.samples

    def _log_auto(self, trainer: Trainer, strategy: EPipeStrategy) -> None:
        """The decisions ``compressor="auto"`` made since the last look (strategies without auto have none)."""
        history = strategy.auto_history
        new = history[self._auto_seen:]
        self._auto_seen = len(history)
        if new:
            self._auto.extend(new)
            self._log(trainer, auto_metrics(new), self.prefix)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.is_global_zero:
            self._batches += 1
            strategy = self._strategy(trainer)
            self._log_auto(trainer, strategy)  # the strategy decides in its on_train_batch_start, after callbacks
            if self.batch_size_fn is not None:
                samples = int(self.batch_size_fn(batch))
            else:
                samples = strategy.stats.samples - self._samples_before
            self._samples += samples * strategy.replicas  # every replica ran a batch of its shard
        if not self._should_log_step(trainer, pl_module):
            return
        self._collect(trainer)
        if not trainer.is_global_zero:
            return
        metrics = self._meter.compute("step")
        self._meter.mark("step")
        self._log(trainer, metrics, self.prefix)
        if self.prog_bar:
            for name, key in (("samples/s", "throughput_samples_per_s"), ("wire/raw", "ratio")):
                if key in metrics:
                    pl_module.log(name, metrics[key], prog_bar=True, logger=False, on_step=True, on_epoch=False,
                                  batch_size=1, rank_zero_only=True)

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._watch.pause()  # a no-op outside fit: the watch is not running

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._watch.resume()

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._collect(trainer)
        if not trainer.is_global_zero:
            return
        metrics = self._meter.compute("epoch")
        self._meter.mark("epoch")
        self._meter.mark("step")
        self._log(trainer, metrics, self.epoch_prefix)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero and self._meter is not None and self._meter.latest.ranks:
            log_link_table(trainer.loggers, f"{self.prefix}/links", self.summary())
        if trainer.is_global_zero:
            log_auto_table(trainer.loggers, f"{self.prefix}/auto", self._auto)

    # ------------------------------------------------------------------ results

    def summary(self) -> dict[str, Any]:
        """The whole training run up to the last log or epoch end, as plain data (rank 0 only).

        Keys: ``batches``, ``samples``, ``train_seconds``, ``wall_seconds``, throughput and
        ratios, ``bytes`` (all links), ``links`` (per link: ``codec``, ``messages``,
        ``bytes_sent``, ``bytes_received``, ``raw_bytes``, ``ratio``, ``bandwidth_avg``,
        ``bandwidth_peak`` in bytes/s), ``stages`` and ``ranks`` (compute, wait, bubble),
        ``compressors``, ``auto`` (``compressor="auto"``'s decisions: dicts of step, link,
        codec, ratio, bandwidth, predicted and baseline ms, error, reason).
        """
        if self._meter is None or not self._meter.latest.ranks:
            raise RuntimeError(
                "EPipeMonitor has no measurements: only rank 0 gathers them, from the first logged step or epoch"
                " end of `trainer.fit` on. Call summary() after fit, under `if trainer.is_global_zero:`"
            )
        out = self._meter.summary()
        for label, link in out["links"].items():
            names = self._codecs.get(link["kind"], [])
            codecs = sorted({names[c] for c in link["cuts"] if c < len(names)})
            link["codec"] = "raw" if link["kind"] == "input" else "/".join(codecs) or "?"
        out["compressors"] = self._codecs
        out["auto"] = [dict(zip(AUTO_COLUMNS, row)) for row in auto_rows(self._auto)]
        return out

    def format_summary(self) -> str:
        """:meth:`summary` as a text table, for a script to print at the end."""
        return format_summary(self.summary())
