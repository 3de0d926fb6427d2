"""lightning-epipe: GPipe pipeline parallelism with compressed cuts for PyTorch Lightning."""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_epipe.callbacks import EPipeMonitor
from lightning_epipe.strategy import EPipeStrategy, PeerError, PipelineStats, WireError

if "epipe" not in StrategyRegistry:
    EPipeStrategy.register_strategies(StrategyRegistry)

__all__ = ["EPipeStrategy", "EPipeMonitor", "PeerError", "PipelineStats", "WireError"]
__version__ = "0.1.0"
