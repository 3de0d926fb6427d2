"""EPipeMonitor's hooks with mocked collaborators: no processes, a patched clock."""

from __future__ import annotations

from unittest import mock

import lightning as L
import pytest
import torch
from torch import nn
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_epipe import EPipeStrategy
from lightning_epipe.callbacks import EPipeMonitor
from lightning_epipe.strategy import plan_pipeline
from lightning_epipe.strategy.assembly import RankAssembly
from lightning_epipe.strategy.engine.stats import LinkKey, PipelineStats

PLAN = plan_pipeline(4, 2, [1, 2, 1])  # ranks (0, 1, 0)


def test_without_epipe_strategy_the_error_names_the_fix():
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[EPipeMonitor()],
    )
    with pytest.raises(MisconfigurationException, match=r"uses SingleDeviceStrategy: pass `Trainer\(strategy=EPipeStrategy"):
        trainer.fit(BoringModel())


def test_summary_before_any_measurement_says_when_it_is_available():
    with pytest.raises(RuntimeError, match="after fit, under `if trainer.is_global_zero:`"):
        EPipeMonitor().summary()


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Run:
    """A 2-rank pipeline seen from one rank: a real (unlaunched) EPipeStrategy, a mocked Trainer."""

    def __init__(self, rank: int, log_every: int = 2) -> None:
        self.strategy = EPipeStrategy(parallel_devices=[torch.device("cpu")] * 2)
        self.strategy._assembly = RankAssembly(PLAN, "layers", nn.Sequential(), self.strategy.config.codec_book(PLAN.num_cuts))
        self.trainer = mock.MagicMock()
        self.trainer.strategy = self.strategy
        self.trainer.is_global_zero = rank == 0
        self.trainer.log_every_n_steps = log_every
        self.trainer.fit_loop._should_accumulate.return_value = False
        self.trainer.fit_loop.epoch_loop._batches_that_stepped = 0
        self.trainer.sanity_checking = False
        self.trainer.fast_dev_run = False
        self.module = mock.MagicMock(automatic_optimization=True)
        self.server = PipelineStats()  # what the gather brings from rank 1
        self.gathers = 0
        self.monitor = EPipeMonitor()

    def gather(self, local, links, plan, rank, world_size, device):
        self.gathers += 1
        return {0: local, 1: self.server} if self.trainer.is_global_zero else None

    def batch(self, clock: Clock, seconds: float, rows: int = 32) -> None:
        idx = self.trainer.fit_loop.epoch_loop._batches_that_stepped
        self.monitor.on_train_batch_start(self.trainer, self.module, None, idx)
        if self.trainer.is_global_zero:
            self.strategy.stats.samples += rows
            self.strategy.stats.link(LinkKey("send", 1, "activation")).add(1000, 4000)
            self.strategy.stats.add_compute(0, seconds / 4)
        self.server.link(LinkKey("recv", 0, "activation")).add(1000, 4000, seconds=0.001)
        clock.now += seconds
        self.monitor.on_train_batch_end(self.trainer, self.module, None, None, idx)
        self.trainer.fit_loop.epoch_loop._batches_that_stepped += 1

    def logged(self) -> list[dict[str, float]]:
        return [c.args[0] for c in self.trainer._logger_connector.log_metrics.call_args_list]


def drive(run: Run) -> None:
    """4 batches of 1 s, 3 s of validation after the second, then the epoch end."""
    clock = Clock()
    with mock.patch("lightning_epipe.callbacks.monitor.gather_stats", run.gather), \
            mock.patch("time.perf_counter", clock):
        run.monitor.on_train_start(run.trainer, run.module)
        run.batch(clock, 1.0)
        run.batch(clock, 1.0)  # logged: 2 batches in 2 s
        run.monitor.on_validation_start(run.trainer, run.module)
        clock.now += 3.0
        run.monitor.on_validation_end(run.trainer, run.module)
        run.batch(clock, 1.0)
        run.batch(clock, 1.0)  # logged: 2 batches in 2 s of training, 5 s of wall time
        clock.now += 1.0
        run.monitor.on_train_epoch_end(run.trainer, run.module)


def test_client_logs_windows_since_the_previous_log_and_the_epoch():
    run = Run(rank=0)
    drive(run)
    first, second, epoch = run.logged()
    assert first["epipe/throughput_samples_per_s"] == 32.0 and first["epipe/throughput_batches_per_s"] == 1.0
    assert first["epipe/bytes/activation/0->1"] == 2000 and first["epipe/compute_s"] == 0.5
    assert first["epipe/bandwidth_avg/activation/0->1"] == 2000 / 0.5  # over the computation time
    assert first["epipe/bandwidth_wall/activation/0->1"] == 1000.0
    assert first["epipe/ratio/activation/cut0"] == 0.25 and first["epipe/ratio"] == 0.25
    assert first["epipe/bandwidth_peak/activation/0->1"] == pytest.approx(1e6)  # the server's receive timing
    assert second["epipe/throughput_samples_per_s"] == 32.0  # validation left out
    assert second["epipe/bandwidth_wall/activation/0->1"] == pytest.approx(2000 / 5.0)  # but not from the wall time
    assert second["epipe/bandwidth_avg/activation/0->1"] == pytest.approx(2000 / 0.5)  # nor from the computation
    assert epoch["epipe_epoch/throughput_samples_per_s"] == pytest.approx(128 / 5.0)
    assert epoch["epipe_epoch/bytes/activation/0->1"] == 4000
    assert epoch["epipe_epoch/stage0/compute_s"] == pytest.approx(1.0)
    assert all(k.startswith("epipe_epoch/") for k in epoch)
    bar = {c.args[0]: c.args[1] for c in run.module.log.call_args_list}
    assert bar == {"samples/s": 32.0, "wire/raw": 0.25}
    assert all(c.kwargs["prog_bar"] and not c.kwargs["logger"] for c in run.module.log.call_args_list)
    summary = run.monitor.summary()
    assert (summary["batches"], summary["samples"], summary["train_seconds"], summary["wall_seconds"]) == (4, 128, 5.0, 8.0)
    assert summary["links"]["activation/0->1"]["codec"] == "none"


def test_servers_join_every_gather_and_log_nothing():
    client, server = Run(rank=0), Run(rank=1)
    drive(client)
    drive(server)
    assert server.gathers == client.gathers == 3
    assert server.logged() == [] and not server.module.log.called


@pytest.mark.parametrize(
    ("log_every", "stepped", "accumulating", "automatic", "expected"),
    [
        (2, 1, False, True, True),
        (2, 0, False, True, False),
        (0, 1, False, True, False),  # log_every_n_steps=0 turns step logging off
        (2, 1, True, True, False),  # in the middle of gradient accumulation
        (2, 1, True, False, True),  # manual optimization logs regardless
    ],
)
def test_step_gathers_follow_lightnings_log_steps(log_every, stepped, accumulating, automatic, expected):
    run = Run(rank=0, log_every=log_every)
    run.trainer.fit_loop.epoch_loop._batches_that_stepped = stepped
    run.trainer.fit_loop._should_accumulate.return_value = accumulating
    run.module.automatic_optimization = automatic
    assert EPipeMonitor._should_log_step(run.trainer, run.module) is expected


def test_batch_size_fn_overrides_the_strategys_row_count():
    run = Run(rank=0)
    run.monitor = EPipeMonitor(batch_size_fn=lambda batch: 10)
    drive(run)
    assert run.monitor.summary()["samples"] == 40


def test_auto_decisions_are_logged_at_their_step_and_as_a_wandb_table():
    from lightning.pytorch.loggers import WandbLogger

    from lightning_epipe.strategy.compression.auto_choice import LinkChoice
    from lightning_epipe.strategy.compression.auto_tuner import AutoTuner

    run = Run(rank=0, log_every=100)
    run.strategy._tuner = AutoTuner()
    wandb = mock.MagicMock(spec=WandbLogger)
    run.trainer.loggers = [wandb]
    fp16 = LinkChoice(0, "activation", "fp16", "fp16", {}, 1e-3, 2e-3, 1e-4, "fp16 is faster", ratio=0.5, bandwidth=3e6)
    none = LinkChoice(1, "gradient", "none", "none", {}, 1e-3, 1e-3, 0.0, "unlimited", ratio=1.0, bandwidth=float("inf"))
    clock = Clock()
    with mock.patch("lightning_epipe.callbacks.monitor.gather_stats", run.gather), mock.patch("time.perf_counter", clock):
        run.monitor.on_train_start(run.trainer, run.module)
        run.batch(clock, 1.0)
        assert run.logged() == []  # no decision yet, no log step
        run.strategy._tuner.history += [(1, fp16), (1, none)]
        run.batch(clock, 1.0)
        run.batch(clock, 1.0)  # logged once only
        run.monitor.on_train_epoch_end(run.trainer, run.module)
        run.monitor.on_train_end(run.trainer, run.module)
    auto = [m for m in run.logged() if any(k.startswith("epipe/auto/") for k in m)]
    assert auto == [{"epipe/auto/activation/cut0": 0.5, "epipe/auto/activation/cut0/bandwidth": 3e6,
                     "epipe/auto/gradient/cut1": 1.0}]
    table = [c for c in wandb.log_table.call_args_list if c.args[0] == "epipe/auto"]
    assert len(table) == 1 and [row[-1] for row in table[0].kwargs["data"]] == ["fp16 is faster", "unlimited"]
    assert [d["codec"] for d in run.monitor.summary()["auto"]] == ["fp16", "none"]


def test_without_auto_nothing_about_auto_is_logged():
    run = Run(rank=0)
    drive(run)
    assert not any(k.startswith("epipe/auto") for m in run.logged() for k in m)
    assert run.monitor.summary()["auto"] == []
