"""Put learned bottlenecks on a LightningModule: build, initialize, place, checkpoint.

The pairs live on the module as ``epipe_bottlenecks`` (an ``nn.ModuleDict`` keyed by cut),
so ``configure_optimizers`` sees their parameters with the model's, and every rank holds
real weights only for its half: the encoder of cut ``c`` with the rank of stage ``c``, the
decoder with the rank of stage ``c + 1`` (the other half becomes meta, like foreign layers).
Checkpoints keep them apart from the model's own ``state_dict`` (under
``checkpoint["epipe"]["bottlenecks"]``), so ``load_from_checkpoint`` without the strategy
still loads the plain model.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lightning_epipe.compressors.bottleneck import Bottleneck, BottleneckPair
from lightning_epipe.strategy.comm.collectives import broadcast_json
from lightning_epipe.strategy.planning.partition import PipelinePlan

__all__ = ["ATTRIBUTE", "install_bottlenecks", "release_foreign_halves", "split_bottleneck_state",
           "bottleneck_lr", "bottleneck_layout", "rebuild_bottlenecks"]

#: The module attribute holding the pairs, and the prefix of their state-dict keys.
ATTRIBUTE = "epipe_bottlenecks"
PREFIX = ATTRIBUTE + "."


def cut_activations(layers: nn.Sequential, example: Any, cuts: list[int], plan: PipelinePlan) -> dict[int, Any]:
    """Stage outputs at ``cuts`` for ``example`` (train mode, no grad; buffers and RNG restored)."""
    buffers = {name: b.detach().clone() for name, b in layers.named_buffers()}
    outputs: dict[int, Any] = {}
    ends = {plan.bounds[c][1]: c for c in cuts}
    x = example
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for i, layer in enumerate(layers):
            if not ends or i >= max(ends):
                break
            x = layer(x)
            if i + 1 in ends:
                outputs[ends[i + 1]] = x
    with torch.no_grad():  # BatchNorm running stats must not see the example
        for name, b in layers.named_buffers():
            b.copy_(buffers[name])
    return outputs


def _first_shape(x: Any) -> list[int]:
    t = x[0] if isinstance(x, (tuple, list)) else x
    return list(t.shape)


def install_bottlenecks(
    module: nn.Module, layers: nn.Sequential, plan: PipelinePlan, specs: dict[int, Bottleneck],
    rank: int, device: torch.device, saved: Optional[dict[str, Tensor]] = None,
) -> dict[int, BottleneckPair]:
    """Build the pairs of ``specs`` (cut -> Bottleneck) on every rank, identical everywhere.

    Rank 0 builds them from the module's ``example_input_array`` (PCA initialization), keeps
    the ones the module already has (a second ``fit``/``test``), or loads ``saved``
    (a resumed checkpoint); the other ranks build same-shaped pairs and receive rank 0's
    weights by broadcast. Call with every layer still real (before foreign layers are released).
    """
    if not specs:
        return {}
    cuts = sorted(specs)
    existing = getattr(module, ATTRIBUTE, None)
    reuse = saved is None and isinstance(existing, nn.ModuleDict) and sorted(existing.keys()) == [str(c) for c in cuts]
    shapes: Optional[dict[str, Any]] = None
    pairs: dict[int, BottleneckPair] = {}
    if rank == 0:
        if reuse:
            pairs = {c: existing[str(c)] for c in cuts}
        else:
            needed = [c for c in cuts if specs[c].encoder is None]
            example = getattr(module, "example_input_array", None)
            if needed and example is None:
                raise ValueError(
                    "compressor='bottleneck' sizes and initializes each bottleneck from an activation at its cut:"
                    " set `self.example_input_array` (the input of the pipelined Sequential; a few real samples"
                    " give a PCA start) in your LightningModule, or pass Bottleneck(encoder=..., decoder=...)"
                )
            acts = cut_activations(layers, example, cuts, plan) if example is not None else {}
            for c in cuts:
                spec = specs[c] if saved is None else _without_pca(specs[c])
                pairs[c] = spec.build(acts.get(c))
            for c in cuts:
                pairs[c].example_shape = _first_shape(acts[c]) if c in acts else None
        shapes = _shapes_of(pairs)
    shapes = broadcast_json(shapes, device)
    if rank != 0:
        pairs = _same_shaped(specs, shapes)
    holder = nn.ModuleDict({str(c): pairs[c] for c in cuts})
    if rank == 0 and saved is not None:
        holder.load_state_dict({k[len(PREFIX):]: v for k, v in saved.items()}, strict=True)
    for tensor in holder.state_dict().values():
        buffer = tensor.detach().to(device)
        dist.broadcast(buffer, 0)
        tensor.detach().copy_(buffer)
    setattr(module, ATTRIBUTE, holder)
    return pairs


def _shapes_of(pairs: dict[int, BottleneckPair]) -> dict[str, Any]:
    """Per cut (a string key, as JSON has them): the pair's expansion and the activation shape it was built for."""
    return {str(c): {"expansion": pair.expansion, "shape": pair.example_shape} for c, pair in pairs.items()}


def _same_shaped(specs: dict[int, Bottleneck], shapes: dict[str, Any]) -> dict[int, BottleneckPair]:
    """Pairs shaped as :func:`_shapes_of` describes, default-initialized (their weights come from elsewhere)."""
    pairs = {}
    for c, info in shapes.items():
        example = None if info["shape"] is None else torch.zeros(info["shape"])
        pair = pairs[int(c)] = _without_pca(specs[int(c)]).build(example)
        pair.expansion, pair.example_shape = info["expansion"], info["shape"]
    return pairs


def bottleneck_layout(module: nn.Module, num_cuts: int) -> Optional[dict[str, Any]]:
    """What it takes to build ``module``'s pairs again elsewhere, as JSON types: the pipeline's
    number of cuts (``num_cuts``), and per cut its pair's expansion and the activation shape it
    was built for; ``None`` where the module has no pairs."""
    holder = getattr(module, ATTRIBUTE, None)
    if not isinstance(holder, nn.ModuleDict):
        return None
    return {"num_cuts": num_cuts, "pairs": _shapes_of({int(c): pair for c, pair in holder.items()})}


def rebuild_bottlenecks(module: nn.Module, specs: dict[int, Bottleneck], layout: dict[str, Any]) -> None:
    """Put same-shaped pairs of ``layout`` (:func:`bottleneck_layout`) on ``module``, weights not
    yet loaded: a launching process that is not a rank gets rank 0's trained pairs this way
    (their keys then match the weights Lightning's launcher loads into it)."""
    pairs = _same_shaped(specs, layout["pairs"])
    setattr(module, ATTRIBUTE, nn.ModuleDict({str(c): pair for c, pair in pairs.items()}))


def _without_pca(spec: Bottleneck) -> Bottleneck:
    plain = copy.copy(spec)
    plain.init = "default"
    return plain


def release_foreign_halves(pairs: dict[int, BottleneckPair], plan: PipelinePlan, rank: int) -> None:
    """Make the halves this rank does not run meta tensors."""
    for c, pair in pairs.items():
        sender, receiver = plan.cut_ranks(c)
        if sender != rank:
            pair.encoder.to("meta")
        if receiver != rank:
            pair.decoder.to("meta")


def split_bottleneck_state(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model state without the pairs, the pairs' entries)`` of a full state dict."""
    model = {k: v for k, v in state.items() if not k.startswith(PREFIX)}
    pairs = {k: v for k, v in state.items() if k.startswith(PREFIX)}
    return model, pairs


def bottleneck_lr(specs: dict[int, Bottleneck]) -> Optional[float]:
    """The learning rate the cuts' bottlenecks ask for (one for all of them), or ``None``."""
    rates = {spec.lr for spec in specs.values()}
    if len(rates) > 1:
        raise ValueError(f"bottlenecks: every cut's Bottleneck needs the same lr (one param group), got {sorted(rates, key=str)}")
    return rates.pop() if rates else None
