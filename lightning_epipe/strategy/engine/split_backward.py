"""A stage's backward in two passes: its input gradients first, its weights' after.

The stage before this one waits for the gradients of this stage's received tensors (its
*inputs*); only this rank's optimizer step waits for the gradients of its weights. One
backward computes both, node by node: a ``Linear``'s ``AddmmBackward`` computes the input's
gradient and the weight's in the same call, so the input gradient leaves only once the
whole stage's weights have theirs, about twice the time the input gradient alone takes.

:func:`input_pass` computes the input gradients alone: ``torch.autograd.grad`` toward the
inputs, where autograd runs a node only for its outputs that lead to an input. On the way
it keeps, for every node of that path that also leads to weights (an *intermediate*: the
``AddmmBackward`` above; a layer norm's backward), the gradient that reached it.
:func:`run_weight_passes` later starts autograd from those nodes, with those gradients,
toward the weights alone: every node of the backward runs once for each of its outputs,
as in one backward, and the two passes cost what one does plus a walk over the graph.
Zero-bubble pipeline schedules split a backward the same way (Qi et al., 2023, "Zero Bubble
Pipeline Parallelism"; ``torch.distributed.pipelining``'s ``stage_backward_input`` and
``stage_backward_weight``).

*Weights* are every leaf of the graph that is not an input: the stage's parameters, and any
other tensor that requires grad which the stage's code reached (a parameter of a module
outside the stage, a plain tensor). Their gradients accumulate into ``.grad`` through
autograd's own accumulators, hooks included, as in one backward.

The split costs Python per micro-batch (the walk, the kept gradients, a few more autograd
calls): a fraction of a millisecond, which the weights' work it moves off the path to the
stage before must outweigh. :func:`worth_splitting` says where it does: a stage whose forward
of one micro-batch takes at least :data:`SPLIT_MIN_FLOPS` (counted once per stage and input
shape, ``torch.utils.flop_counter``), on the CPU, the one device it was measured on.

Where the split cannot be taken, :func:`input_pass` returns ``None`` and the caller runs one
backward: no inputs, an output without a graph, an output that no input reaches, or a
reentrant checkpoint inside a layer (``torch.utils.checkpoint(use_reentrant=True)``: its node
backpropagates its own segment with ``torch.autograd.backward``, which ``torch.autograd.grad``
refuses).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["WeightPass", "input_pass", "run_weight_passes", "worth_splitting", "SPLIT_MIN_FLOPS"]

#: ``split_backward="auto"``: the least forward work of one micro-batch through a stage, in
#: FLOPs, at which its backward is split on the CPU. With every stage split
#: (``benchmarks/results/engine_baseline_split.json``), the client's stage of 3 and 25 MFLOPs
#: a micro-batch (width 128, 8 and 1 micro-batches) ran at 0.53x and 0.90x of the engine
#: before, of 50 MFLOPs (width 512, 8 micro-batches, 1F1B) at 0.93x, of 100 MFLOPs and more
#: (width 512, 4 and 1 micro-batches; 2048; 1024 with 3 processes) at 1.07x-1.25x. Elsewhere
#: than on the CPU ``"auto"`` does not split.
SPLIT_MIN_FLOPS = 64e6

#: Nodes whose backward calls autograd itself (``torch.autograd.grad`` raises inside them).
_REENTRANT = frozenset({"CheckpointFunctionBackward"})


@dataclass
class _Group:
    """Weights and the intermediates whose kept gradients reach them (one autograd call)."""

    weights: list[Tensor]
    kept: list[tuple[Any, tuple[Optional[Tensor], ...]]] = field(default_factory=list)  # (node, its gradients)
    clamp: bool = False  # two of one micro-batch's intermediates reach a common weight


@dataclass
class WeightPass:
    """What :func:`input_pass` left for the weights (:func:`run_weight_passes`): per group of
    weights (keyed by their ids), the intermediates' gradients to start from. Its edges hold
    the graph below the intermediates alive until it has run."""

    groups: dict[frozenset[int], _Group]


def input_pass(outputs: Sequence[Tensor], grads: Sequence[Optional[Tensor]],
               inputs: Sequence[Tensor]) -> Optional[tuple[list[Optional[Tensor]], WeightPass]]:
    """The gradients of ``inputs`` (leaves that require grad) from ``outputs`` (a stage's
    outputs with their ``grads``, or a loss with ``None``), and the weight pass that completes
    the backward; ``None`` where the backward cannot be split (the caller runs it whole).

    The graph is kept (``retain_graph``) for the weight pass. An input the outputs do not
    depend on gets ``None``.
    """
    roots = [o.grad_fn for o in outputs]
    if not inputs or any(r is None for r in roots):
        return None
    walked = _walk(roots, {id(t) for t in inputs})
    if walked is None:
        return None
    intermediates, weights_under = walked
    kept: dict[Any, tuple[Optional[Tensor], ...]] = {}
    handles = [node.register_prehook(_keeper(kept, node)) for node in intermediates]
    try:
        input_grads = torch.autograd.grad(list(outputs), list(inputs), list(grads), retain_graph=True, allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    return list(input_grads), WeightPass(_groups(intermediates, weights_under, kept))


def run_weight_passes(passes: Sequence[WeightPass]) -> None:
    """Run the weight passes of several micro-batches of one stage: one autograd call per group
    of weights for all of them (the gradients summed by autograd, accumulated once)."""
    merged: dict[frozenset[int], _Group] = {}
    for wp in passes:
        for key, group in wp.groups.items():
            into = merged.get(key)
            if into is None:
                merged[key] = _Group(list(group.weights), list(group.kept), group.clamp)
            else:
                into.kept += group.kept
                into.clamp = into.clamp or group.clamp
    for group in merged.values():
        # a group started from two intermediates on one path (a weight used twice) would carry
        # the first one's gradient down to the second: each intermediate gets exactly its own
        clamps = [node.register_prehook(lambda _, g=g: g) for node, g in group.kept] if group.clamp else []
        edges = [(GradientEdge(node, k), g) for node, got in group.kept for k, g in enumerate(got) if g is not None]
        try:
            torch.autograd.backward([e for e, _ in edges], [g for _, g in edges], retain_graph=True, inputs=group.weights)
        finally:
            for handle in clamps:
                handle.remove()


def _keeper(kept: dict[Any, tuple[Optional[Tensor], ...]], node: Any) -> Any:
    def keep(grad_outputs: tuple[Optional[Tensor], ...]) -> None:
        kept[node] = tuple(grad_outputs)
    return keep


def _walk(roots: list[Any], input_ids: set[int]) -> Optional[tuple[list[Any], dict[Any, list[Any]]]]:
    """The graph below ``roots``: its intermediates (nodes that lead to an input and, through
    another of their edges, to a weight) and, per intermediate, the weights' accumulators
    reached through those edges; ``None`` if a root reaches no input or a node is reentrant."""
    order: list[Any] = []  # post-order: every node after the nodes it leads to
    seen: set[Any] = set()
    stack: list[tuple[Any, bool]] = [(r, False) for r in roots]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        for child, _ in node.next_functions:
            if child is not None and child not in seen:
                stack.append((child, False))
    to_input: dict[Any, bool] = {}
    weights: dict[Any, frozenset[Any]] = {}  # node -> the weight accumulators it leads to (off the input path)
    intermediates: list[Any] = []
    weights_under: dict[Any, list[Any]] = {}
    for node in order:
        name = type(node).__name__
        if name in _REENTRANT:
            return None
        if name == "AccumulateGrad":
            is_input = id(node.variable) in input_ids
            to_input[node] = is_input
            weights[node] = frozenset() if is_input else frozenset((node,))
            continue
        children = [c for c, _ in node.next_functions if c is not None]
        to_input[node] = any(to_input[c] for c in children)
        off = [c for c in children if not to_input[c]]
        below = frozenset().union(*(weights[c] for c in off)) if off else frozenset()
        weights[node] = below
        if to_input[node] and below:
            intermediates.append(node)
            weights_under[node] = list(below)
    if not all(to_input[r] for r in roots):
        return None  # an output that no input reaches: its weights have no intermediate
    return intermediates, weights_under


def _groups(intermediates: list[Any], weights_under: dict[Any, list[Any]],
            kept: dict[Any, tuple[Optional[Tensor], ...]]) -> dict[frozenset[int], _Group]:
    """Intermediates joined where they reach a common weight, each group with its weights and
    the gradients its intermediates kept."""
    parent: dict[Any, Any] = {}

    def find(a: Any) -> Any:
        while parent.setdefault(a, a) is not a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    owner: dict[Any, Any] = {}  # weight accumulator -> an intermediate reaching it
    for node in intermediates:
        for acc in weights_under[node]:
            other = owner.setdefault(acc, node)
            parent[find(node)] = find(other)
    members: dict[Any, list[Any]] = {}
    for node in intermediates:
        members.setdefault(find(node), []).append(node)
    groups: dict[frozenset[int], _Group] = {}
    for nodes in members.values():
        accs = {acc for node in nodes for acc in weights_under[node]}
        weights = [acc.variable for acc in accs]
        key = frozenset(id(w) for w in weights)
        group = groups.setdefault(key, _Group(weights, clamp=len(nodes) > 1))
        for node in nodes:
            got = kept.get(node)
            if got is None:
                continue  # no gradient reached it: its weights get nothing through it
            if any(g is not None for g in got):
                group.kept.append((node, got))
    return {key: g for key, g in groups.items() if g.kept}


def worth_splitting(stage: nn.Module, x: Any, device: torch.device, setting: Union[bool, str],
                    one_f_one_b: bool = False) -> bool:
    """Whether ``stage``'s backward on input ``x`` (one micro-batch) is split: ``setting``
    ``True``/``False``, or ``"auto"``: under GPipe on the CPU where its forward takes at least
    :data:`SPLIT_MIN_FLOPS` (counted on a dry run: no grad, eval mode, so no state changes);
    never under 1F1B (``one_f_one_b``), where each weight pass runs alone right after its
    micro-batch's input pass and costs more than the drain it shortens."""
    if setting != "auto":
        return bool(setting)
    if device.type != "cpu" or one_f_one_b:
        return False
    was_training = stage.training
    stage.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            stage(x)
    finally:
        stage.train(was_training)
    return counter.get_total_flops() >= SPLIT_MIN_FLOPS
