"""RoBERTa fine-tuned for sentence classification, its network one ``nn.Sequential``."""

import torch  # noqa: F401  (for the doctest below)
from transformers import RobertaConfig, RobertaForSequenceClassification

from examples.common import SequentialClassifier
from examples.common.finetune import accuracy_and_mcc, adamw_warmup_decay
from examples.roberta.layers import roberta_layers


def tiny_config(num_labels: int) -> RobertaConfig:
    """A 4-layer, 64-wide RoBERTa with roberta-base's vocabulary and positions, for offline runs."""
    return RobertaConfig(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=514,
        type_vocab_size=1,
        num_labels=num_labels,
    )


class RobertaClassifier(SequentialClassifier):
    """RoBERTa on GLUE: AdamW, linear warm-up and decay; logs accuracy and Matthews correlation.

    ``layers`` takes ``(input_ids [B, T], attention_mask [B, T])`` and returns logits
    ``[B, num_classes]`` (see ``roberta_layers``).

    Args:
        num_classes: set from the data module by the CLI.
        model_name: the checkpoint ``from_pretrained`` loads (a download).
        tiny: build ``tiny_config`` with random weights instead: no download at all.
        lr, weight_decay: of AdamW (the report: 2e-5 at batch 32, 4e-5 at batch 64).
        warmup_ratio: share of the optimizer steps spent warming up.

    Example:
        >>> model = RobertaClassifier(tiny=True)
        >>> ids = torch.randint(3, 1000, (2, 16))
        >>> model.layers((ids, torch.ones_like(ids))).shape
        torch.Size([2, 2])
    """

    def __init__(
        self,
        num_classes: int = 2,
        model_name: str = "roberta-base",
        tiny: bool = False,
        lr: float = 2e-5,
        weight_decay: float = 0.0,
        warmup_ratio: float = 0.06,
    ) -> None:
        if tiny:
            network = RobertaForSequenceClassification(tiny_config(num_classes))
        else:
            network = RobertaForSequenceClassification.from_pretrained(model_name, num_labels=num_classes)
        super().__init__(roberta_layers(network), accuracy_and_mcc(num_classes))
        self.save_hyperparameters()

    def configure_optimizers(self) -> dict:
        return adamw_warmup_decay(self)
