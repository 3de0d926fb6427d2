"""What the transformer examples share: their metrics and their fine-tuning optimizer."""

import lightning as L
import torch
from torchmetrics import Accuracy, MatthewsCorrCoef, MetricCollection

from examples.common.schedule import warmup_decay


def accuracy_and_mcc(num_classes: int) -> MetricCollection:
    """``{"acc": Accuracy, "mcc": MatthewsCorrCoef}`` for ``num_classes`` classes (the report's)."""
    return MetricCollection(
        {
            "acc": Accuracy(task="multiclass", num_classes=num_classes),
            "mcc": MatthewsCorrCoef(task="multiclass", num_classes=num_classes),
        }
    )


def adamw_warmup_decay(module: L.LightningModule) -> dict:
    """AdamW (``hparams.lr``, ``hparams.weight_decay``) with a linear warm-up over
    ``hparams.warmup_ratio`` of the optimizer steps, then linear decay to 0; stepped per step."""
    hp = module.hparams
    optimizer = torch.optim.AdamW(module.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
    total = module.trainer.estimated_stepping_batches
    schedule = warmup_decay(optimizer, int(hp.warmup_ratio * total), total, decay="linear")
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
