"""A deep, wide MLP for the digits: enough children to cut, wide enough to be worth compressing."""

import torch
from torch import nn
from torchmetrics import Accuracy, MetricCollection

from examples.common import SequentialClassifier


def digits_layers(num_classes: int = 10, hidden: int = 256, depth: int = 7, in_features: int = 64) -> nn.Sequential:
    """``depth`` children: ``depth - 1`` blocks ``Linear + ReLU`` (``[B, 64] -> [B, hidden] -> ...``)
    and a last ``Linear`` to logits ``[B, num_classes]``; every cut carries ``[B, hidden]`` floats.
    """
    if depth < 2:
        raise ValueError(f"depth counts the blocks and the output layer: at least 2 (depth: {depth})")
    widths = [in_features] + [hidden] * (depth - 1)
    blocks = [nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(widths[:-1], widths[1:])]
    return nn.Sequential(*blocks, nn.Linear(hidden, num_classes))


class DigitsClassifier(SequentialClassifier):
    """The digits MLP trained with Adam; reaches >90% test accuracy in a few epochs on a CPU.

    Example:
        >>> model = DigitsClassifier()
        >>> len(model.layers), model.layers(torch.zeros(2, 64)).shape
        (7, torch.Size([2, 10]))
    """

    def __init__(self, num_classes: int = 10, hidden: int = 256, depth: int = 7, lr: float = 1e-3) -> None:
        metrics = MetricCollection({"acc": Accuracy(task="multiclass", num_classes=num_classes)})
        super().__init__(digits_layers(num_classes, hidden, depth), metrics)
        self.save_hyperparameters()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
