"""Each example trains a step in one process on generated data, and the digits MLP learns."""

import sys

import lightning as L
import pytest
import torch

from examples.common import run_cli
from examples.digits.data import DigitsDataModule
from examples.digits.model import DigitsClassifier
from examples.mobilenet.data import ImageDataModule
from examples.mobilenet.model import MobileNetClassifier
from examples.roberta.data import GlueDataModule
from examples.roberta.model import RobertaClassifier
from tests.examples.helpers import EXAMPLES_DIR


def _trainer(**kwargs) -> L.Trainer:
    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return L.Trainer(accelerator="cpu", devices=1, **quiet, **kwargs)


def _fit_and_test_one_batch(model: L.LightningModule, datamodule: L.LightningDataModule) -> set[str]:
    """The names of what ``fit`` and then ``test`` logged, one batch each."""
    trainer = _trainer(fast_dev_run=True)
    trainer.fit(model, datamodule)
    logged = set(trainer.callback_metrics)
    trainer.test(model, datamodule, verbose=False)
    return logged | set(trainer.callback_metrics)


@pytest.mark.parametrize("dataset", ["cifar10", "food101"])
def test_mobilenet_fast_dev_run(dataset):
    data = ImageDataModule(dataset, batch_size=4, num_workers=0, image_size=32, synthetic=True, synthetic_size=8)
    logged = _fit_and_test_one_batch(MobileNetClassifier(num_classes=data.num_classes), data)
    assert {"train_loss", "val_loss", "val_acc", "test_loss", "test_acc"} <= logged


@pytest.mark.parametrize("task", ["rte", "cola"])
def test_roberta_fast_dev_run(task):
    data = GlueDataModule(task, max_length=32, batch_size=4, num_workers=0, synthetic=True, synthetic_size=8)
    logged = _fit_and_test_one_batch(RobertaClassifier(num_classes=data.num_classes, tiny=True), data)
    assert {"train_loss", "val_loss", "val_acc", "val_mcc", "test_acc", "test_mcc"} <= logged


def test_digits_reaches_90_percent_test_accuracy():
    L.seed_everything(0)
    model, data = DigitsClassifier(), DigitsDataModule()
    trainer = _trainer(max_epochs=10)
    trainer.fit(model, data)
    assert {"train_loss", "val_loss", "val_acc"} <= set(trainer.callback_metrics)

    (result,) = trainer.test(model, data, verbose=False)
    assert result["test_acc"] > 0.9


def test_digits_cli_fits_from_its_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["main.py"])
    config = EXAMPLES_DIR / "digits" / "configs" / "digits.yaml"
    cli = run_cli(
        DigitsClassifier, DigitsDataModule, ["fit", "--config", str(config), "--trainer.fast_dev_run=true"]
    )
    assert cli.trainer.state.finished


def test_predict_returns_one_class_per_sample():
    data = DigitsDataModule(batch_size=100)
    data.setup("predict")
    batches = _trainer().predict(DigitsClassifier(), dataloaders=data.test_dataloader())
    assert [tuple(b.shape) for b in batches] == [(100,), (100,), (100,)]
    assert all(int(b.min()) >= 0 and int(b.max()) < 10 for b in batches)


@pytest.mark.parametrize("task, columns", [("rte", ("sentence1", "sentence2")), ("cola", ("sentence",))])
def test_glue_encoding_feeds_the_task_columns_to_the_tokenizer(task, columns):
    """The real path without a download: a stand-in tokenizer records what it was given."""
    from datasets import Dataset

    seen = []

    def tokenizer(*texts, truncation, padding, max_length, return_tensors):
        seen.append(texts)
        ones = torch.ones(len(texts[0]), max_length, dtype=torch.long)
        return {"input_ids": ones, "attention_mask": ones}

    split = Dataset.from_dict({**{c: [f"{c} a", f"{c} b"] for c in columns}, "label": [1, 0], "idx": [0, 1]})
    (input_ids, attention_mask), label = GlueDataModule(task, max_length=8)._encode(split, tokenizer)[0]

    assert seen == [tuple([f"{c} a", f"{c} b"] for c in columns)]
    assert input_ids.shape == attention_mask.shape == (8,) and int(label) == 1


@pytest.mark.parametrize("cores, expected", [(1, 2), (2, 2), (3, 3), (64, 3)])
def test_main_job_runs_one_process_per_core_two_to_three(monkeypatch, cores, expected):
    from examples.digits import demo
    from lightning_epipe.strategy import launch

    monkeypatch.setattr(launch, "usable_cores", lambda: cores)
    assert demo.default_devices() == expected
