"""The pipeline strategy and the pure pieces it is built from."""

from lightning_epipe.strategy.planning.layer_costs import balance_by_parameters, balance_by_time
from lightning_epipe.strategy.epipe import EPipeStrategy
from lightning_epipe.strategy.planning.partition import PipelinePlan, plan_pipeline
from lightning_epipe.strategy.engine.runtime import NonFiniteActivation
from lightning_epipe.strategy.engine.schedule import clock_cycles, rank_tasks
from lightning_epipe.strategy.engine.stats import LinkCounter, LinkKey, PipelineStats
from lightning_epipe.strategy.comm.transport import PeerError
from lightning_epipe.strategy.comm.wire import WireError

__all__ = [
    "EPipeStrategy",
    "PipelinePlan",
    "PipelineStats",
    "LinkCounter",
    "LinkKey",
    "PeerError",
    "WireError",
    "NonFiniteActivation",
    "balance_by_parameters",
    "balance_by_time",
    "clock_cycles",
    "plan_pipeline",
    "rank_tasks",
]
