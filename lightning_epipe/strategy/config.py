"""EPipeStrategy's arguments, validated once into a frozen :class:`PipelineConfig`.

Every check that needs only the arguments runs here, when the strategy is built, so a bad
argument fails in the user's script before any process starts; checks that need the model
(layers, ``pipeline_loss``, bottleneck sizes) run in ``EPipeStrategy.check_model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Mapping, Optional, Sequence, Union

from lightning_epipe.compressors import Compressor
from lightning_epipe.strategy.compression.codec_book import AUTO_KEYS, CodecBook, DeltaConfig, resolve_specs
from lightning_epipe.strategy.core_binding import check_bind_cores
from lightning_epipe.strategy.gc_freeze import check_freeze_gc
from lightning_epipe.strategy.planning.partition import PLACEMENTS
from lightning_epipe.strategy.engine.replicas import check_replicas

__all__ = ["ARGUMENTS", "PipelineConfig", "CompressorArg"]

CompressorArg = Union[str, Compressor, Sequence[Union[str, Compressor]]]

SCHEDULES = ("gpipe", "1f1b")
CHECKPOINTS = ("always", "except_last", "never")
NONFINITE = ("raise", "skip")
START_METHODS = ("popen", "spawn", "fork", "forkserver")


#: The "Args:" section of ``EPipeStrategy``'s docstring: each argument, next to its checks below.
ARGUMENTS = """\
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
            Under ``precision="16-mixed"`` they cross raw and the GradScaler skips the step on every rank.
        checkpoint: activation recomputation per stage (torchgpipe's): ``"always"``,
            ``"except_last"`` (all micro-batches but the last) or ``"never"``.
        start_ahead: at the end of each training batch a server runs the next step's forward
            (under 1F1B up to its first backward) at once where the client has already begun
            that step (automatic optimization),
            before the rest of Lightning's work between the two steps on that rank: the first
            stage's step boundary is on the critical path of every step. Set ``False`` where a
            hook changes a server's weights or buffers between steps (``on_train_batch_end``,
            ``on_train_batch_start``; epoch ends excepted: a server never starts ahead across one).
        split_backward: a stage that sends gradients upstream computes them before its
            weights' gradients (an input pass, then a weight pass once the stage's micro-batches
            have sent theirs; :mod:`~lightning_epipe.strategy.engine.split_backward`), so the
            stage before starts its backward that much sooner. ``"auto"`` (default) splits a
            stage whose forward of one micro-batch takes at least ``SPLIT_MIN_FLOPS`` on the
            CPU under GPipe (below it the split's per-micro-batch Python costs more than it
            moves; under 1F1B, which starts every backward at once already, its extra work costs
            more than the drain it shortens); ``True`` splits every stage that can be (1F1B and
            GPUs included, where ``"auto"`` does not: not measured on GPUs), ``False`` none.
        timeout: bound on every wait for a peer (and the process group's collectives).
        start_method: ``"popen"`` (re-run the script per rank), ``"spawn"``, ``"fork"`` or ``"forkserver"``.
        process_group_backend: ``"gloo"`` or ``"nccl"`` (default: gloo on CPU, NCCL on CUDA).
        verify_checksum: checksum (XXH3-64) every CPU payload, checked by the receiver.
        bind_cores: run each process of a machine, with every thread it runs, on its own
            contiguous share of the CPU cores it was started on; left unbound where the
            processes outnumber the cores (:mod:`~lightning_epipe.strategy.core_binding`; Linux).
        freeze_gc: at the end of set-up each process collects its garbage once and freezes what
            survives (``gc.freeze``: imports, model, optimizers, Lightning's loop), so Python's
            full collections, which would otherwise stop one rank, and with it the whole pipeline,
            for a few hundred milliseconds every few hundred steps, scan only what the training
            created since; undone at teardown (:mod:`~lightning_epipe.strategy.gc_freeze`). Left
            alone in a process that froze objects itself.
"""


@dataclass(frozen=True)
class PipelineConfig:
    """What the user asked for (each argument: :data:`ARGUMENTS`); ``compressor_kwargs`` holds ``bits`` too, ``delta`` is set when
    ``delta_compression`` is on, ``balance`` is a tuple of layer counts or a method name."""

    chunks: int = 4
    schedule: str = "gpipe"
    compressor: CompressorArg = "none"
    activation_compressor: Optional[CompressorArg] = None
    gradient_compressor: Optional[CompressorArg] = None
    compressor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    error_feedback: bool = False
    delta: Optional[DeltaConfig] = None
    balance: Union[tuple[int, ...], str] = "parameters"
    replicas: int = 1
    pipeline: Optional[str] = None
    placement: str = "client-server"
    nonfinite: str = "raise"
    checkpoint: str = "never"
    start_ahead: bool = True
    split_backward: Union[bool, str] = "auto"
    timeout: timedelta = timedelta(minutes=10)
    start_method: str = "popen"
    process_group_backend: Optional[str] = None
    verify_checksum: bool = True
    bind_cores: bool = False
    freeze_gc: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.chunks, int) or isinstance(self.chunks, bool) or self.chunks < 1:
            raise ValueError(f"chunks must be a positive integer (micro-batches per batch), got {self.chunks!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.checkpoint not in CHECKPOINTS:
            raise ValueError(f"checkpoint must be 'always', 'except_last' or 'never', got {self.checkpoint!r}")
        if self.nonfinite not in NONFINITE:
            raise ValueError(f"nonfinite must be 'raise' or 'skip', got {self.nonfinite!r}")
        if not isinstance(self.timeout, timedelta) or self.timeout.total_seconds() <= 0:
            raise ValueError(f"timeout must be a positive datetime.timedelta, got {self.timeout!r}")
        if isinstance(self.balance, str) and self.balance not in ("parameters", "time"):
            raise ValueError(f"balance must be a list of layer counts, 'parameters' or 'time', got {self.balance!r}")
        check_replicas(self.replicas)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {self.schedule!r}")
        if self.start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, got {self.start_method!r}")
        if not isinstance(self.error_feedback, bool):
            raise ValueError(f"error_feedback must be True or False, got {self.error_feedback!r}")
        if not isinstance(self.start_ahead, bool):
            raise ValueError(f"start_ahead must be True or False, got {self.start_ahead!r}")
        if not isinstance(self.split_backward, bool) and self.split_backward != "auto":
            raise ValueError(f"split_backward must be True, False or 'auto', got {self.split_backward!r}")
        check_bind_cores(self.bind_cores)
        check_freeze_gc(self.freeze_gc)
        self.codec_book(num_cuts=None)  # every codec name and argument, before any process starts

    @classmethod
    def from_arguments(cls, bits: Optional[int] = None, compressor_kwargs: Optional[Mapping[str, Any]] = None,
                       balance: Union[Sequence[int], str, None] = None, delta_compression: bool = False,
                       delta_first: str = "none", delta_cache_limit: Optional[int] = None, **rest: Any) -> "PipelineConfig":
        """The config of ``EPipeStrategy(**arguments)``: ``bits`` joins the codec's keyword arguments,
        the three ``delta_*`` arguments become :class:`DeltaConfig`."""
        kwargs = dict(compressor_kwargs or {})
        if bits is not None:
            kwargs["bits"] = bits
        if not isinstance(delta_compression, bool):
            raise ValueError(f"delta_compression must be True or False, got {delta_compression!r}")
        delta = DeltaConfig(delta_first, delta_cache_limit) if delta_compression else None
        balance = tuple(balance) if isinstance(balance, (list, tuple)) else (balance or "parameters")
        return cls(compressor_kwargs=kwargs, balance=balance, delta=delta, **rest)

    @property
    def auto(self) -> bool:
        """Whether ``compressor="auto"`` chooses some link's codec."""
        return any(isinstance(c, str) and c == "auto"
                   for c in (self.compressor, self.activation_compressor, self.gradient_compressor))

    @property
    def auto_kwargs(self) -> dict[str, Any]:
        """The codec keyword arguments that configure ``compressor="auto"`` itself."""
        return {k: self.compressor_kwargs[k] for k in AUTO_KEYS if k in self.compressor_kwargs}

    def codec_book(self, num_cuts: Optional[int], cache_limit: Optional[int] = None) -> CodecBook:
        """The codecs per cut and direction (``num_cuts=None``: validate without a plan);
        ``cache_limit``: the delta caches' size where ``delta_cache_limit`` was not given."""
        kwargs = dict(self.compressor_kwargs)
        act = self.activation_compressor if self.activation_compressor is not None else self.compressor
        grad = self.gradient_compressor if self.gradient_compressor is not None else self.compressor
        activation = resolve_specs(act, kwargs, num_cuts, "activation_compressor")
        gradient = resolve_specs(grad, kwargs, num_cuts, "gradient_compressor", self.error_feedback)
        if self.gradient_compressor is not None and any(spec.bottleneck is not None for spec in gradient):
            raise ValueError(
                "a bottleneck is a pair of layers on the activation's path: give it as compressor= or"
                " activation_compressor= (its code's gradient then travels back through the same cut)"
            )
        # a bottleneck's code travels back as a gradient of the same size: the gradient codec
        # of that cut (unless set separately) is the bottleneck's wire codec
        delta = self.delta
        if delta is not None and delta.cache_limit is None and cache_limit is not None:
            delta = replace(delta, cache_limit=cache_limit)
        return CodecBook(activation, gradient, delta)
