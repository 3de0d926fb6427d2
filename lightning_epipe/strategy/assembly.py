"""This rank's part of the pipeline: assembled in ``setup``, given back in ``teardown``.

:func:`assemble` takes the user's LightningModule and leaves on this rank only what it runs:
the plan (measured across the processes for ``balance="time"``), the codec of every cut, the
bottleneck pairs (identical on every rank), and the module with every foreign layer on the
``meta`` device. :func:`give_back` is its inverse: after fit the client's module holds every
stage's trained weights again (as after DDP); after validate/test/predict the client's own
weights are put back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from lightning_epipe.compressors import BottleneckPair
from lightning_epipe.strategy.comm.collectives import gather_tensors
from lightning_epipe.strategy.comm.transport import Transport
from lightning_epipe.strategy.compression.bottleneck_layers import install_bottlenecks
from lightning_epipe.strategy.compression.codec_book import CodecBook
from lightning_epipe.strategy.config import PipelineConfig
from lightning_epipe.strategy.engine.grad_scaling import scaler_of
from lightning_epipe.strategy.layer_ownership import release_foreign_layers
from lightning_epipe.strategy.planning.device_memory import default_cache_limit
from lightning_epipe.strategy.planning.partition import PipelinePlan, find_pipeline
from lightning_epipe.strategy.planning.plan import plan_by_time

__all__ = ["RankAssembly", "assemble", "check_setup", "give_back"]


@dataclass
class RankAssembly:
    """What one rank holds of the pipeline once set up."""

    plan: PipelinePlan
    pipeline_attr: str                       # the module's attribute holding the Sequential
    layers: nn.Sequential
    codecs: CodecBook
    bottlenecks: dict[int, BottleneckPair] = field(default_factory=dict)
    client_backup: dict[str, Tensor] = field(default_factory=dict)  # the client's real weights before release


def check_setup(module: LightningModule, model: nn.Module, precision_plugin: object, nonfinite: str) -> None:
    """Refuse what Lightning could hand the strategy but a pipeline cannot run."""
    if module is not model:
        raise ValueError("EPipeStrategy needs the LightningModule itself, not a wrapped model")
    if scaler_of(precision_plugin) is not None and nonfinite == "skip":
        raise ValueError(
            "nonfinite='skip' with precision='16-mixed': the GradScaler already skips a step whose gradients"
            " overflowed, on every rank, and lowers its scale (a step skipped here would not lower it); leave"
            " nonfinite at its default"
        )


def assemble(module: LightningModule, config: PipelineConfig, plan: PipelinePlan, before: Optional[RankAssembly],
             pipeline_size: int, pipeline_rank: int, global_rank: int, device: torch.device, local_processes: int,
             saved_bottlenecks: Optional[dict[str, Tensor]] = None) -> RankAssembly:
    """Assemble this rank's part (a collective for ``balance="time"`` and bottlenecks).

    ``plan``: the checked plan (``plan_for``); ``before``: the assembly of an earlier stage of
    the same process (fit, then test): a measured split and the codec streams' state are kept.
    """
    attr, layers = find_pipeline(module, config.pipeline)
    if config.balance == "time":  # measured once: later stages (test, predict) keep the split
        reuse = before is not None and before.plan.num_layers == len(layers)
        plan = before.plan if reuse else plan_by_time(module, layers, config, pipeline_size, global_rank, device,
                                                      local_processes)
    if before is not None and len(before.codecs.specs["activation"]) == plan.num_cuts:
        codecs = before.codecs
    else:  # delta caches sized for this stage's own device unless the user gave a size
        codecs = config.codec_book(plan.num_cuts, default_cache_limit(device, local_processes))
        codecs.warm_up()  # compiled codec loops compiled or loaded now, not in the first steps
    bottlenecks = install_bottlenecks(module, layers, plan, codecs.bottlenecks(), global_rank, device,
                                      saved_bottlenecks)  # built on global rank 0, broadcast to every replica
    backup = release_foreign_layers(module, layers, plan, pipeline_rank, bottlenecks) or {}
    return RankAssembly(plan, attr, layers, codecs, bottlenecks, backup)


def give_back(module: LightningModule, assembly: RankAssembly, fitted: bool, transport: Transport, world_size: int,
              owned: dict[str, Tensor]) -> None:
    """Undo :func:`assemble` on the module (a collective after a successful fit).

    ``fitted``: a fit that ended normally: every rank sends ``owned`` (its trained weights) and
    rank 0's module gets all of them; otherwise the client puts its own weights back.
    """
    if fitted:
        merged = gather_tensors(transport, world_size, owned)
        if merged is not None:
            module.load_state_dict(merged, strict=True, assign=True)
    elif assembly.client_backup:
        module.load_state_dict(assembly.client_backup, strict=False, assign=True)
    assembly.client_backup = {}
    assembly.layers.__dict__.pop("forward", None)  # the client's pipelined forward
