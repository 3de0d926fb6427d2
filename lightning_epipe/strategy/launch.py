"""Lightning's launchers, with the model checked before any process is started."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher, _SubprocessScriptLauncher
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_epipe.strategy.compression.bottleneck_layers import ATTRIBUTE, bottleneck_layout, rebuild_bottlenecks

__all__ = ["ScriptLauncher", "SpawnLauncher", "make_launcher", "more_processes_than_cores", "usable_cores"]


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def more_processes_than_cores(processes: int, cores: int) -> Optional[str]:
    """The warning for ``processes`` CPU pipeline processes on one machine of ``cores`` cores, or None."""
    if processes <= cores:
        return None
    return (f"EPipeStrategy: {processes} pipeline processes on this machine share {cores} CPU cores, so stages wait"
            f" for a core and each wait holds up every stage after it. Run at most one process per core"
            f" (Trainer(devices={cores}); with placement='client-server' the client holds two stages) unless the"
            " stages must be this many.")


class _ChecksModelFirst:
    """Runs ``strategy.check_model(model)`` in the launching process, then launches as usual."""

    _epipe_strategy: Any

    def launch(self, function: Callable, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        model = args[0] if args else kwargs.get("model")
        strategy = self._epipe_strategy
        if model is not None:
            strategy.check_model(model)
        devices = strategy.parallel_devices
        if devices and devices[0].type == "cpu":
            warning = more_processes_than_cores(strategy.num_processes, usable_cores())
            if warning:
                rank_zero_warn(warning)
        return super().launch(function, *args, trainer=trainer, **kwargs)  # type: ignore[misc]


class ScriptLauncher(_ChecksModelFirst, _SubprocessScriptLauncher):
    def __init__(self, strategy: Any, *args: Any) -> None:
        super().__init__(*args)
        self._epipe_strategy = strategy


class SpawnLauncher(_ChecksModelFirst, _MultiProcessingLauncher):
    """Lightning's launcher for ``start_method`` spawn, fork or forkserver. The launching process
    is not a rank: after a fit it gets rank 0's weights, and with them the learned bottlenecks,
    which rank 0 built (the launching process's module has no pairs to load them into)."""

    def __init__(self, strategy: Any, start_method: str) -> None:
        super().__init__(strategy, start_method=start_method)
        self._epipe_strategy = strategy

    def get_extra_results(self, trainer: Any) -> dict[str, Any]:
        extra = super().get_extra_results(trainer)
        if hasattr(trainer.lightning_module, ATTRIBUTE):  # built at setup, with the plan
            extra[ATTRIBUTE] = bottleneck_layout(trainer.lightning_module, self._epipe_strategy.plan.num_cuts)
        return extra

    def _recover_results_in_main_process(self, worker_output: Any, trainer: Any) -> None:
        layout = worker_output.extra.get(ATTRIBUTE)
        if layout is not None and worker_output.weights_path is not None:
            specs = self._epipe_strategy.config.codec_book(layout["num_cuts"]).bottlenecks()
            rebuild_bottlenecks(trainer.lightning_module, specs, layout)
        super()._recover_results_in_main_process(worker_output, trainer)


def make_launcher(strategy: Any, backend: Optional[str]) -> Any:
    """The launcher for ``strategy.config.start_method``, after checking that ``backend`` fits the devices."""
    devices = strategy.parallel_devices
    device_type = devices[0].type if devices else "cpu"
    if backend == "nccl" and device_type != "cuda":
        raise ValueError(
            f"process_group_backend='nccl' needs CUDA devices but the accelerator gives {device_type!r}:"
            " leave process_group_backend unset (gloo on CPU, NCCL on CUDA) or use accelerator='gpu'"
        )
    if strategy.config.start_method == "popen":
        return ScriptLauncher(strategy, strategy.cluster_environment, strategy.num_processes, strategy.num_nodes)
    return SpawnLauncher(strategy, start_method=strategy.config.start_method)
