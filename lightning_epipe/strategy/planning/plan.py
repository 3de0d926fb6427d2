"""Which layers each rank runs: the plan of a LightningModule under a :class:`PipelineConfig`.

:func:`plan_for` checks the module against the configuration and returns its
:class:`~lightning_epipe.strategy.planning.partition.PipelinePlan` before any process starts (for
``balance="time"`` a placeholder split: the real one is measured across the processes by
:func:`plan_by_time` in ``setup``).
"""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from torch import nn

from lightning_epipe.strategy.planning.layer_costs import balance_by_parameters
from lightning_epipe.strategy.config import PipelineConfig
from lightning_epipe.strategy.planning.measured import measured_balance
from lightning_epipe.strategy.engine.one_f_one_b import check_1f1b
from lightning_epipe.strategy.planning.partition import PipelinePlan, find_pipeline, num_stages_for, plan_pipeline
from lightning_epipe.strategy.engine.replicas import ReplicaLayout

__all__ = ["plan_for", "plan_by_time"]


def plan_for(model: LightningModule, config: PipelineConfig, world_size: int, processes_per_node: int, num_nodes: int) -> PipelinePlan:
    """Validate ``model`` for ``world_size`` processes; raises with the fix in the message."""
    if world_size < 2:
        raise ValueError(
            f"EPipeStrategy needs at least 2 processes, got devices={processes_per_node} x num_nodes="
            f"{num_nodes}: set Trainer(devices=2) or more"
        )
    size = ReplicaLayout(world_size, config.replicas).size  # processes per pipeline
    _, layers = find_pipeline(model, config.pipeline)
    stages = num_stages_for(config.placement, size)
    if len(layers) < stages:
        raise ValueError(
            f"{size} processes per pipeline with placement={config.placement!r} need {stages} stages but"
            f" {type(model).__name__}'s Sequential has only {len(layers)} layers: use fewer devices or more layers"
        )
    if isinstance(config.balance, tuple):
        balance = list(config.balance)
    elif config.balance == "parameters":
        balance = balance_by_parameters(layers, size, config.placement)
    else:  # "time" is measured in setup(); any valid split checks the rest now
        balance = [1] * (stages - 1) + [len(layers) - stages + 1]
    plan = plan_pipeline(len(layers), size, balance, config.placement)
    if config.schedule == "1f1b":
        check_1f1b(model)
    codecs = config.codec_book(plan.num_cuts)
    built = [c for c, b in codecs.bottlenecks().items() if b.encoder is None]
    if built and getattr(model, "example_input_array", None) is None:
        raise ValueError(
            f"compressor='bottleneck' sizes and initializes the bottleneck of cuts {built} from the activation"
            " there: set `self.example_input_array` (an input of the pipelined Sequential; a few real samples"
            " give a PCA start) in your LightningModule, or pass Bottleneck(encoder=..., decoder=...)"
        )
    return plan


def plan_by_time(module: LightningModule, layers: nn.Sequential, config: PipelineConfig, size: int, global_rank: int,
                 device: torch.device, local_processes: int) -> PipelinePlan:
    """``balance="time"``: every rank times the layers on its device, rank 0 solves (a collective)."""
    example = module.example_input_array
    if example is None:
        raise ValueError(
            "EPipeStrategy(balance='time') measures every layer on `example_input_array`: set"
            " `self.example_input_array` in your LightningModule, or give balance=[...] / 'parameters'"
        )
    codecs = config.codec_book(num_stages_for(config.placement, size) - 1)
    first_cut = (codecs.specs["activation"][0].make(), codecs.specs["gradient"][0].make())
    balance = measured_balance(layers, example, size, config.placement, global_rank, device, first_cut, local_processes)
    return plan_pipeline(len(layers), size, balance, config.placement)
