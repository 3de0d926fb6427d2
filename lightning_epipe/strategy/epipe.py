"""EPipeStrategy: pipeline parallelism with compressed cuts, as a Lightning strategy.

Lightning delegation only; the logic lives beside it (``docs/architecture.md`` draws the
data path): arguments (and their documentation) in ``config``, the split in ``planning/``,
this rank's part of the pipeline in ``assembly``, a step's messages in ``engine/``
(``client_step`` and ``runtime`` on the client, ``server_loop`` on the servers, 1F1B's losses
in ``one_f_one_b``) over ``comm/``, codecs per stream in ``compression/``, checkpoints in
``checkpoint_state``. How a step runs:

- The client (rank 0) runs the user's step. Its ``self.layers(x)`` call is the pipelined
  forward: it tells every server ``FORWARD``, feeds the micro-batches in and returns the
  gathered output of the last stage, so loss and metrics are ordinary code.
- The servers never run user code: their ``training_step`` follows the client's commands
  (:func:`~lightning_epipe.strategy.engine.server_loop.serve_step`) and returns a placeholder loss.
- ``strategy.backward`` runs after Lightning's ``zero_grad``: the client backpropagates the
  loss through its last stage (each micro-batch's gradient leaves as autograd produces it),
  then every rank drains the backward schedule.
"""

from __future__ import annotations

import logging
import warnings
from datetime import timedelta
from functools import partial
from pathlib import Path, PurePath
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
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_epipe.strategy import checkpoint_state as ckpt
from lightning_epipe.strategy.assembly import RankAssembly, assemble, give_back
from lightning_epipe.strategy.comm.collectives import broadcast_json, start_process_group
from lightning_epipe.strategy.comm.stream_groups import StreamGroups, create_stream_groups, create_transports
from lightning_epipe.strategy.comm.transport import Transport
from lightning_epipe.strategy.comm.wire import Command
from lightning_epipe.strategy.compression.auto_tuner import AutoTuner
from lightning_epipe.strategy.compression.bottleneck_layers import ATTRIBUTE, bottleneck_lr
from lightning_epipe.strategy.compression.bottleneck_optimizer import optimize_bottlenecks
from lightning_epipe.strategy.compression.sample_ids import SampleIdRecorder
from lightning_epipe.strategy.config import ARGUMENTS, CompressorArg, PipelineConfig
from lightning_epipe.strategy.engine.after_backward import finish_backward
from lightning_epipe.strategy.engine.client_step import ClientStep
from lightning_epipe.strategy.engine.clipping import clip_across_stages
from lightning_epipe.strategy.engine.one_f_one_b import GradientStash
from lightning_epipe.strategy.engine.replicas import ReplicaLayout
from lightning_epipe.strategy.engine.runtime import PipelineRuntime
from lightning_epipe.strategy.engine.server_loop import ServerHooks, StepEnd, serve_step, step_optimizer
from lightning_epipe.strategy.engine.stats import PipelineStats
from lightning_epipe.strategy.launch import make_launcher
from lightning_epipe.strategy.metrics_sync import CallbackMetricsSync, keep_metrics_local
from lightning_epipe.strategy.planning.partition import PipelinePlan
from lightning_epipe.strategy.planning.plan import plan_for
from lightning_epipe.strategy.server_data import ServerBatches
from lightning_epipe.strategy.sigterm_broadcast import AsyncSigtermBroadcast, install_sigterm_handling

__all__ = ["EPipeStrategy"]

log = logging.getLogger(__name__)


class EPipeStrategy(ParallelStrategy):
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
        timeout: timedelta = timedelta(minutes=10),
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        process_group_backend: Optional[str] = None,
        verify_checksum: bool = True,
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
            checkpoint=checkpoint, timeout=timeout, start_method=start_method,
            process_group_backend=process_group_backend, verify_checksum=verify_checksum,
        )
        self._backend = process_group_backend  # resolved in setup_environment
        self._num_nodes = 1
        self._tuner = AutoTuner(**self.config.auto_kwargs) if self.config.auto else None
        self._sample_ids = SampleIdRecorder()
        self.stats = PipelineStats()
        self._assembly: Optional[RankAssembly] = None  # this rank's part of the pipeline, after setup
        self._runtime: Optional[PipelineRuntime] = None
        self._sigterm_broadcast: Optional[AsyncSigtermBroadcast] = None
        self._transport: Optional[Transport] = None  # global ranks: checkpoint state
        self._pipe_transport: Optional[Transport] = None  # this pipeline's ranks: the training's messages
        self._stream_groups: Optional[tuple[StreamGroups, Any]] = None
        self._stage_groups: list[Any] = []
        self._failed = False
        self._checkpoint = ckpt.PipelineCheckpoint()
        self._skip_backward = False
        self._stash = GradientStash()
        self._client = ClientStep(self.config, self.stats, self._sample_ids, self._stash)

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
    @override
    def root_device(self) -> torch.device:
        assert self.parallel_devices is not None
        return self.parallel_devices[self.local_rank]

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, num_nodes: int) -> None:
        self._num_nodes = num_nodes

    @property
    def num_processes(self) -> int:
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_processes

    @property
    def is_distributed(self) -> bool:
        """For Lightning's data: with one pipeline the stages form *one* replica, so the user's
        sampler is used as is (no DistributedSampler); with ``replicas > 1`` each pipeline
        reads its own shard. ``sync_dist`` stays a no-op: logged values are rank 0's."""
        return self.replicas > 1

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # Every stage of a pipeline reads the same batches: the shard of its replica.
        return {"num_replicas": self.replicas, "rank": self.layout.replica_of(self.global_rank)}

    @property
    def layout(self) -> ReplicaLayout:
        """Which global ranks form which pipeline replica."""
        return ReplicaLayout(self.world_size, self.replicas)

    @property
    def pipeline_rank(self) -> int:
        """This process's rank within its pipeline (0: the client)."""
        return self.layout.pipeline_rank(self.global_rank)

    @property
    def is_client(self) -> bool:
        """Rank 0 of a pipeline holds the data, the loss and the Lightning loop's user code."""
        return self.pipeline_rank == 0

    @property
    def plan(self) -> PipelinePlan:
        """Which layers each stage holds and which rank runs it (after setup)."""
        if self._assembly is None:
            raise RuntimeError("The pipeline plan exists only after the Trainer has set up the strategy.")
        return self._assembly.plan

    @property
    def runtime(self) -> PipelineRuntime:
        if self._runtime is None:
            raise RuntimeError("Accessing the pipeline runtime before the processes have initialized is not allowed.")
        return self._runtime

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
        start_process_group(self.cluster_environment, self._backend, self.config.timeout)
        layout = self.layout
        if self._stream_groups is None:  # once per process (fit and a later test share them), in the same order on every rank
            self._stream_groups = create_stream_groups(layout, self.placement, self.global_rank, self._backend)
            if layout.replicas > 1:
                self._stage_groups = [dist.new_group(list(layout.stage_group(k))) for k in range(layout.size)]

    def set_world_ranks(self) -> None:
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)
        rank_zero_only.rank = self.global_rank

    # ------------------------------------------------------------------ setup

    @override
    def setup(self, trainer: Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        if self.lightning_module is not self.model:
            raise ValueError("EPipeStrategy needs the LightningModule itself, not a wrapped model")
        if getattr(self.precision_plugin, "scaler", None) is not None:
            raise ValueError(
                "precision='16-mixed' needs a GradScaler, whose per-rank overflow checks would disagree across"
                " stages: use precision='bf16-mixed', 'bf16-true' or '32-true' with EPipeStrategy"
            )
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
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)
        if self._pipe_transport is None:  # kept across fit/validate/test: receives may be posted ahead
            self._transport, self._pipe_transport = create_transports(
                self.layout, self.global_rank, self.root_device, *self._stream_groups, self.config.timeout,
                self.config.verify_checksum, self.stats, self._backend)
            if self._tuner is not None:  # the rate windows hold what compressor="auto" measures over
                self._pipe_transport.rate_window_bytes = self._tuner.window_bytes
        self._runtime = PipelineRuntime(plan, self.pipeline_rank, layers, self._pipe_transport, codecs, self.stats,
                                        self.config.nonfinite, self.config.checkpoint, assembly.bottlenecks)
        self._checkpoint.restore_codecs(codecs, self._tuner, list(plan.balance), self.global_rank)
        if self.is_client:  # the user's self.layers(x) runs the pipeline: Lightning has no hook for a module's call
            layers.forward = self._pipelined_forward  # type: ignore[method-assign]
        clip_across_stages(self.precision_plugin, self.root_device, self.replicas,
                           lambda: self.lightning_module.automatic_optimization)
        # no barrier at every step boundary; SIGTERM stops every rank on the same step
        self._sigterm_broadcast = install_sigterm_handling(trainer, self.root_device, self.config.timeout,
                                                           trainer.state.fn == TrainerFn.FITTING)
        if not any(isinstance(cb, CallbackMetricsSync) for cb in trainer.callbacks):
            trainer.callbacks.insert(0, CallbackMetricsSync(self.root_device))
        if self.is_client:
            log.info("EPipeStrategy plan: balance=%s ranks=%s codecs=%s", plan.balance, plan.stage_ranks, self.compressor_description())

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
        try:
            return ServerBatches(len(dataloader))  # type: ignore[arg-type]
        except TypeError:
            return dataloader  # an iterable without length: read it to keep the step count equal

    # ------------------------------------------------------------------ steps

    def _pipelined_forward(self, inputs: Any) -> Any:
        """The client's ``self.layers(x)``: run the whole pipeline, return the gathered output."""
        return self._client.forward(self.runtime, self.lightning_module, inputs)

    def _run_step(self, hook: str, context: Any, *args: Any, **kwargs: Any) -> Any:
        training = hook == "training_step"
        automatic = self.lightning_module.automatic_optimization
        if not self.is_client:
            with context:
                return self._serve(training, automatic)
        batch = (args[0] if args else kwargs.get("batch")) if training else None
        with self._client.inside(batch), context:
            output = getattr(self.lightning_module, hook)(*args, **kwargs)
        return self._skipped_step_loss() if self._client.end(self.runtime, output, training, automatic) else output

    def _serve(self, training: bool, automatic: bool) -> Optional[Tensor]:
        """A server's step hook: what Lightning expects back once the client ended the step."""
        hooks = ServerHooks(after_backward=self._after_backward, optimizer_step=partial(step_optimizer, self.lightning_module),
                            set_gradients_aside=lambda: self._stash.set_aside(self.lightning_module))
        end = serve_step(self.runtime, hooks, training)
        if end is StepEnd.STOPPED:  # as the client did: Lightning's way out on SIGTERM
            raise SIGTERMException()
        if end is StepEnd.SKIPPED:
            return self._skipped_step_loss() if training and automatic else None
        if end is StepEnd.FINISHED and automatic:
            return torch.zeros((), device=self.root_device, requires_grad=True)  # Lightning's backward runs ours
        self.runtime.discard()
        return None

    def _skipped_step_loss(self) -> Tensor:
        """Lightning refuses ``None`` from a distributed training_step: return a zero loss
        and let :meth:`backward` drop every gradient, so the optimizer updates nothing."""
        self._skip_backward = True
        return torch.zeros((), device=self.root_device, requires_grad=True)

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._run_step("training_step", self.precision_plugin.train_step_context(), *args, **kwargs)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._run_step("validation_step", self.precision_plugin.val_step_context(), *args, **kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._run_step("test_step", self.precision_plugin.test_step_context(), *args, **kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        return self._run_step("predict_step", self.precision_plugin.predict_step_context(), *args, **kwargs)

    # ------------------------------------------------------------------ backward and optimizer

    @override
    def backward(self, closure_loss: Tensor, optimizer: Optional[Optimizer], *args: Any, **kwargs: Any) -> Tensor:
        runtime = self.runtime
        if self._skip_backward:
            self._skip_backward = False
            for p in self.lightning_module.parameters():
                p.grad = None
            return closure_loss
        if self.is_client:
            if not self.lightning_module.automatic_optimization:
                if not runtime.has_pending_backward:
                    raise RuntimeError("manual_backward() needs a pipelined forward in the same training_step")
                runtime.command(Command.BACKWARD)
            with runtime.timer.measure(self.plan.num_stages - 1):  # the loss and the last stage (its gradients leave as they come)
                closure_loss = super().backward(closure_loss, optimizer, *args, **kwargs)
        runtime.backward()
        self._stash.restore()
        self._after_backward()
        return closure_loss

    def _after_backward(self) -> None:
        runtime, group = self.runtime, self._stage_groups[self.pipeline_rank] if self._stage_groups else None
        finish_backward(self.lightning_module, self.config.nonfinite, runtime.nonfinite_seen, runtime.step,
                        self.root_device, group, self.replicas)

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        if self.is_client and not self.lightning_module.automatic_optimization:
            inner = getattr(optimizer, "_optimizer", optimizer)
            self.runtime.command(Command.OPTIMIZER_STEP, arg=self.optimizers.index(inner))
        return super().optimizer_step(optimizer, closure, model, **kwargs)

    # ------------------------------------------------------------------ collectives Lightning asks for

    @override
    def reduce(self, tensor: Any, group: Optional[Any] = None, reduce_op: Optional[Union[ReduceOp, str]] = "mean") -> Any:
        """Logged values exist only on the client and there is one replica: nothing to reduce."""
        return tensor

    @override
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        flag = torch.tensor([int(decision)], device=self.root_device)
        dist.all_reduce(flag, op=dist.ReduceOp.SUM)
        return bool(flag.item() == self.world_size) if all else bool(flag.item() > 0)

    @override
    def barrier(self, name: Optional[str] = None) -> None:
        if _distributed_is_initialized():
            dist.barrier()

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Broadcast plain data (JSON types, paths) from ``src``; nothing is pickled."""
        if not _distributed_is_initialized():
            return obj
        payload = {"path": str(obj)} if isinstance(obj, PurePath) else {"value": obj}
        value = broadcast_json(payload if self.global_rank == src else None, self.root_device, src)
        return Path(value["path"]) if "path" in value else value["value"]

    @override
    def all_gather(self, tensor: Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> Tensor:
        """One replica: gathering is the identity (as on a single device)."""
        return tensor

    # ------------------------------------------------------------------ checkpoints (checkpoint_state.py)

    def _owned_state(self) -> dict[str, Tensor]:
        owned = None if self.is_client else self.plan.layers_of(self.pipeline_rank)
        return ckpt.owned_state(self.lightning_module, self._assembly.pipeline_attr, owned)

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The full state dict on rank 0 (every stage's weights gathered), ``{}`` elsewhere."""
        if self._runtime is None:
            return self.lightning_module.state_dict()
        return self._checkpoint.model_state(self._transport, self.world_size, self.lightning_module, self._owned_state())

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        if self._runtime is None:
            return optimizer.state_dict()
        return ckpt.gather_optimizer_state(self._transport, self.world_size, optimizer) or {}

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Each rank keeps the optimizer state of the parameters it owns."""
        ckpt.load_owned_optimizer_state(self.optimizers, checkpoint["optimizer_states"], self.root_device)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Optional[Any] = None) -> None:
        """Rank 0 writes; every rank sends its codec streams' and RNG state into ``checkpoint["epipe"]``."""
        extra = None if self._runtime is None else self._checkpoint.extra_state(
            self._transport, self.world_size, self.global_rank, self._assembly.codecs.state_dict(), self.root_device,
            list(self.plan.balance), self.placement, None if self._tuner is None else self._tuner.state_dict())
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
        if self._tuner is not None and self._runtime is not None:
            step = self.lightning_module.trainer.global_step
            runtime = self._runtime
            self._tuner.maybe_retune(step, self.plan, self.pipeline_rank, self._assembly.codecs, runtime.samples, self.root_device,
                                     self.layout.offset(self.global_rank), runtime.transport.rates,
                                     (self.stats.busy_seconds, runtime.microbatches_run))

    @override
    def on_train_start(self) -> None:
        self._checkpoint.restore_rng(None if self._assembly is None else list(self.plan.balance), self.global_rank, self.root_device)

    # ------------------------------------------------------------------ teardown

    @override
    def on_exception(self, exception: BaseException) -> None:
        self._failed = True
        stopped_alone = isinstance(exception, SIGTERMException) and self._sigterm_broadcast is None
        if stopped_alone and self.is_client and self._runtime is not None:
            # SIGTERM in validate/test/predict: Lightning stopped the client between two batches,
            # where every server waits for its next command (in fit, rank 0's broadcast stops all)
            try:
                self._runtime.command(Command.STOP)
                self._runtime.transport.flush()
            except Exception as error:  # a server already gone: it ends on its own
                log.info("EPipeStrategy: could not tell the servers to stop (%s)", error)

    @override
    def teardown(self) -> None:
        module = self.lightning_module
        if self._sigterm_broadcast is not None:
            self._sigterm_broadcast.uninstall(wait=not self._failed)
            self._sigterm_broadcast = None
        if module is not None and self._runtime is not None:
            fitted = module._trainer is not None and module._trainer.state.fn == TrainerFn.FITTING and not self._failed
            give_back(module, self._assembly, fitted, self._transport, self.world_size, self._owned_state())
        _optimizers_to_device(self.optimizers, torch.device("cpu"))
        if module is not None:
            module._apply(lambda t: t if t.is_meta else t.cpu())
        self._runtime = None
        self.precision_plugin.teardown()
        assert self.accelerator is not None
        self.accelerator.teardown()
        self.checkpoint_io.teardown()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register("epipe", cls, description="GPipe pipeline with compressed cuts (lightning-epipe)")
        strategy_registry.register(
            "epipe_spawn", cls, description="GPipe pipeline with compressed cuts, spawned processes", start_method="spawn"
        )
