"""RoBERTa as one ``nn.Sequential``: the embeddings, one child per encoder layer, the head.

Between children travels ``(hidden [B, T, H] float, attention_mask [B, T] int)``: the pipeline
compresses the hidden states and passes the integer mask raw; each encoder layer builds the
attention bias it needs from that mask, exactly as ``RobertaModel`` does.
"""

import torch
from torch import nn
from transformers import RobertaConfig, RobertaForSequenceClassification
from transformers.masking_utils import create_bidirectional_mask

Hidden = tuple[torch.Tensor, torch.Tensor]


class Embeddings(nn.Module):
    """``(input_ids [B, T], attention_mask [B, T]) -> (hidden [B, T, H], attention_mask)``."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, inputs: Hidden) -> Hidden:
        input_ids, attention_mask = inputs
        return self.embeddings(input_ids=input_ids), attention_mask


class EncoderLayer(nn.Module):
    """``(hidden [B, T, H], attention_mask [B, T]) -> (hidden [B, T, H], attention_mask)``."""

    def __init__(self, layer: nn.Module, config: RobertaConfig) -> None:
        super().__init__()
        self.layer = layer
        self.config = config

    def forward(self, inputs: Hidden) -> Hidden:
        hidden, attention_mask = inputs
        bias = create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask)
        return self.layer(hidden, attention_mask=bias), attention_mask


class Head(nn.Module):
    """``(hidden [B, T, H], attention_mask) -> logits [B, num_labels]``, read at the ``<s>`` token."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, inputs: Hidden) -> torch.Tensor:
        hidden, _ = inputs
        return self.classifier(hidden)


def roberta_layers(model: RobertaForSequenceClassification) -> nn.Sequential:
    """``Sequential(Embeddings, EncoderLayer x num_hidden_layers, Head)`` sharing ``model``'s modules.

    Takes ``(input_ids, attention_mask)`` and returns the logits ``model`` would return; roberta-base
    gives 14 children, so a client keeping the embeddings, the first and the last encoder layer
    and the head is ``balance=[2, ..., 2]``.

    Example:
        >>> config = RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        ...                        intermediate_size=64, vocab_size=100)
        >>> layers = roberta_layers(RobertaForSequenceClassification(config))
        >>> ids = torch.randint(3, 100, (2, 8))
        >>> len(layers), layers((ids, torch.ones_like(ids))).shape
        (4, torch.Size([2, 2]))
    """
    encoder_layers = (EncoderLayer(layer, model.config) for layer in model.roberta.encoder.layer)
    return nn.Sequential(Embeddings(model.roberta.embeddings), *encoder_layers, Head(model.classifier))
