"""EPipeStrategy: GPipe pipeline parallelism with compressed cuts, as a Lightning strategy.

Lightning glue only: planning lives in ``partition``/``schedule``, the wire in
``wire``/``transport``, the per-rank loop in ``runtime``. How a step runs:

- The client (rank 0) runs the user's step. Its ``self.layers(x)`` call is the pipelined
  forward: it tells every server ``FORWARD``, feeds the micro-batches in and returns the
  gathered output of the last stage, so loss and metrics are ordinary code.
- The servers never run user code: their ``training_step`` follows the client's commands
  (``FORWARD``, then ``FINISH_STEP`` or ``SKIP_STEP``; under manual optimization also
  ``BACKWARD`` and ``OPTIMIZER_STEP``) and returns a placeholder loss.
- ``strategy.backward`` runs after Lightning's ``zero_grad``: the client backpropagates the
  loss through its last stage, then every rank drains the backward schedule.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from pathlib import Path, PurePath
from typing import Any, Callable, Iterator, Literal, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.utilities.distributed import (
    ReduceOp,
    _distributed_is_initialized,
    _get_default_process_group_backend_for_device,
    _init_dist_connection,
)
from lightning.fabric.utilities.optimizer import _optimizer_to_device, _optimizers_to_device
from lightning.fabric.utilities.seed import reset_seed
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn
from torch import Tensor, nn
from torch.optim import Optimizer
from typing_extensions import override

from lightning_epipe.compressors import BottleneckPair, Compressor
from lightning_epipe.strategy.balance import balance_by_parameters
from lightning_epipe.strategy.bottlenecks import ATTRIBUTE as BOTTLENECKS
from lightning_epipe.strategy.bottlenecks import (
    ensure_optimized,
    install_bottlenecks,
    release_foreign_halves,
    split_bottleneck_state,
)
from lightning_epipe.strategy.codecs import AUTO_KEYS, CodecBook, DeltaConfig, resolve_specs
from lightning_epipe.strategy.launch import ScriptLauncher, SpawnLauncher
from lightning_epipe.strategy.measured_balance import measured_balance, memory_capacity
from lightning_epipe.strategy.metrics_sync import CallbackMetricsSync, broadcast_json
from lightning_epipe.strategy.microbatch import batch_size, gather, scatter
from lightning_epipe.strategy.partition import PLACEMENTS, PipelinePlan, find_pipeline, num_stages_for, plan_pipeline
from lightning_epipe.strategy.replicas import ReplicaLayout, average_gradients, check_replicas
from lightning_epipe.strategy.runtime import PipelineRuntime
from lightning_epipe.strategy.sample_ids import SampleIdRecorder
from lightning_epipe.strategy.server_data import ServerBatches
from lightning_epipe.strategy.state import flatten_state, gather_tensors, unflatten_state
from lightning_epipe.strategy.stats import PipelineStats
from lightning_epipe.strategy.stream_groups import StreamGroups, create_stream_groups
from lightning_epipe.strategy.transport import Transport
from lightning_epipe.strategy.tuning import AutoTuner
from lightning_epipe.strategy.wire import Command, StepFlag

__all__ = ["EPipeStrategy"]

log = logging.getLogger(__name__)

CompressorArg = Union[str, Compressor, Sequence[Union[str, Compressor]]]
_RENDEZVOUS_TIMEOUT = timedelta(minutes=10)


def _set_collective_timeout(timeout: timedelta) -> None:
    if hasattr(dist, "set_timeout"):
        dist.set_timeout(timeout)
    else:  # torch < 2.6
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timeout)


def _default_cache_limit(device: torch.device, local_processes: int) -> int:
    """A quarter of what this process may use: its accelerator's memory, or its share of the host's RAM."""
    limit = memory_capacity(device, local_processes) / 4
    return int(limit) if limit != float("inf") else 4 << 30


def _check_1f1b(model: LightningModule) -> None:
    if not callable(getattr(model, "pipeline_loss", None)):
        raise ValueError(
            f"EPipeStrategy(schedule='1f1b') backpropagates every micro-batch as soon as its forward ends, so it needs"
            f" the loss per micro-batch: define `def pipeline_loss(self, output, batch)` on {type(model).__name__},"
            " returning the mean loss of one micro-batch (`output` and `batch` are its slices), e.g."
            " `return F.cross_entropy(output, batch[1])`; or use schedule='gpipe'"
        )
    if not model.automatic_optimization:
        raise ValueError("EPipeStrategy(schedule='1f1b') runs with automatic optimization; use schedule='gpipe' for manual")


def _not_distributed() -> bool:
    return False


def _as_leaf(output: Any) -> Any:
    """1F1B: the gathered output as a leaf that requires grad, so the step's returned loss can be
    backpropagated by Lightning (into nothing: the pipeline's gradients are already computed)."""
    if isinstance(output, Tensor):
        return output.detach().requires_grad_(output.is_floating_point())
    if isinstance(output, dict):
        return {k: _as_leaf(v) for k, v in output.items()}
    return type(output)(_as_leaf(v) for v in output)


def _keep_metrics_local(module: nn.Module) -> None:
    """torchmetrics would all-gather states over every rank; only the client updates them."""
    try:
        from torchmetrics import Metric
    except ImportError:  # pragma: no cover - torchmetrics is a dependency
        return
    for m in module.modules():
        if isinstance(m, Metric):
            m.distributed_available_fn = _not_distributed


class EPipeStrategy(ParallelStrategy):
    """Train a LightningModule's ``nn.Sequential`` as a GPipe pipeline across processes.

    Args:
        chunks: micro-batches per batch (a smaller last batch runs as fewer).
        schedule: ``"gpipe"`` (every forward, then every backward: the loss is computed on the
            whole batch) or ``"1f1b"`` (each micro-batch's backward starts as soon as its forward
            ends, so a stage holds at most as many micro-batches as there are stages after it;
            needs a ``pipeline_loss(output, batch)`` method on the LightningModule giving one
            micro-batch's mean loss, and automatic optimization).
        compressor: codec for everything crossing a cut: a name from
            ``lightning_epipe.compressors.available_compressors()``, a ``Compressor`` instance,
            ``"bottleneck"`` (a learned encoder/decoder pair per cut), ``"auto"`` (chosen per
            link from the rate of the training's own traffic and codec speed within an error
            budget; keys ``error_budget``, ``retune_every`` and ``tolerance`` in
            ``compressor_kwargs``), or a list with one per cut.
        bits: bit width for the quantizing codecs (``sortquant``, ``quantize``, ``topk``).
        activation_compressor: overrides ``compressor`` for activations (forward).
        gradient_compressor: overrides ``compressor`` for gradients (backward).
        compressor_kwargs: further keyword arguments of the codec (``split``, ``fraction``, ``rank``...;
            ``ratio``, ``stride``, ``wire``, ``init`` for ``compressor="bottleneck"``).
        error_feedback: add each gradient compression's error to the next gradient of the same
            cut and micro-batch slot (:class:`~lightning_epipe.compressors.ErrorFeedback`).
        delta_compression: AQ-SGD-style: every activation crossing a cut in training is sent as
            its change since the same training sample last crossed, compressed with the
            activation codec; both sides of the cut cache one row per training sample
            (:class:`~lightning_epipe.compressors.delta.DeltaCompressor`). Needs a
            map-style training DataLoader (the sample indices come from its sampler).
        delta_first: the codec for a sample's first crossing (default uncompressed).
        delta_cache_limit: bytes one cache may take (default: a quarter of the stage's device
            memory, or of the process's share of the host's RAM on CPU); a larger one fails at the
            first step, saying what it would need.
        balance: layers per stage, or ``"parameters"`` (default) / ``"time"`` to balance
            automatically: ``"time"`` times every layer on every rank's own device with the
            LightningModule's ``example_input_array``, sizes every cut after compression, probes
            the link, and minimizes the busiest rank's compute + communication within each
            rank's memory (heterogeneous processes get the share that fits them).
        replicas: pipelines trained data-parallel: ``devices x num_nodes`` processes form
            ``replicas`` pipelines of equal size, each reading its own shard of the data;
            gradients are averaged between the ranks that run the same stages.
        pipeline: attribute name of the ``nn.Sequential`` (default: the only one).
        placement: ``"client-server"`` (rank 0 runs the first and last stage) or ``"chain"``.
        nonfinite: ``"raise"`` stops on NaN/Inf crossing a cut, ``"skip"`` skips that step on every rank.
        checkpoint: activation recomputation per stage (torchgpipe's): ``"always"``,
            ``"except_last"`` (all micro-batches but the last) or ``"never"``.
        timeout: bound on every wait for a peer (and the process group's collectives).
        start_method: ``"popen"`` (re-run the script per rank), ``"spawn"``, ``"fork"`` or ``"forkserver"``.
        verify_checksum: CRC32 every CPU payload.

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
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
            raise ValueError(f"chunks must be a positive integer (micro-batches per batch), got {chunks!r}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if checkpoint not in ("always", "except_last", "never"):
            raise ValueError(f"checkpoint must be 'always', 'except_last' or 'never', got {checkpoint!r}")
        if nonfinite not in ("raise", "skip"):
            raise ValueError(f"nonfinite must be 'raise' or 'skip', got {nonfinite!r}")
        if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
            raise ValueError(f"timeout must be a positive datetime.timedelta, got {timeout!r}")
        if isinstance(balance, str) and balance not in ("parameters", "time"):
            raise ValueError(f"balance must be a list of layer counts, 'parameters' or 'time', got {balance!r}")
        self.replicas = check_replicas(replicas)
        if schedule not in ("gpipe", "1f1b"):
            raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
        self.schedule = schedule
        self.chunks = chunks
        self.placement = placement
        self.nonfinite = nonfinite
        self.checkpoint = checkpoint
        self.balance = list(balance) if isinstance(balance, (list, tuple)) else (balance or "parameters")
        self.pipeline_name = pipeline
        self.verify_checksum = verify_checksum
        self._timeout = timeout
        self._start_method = start_method
        self._process_group_backend = process_group_backend
        self._num_nodes = 1
        kwargs = dict(compressor_kwargs or {})
        if bits is not None:
            kwargs["bits"] = bits
        if not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback must be True or False, got {error_feedback!r}")
        self.error_feedback = error_feedback
        if not isinstance(delta_compression, bool):
            raise ValueError(f"delta_compression must be True or False, got {delta_compression!r}")
        self._delta = DeltaConfig(delta_first, delta_cache_limit) if delta_compression else None
        self._sample_ids = SampleIdRecorder()
        self._compressor_args = (compressor, activation_compressor, gradient_compressor, kwargs)
        self._check_compressors(num_cuts=None)
        auto = any(isinstance(c, str) and c == "auto" for c in (compressor, activation_compressor, gradient_compressor))
        self._tuner = AutoTuner(**{k: kwargs[k] for k in AUTO_KEYS if k in kwargs}) if auto else None
        self.stats = PipelineStats()
        self._plan: Optional[PipelinePlan] = None
        self._runtime: Optional[PipelineRuntime] = None
        self._transport: Optional[Transport] = None
        self._codecs: Optional[CodecBook] = None
        self._pipeline: Optional[nn.Sequential] = None
        self._driving = False
        self._failed = False
        self._resume_state: Optional[dict[str, Any]] = None
        self._client_backup: dict[str, Tensor] = {}
        self._skip_backward = False
        self._step_batch: Any = None  # the client's training batch, for pipeline_loss under 1F1B
        self._step_loss: Optional[Tensor] = None  # sum of the weighted pipeline_loss values of the step
        self._stash: list[tuple[Tensor, Tensor]] = []  # 1F1B gradients kept away from Lightning's zero_grad
        self._bottlenecks: dict[int, BottleneckPair] = {}
        self._pipe_transport: Optional[Transport] = None
        self._stream_groups: Optional[tuple[StreamGroups, Any]] = None
        self._stage_groups: list[Any] = []
        self._bottleneck_state: dict[str, Tensor] = {}

    # ------------------------------------------------------------------ properties

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
    def plan(self) -> PipelinePlan:
        """Which layers each stage holds and which rank runs it (after setup)."""
        if self._plan is None:
            raise RuntimeError("The pipeline plan exists only after the Trainer has set up the strategy.")
        return self._plan

    @property
    def runtime(self) -> PipelineRuntime:
        if self._runtime is None:
            raise RuntimeError("Accessing the pipeline runtime before the processes have initialized is not allowed.")
        return self._runtime

    @property
    def is_client(self) -> bool:
        """Rank 0 of a pipeline holds the data, the loss and the Lightning loop's user code."""
        return self.pipeline_rank == 0

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_processes

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
        return self._codecs.describe() if self._codecs else {}

    # ------------------------------------------------------------------ configuration checks

    def _check_compressors(self, num_cuts: Optional[int]) -> CodecBook:
        compressor, act, grad, kwargs = self._compressor_args
        activation = resolve_specs(act if act is not None else compressor, kwargs, num_cuts, "activation_compressor")
        gradient = resolve_specs(
            grad if grad is not None else compressor, kwargs, num_cuts, "gradient_compressor", self.error_feedback
        )
        if grad is not None and any(spec.bottleneck is not None for spec in gradient):
            raise ValueError(
                "a bottleneck is a pair of layers on the activation's path: give it as compressor= or"
                " activation_compressor= (its code's gradient then travels back through the same cut)"
            )
        # a bottleneck's code travels back as a gradient of the same size: the gradient codec
        # of that cut (unless set separately) is the bottleneck's wire codec
        return CodecBook(activation, gradient, self._delta)

    def check_model(self, model: LightningModule) -> PipelinePlan:
        """Validate the module against this configuration; raises before any process starts."""
        world = self.world_size
        if world < 2:
            raise ValueError(
                f"EPipeStrategy needs at least 2 processes, got devices={self.num_processes} x num_nodes="
                f"{self.num_nodes}: set Trainer(devices=2) or more"
            )
        world = ReplicaLayout(world, self.replicas).size
        _, layers = find_pipeline(model, self.pipeline_name)
        stages = num_stages_for(self.placement, world)
        if len(layers) < stages:
            raise ValueError(
                f"{world} processes per pipeline with placement={self.placement!r} need {stages} stages but"
                f" {type(model).__name__}'s Sequential has only {len(layers)} layers: use fewer devices or more layers"
            )
        if isinstance(self.balance, list):
            balance = self.balance
        elif self.balance == "parameters":
            balance = balance_by_parameters(layers, world, self.placement)
        else:  # "time" is measured in setup(); any valid split checks the rest now
            balance = [1] * (stages - 1) + [len(layers) - stages + 1]
        plan = plan_pipeline(len(layers), world, balance, self.placement)
        if self.schedule == "1f1b":
            _check_1f1b(model)
        codecs = self._check_compressors(plan.num_cuts)
        built = [c for c, b in codecs.bottlenecks().items() if b.encoder is None]
        if built and getattr(model, "example_input_array", None) is None:
            raise ValueError(
                f"compressor='bottleneck' sizes and initializes the bottleneck of cuts {built} from the activation"
                " there: set `self.example_input_array` (an input of the pipelined Sequential; a few real samples"
                " give a PCA start) in your LightningModule, or pass Bottleneck(encoder=..., decoder=...)"
            )
        return plan

    # ------------------------------------------------------------------ launch and process group

    @override
    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        device_type = self.parallel_devices[0].type if self.parallel_devices else "cpu"
        if self._process_group_backend == "nccl" and device_type != "cuda":
            raise ValueError(
                f"process_group_backend='nccl' needs CUDA devices but the accelerator gives {device_type!r}:"
                " leave process_group_backend unset (gloo on CPU, NCCL on CUDA) or use accelerator='gpu'"
            )
        if self._start_method == "popen":
            self._launcher = ScriptLauncher(self, self.cluster_environment, self.num_processes, self.num_nodes)
        else:
            self._launcher = SpawnLauncher(self, start_method=self._start_method)

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        reset_seed()
        self.set_world_ranks()
        backend = self._process_group_backend or _get_default_process_group_backend_for_device(self.root_device)
        self._process_group_backend = backend
        # Processes start at different speeds (imports, data set-up): the rendezvous gets at
        # least the default 10 minutes; afterwards every collective is bounded by `timeout`.
        _init_dist_connection(self.cluster_environment, backend, timeout=max(self._timeout, _RENDEZVOUS_TIMEOUT))
        if self._timeout < _RENDEZVOUS_TIMEOUT:
            _set_collective_timeout(self._timeout)
        layout = self.layout
        if self._stream_groups is None:  # once per process: fit and a later test share them
            # every rank creates every group, in the same order
            self._stream_groups = create_stream_groups(layout, self.placement, self.global_rank, backend)
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
        plan = self.check_model(module)
        name, layers = find_pipeline(module, self.pipeline_name)
        if self.balance == "time":  # measured once: later stages (test, predict) keep the split
            reuse = self._plan is not None and self._plan.num_layers == len(layers)
            plan = self._plan if reuse else self._plan_by_time(module, layers)
        self._plan, self._pipeline = plan, layers
        self._pipeline_attr = name
        if self._delta is not None and self._delta.cache_limit is None:  # sized for the stage's own device
            self._delta = replace(self._delta, cache_limit=_default_cache_limit(self.root_device, self.num_processes))
            self._codecs = None
        if self._codecs is None or len(self._codecs.specs["activation"]) != plan.num_cuts:
            self._codecs = self._check_compressors(plan.num_cuts)
        saved = (self._resume_state or {}).get("bottlenecks")
        self._bottlenecks = install_bottlenecks(
            module, layers, plan, self._codecs.bottlenecks(), self.global_rank, self.root_device, saved
        )  # built on global rank 0, broadcast to every replica
        self._release_foreign_layers(module, layers, plan)
        _keep_metrics_local(module)
        # one replica: epoch-level logging has nothing to sync across ranks
        warnings.filterwarnings("ignore", message=r".*sync_dist=True.*when logging on epoch level.*")
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            added = ensure_optimized(module, self.optimizers)
            if added and self.is_client:
                log.info("EPipeStrategy: the first optimizer also trains the bottlenecks' %s", added)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)
        if self._pipe_transport is None:  # kept across fit/validate/test: receives may be posted ahead
            groups, control = self._stream_groups
            host = torch.device("cpu")
            self._transport = Transport(self.global_rank, self.root_device, self._timeout, self.verify_checksum, self.stats,
                                        control_group=control, control_device=host)
            self._pipe_transport = Transport(
                self.pipeline_rank, self.root_device, self._timeout, self.verify_checksum, self.stats,
                offset=self.layout.offset(self.global_rank), groups=groups, control_group=control, control_device=host,
                host_staged=self._process_group_backend == "gloo",  # gloo carries host memory only
            )
            if self._tuner is not None:  # the rate windows hold what compressor="auto" measures over
                self._pipe_transport.rate_window_bytes = self._tuner.window_bytes
        self._runtime = PipelineRuntime(
            plan, self.pipeline_rank, layers, self._pipe_transport, self._codecs, self.stats, self.nonfinite,
            self.checkpoint, self._bottlenecks,
        )
        if self._resume_state is not None:
            self._restore_codec_state(self._resume_state)
        if self.is_client:
            layers.forward = self._pipelined_forward  # type: ignore[method-assign]
        self._patch_gradient_clipping()
        if not any(isinstance(cb, CallbackMetricsSync) for cb in trainer.callbacks):
            trainer.callbacks.insert(0, CallbackMetricsSync(self.root_device))
        if self.is_client:
            log.info("EPipeStrategy plan: balance=%s ranks=%s codecs=%s", plan.balance, plan.stage_ranks, self.compressor_description())

    def _plan_by_time(self, module: LightningModule, layers: nn.Sequential) -> PipelinePlan:
        example = module.example_input_array
        if example is None:
            raise ValueError(
                "EPipeStrategy(balance='time') measures every layer on `example_input_array`: set"
                " `self.example_input_array` in your LightningModule, or give balance=[...] / 'parameters'"
            )
        size = self.layout.size
        codecs = self._check_compressors(num_stages_for(self.placement, size) - 1)
        first_cut = (codecs.specs["activation"][0].make(), codecs.specs["gradient"][0].make())
        balance = measured_balance(layers, example, size, self.placement, self.global_rank, self.root_device,
                                   first_cut, self.num_processes)
        return plan_pipeline(len(layers), size, balance, self.placement)

    def _release_foreign_layers(self, module: LightningModule, layers: nn.Sequential, plan: PipelinePlan) -> None:
        """Free the weights this rank does not run (they become meta tensors, state_dict keys stay)."""
        owned = set(plan.layers_of(self.pipeline_rank))
        if self.is_client:  # kept to give the module back whole after validate/test/predict
            self._client_backup = {k: v for k, v in module.state_dict(keep_vars=True).items() if not v.is_meta}
        for i, layer in enumerate(layers):
            if i not in owned:
                layer.to("meta")
        pairs = getattr(module, BOTTLENECKS, None)
        if not self.is_client:
            for child in module.children():
                if child is not layers and child is not pairs:
                    child.to("meta")
        release_foreign_halves(self._bottlenecks, plan, self.pipeline_rank)

    @override
    def model_to_device(self) -> None:
        assert self.model is not None
        device = self.root_device
        self.model._apply(lambda t: t if t.is_meta else t.to(device))

    # ------------------------------------------------------------------ data

    @override
    def process_dataloader(self, dataloader: object) -> object:
        """Servers never read data: they iterate placeholders, as many as the client's batches."""
        if self.is_client:
            if self._delta is not None and self.lightning_module.trainer.training:
                return self._sample_ids.wrap(dataloader)
            return dataloader
        try:
            return ServerBatches(len(dataloader))  # type: ignore[arg-type]
        except TypeError:
            return dataloader  # an iterable without length: read it to keep the step count equal

    # ------------------------------------------------------------------ steps

    def _pipelined_forward(self, inputs: Any) -> Any:
        """The client's ``self.layers(x)``: run the whole pipeline, return the gathered output."""
        if not self._driving:
            raise RuntimeError(
                "The pipelined Sequential runs only inside training/validation/test/predict steps under"
                " EPipeStrategy (its layers live in other processes). Remove `example_input_array` summaries"
                " or other calls outside the steps."
            )
        runtime = self.runtime
        microbatches = scatter(inputs, self.chunks)
        grad = torch.is_grad_enabled()
        ids = None
        if self._delta is not None and grad and self.lightning_module.trainer.training:
            ids = self._sample_ids.pop(batch_size(inputs))
        runtime.begin_step(len(microbatches), None if ids is None else scatter(ids, self.chunks), self._sample_ids.num_samples)
        one_f_one_b = self.schedule == "1f1b" and grad and self.lightning_module.trainer.training
        flags = StepFlag.NONE
        flags |= StepFlag.GRAD_ENABLED if grad else 0
        flags |= StepFlag.SAMPLE_IDS if ids is not None else 0
        flags |= StepFlag.ONE_F_ONE_B if one_f_one_b else 0
        runtime.command(Command.FORWARD, len(microbatches), flags=flags)
        if ids is not None:
            runtime.send_sample_ids(ids, self._sample_ids.num_samples)
        if one_f_one_b:
            with self._gradients_set_aside():
                outputs = runtime.run_1f1b(microbatches, self._microbatch_losses(microbatches))
        else:
            outputs = runtime.forward(microbatches)
        self.stats.samples += batch_size(inputs)
        self.stats.steps += 1
        output = gather(outputs)
        return _as_leaf(output) if one_f_one_b else output

    def _microbatch_losses(self, microbatches: list[Any]) -> Callable[[int, Any], Tensor]:
        """1F1B: ``loss_of(i, output_i)``, the module's ``pipeline_loss`` of micro-batch ``i``
        weighted by its share of the batch (and by Lightning's gradient accumulation)."""
        module, batch = self.lightning_module, self._step_batch
        parts = scatter(batch, len(microbatches)) if batch is not None else []
        rows = [batch_size(mb) for mb in microbatches]
        if [batch_size(p) for p in parts] != rows:
            raise ValueError(
                "schedule='1f1b' splits the training batch like the pipeline's input to call pipeline_loss per"
                f" micro-batch, but the batch's rows {[batch_size(p) for p in parts]} do not match the input's {rows}:"
                " the pipelined Sequential's input must have one row per row of the batch"
            )
        scale = 1.0 / module.trainer.accumulate_grad_batches
        self._step_loss = None

        def loss_of(i: int, output: Any) -> Tensor:
            loss = module.pipeline_loss(output, parts[i]) * (rows[i] / sum(rows))
            self._step_loss = loss.detach() if self._step_loss is None else self._step_loss + loss.detach()
            return loss * scale

        return loss_of

    @contextmanager
    def _gradients_set_aside(self) -> Iterator[None]:
        """1F1B computes the step's gradients inside the training step, before Lightning's
        ``zero_grad``: keep them aside until :meth:`backward`, and leave ``.grad`` as it was
        (the previous step's, which ``zero_grad`` clears, or an accumulation's)."""
        params = list(self.lightning_module.parameters())
        before = [p.grad for p in params]
        for p in params:
            p.grad = None
        try:
            yield
        finally:
            self._stash = [(p, p.grad) for p in params if p.grad is not None]
            for p, g in zip(params, before):
                p.grad = g

    def _restore_gradients(self) -> None:
        for p, g in self._stash:
            p.grad = g if p.grad is None else p.grad + g
        self._stash = []

    @contextmanager
    def _client_step(self) -> Iterator[None]:
        self._driving = True
        try:
            yield
        finally:
            self._driving = False

    def _run_step(self, hook: str, context: Any, *args: Any, **kwargs: Any) -> Any:
        training = hook == "training_step"
        if not self.is_client:
            with context:
                return self._serve(training)
        runtime = self.runtime
        self._step_batch = (args[0] if args else kwargs.get("batch")) if training else None
        with context, self._client_step():
            output = getattr(self.lightning_module, hook)(*args, **kwargs)
        if training and self._step_loss is not None:
            self._check_step_loss(output)
        if training and self.lightning_module.automatic_optimization:
            loss = output["loss"] if isinstance(output, Mapping) else output
            if loss is not None and self.nonfinite == "skip" and not bool(torch.isfinite(loss).all()):
                rank_zero_warn(f"EPipeStrategy: the loss of step {runtime.step} is not finite; skipping the step on every rank")
                output = None
            if output is None:  # skipped on every rank, as on one device
                runtime.discard()
                runtime.command(Command.SKIP_STEP)
                return self._skipped_step_loss()
        else:
            runtime.discard()  # evaluation, or manual optimization whose backward already ran
        runtime.command(Command.FINISH_STEP)
        return output

    def _check_step_loss(self, output: Any) -> None:
        """1F1B trains on ``pipeline_loss``: say so once if the step's returned loss is another."""
        loss = output["loss"] if isinstance(output, Mapping) else output
        expected, self._step_loss = self._step_loss, None
        if isinstance(loss, Tensor) and not torch.allclose(loss.detach().float(), expected.float(), rtol=1e-4, atol=1e-6):
            rank_zero_warn(
                f"EPipeStrategy(schedule='1f1b'): training_step returned loss {float(loss):.6g} but the micro-batches'"
                f" pipeline_loss adds up to {float(expected):.6g}; the gradients come from pipeline_loss"
            )

    def _serve(self, training: bool) -> Optional[Tensor]:
        """A server's step: follow the client's commands until it finishes the step."""
        runtime = self.runtime
        forwarded = False
        while True:
            msg = runtime.next_command()
            if msg.command == Command.FORWARD:
                runtime.begin_step(msg.num_microbatches)
                if msg.flags & StepFlag.SAMPLE_IDS:
                    ids, num_samples = runtime.recv_sample_ids()
                    runtime.sample_ids, runtime.num_samples = scatter(ids, msg.num_microbatches), num_samples
                with torch.set_grad_enabled(bool(msg.flags & StepFlag.GRAD_ENABLED)):
                    if msg.flags & StepFlag.ONE_F_ONE_B:
                        with self._gradients_set_aside():
                            runtime.run_1f1b()
                    else:
                        runtime.forward()
                forwarded = True
            elif msg.command == Command.BACKWARD:
                runtime.backward()
                if not self._agree_on_nonfinite():
                    self._average_over_replicas()
            elif msg.command == Command.OPTIMIZER_STEP:
                # through the LightningOptimizer, so this rank's global_step advances too
                optimizers = self.lightning_module.optimizers(use_pl_optimizer=True)
                optimizer = optimizers[msg.arg] if isinstance(optimizers, list) else optimizers
                optimizer.step()
                optimizer.zero_grad()
            elif msg.command == Command.SKIP_STEP:
                runtime.discard()
                return self._skipped_step_loss() if training and self.lightning_module.automatic_optimization else None
            elif msg.command == Command.FINISH_STEP:
                if training and forwarded and self.lightning_module.automatic_optimization:
                    return torch.zeros((), device=self.root_device, requires_grad=True)
                runtime.discard()
                return None
            else:
                raise RuntimeError(f"rank {self.global_rank}: unexpected command {msg.command.name}")

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
        if not self.is_client:
            runtime.backward()  # automatic optimization: Lightning calls this right after training_step
            self._restore_gradients()
            if not self._agree_on_nonfinite():
                self._average_over_replicas()
            return closure_loss
        if not self.lightning_module.automatic_optimization:
            if not runtime.has_pending_backward:
                raise RuntimeError("manual_backward() needs a pipelined forward in the same training_step")
            runtime.command(Command.BACKWARD)
        with runtime.timer.measure(self.plan.num_stages - 1):  # the loss and the last stage (its gradients leave as they come)
            closure_loss = super().backward(closure_loss, optimizer, *args, **kwargs)
        runtime.backward()
        self._restore_gradients()
        if not self._agree_on_nonfinite():
            self._average_over_replicas()
        return closure_loss

    def _average_over_replicas(self) -> None:
        """``replicas > 1``: average this rank's gradients with the same stages' in the other replicas."""
        if self._stage_groups:
            params = [p for p in self.lightning_module.parameters() if not p.is_meta]
            average_gradients(params, self._stage_groups[self.pipeline_rank], self.replicas)

    def _agree_on_nonfinite(self) -> bool:
        """``nonfinite="skip"``: if any rank sent NaN/Inf this step, every rank drops its gradients (True)."""
        if self.nonfinite != "skip":
            return False
        flag = torch.tensor([float(self.runtime.nonfinite_seen)], device=self.root_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            for p in self.lightning_module.parameters():
                p.grad = None
            rank_zero_warn(f"EPipeStrategy: NaN/Inf crossed a cut at step {self.runtime.step}; the step was skipped")
            return True
        return False

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        if self.is_client and not self.lightning_module.automatic_optimization:
            inner = getattr(optimizer, "_optimizer", optimizer)
            self.runtime.command(Command.OPTIMIZER_STEP, arg=self.optimizers.index(inner))
        return super().optimizer_step(optimizer, closure, model, **kwargs)

    def _patch_gradient_clipping(self) -> None:
        """Clip by the norm over *all* stages' gradients (one all-reduce per clipped step)."""
        plugin = self.precision_plugin
        if getattr(plugin, "_epipe_clip", False):
            return
        strategy = self

        def clip_grad_by_norm(optimizer: Optimizer, clip_val: Union[int, float]) -> None:
            if not strategy.lightning_module.automatic_optimization:
                raise RuntimeError(
                    "gradient clipping by norm under manual optimization is not supported by EPipeStrategy:"
                    " the other stages do not take part in the norm. Use automatic optimization for clipping."
                )
            params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            local = torch.zeros(1, dtype=torch.float64, device=strategy.root_device)
            for p in params:
                local += p.grad.detach().double().pow(2).sum()
            local /= strategy.replicas  # every replica holds the same (averaged) gradients
            dist.all_reduce(local)
            total = float(local.sqrt())
            coef = float(clip_val) / (total + 1e-6)
            if coef < 1:
                for p in params:
                    p.grad.detach().mul_(coef)

        plugin.clip_grad_by_norm = clip_grad_by_norm  # type: ignore[method-assign]
        plugin._epipe_clip = True  # type: ignore[attr-defined]

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

    # ------------------------------------------------------------------ checkpoints

    def _owned_state(self) -> dict[str, Tensor]:
        """This rank's real (non-meta) entries of the module's state dict."""
        state = self.lightning_module.state_dict()
        if self.is_client:
            return {k: v for k, v in state.items() if not v.is_meta}
        prefix = f"{self._pipeline_attr}."
        owned = {str(i) for i in self.plan.layers_of(self.pipeline_rank)}
        return {
            k: v for k, v in state.items()
            if not v.is_meta and (k.startswith(BOTTLENECKS + ".")
                                  or k.startswith(prefix) and k[len(prefix):].split(".", 1)[0] in owned)
        }

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The full state dict on rank 0 (every stage's weights gathered), ``{}`` elsewhere."""
        full = self.lightning_module.state_dict()
        if self._runtime is None:
            return full
        merged = gather_tensors(self._transport, self.world_size, self._owned_state())
        if merged is None:
            return {}
        missing = [k for k, v in full.items() if k not in merged]
        if missing:
            raise RuntimeError(f"EPipeStrategy could not collect {len(missing)} weights for the checkpoint, e.g. {missing[:3]}")
        # the bottlenecks go to checkpoint["epipe"], so that the plain model loads without the strategy
        model_state, self._bottleneck_state = split_bottleneck_state({k: merged[k] for k in full})
        return model_state

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        state = optimizer.state_dict()
        if self._runtime is None:
            return state
        flat = flatten_state(state["state"])
        merged = gather_tensors(self._transport, self.world_size, flat)
        if merged is None:
            return {}
        return {"state": dict(sorted(unflatten_state(merged, int_keys=True).items())), "param_groups": state["param_groups"]}

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Each rank keeps the optimizer state of the parameters it owns."""
        for optimizer, opt_state in zip(self.optimizers, checkpoint["optimizer_states"]):
            params = [p for g in optimizer.param_groups for p in g["params"]]
            own = {i for i, p in enumerate(params) if not p.is_meta}
            opt_state = {**opt_state, "state": {i: s for i, s in opt_state["state"].items() if i in own}}
            optimizer.load_state_dict(opt_state)
            _optimizer_to_device(optimizer, self.root_device)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Optional[Any] = None) -> None:
        extra = self._gather_extra_state()
        if self.is_global_zero:
            checkpoint["epipe"] = extra
            self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def _gather_extra_state(self) -> Optional[dict[str, Any]]:
        """Codec stream state and RNG state of every rank, keyed by rank (rank 0 only)."""
        if self._runtime is None:
            return None
        local = flatten_state({"codecs": self._codecs.state_dict(), "rng": {"cpu": torch.get_rng_state()}})
        if self.root_device.type == "cuda":
            local["rng/cuda"] = torch.cuda.get_rng_state(self.root_device)
        local = {f"{self.global_rank}/{k}": v for k, v in local.items()}
        merged = gather_tensors(self._transport, self.world_size, local)
        if merged is None:
            return None
        extra = {"balance": list(self.plan.balance), "placement": self.placement, "ranks": unflatten_state(merged)}
        if self._bottleneck_state:
            extra["bottlenecks"] = self._bottleneck_state
        if self._tuner is not None:
            extra["auto"] = self._tuner.state_dict()
        return extra

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: Optional[bool] = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._resume_state = checkpoint.get("epipe")
        return checkpoint

    def _rank_resume_state(self, state: dict[str, Any]) -> Optional[dict[str, Any]]:
        if self._plan is not None and list(state.get("balance", [])) != list(self._plan.balance):
            rank_zero_warn(
                f"the checkpoint was written with balance={state.get('balance')} but this run uses"
                f" {list(self._plan.balance)}: codec and RNG state are not restored"
            )
            return None
        return state.get("ranks", {}).get(str(self.global_rank))

    def _restore_codec_state(self, state: dict[str, Any]) -> None:
        if self._tuner is not None and "auto" in state:  # the codecs in force first, then their streams' state
            self._tuner.load_state_dict(state["auto"], self._codecs)
        mine = self._rank_resume_state(state)
        if mine and mine.get("codecs"):
            self._codecs.load_state_dict(mine["codecs"])

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """``compressor="auto"``: every rank measures and decides at the same step (a collective)."""
        if self._tuner is not None and self._runtime is not None:
            step = self.lightning_module.trainer.global_step
            runtime = self._runtime
            self._tuner.maybe_retune(step, self.plan, self.pipeline_rank, self._codecs, runtime.samples, self.root_device,
                                     self.layout.offset(self.global_rank), runtime.transport.rates,
                                     (self.stats.busy_seconds, runtime.microbatches_run))

    @override
    def on_train_start(self) -> None:
        if self._resume_state is None:
            return
        mine = self._rank_resume_state(self._resume_state)
        self._resume_state = None
        if mine and "rng" in mine:
            torch.set_rng_state(mine["rng"]["cpu"])
            if "cuda" in mine["rng"] and self.root_device.type == "cuda":
                torch.cuda.set_rng_state(mine["rng"]["cuda"], self.root_device)

    # ------------------------------------------------------------------ teardown

    @override
    def on_exception(self, exception: BaseException) -> None:
        self._failed = True

    @override
    def teardown(self) -> None:
        module = self.lightning_module
        if module is not None and self._runtime is not None:
            fitted = module._trainer is not None and module._trainer.state.fn == TrainerFn.FITTING
            if fitted and not self._failed:
                self._materialize_on_client()
            elif self.is_client and self._client_backup:
                module.load_state_dict(self._client_backup, strict=False, assign=True)
            self._client_backup = {}
            if self._pipeline is not None:
                self._pipeline.__dict__.pop("forward", None)
        _optimizers_to_device(self.optimizers, torch.device("cpu"))
        if module is not None:
            module._apply(lambda t: t if t.is_meta else t.cpu())
        self._runtime = None
        self.precision_plugin.teardown()
        assert self.accelerator is not None
        self.accelerator.teardown()
        self.checkpoint_io.teardown()

    def _materialize_on_client(self) -> None:
        """After fit, rank 0's module holds every trained weight again (as after DDP)."""
        merged = gather_tensors(self._transport, self.world_size, self._owned_state())
        if merged is not None:
            self.lightning_module.load_state_dict(merged, strict=True, assign=True)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register("epipe", cls, description="GPipe pipeline with compressed cuts (lightning-epipe)")
        strategy_registry.register(
            "epipe_spawn", cls, description="GPipe pipeline with compressed cuts, spawned processes", start_method="spawn"
        )
