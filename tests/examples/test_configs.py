"""Every example config parses with its LightningCLI and cuts the model into stages that fit."""

import sys

import pytest
from transformers import RobertaConfig

from examples.common import run_cli
from examples.digits.data import DigitsDataModule
from examples.digits.model import DigitsClassifier
from examples.mobilenet.model import mobilenet_layers
from lightning_epipe.callbacks import EPipeMonitor
from tests.examples.helpers import ALL_CONFIGS, config_id, load_yaml, uses_epipe

EPIPE_CONFIGS = [case for case in ALL_CONFIGS if uses_epipe(load_yaml(case[1]))]


def _full_size_children(example: str, config: dict) -> int:
    """Children of the full-size ``layers`` the config trains (not the tiny offline stand-in)."""
    if example == "mobilenet":
        return len(mobilenet_layers(num_classes=10))
    if example == "roberta":  # embeddings, one per encoder layer of roberta-base, head
        return RobertaConfig().num_hidden_layers + 2
    return config["model"]["depth"]


@pytest.mark.parametrize("case", ALL_CONFIGS, ids=config_id)
def test_config_parses_and_instantiates(case, tmp_path, monkeypatch):
    """The CLI builds the trainer, its strategy (which checks the compressor arguments), the
    model and the data from the config, with the offline stand-ins for downloads."""
    example, path = case
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main.py"])

    args = ["--config", str(path), *example.offline_args]
    cli = run_cli(example.model_class, example.datamodule_class, args, run=False)

    assert isinstance(cli.model, example.model_class)
    assert cli.model.hparams.num_classes == cli.datamodule.num_classes
    monitors = [c for c in cli.trainer.callbacks if isinstance(c, EPipeMonitor)]
    if uses_epipe(load_yaml(path)):
        assert type(cli.trainer.strategy).__name__ == "EPipeStrategy"
        assert len(monitors) == 1  # every pipelined run logs EPipe's metrics
    else:
        assert monitors == []  # nothing to measure without the pipeline


@pytest.mark.parametrize(("args", "monitors"), [([], 1), (["--trainer.callbacks=[]"], 0)])
def test_cli_adds_the_monitor_unless_removed(args, monitors, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    cli = run_cli(DigitsClassifier, DigitsDataModule, args, run=False)
    assert sum(isinstance(c, EPipeMonitor) for c in cli.trainer.callbacks) == monitors


@pytest.mark.parametrize("case", EPIPE_CONFIGS, ids=config_id)
def test_balance_fits_the_model_and_the_processes(case):
    example, path = case
    config = load_yaml(path)
    init_args = config["trainer"]["strategy"]["init_args"]
    devices = config["trainer"]["devices"]
    stages = devices + 1 if init_args.get("placement", "client-server") == "client-server" else devices

    assert len(init_args["balance"]) == stages
    assert sum(init_args["balance"]) == _full_size_children(example.name, config)
