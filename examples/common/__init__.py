"""Pieces every example shares: the classifier, the data module, the schedule, the CLI."""

from examples.common.classifier import SequentialClassifier
from examples.common.cli import ExampleCLI, run_cli
from examples.common.data import ClassificationDataModule, PairDataset
from examples.common.schedule import warmup_decay

__all__ = [
    "ClassificationDataModule",
    "ExampleCLI",
    "PairDataset",
    "SequentialClassifier",
    "run_cli",
    "warmup_decay",
]
