"""EPipeStrategy: pipeline parallelism with compressed cuts, as a Lightning strategy.

Lightning delegation only; ``docs/architecture.md`` draws the data path and where each
module sits on it: arguments in ``config``, the split in ``planning/``, this rank's part of
the pipeline in ``assembly``, a step's hooks in ``engine/rank_steps`` (the client runs the
user's step, whose ``self.layers(x)`` is the pipelined forward; servers follow its
commands), messages in ``comm/``, codecs per stream in ``compression/``, checkpoints in
``checkpoint_state``.
"""

from __future__ import annotations

import logging
import warnings
from datetime import timedelta
from typing import Any, Literal, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.utilities.distributed import (
    ReduceOp,
    _distributed_is_initialized,
    _get_default_process_group_backend_for_device,
)
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.fabric.utilities.seed import reset_seed
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_epipe.strategy import checkpoint_state as ckpt
from lightning_epipe.strategy.assembly import RankAssembly, assemble, check_setup, give_back
from lightning_epipe.strategy.comm.collectives import agree, broadcast_plain, start_process_group
from lightning_epipe.strategy.comm.stream_groups import PipelineGroups, create_groups, create_transports
from lightning_epipe.strategy.comm.transport import Transport
from lightning_epipe.strategy.compression.auto_tuner import AutoTuner
from lightning_epipe.strategy.compression.bottleneck_layers import ATTRIBUTE, bottleneck_lr
from lightning_epipe.strategy.compression.bottleneck_optimizer import optimize_bottlenecks
from lightning_epipe.strategy.compression.sample_ids import SampleIdRecorder
from lightning_epipe.strategy.config import ARGUMENTS, CompressorArg, PipelineConfig
from lightning_epipe.strategy.core_binding import CoreBinding
from lightning_epipe.strategy.engine.client_step import ClientStep
from lightning_epipe.strategy.engine.clipping import clip_across_stages
from lightning_epipe.strategy.engine.grad_scaling import agree_on_overflow, check_unscaling, scaler_of
from lightning_epipe.strategy.engine.one_f_one_b import GradientStash
from lightning_epipe.strategy.engine.rank_steps import RankSteps
from lightning_epipe.strategy.engine.runtime import PipelineRuntime
from lightning_epipe.strategy.engine.stats import PipelineStats
from lightning_epipe.strategy.gc_freeze import FrozenGC
from lightning_epipe.strategy.launch import make_launcher
from lightning_epipe.strategy.metrics_sync import CallbackMetricsSync, keep_metrics_local
from lightning_epipe.strategy.planning.partition import PipelinePlan
from lightning_epipe.strategy.planning.plan import plan_for
from lightning_epipe.strategy.rank_topology import RankTopology
from lightning_epipe.strategy.server_data import server_dataloader
from lightning_epipe.strategy.sigterm_broadcast import StepStartSignal, install_sigterm_handling
from lightning_epipe.strategy.start_ahead import StartAhead

__all__ = ["EPipeStrategy"]

log = logging.getLogger(__name__)


class EPipeStrategy(RankTopology, ParallelStrategy):
    __doc__ = f"""Train a LightningModule's ``nn.Sequential`` as a GPipe pipeline across processes.

    Args:
{ARGUMENTS}
    Example::

        trainer = L.Trainer(accelerator="cpu", devices=3,
                            strategy=EPipeStrategy(chunks=8, compressor="sortquant", bits=8))
        trainer.fit(model)   # model.layers is an nn.Sequential
    """

    strategy_name = "epipe"

    def __init__(
        self,
        chunks: int = 4,
        schedule: Literal["gpipe", "1f1b"] = "gpipe",
        compressor: CompressorArg = "none",
        bits: Optional[int] = None,
        activation_compressor: Optional[CompressorArg] = None,
        gradient_compressor: Optional[CompressorArg] = None,
        compressor_kwargs: Optional[dict[str, Any]] = None,
        error_feedback: bool = False,
        delta_compression: bool = False,
        delta_first: str = "none",
        delta_cache_limit: Optional[int] = None,
        balance: Union[Sequence[int], Literal["parameters", "time"], None] = None,
        replicas: int = 1,
        pipeline: Optional[str] = None,
        placement: Literal["client-server", "chain"] = "client-server",
        nonfinite: Literal["raise", "skip"] = "raise",
        checkpoint: Literal["always", "except_last", "never"] = "never",
        start_ahead: bool = True,
        split_backward: Union[bool, Literal["auto"]] = "auto",
        timeout: timedelta = timedelta(minutes=10),
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        process_group_backend: Optional[str] = None,
        verify_checksum: bool = True,
        bind_cores: bool = False,
        freeze_gc: bool = True,
        accelerator: Optional[Any] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
    ) -> None:
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices, cluster_environment=cluster_environment,
                         checkpoint_io=checkpoint_io, precision_plugin=precision_plugin)
        self.config = PipelineConfig.from_arguments(
            chunks=chunks, schedule=schedule, compressor=compressor, bits=bits, activation_compressor=activation_compressor,
            gradient_compressor=gradient_compressor, compressor_kwargs=compressor_kwargs, error_feedback=error_feedback,
            delta_compression=delta_compression, delta_first=delta_first, delta_cache_limit=delta_cache_limit,
            balance=balance, replicas=replicas, pipeline=pipeline, placement=placement, nonfinite=nonfinite,
            checkpoint=checkpoint, start_ahead=start_ahead, split_backward=split_backward, timeout=timeout,
            start_method=start_method,
            process_group_backend=process_group_backend, verify_checksum=verify_checksum, bind_cores=bind_cores,
            freeze_gc=freeze_gc,
        )
        self._backend = process_group_backend  # resolved in setup_environment
        self._tuner = AutoTuner(**self.config.auto_kwargs) if self.config.auto else None
        self._sample_ids = SampleIdRecorder()
        self.stats = PipelineStats()
        self._assembly: Optional[RankAssembly] = None  # this rank's part of the pipeline, after setup
        self._step_start: Optional[StepStartSignal] = None
        self._transport: Optional[Transport] = None  # global ranks: checkpoint state
        self._pipe_transport: Optional[Transport] = None  # this pipeline's ranks: the training's messages
        self._groups: Optional[PipelineGroups] = None
        self._failed = False
        self._checkpoint = ckpt.PipelineCheckpoint()
        self._client = ClientStep(self.config, self.stats, self._sample_ids, GradientStash())
        self._rank_steps: Optional[RankSteps] = None  # after setup
        self._cores = CoreBinding()  # bind_cores=True: this process's share of the machine's cores
        self._said_unbound = False  # bind_cores=True with more processes than cores: warned
        self._gc = FrozenGC()  # freeze_gc=True: what set-up left, out of the collector's way

    # ------------------------------------------------------------------ properties

    @property
    def chunks(self) -> int:
        return self.config.chunks

    @property
    def schedule(self) -> str:
        return self.config.schedule

    @property
    def placement(self) -> str:
        return self.config.placement

    @property
    def replicas(self) -> int:
        return self.config.replicas

    @property
    def balance(self) -> Union[list[int], str]:
        return list(self.config.balance) if isinstance(self.config.balance, tuple) else self.config.balance

    @property
    def plan(self) -> PipelinePlan:
        """Which layers each stage holds and which rank runs it (after setup)."""
        if self._assembly is None:
            raise RuntimeError("The pipeline plan exists only after the Trainer has set up the strategy.")
        return self._assembly.plan

    @property
    def runtime(self) -> PipelineRuntime:
        if self._rank_steps is None:
            raise RuntimeError("Accessing the pipeline runtime before the processes have initialized is not allowed.")
        return self._rank_steps.runtime

    @property
    def auto_choices(self) -> dict[str, str]:
        """``compressor="auto"``: the codec chosen per link so far, e.g. ``{"activation/cut0": "fp16"}``."""
        return self._tuner.describe() if self._tuner is not None else {}

    @property
    def auto_history(self) -> list:
        """``compressor="auto"``: every decision as ``(step, LinkChoice)``, in order (empty without auto)."""
        return list(self._tuner.history) if self._tuner is not None else []

    def compressor_description(self) -> dict[str, list[str]]:
        """The codec per cut and direction, e.g. ``{"activation": ["sortquant(bits=8)", ...]}``."""
        return self._assembly.codecs.describe() if self._assembly else {}

    def check_model(self, model: LightningModule) -> PipelinePlan:
        """Validate the module against this configuration; raises before any process starts."""
        return plan_for(model, self.config, self.world_size, self.num_processes, self.num_nodes)

    # ------------------------------------------------------------------ launch and process group

    @override
    def _configure_launcher(self) -> None:
        self._launcher = make_launcher(self, self._backend)

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        reset_seed()
        self.set_world_ranks()
        self._backend = self._backend or _get_default_process_group_backend_for_device(self.root_device)
        if self.config.bind_cores:  # before the process group: gloo's threads start on the share
            share = self._cores.bind(self.local_rank, self.num_processes)
            if share is not None:
                log.info("EPipeStrategy: rank %d bound to CPU cores %s", self.global_rank, list(share))
            elif not self._said_unbound:  # once: fit and a later test both set up
                self._said_unbound = True
                rank_zero_warn(f"EPipeStrategy(bind_cores=True): {self.num_processes} processes on this machine outnumber"
                               " its cores; left unbound")
        start_process_group(self.cluster_environment, self._backend, self.config.timeout)
        if self._groups is None:  # once per process (fit and a later test share them), in the same order on every rank
            self._groups = create_groups(self.layout, self.placement, self.global_rank, self._backend)

    # ------------------------------------------------------------------ setup

    @override
    def setup(self, trainer: Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        check_setup(self.lightning_module, self.model, self.precision_plugin, self.config.nonfinite)
        self.accelerator.setup(trainer)
        module = self.lightning_module
        saved = (self._checkpoint.resume or {}).get("bottlenecks")
        self._assembly = assembly = assemble(module, self.config, self.check_model(module), self._assembly, self.layout.size,
                                             self.pipeline_rank, self.global_rank, self.root_device, self.num_processes, saved)
        plan, layers, codecs = assembly.plan, assembly.layers, assembly.codecs
        keep_metrics_local(module)
        # one replica: epoch-level logging has nothing to sync across ranks
        warnings.filterwarnings("ignore", message=r".*sync_dist=True.*when logging on epoch level.*")
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            added = optimize_bottlenecks(getattr(module, ATTRIBUTE, None), bottleneck_lr(codecs.bottlenecks()),
                                         self.optimizers, [c.scheduler for c in self.lr_scheduler_configs])
            if added and self.is_client:
                log.info("EPipeStrategy: the first optimizer also trains the bottlenecks' %s", added)
        self.setup_precision_plugin()
        scaler = scaler_of(self.precision_plugin)
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)
            if scaler is not None:  # 16-mixed: every rank skips, steps and scales as one
                check_unscaling(self.optimizers)
                agree_on_overflow(self.precision_plugin, self.root_device)
        if self._pipe_transport is None:  # kept across fit/validate/test: receives may be posted ahead
            self._transport, self._pipe_transport = create_transports(
                self.layout, self.placement, self.global_rank, self.root_device, self._groups, self.config.timeout,
                self.config.verify_checksum, self.stats, self._backend, self.cluster_environment.main_address)
            if self._tuner is not None:  # the rate windows hold what compressor="auto" measures over
                self._pipe_transport.rate_window_bytes = self._tuner.window_bytes
        nonfinite = "allow" if scaler is not None else self.config.nonfinite  # overflow is the GradScaler's to handle
        runtime = PipelineRuntime(plan, self.pipeline_rank, layers, self._pipe_transport, codecs, self.stats,
                                  nonfinite, self.config.checkpoint, assembly.bottlenecks, self.config.split_backward)
        self._checkpoint.attach(ckpt.CheckpointRank(
            self._transport, self.world_size, self.global_rank, self.root_device, module, assembly.pipeline_attr,
            None if self.is_client else tuple(plan.layers_of(self.pipeline_rank)), codecs, list(plan.balance),
            self.placement, self._tuner))
        self._rank_steps = RankSteps(runtime, module, self._client, self.root_device, self._groups.stage, self.replicas)
        if self.is_client:  # the user's self.layers(x) runs the pipeline: Lightning has no hook for a module's call
            layers.forward = self._rank_steps.pipelined_forward  # type: ignore[method-assign]
        clip_across_stages(self.precision_plugin, self.root_device, self.replicas,
                           lambda optimizer, algorithm, value: self._steps.before_clip(optimizer, self.optimizers, algorithm, value))
        # no collective at every step boundary; SIGTERM stops every rank on the same step
        clients = self._groups.stage if self.is_client else None  # None with one replica
        self._step_start = install_sigterm_handling(trainer, runtime, self.root_device, self.config.timeout,
                                                    trainer.state.fn == TrainerFn.FITTING, clients)
        if not any(isinstance(cb, CallbackMetricsSync) for cb in trainer.callbacks):
            trainer.callbacks.insert(0, CallbackMetricsSync(self.root_device))
        trainer.callbacks = [cb for cb in trainer.callbacks if not isinstance(cb, StartAhead)]  # one, set up again or not
        if self.config.start_ahead and not self.is_client:
            trainer.callbacks.insert(0, StartAhead(self._start_next_step))
        if self.is_client:
            log.info("EPipeStrategy plan: balance=%s ranks=%s codecs=%s", plan.balance, plan.stage_ranks, self.compressor_description())
        if self.config.freeze_gc:  # last: everything set-up made is frozen with the rest
            self._gc.freeze()

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        device = self.root_device
        self.model._apply(lambda t: t if t.is_meta else t.to(device))

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """Servers never read data: they iterate placeholders, as many as the client's batches."""
        if self.is_client:
            if self.config.delta is not None and self.lightning_module.trainer.training:
                return self._sample_ids.wrap(dataloader)
            return dataloader
        return server_dataloader(dataloader)

    # ------------------------------------------------------------------ steps (engine/rank_steps.py)

    @property
    def _steps(self) -> RankSteps:
        if self._rank_steps is None:
            raise RuntimeError("EPipeStrategy runs steps only after the Trainer has set it up.")
        return self._rank_steps

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._steps.run("training_step", self.precision_plugin.train_step_context(), *args, **kwargs)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._steps.run("validation_step", self.precision_plugin.val_step_context(), *args, **kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._steps.run("test_step", self.precision_plugin.test_step_context(), *args, **kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._steps.run("predict_step", self.precision_plugin.predict_step_context(), *args, **kwargs)

    @override
    def backward(self, closure_loss: Tensor, optimizer: Optional[Optimizer], *args: Any, **kwargs: Any) -> Tensor:
        lightning_backward = super().backward
        return self._steps.backward(closure_loss, lambda loss: lightning_backward(loss, optimizer, *args, **kwargs))

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        self._steps.before_optimizer_step(optimizer, self.optimizers)
        return super().optimizer_step(optimizer, closure, model, **kwargs)

    def _start_next_step(self) -> None:
        """A server at the end of a training batch: the client's next step now, if it has begun (``start_ahead.py``)."""
        self._steps.start_next_step(self.precision_plugin.train_step_context())

    # ------------------------------------------------------------------ collectives Lightning asks for

    @override
    def reduce(self, tensor: Any, group: Optional[Any] = None, reduce_op: Optional[Union[ReduceOp, str]] = "mean") -> Any:
        """Logged values exist only on the client and there is one replica: nothing to reduce."""
        return tensor

    @override
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return agree(decision, self.root_device, every=all)

    @override
    def barrier(self, name: Optional[str] = None) -> None:
        if _distributed_is_initialized():
            dist.barrier()

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Broadcast plain data (JSON types, paths) from ``src``; nothing is pickled."""
        return broadcast_plain(obj, self.root_device, src) if _distributed_is_initialized() else obj

    @override
    def all_gather(self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> Tensor:
        """One replica: gathering is the identity (as on a single device)."""
        return tensor

    # ------------------------------------------------------------------ checkpoints (checkpoint_state.py)

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The full state dict on rank 0 (every stage's weights gathered), ``{}`` elsewhere."""
        return self.lightning_module.state_dict() if self._rank_steps is None else self._checkpoint.model_state()

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        return optimizer.state_dict() if self._rank_steps is None else self._checkpoint.optimizer_state(optimizer)

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Each rank keeps the optimizer state of the parameters it owns."""
        ckpt.load_owned_optimizer_state(self.optimizers, checkpoint["optimizer_states"], self.root_device)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Optional[Any] = None) -> None:
        """Rank 0 writes; every rank sends its codec streams' and RNG state into ``checkpoint["epipe"]``."""
        extra = None if self._rank_steps is None else self._checkpoint.extra_state()
        if self.is_global_zero:
            checkpoint["epipe"] = extra
            self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: Optional[bool] = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._checkpoint.resume = checkpoint.get("epipe")
        return checkpoint

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """``compressor="auto"``: every rank measures and decides at the same step (a collective)."""
        if self._tuner is not None and self._rank_steps is not None:
            self._rank_steps.retune(self._tuner, self.lightning_module.trainer.global_step, self.layout.offset(self.global_rank))

    @override
    def on_train_start(self) -> None:
        self._checkpoint.restore_rng(self.global_rank, self.root_device)

    # ------------------------------------------------------------------ teardown

    @override
    def on_exception(self, exception: BaseException) -> None:
        self._failed = True
        stopped_alone = isinstance(exception, SIGTERMException) and self._step_start is None
        if stopped_alone and self.is_client and self._rank_steps is not None:
            self._rank_steps.stop_servers()

    @override
    def teardown(self) -> None:
        module = self.lightning_module
        if self._step_start is not None:
            self._step_start.uninstall(wait=not self._failed)
            self._step_start = None
        if module is not None and self._rank_steps is not None:
            fitted = module._trainer is not None and module._trainer.state.fn == TrainerFn.FITTING and not self._failed
            give_back(module, self._assembly, fitted, self._transport, self.world_size, self._checkpoint.owned_state())
        _optimizers_to_device(self.optimizers, torch.device("cpu"))
        if module is not None:
            module._apply(lambda t: t if t.is_meta else t.cpu())
        self._rank_steps = None
        self.precision_plugin.teardown()
        assert self.accelerator is not None
        self.accelerator.teardown()
        self.checkpoint_io.teardown()
        self._cores.restore()
        self._gc.unfreeze()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register("epipe", cls, description="GPipe pipeline with compressed cuts (lightning-epipe)")
        strategy_registry.register(
            "epipe_spawn", cls, description="GPipe pipeline with compressed cuts, spawned processes", start_method="spawn"
        )
