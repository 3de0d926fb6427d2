"""The examples' Sequentials compute what the original models compute, and keep the user contract."""

import pytest
import torch
from torchvision.models import mobilenet_v2
from transformers import RobertaForSequenceClassification

from examples.digits.model import digits_layers
from examples.mobilenet.model import mobilenet_layers
from examples.roberta.layers import roberta_layers
from examples.roberta.model import tiny_config


def _padded_batch(batch: int = 3, length: int = 16, vocab: int = 1000) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` [batch, length] with rows of different padded lengths."""
    generator = torch.Generator().manual_seed(0)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    attention_mask[1, 10:] = 0
    attention_mask[2, 4:] = 0
    input_ids = torch.randint(3, vocab, (batch, length), generator=generator).masked_fill(attention_mask == 0, 1)
    return input_ids, attention_mask


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_roberta_sequential_gives_the_logits_of_hugging_face(attention):
    torch.manual_seed(0)
    config = tiny_config(num_labels=2)
    config._attn_implementation = attention
    network = RobertaForSequenceClassification(config).eval()
    input_ids, attention_mask = _padded_batch()

    with torch.no_grad():
        expected = network(input_ids=input_ids, attention_mask=attention_mask).logits
        actual = roberta_layers(network)((input_ids, attention_mask))

    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6)


def test_roberta_padding_changes_nothing_at_the_real_tokens():
    network = RobertaForSequenceClassification(tiny_config(num_labels=2)).eval()
    input_ids, attention_mask = _padded_batch()
    longer_ids = torch.cat([input_ids, torch.ones(3, 8, dtype=torch.long)], dim=1)
    longer_mask = torch.cat([attention_mask, torch.zeros(3, 8, dtype=torch.long)], dim=1)

    with torch.no_grad():
        logits = roberta_layers(network)((input_ids, attention_mask))
        padded_logits = roberta_layers(network)((longer_ids, longer_mask))

    torch.testing.assert_close(padded_logits, logits, rtol=1e-5, atol=1e-5)


def test_mobilenet_sequential_gives_the_logits_of_torchvision():
    torch.manual_seed(0)
    layers = mobilenet_layers(num_classes=10).eval()
    reference = mobilenet_v2(num_classes=10).eval()
    reference.features = torch.nn.Sequential(*layers[:19])
    reference.classifier = torch.nn.Sequential(layers[19][2], layers[19][3])
    images = torch.randn(2, 3, 64, 64)

    with torch.no_grad():
        torch.testing.assert_close(layers(images), reference(images), rtol=0, atol=0)


def test_mobilenet_activations_at_the_reports_cuts():
    layers = mobilenet_layers(num_classes=10).eval()
    shapes, x = [], torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        for child in layers:
            x = child(x)
            shapes.append(tuple(x.shape[1:]))

    assert len(layers) == 20
    assert shapes[0] == (32, 112, 112)  # features[0]: the client's first cut
    assert shapes[2] == (24, 56, 56)  # after features[1:3]
    assert shapes[6] == (32, 28, 28)  # after features[3:7]
    assert shapes[18] == (1280, 7, 7)  # features[18]: back to the client
    assert shapes[19] == (10,)


def _contract_cases():
    input_ids, attention_mask = _padded_batch()
    roberta = roberta_layers(RobertaForSequenceClassification(tiny_config(num_labels=2)))
    yield pytest.param("mobilenet", mobilenet_layers(num_classes=10), torch.randn(2, 3, 32, 32), id="mobilenet")
    yield pytest.param("roberta", roberta, (input_ids, attention_mask), id="roberta")
    yield pytest.param("digits", digits_layers(), torch.randn(4, 64), id="digits")


@pytest.mark.parametrize("name, layers, inputs", list(_contract_cases()))
def test_every_child_keeps_the_contract(name, layers, inputs):
    """Each child takes its predecessor's output as a received leaf that requires grad, never
    changes it in place, and returns a Tensor or a tuple of Tensors; masks stay integers."""
    x = inputs
    for index, child in enumerate(layers):
        received = tuple(x) if isinstance(x, tuple) else (x,)
        received = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in received)
        versions = [t._version for t in received]
        x = child(received if isinstance(x, tuple) else received[0])

        outputs = x if isinstance(x, tuple) else (x,)
        assert all(isinstance(t, torch.Tensor) for t in outputs), f"{name} child {index}"
        assert [t._version for t in received] == versions, f"{name} child {index} changed its input in place"
        assert all(t.dtype in (torch.float32, torch.int64) for t in outputs), f"{name} child {index}"
    x.sum().backward()
