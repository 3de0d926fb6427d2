"""Lightning's launchers, with the model checked before any process is started."""

from __future__ import annotations

from typing import Any, Callable, Optional

from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher, _SubprocessScriptLauncher

__all__ = ["ScriptLauncher", "SpawnLauncher", "make_launcher"]


class _ChecksModelFirst:
    """Runs ``strategy.check_model(model)`` in the launching process, then launches as usual."""

    _epipe_strategy: Any

    def launch(self, function: Callable, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        model = args[0] if args else kwargs.get("model")
        if model is not None:
            self._epipe_strategy.check_model(model)
        return super().launch(function, *args, trainer=trainer, **kwargs)  # type: ignore[misc]


class ScriptLauncher(_ChecksModelFirst, _SubprocessScriptLauncher):
    def __init__(self, strategy: Any, *args: Any) -> None:
        super().__init__(*args)
        self._epipe_strategy = strategy


class SpawnLauncher(_ChecksModelFirst, _MultiProcessingLauncher):
    def __init__(self, strategy: Any, start_method: str) -> None:
        super().__init__(strategy, start_method=start_method)
        self._epipe_strategy = strategy


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
