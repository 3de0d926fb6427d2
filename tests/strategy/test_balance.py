"""What balance='time' measures on each rank: layer times, cut bytes after compression, memory."""

from __future__ import annotations

import torch
from torch import nn

from lightning_epipe.compressors import get_compressor
from lightning_epipe.strategy.planning.layer_costs import balance_by_time, cut_nbytes, layer_memory, measure_layers


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.BatchNorm1d(64), nn.Linear(64, 4))


def test_measure_layers_times_every_layer_and_leaves_the_model_as_it_was():
    seq = net()
    before = {k: v.clone() for k, v in seq.state_dict().items()}
    x = torch.randn(16, 8)
    rng = torch.get_rng_state()
    costs, outputs = measure_layers(seq, x, repeats=2)
    assert len(costs) == 4 and all(c > 0 for c in costs)
    assert [tuple(o.shape) for o in outputs] == [(16, 64)] * 3 + [(16, 4)]
    assert all(torch.equal(seq.state_dict()[k], v) for k, v in before.items())   # BatchNorm stats too
    assert all(p.grad is None for p in seq.parameters()) and torch.equal(torch.get_rng_state(), rng)


def test_measure_layers_moves_one_layer_at_a_time_to_the_device():
    """A model larger than one device is measured too: each layer goes to the device, is timed,
    and goes back before the next one comes."""
    seq, events = net(), []
    for i, layer in enumerate(seq):
        layer.register_forward_hook(lambda *_, i=i: events.append(("forward", i)))
        moved = layer.to
        layer.to = lambda *args, i=i, moved=moved, **kwargs: (events.append(("to", i)), moved(*args, **kwargs))[1]
    measure_layers(seq, torch.randn(16, 8), repeats=2)
    expected = []
    for i in range(len(seq)):
        expected += [("to", i)] + [("forward", i)] * 3 + [("to", i)]
    assert events == expected


def test_cut_bytes_count_both_directions_after_compression():
    _, outputs = measure_layers(net(), torch.randn(16, 8), repeats=1)
    raw = 16 * 64 * 4
    assert cut_nbytes(outputs) == [2 * raw] * 3                 # activation + gradient, no cut after the last
    fp16 = get_compressor("fp16")
    half = cut_nbytes(outputs, fp16, fp16)
    assert all(abs(b - raw) < 100 for b in half)                # half each way, plus packet headers
    mixed = cut_nbytes(outputs, get_compressor("quantize", bits=8), None)
    assert all(raw < b < 1.3 * raw for b in mixed)


def test_layer_memory_counts_weights_grads_optimizer_state_and_outputs():
    seq = net()
    _, outputs = measure_layers(seq, torch.randn(16, 8), repeats=1)
    memory = layer_memory(seq, outputs, optimizer_slots=2)
    assert memory[0] == (8 * 64 + 64) * 4 * 4 + 16 * 64 * 4
    assert memory[1] == 16 * 64 * 4


def test_balance_by_time_is_a_valid_split():
    seq = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
    balance = balance_by_time(seq, torch.randn(4, 8), 3)
    assert sum(balance) == 6 and len(balance) == 4 and min(balance) >= 1
