"""A stage's backward in two passes (``engine/split_backward.py``): the input gradients alone,
then the weights'. Together they must give every gradient one backward gives, for the
layers real stages hold, and the first pass must leave the weights' work to the second."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lightning_epipe.strategy.engine import split_backward
from lightning_epipe.strategy.engine.split_backward import input_pass, run_weight_passes, worth_splitting

WIDTH = 16


class Residual(nn.Module):
    """x + Linear(ReLU(LayerNorm(x))): the input reaches the output two ways."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + self.linear(torch.relu(self.norm(x)))


class Tied(nn.Module):
    """One Linear applied twice: its weight is reached from two points of the input's path."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.linear(torch.tanh(self.linear(x)))


class TwoInputs(nn.Module):
    """A stage that receives (hidden, gate) and a scale that is a plain tensor, not a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.scale = torch.full((WIDTH,), 0.5, requires_grad=True)

    def forward(self, pair):
        hidden, gate = pair
        return self.linear(hidden) * torch.sigmoid(gate) * self.scale


def _mlp():
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 3))


STAGES = {
    "mlp": _mlp,
    "residual": lambda: nn.Sequential(Residual(), Residual(), nn.Linear(WIDTH, 3)),
    "tied": lambda: nn.Sequential(Tied(), nn.Linear(WIDTH, 3)),
    "transformer": lambda: nn.TransformerEncoderLayer(WIDTH, 2, 32, dropout=0.0, batch_first=True),
}


def _leaves(stage_name, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (2, 5, WIDTH) if stage_name == "transformer" else (5, WIDTH)
    return [torch.randn(*shape, generator=g).requires_grad_()]


def _leaves_of(leaves):
    return [leaf.detach().clone().requires_grad_() for leaf in leaves]


def _weights(module):
    return [p for p in module.parameters()] + [t for t in vars(module).values() if isinstance(t, torch.Tensor)]


def _reference(stage, inputs_of, micro, loss):
    """One backward per micro-batch: the input gradients, and the weights' summed in .grad."""
    ref = copy.deepcopy(stage)
    grads = []
    for leaves, out_grad in micro:
        leaves = _leaves_of(leaves)
        y = ref(inputs_of(leaves))
        if loss:
            (y.pow(2).mean() + sum(p.pow(2).sum() for p in ref.parameters())).backward()
        else:
            y.backward(out_grad)
        grads.append([leaf.grad for leaf in leaves])
    return ref, grads


@pytest.mark.parametrize("loss", [False, True], ids=["stage-outputs", "loss-with-weight-decay-term"])
@pytest.mark.parametrize("stage_name", sorted(STAGES))
def test_the_two_passes_give_every_gradient_of_one_backward(stage_name, loss):
    """Three micro-batches through a stage: each input pass gives that micro-batch's input
    gradients and touches no weight; one weight pass for all three then leaves in ``.grad``
    what three backwards would (a loss with a term on the weights alone included: that branch
    leaves the input's path at the root)."""
    torch.manual_seed(0)
    stage = STAGES[stage_name]()
    micro = []
    for seed in range(3):
        leaves = _leaves(stage_name, seed)
        with torch.no_grad():
            out_grad = None if loss else torch.randn_like(stage(leaves[0]))
        micro.append((leaves, out_grad))
    ref, ref_grads = _reference(stage, lambda ls: ls[0], micro, loss)
    passes = []
    for (leaves, out_grad), want in zip(micro, ref_grads):
        leaves = _leaves_of(leaves)
        y = stage(leaves[0])
        root = y.pow(2).mean() + sum(p.pow(2).sum() for p in stage.parameters()) if loss else y
        split = input_pass([root], [out_grad], leaves)
        assert split is not None
        got, weight_pass = split
        torch.testing.assert_close(got, want)
        assert all(leaf.grad is None for leaf in leaves)
        passes.append(weight_pass)
    assert all(p.grad is None for p in stage.parameters())
    run_weight_passes(passes)
    for (name, p), want in zip(stage.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, want.grad, msg=lambda m: f"{name}: {m}")


def test_two_inputs_and_a_plain_tensor_weight():
    """A stage of two received tensors, one weight a plain tensor outside ``parameters()``: both
    input gradients come from the first pass, the plain tensor's from the second."""
    torch.manual_seed(0)
    stage = TwoInputs()
    leaves = [torch.randn(4, WIDTH).requires_grad_(), torch.randn(4, WIDTH).requires_grad_()]
    out_grad = torch.randn(4, WIDTH)
    ref = copy.deepcopy(stage)
    ref_leaves = _leaves_of(leaves)
    ref(tuple(ref_leaves)).backward(out_grad)
    got, weight_pass = input_pass([stage(tuple(leaves))], [out_grad], leaves)
    torch.testing.assert_close(got, [leaf.grad for leaf in ref_leaves])
    assert stage.scale.grad is None and stage.linear.weight.grad is None
    run_weight_passes([weight_pass])
    for p, want in zip(_weights(stage), _weights(ref)):
        torch.testing.assert_close(p.grad, want.grad)


def test_an_input_the_outputs_do_not_use_gets_none():
    stage = nn.Linear(WIDTH, WIDTH)
    used, unused = torch.randn(3, WIDTH).requires_grad_(), torch.randn(3, WIDTH).requires_grad_()
    got, _ = input_pass([stage(used)], [torch.ones(3, WIDTH)], [used, unused])
    assert got[0] is not None and got[1] is None


def test_the_input_pass_leaves_the_weights_work_to_the_weight_pass():
    """On a 4-layer MLP the first pass computes the input gradients only and the weight pass
    the weights' only: each takes half of one backward's flops (a Linear's weight gradient is a
    matmul as large as its input gradient), and nothing runs twice."""
    torch.manual_seed(0)
    stage = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(64, 64), nn.ReLU())])
    x = torch.randn(32, 64)

    def flops(run):
        leaf = x.clone().requires_grad_()
        y = stage(leaf)
        with FlopCounterMode(display=False) as counter:
            result = run(leaf, y)
        return counter.get_total_flops(), result

    whole, _ = flops(lambda leaf, y: y.backward(torch.ones_like(y)))
    first, (_, weight_pass) = flops(lambda leaf, y: input_pass([y], [torch.ones_like(y)], [leaf]))
    with FlopCounterMode(display=False) as counter:
        run_weight_passes([weight_pass])
    second = counter.get_total_flops()
    assert first == second == whole // 2


def test_gradients_accumulate_into_existing_grads_through_autograds_hooks():
    """Weight gradients land through autograd's own accumulators: on top of a ``.grad`` already
    there (gradient accumulation), with post-accumulate hooks fired once per weight pass."""
    torch.manual_seed(0)
    stage = _mlp()
    before = {name: torch.randn_like(p) for name, p in stage.named_parameters()}
    fired = []
    for name, p in stage.named_parameters():
        p.grad = before[name].clone()
        p.register_post_accumulate_grad_hook(lambda _, name=name: fired.append(name))
    ref = copy.deepcopy(stage)  # without the grads
    for name, p in ref.named_parameters():
        p.grad = before[name].clone()
    x, g = torch.randn(5, WIDTH), torch.randn(5, 3)
    ref(x.clone().requires_grad_()).backward(g)
    leaf = x.clone().requires_grad_()
    _, weight_pass = input_pass([stage(leaf)], [g], [leaf])
    run_weight_passes([weight_pass])
    for (name, p), want in zip(stage.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, want.grad)
    assert sorted(fired) == sorted(name for name, _ in stage.named_parameters())


def test_where_the_backward_cannot_be_split_the_caller_runs_it_whole():
    """No split for: a reentrant checkpoint inside a layer (its node runs a backward of its own),
    an output no input reaches, an output without a graph, no inputs."""
    lin = nn.Linear(WIDTH, WIDTH)
    leaf = torch.randn(2, WIDTH).requires_grad_()
    checkpointed = torch.utils.checkpoint.checkpoint(lin, leaf, use_reentrant=True)
    assert input_pass([checkpointed], [torch.ones(2, WIDTH)], [leaf]) is None
    assert input_pass([lin(leaf), lin.weight.sum(0, keepdim=True)], [torch.ones(2, WIDTH), torch.ones(1, WIDTH)], [leaf]) is None
    assert input_pass([leaf], [torch.ones(2, WIDTH)], [leaf]) is None
    assert input_pass([lin(leaf)], [torch.ones(2, WIDTH)], []) is None


def test_auto_splits_on_the_cpu_from_a_micro_batchs_forward_flops_and_leaves_the_stage_as_it_was():
    """``"auto"``: a stage whose forward of one micro-batch reaches ``SPLIT_MIN_FLOPS`` splits, a
    smaller one does not, counted on a dry run that changes nothing (training flag, batch-norm
    statistics, the random stream: dropout is off in it); on a GPU and under 1F1B ``"auto"``
    does not split, ``True`` and ``False`` are what they say."""
    width = 1024
    stage = nn.Sequential(nn.Linear(width, width), nn.BatchNorm1d(width), nn.Dropout(0.5), nn.Linear(width, width))
    rows_at_threshold = -(-int(split_backward.SPLIT_MIN_FLOPS) // (2 * 2 * width * width))  # two Linears
    at, below = torch.randn(rows_at_threshold, width), torch.randn(rows_at_threshold - 2, width)
    state = copy.deepcopy(stage.state_dict())
    rng = torch.get_rng_state()
    cpu = torch.device("cpu")
    assert worth_splitting(stage, at, cpu, "auto")
    assert not worth_splitting(stage, below, cpu, "auto")
    assert stage.training and torch.equal(torch.get_rng_state(), rng)
    for name, value in stage.state_dict().items():
        assert torch.equal(value, state[name]), name
    assert not worth_splitting(stage, torch.randn(4, width), torch.device("cuda"), "auto")
    assert not worth_splitting(stage, at, cpu, "auto", one_f_one_b=True)
    assert worth_splitting(stage, torch.randn(4, width), cpu, True, one_f_one_b=True)
    assert worth_splitting(stage, torch.randn(4, width), cpu, True)
    assert not worth_splitting(stage, torch.randn(512, width), cpu, False)
