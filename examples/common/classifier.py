"""The LightningModule the examples subclass: ``layers`` is the pipeline, the rest is plain Lightning."""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MetricCollection

from examples.common.data import Inputs

Batch = tuple[Inputs, torch.Tensor]


class SequentialClassifier(L.LightningModule):
    """A classifier whose whole network is one ``nn.Sequential`` named ``layers``.

    This is the user contract of ``EPipeStrategy``: each step calls ``self.layers(inputs)``
    exactly once on the full batch and computes the loss and the metrics on the full output.
    Subclasses build ``layers`` and ``configure_optimizers``; nothing here knows about pipelines.

    Batches are ``(inputs, labels)``: ``inputs`` is what ``layers`` takes (a Tensor or a tuple
    of Tensors, batch first), ``labels`` int64 ``[B]``; ``layers`` returns logits ``[B, C]``.
    Logs ``train_loss``, ``val_loss``, ``test_loss`` and ``val_<metric>``/``test_<metric>`` for
    each entry of ``metrics``.

    Example:
        >>> from torchmetrics import Accuracy
        >>> accuracy = Accuracy(task="multiclass", num_classes=3)
        >>> model = SequentialClassifier(nn.Sequential(nn.Linear(4, 3)), MetricCollection({"acc": accuracy}))
        >>> model.layers(torch.zeros(2, 4)).shape
        torch.Size([2, 3])
    """

    def __init__(self, layers: nn.Sequential, metrics: MetricCollection) -> None:
        super().__init__()
        self.layers = layers
        self.val_metrics = metrics.clone(prefix="val_")
        self.test_metrics = metrics.clone(prefix="test_")

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        inputs, labels = batch
        loss = F.cross_entropy(self.layers(inputs), labels)
        self.log("train_loss", loss, prog_bar=True, batch_size=labels.shape[0])
        return loss

    def pipeline_loss(self, output: torch.Tensor, batch: Batch) -> torch.Tensor:
        """One micro-batch's mean loss: what ``EPipeStrategy(schedule="1f1b")`` backpropagates."""
        return F.cross_entropy(output, batch[1])

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_metrics)

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_metrics)

    def predict_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        """Predicted class ids ``[B]``."""
        inputs, _ = batch
        return self.layers(inputs).argmax(dim=-1)

    def _evaluate(self, batch: Batch, stage: str, metrics: MetricCollection) -> None:
        inputs, labels = batch
        logits = self.layers(inputs)
        batch_size = labels.shape[0]
        loss = F.cross_entropy(logits, labels)
        self.log(f"{stage}_loss", loss, prog_bar=True, sync_dist=True, batch_size=batch_size)
        metrics.update(logits, labels)
        self.log_dict(metrics, prog_bar=True, batch_size=batch_size)
