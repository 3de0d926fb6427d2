"""Each rank keeps the weights of the layers it runs; the others become meta tensors.

The state dict's keys stay (so Lightning's checkpoint and optimizer code sees one module),
only the storage goes. The client keeps a copy of its real weights to give the module back
whole after validate/test/predict; after fit it gathers every stage's trained weights.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from lightning_epipe.compressors import BottleneckPair
from lightning_epipe.strategy.compression.bottleneck_layers import ATTRIBUTE as BOTTLENECKS
from lightning_epipe.strategy.compression.bottleneck_layers import release_foreign_halves
from lightning_epipe.strategy.planning.partition import PipelinePlan

__all__ = ["release_foreign_layers"]


def release_foreign_layers(module: nn.Module, layers: nn.Sequential, plan: PipelinePlan, pipeline_rank: int,
                           pairs: dict[int, BottleneckPair]) -> Optional[dict[str, Tensor]]:
    """Free the weights pipeline rank ``pipeline_rank`` does not run; on the client, return its
    real weights before (to put back after evaluation), elsewhere ``None``."""
    owned = set(plan.layers_of(pipeline_rank))
    client = pipeline_rank == 0
    backup = {k: v for k, v in module.state_dict(keep_vars=True).items() if not v.is_meta} if client else None
    for i, layer in enumerate(layers):
        if i not in owned:
            layer.to("meta")
    holder = getattr(module, BOTTLENECKS, None)
    if not client:  # servers run no user code: everything outside the Sequential goes
        for child in module.children():
            if child is not layers and child is not holder:
                child.to("meta")
    release_foreign_halves(pairs, plan, pipeline_rank)
    return backup
