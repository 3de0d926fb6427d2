"""Every example config parses with its LightningCLI and cuts the model into stages that fit."""

import inspect
import sys

import pytest
import yaml
from transformers import RobertaConfig

from examples.common import run_cli
from examples.mobilenet.model import mobilenet_layers
from tests.examples.helpers import ALL_CONFIGS, config_id, epipe_available, load_yaml, uses_epipe

EPIPE_CONFIGS = [case for case in ALL_CONFIGS if uses_epipe(load_yaml(case[1]))]

# The constructor arguments the brief fixed for EPipeStrategy; the class itself decides once it imports.
_PLANNED_STRATEGY_ARGS = {
    "chunks", "compressor", "bits", "balance", "pipeline", "placement", "activation_compressor",
    "gradient_compressor", "compressor_kwargs", "timeout", "start_method",
}


def _full_size_children(example: str, config: dict) -> int:
    """Children of the full-size ``layers`` the config trains (not the tiny offline stand-in)."""
    if example == "mobilenet":
        return len(mobilenet_layers(num_classes=10))
    if example == "roberta":  # embeddings, one per encoder layer of roberta-base, head
        return RobertaConfig().num_hidden_layers + 2
    return config["model"]["depth"]


@pytest.mark.parametrize("case", ALL_CONFIGS, ids=config_id)
def test_config_parses_and_instantiates(case, tmp_path, monkeypatch):
    example, path = case
    config = load_yaml(path)
    if uses_epipe(config) and not epipe_available():
        config["trainer"]["strategy"] = "auto"  # check the rest now; the strategy part once it lands
        path = tmp_path / path.name
        path.write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main.py"])

    cli = run_cli(example.model_class, example.datamodule_class, ["--config", str(path), *example.offline_args], run=False)

    assert isinstance(cli.model, example.model_class)
    assert cli.model.hparams.num_classes == cli.datamodule.num_classes
    if uses_epipe(config):
        assert type(cli.trainer.strategy).__name__ == "EPipeStrategy"


@pytest.mark.parametrize("case", EPIPE_CONFIGS, ids=config_id)
def test_balance_fits_the_model_and_the_processes(case):
    example, path = case
    config = load_yaml(path)
    init_args = config["trainer"]["strategy"]["init_args"]
    devices = config["trainer"]["devices"]
    stages = devices + 1 if init_args.get("placement", "client-server") == "client-server" else devices

    assert len(init_args["balance"]) == stages
    assert sum(init_args["balance"]) == _full_size_children(example.name, config)


@pytest.mark.parametrize("case", EPIPE_CONFIGS, ids=config_id)
def test_strategy_arguments_exist(case):
    init_args = load_yaml(case[1])["trainer"]["strategy"]["init_args"]
    if epipe_available():
        from lightning_epipe import EPipeStrategy

        known = set(inspect.signature(EPipeStrategy).parameters)
    else:
        known = _PLANNED_STRATEGY_ARGS
    assert set(init_args) <= known
