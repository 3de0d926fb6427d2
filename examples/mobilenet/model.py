"""MobileNetV2 rearranged into one ``nn.Sequential`` of 20 children, ready to be cut."""

import torch
from torch import nn
from torchmetrics import Accuracy, MetricCollection
from torchvision.models import MobileNet_V2_Weights, mobilenet_v2

from examples.common import SequentialClassifier, warmup_decay


def mobilenet_layers(num_classes: int, pretrained: bool = False, dropout: float = 0.2) -> nn.Sequential:
    """torchvision's MobileNetV2 as ``Sequential(features[0], ..., features[18], head)``.

    Children 0-18 are ``features[0..18]`` (child i is ``features[i]``), child 19 the head
    (pool, flatten, dropout, linear), so a ``balance`` counts feature blocks directly. At
    224x224 the activations at the report's cuts are ``features[0]`` -> ``[B, 32, 112, 112]``,
    ``features[2]`` -> ``[B, 24, 56, 56]``, ``features[6]`` -> ``[B, 32, 28, 28]``,
    ``features[18]`` -> ``[B, 1280, 7, 7]``; the head returns logits ``[B, num_classes]``.

    ``pretrained`` loads torchvision's ImageNet weights (a download); the classifier's
    last Linear is always new.
    """
    weights = MobileNet_V2_Weights.IMAGENET1K_V1 if pretrained else None
    net = mobilenet_v2(weights=weights, dropout=dropout)
    head = nn.Sequential(
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(1),
        net.classifier[0],
        nn.Linear(net.last_channel, num_classes),
    )
    return nn.Sequential(*net.features, head)


class MobileNetClassifier(SequentialClassifier):
    """MobileNetV2 classifier trained the report's way: SGD, momentum, cosine schedule with warm-up.

    Args:
        num_classes: set from the data module by the CLI.
        pretrained: start from torchvision's ImageNet weights (the report fine-tunes them).
        dropout: before the last Linear.
        lr: peak learning rate (the report: 0.005 at batch 64, 0.02 at batch 256).
        momentum, weight_decay: of SGD.
        warmup_epochs: linear warm-up before the cosine decay over ``trainer.max_epochs``.

    Example:
        >>> model = MobileNetClassifier(num_classes=10)
        >>> model.layers(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        num_classes: int = 10,
        pretrained: bool = False,
        dropout: float = 0.2,
        lr: float = 0.02,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        warmup_epochs: int = 4,
    ) -> None:
        metrics = MetricCollection({"acc": Accuracy(task="multiclass", num_classes=num_classes)})
        super().__init__(mobilenet_layers(num_classes, pretrained, dropout), metrics)
        self.save_hyperparameters()

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.SGD(
            self.parameters(),
            lr=self.hparams.lr,
            momentum=self.hparams.momentum,
            weight_decay=self.hparams.weight_decay,
        )
        warmup = min(self.hparams.warmup_epochs, self.trainer.max_epochs - 1)
        schedule = warmup_decay(optimizer, warmup, self.trainer.max_epochs, decay="cosine")
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "epoch"}}
