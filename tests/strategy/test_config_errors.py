"""Bad configurations fail in the launching process, before any other rank starts."""

from __future__ import annotations

import warnings
from datetime import timedelta

import lightning as L
import pytest
from lightning.pytorch.strategies import StrategyRegistry
from torch import nn

from lightning_epipe import EPipeStrategy
from tests.strategy.scenario import TinyNet, loader


def _fit(model, devices=3, **strategy_kwargs):
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=EPipeStrategy(**strategy_kwargs),
                        logger=False, enable_progress_bar=False, enable_model_summary=False, max_steps=1)
    trainer.fit(model, loader(16))


class NoSequential(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(compressor="zip"), "zip"),
        (dict(compressor="sortquant", bits=1), "bits"),
        (dict(compressor="sortquant", bits=8, compressor_kwargs={"split": 8}), "split"),
        (dict(chunks=0), "chunks must be a positive integer"),
        (dict(placement="ring"), "placement must be one of"),
        (dict(nonfinite="ignore"), "nonfinite"),
        (dict(timeout=5), "timedelta"),
        (dict(balance="memory"), "balance must be"),
        (dict(error_feedback="gradient"), "error_feedback must be True or False"),
        (dict(start_ahead="yes"), "start_ahead must be True or False"),
        (dict(split_backward="always"), "split_backward must be True, False or 'auto'"),
        (dict(replicas=0), "replicas must be a positive integer"),
        (dict(schedule="interleaved"), "schedule must be 'gpipe' or '1f1b'"),
        (dict(compressor="bottleneck", compressor_kwargs={"ratio": 2}), "ratio must be a number in"),
        (dict(compressor="bottleneck", compressor_kwargs={"wire": "zip"}), "unknown compressor 'zip'"),
        (dict(gradient_compressor="bottleneck"), "a bottleneck is a pair of layers on the activation's path"),
    ],
)
def test_bad_arguments_raise_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EPipeStrategy(**kwargs)


def test_module_without_sequential():
    with pytest.raises(ValueError, match="no nn.Sequential child"):
        _fit(NoSequential())


def test_balance_that_does_not_add_up():
    with pytest.raises(ValueError, match=r"Sequential: 8, sum of balance: 7"):
        _fit(TinyNet(), balance=[1, 2, 3, 1])


def test_balance_with_the_wrong_number_of_stages():
    with pytest.raises(ValueError, match="form 4 stages: give 4 numbers"):
        _fit(TinyNet(), balance=[4, 4])


def test_more_stages_than_layers():
    with pytest.raises(ValueError, match="need 9 stages but TinyNet's Sequential has only 8 layers"):
        _fit(TinyNet(), devices=8)


def test_one_process():
    with pytest.raises(ValueError, match="at least 2 processes"):
        _fit(TinyNet(), devices=1)


def test_per_cut_compressor_list_must_match_cuts():
    with pytest.raises(ValueError, match="lists 2 compressors but the pipeline has 3 cuts"):
        _fit(TinyNet(), compressor=["none", "fp16"])


def test_registry_name_and_defaults():
    assert "epipe" in StrategyRegistry
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="epipe", logger=False)
    assert isinstance(trainer.strategy, EPipeStrategy)
    assert trainer.strategy.chunks == 4


def test_nccl_on_cpu_is_refused_before_launch():
    with pytest.raises(ValueError, match="process_group_backend='nccl' needs CUDA devices"):
        L.Trainer(accelerator="cpu", devices=2, strategy=EPipeStrategy(process_group_backend="nccl"), logger=False)


def test_timeout_is_kept():
    assert EPipeStrategy(timeout=timedelta(seconds=7)).config.timeout == timedelta(seconds=7)


def test_lightning_cli_builds_the_strategy(tmp_path):
    from lightning.pytorch.cli import LightningCLI

    cli = LightningCLI(
        TinyNet, run=False, save_config_callback=None,
        args=["--trainer.accelerator=cpu", "--trainer.devices=3", "--trainer.logger=false",
              "--trainer.strategy=lightning_epipe.EPipeStrategy", "--trainer.strategy.chunks=8",
              "--trainer.strategy.compressor=sortquant", "--trainer.strategy.bits=8"],
    )
    strategy = cli.trainer.strategy
    assert isinstance(strategy, EPipeStrategy) and strategy.chunks == 8
    assert strategy.config.compressor == "sortquant" and strategy.config.compressor_kwargs["bits"] == 8


def test_bottleneck_without_example_input_is_refused_before_launch():
    with pytest.raises(ValueError, match=r"bottleneck of cuts \[0, 1, 2\].*example_input_array"):
        _fit(TinyNet(), compressor="bottleneck")


def test_processes_that_do_not_split_into_replicas():
    with pytest.raises(ValueError, match="3 processes do not split into replicas=2 pipelines"):
        _fit(TinyNet(), devices=3, replicas=2)


def test_1f1b_needs_a_loss_per_micro_batch():
    with pytest.raises(ValueError, match=r"define `def pipeline_loss\(self, output, batch\)` on NoLoss"):
        _fit(type("NoLoss", (TinyNet,), {"pipeline_loss": None})(), schedule="1f1b")


def test_1f1b_needs_automatic_optimization():
    with pytest.raises(ValueError, match="runs with automatic optimization"):
        _fit(TinyNet(manual=True), schedule="1f1b")


@pytest.mark.parametrize("cores, warned", [(1, True), (2, False), (8, False)])
def test_more_cpu_processes_than_cores_warns_before_launch(monkeypatch, cores, warned):
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

    from lightning_epipe.strategy import launch

    launched = []
    monkeypatch.setattr(launch, "usable_cores", lambda: cores)
    monkeypatch.setattr(_SubprocessScriptLauncher, "launch", lambda self, fn, *args, **kwargs: launched.append(fn))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _fit(TinyNet(), devices=2)
    messages = [str(w.message) for w in record if "CPU cores" in str(w.message)]
    assert launched, "the launcher ran after the check"
    assert bool(messages) == warned
    if warned:
        assert "2 pipeline processes on this machine share 1 CPU cores" in messages[0]
        assert "Trainer(devices=1)" in messages[0]


def test_more_processes_than_cores_message():
    from lightning_epipe.strategy.launch import more_processes_than_cores

    assert more_processes_than_cores(2, 2) is None
    assert "3 pipeline processes on this machine share 2 CPU cores" in more_processes_than_cores(3, 2)
