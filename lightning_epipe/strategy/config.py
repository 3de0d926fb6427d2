"""EPipeStrategy's arguments, validated once into a frozen :class:`PipelineConfig`.

Every check that needs only the arguments runs here, when the strategy is built, so a bad
argument fails in the user's script before any process starts; checks that need the model
(layers, ``pipeline_loss``, bottleneck sizes) run in ``EPipeStrategy.check_model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Mapping, Optional, Sequence, Union

from lightning_epipe.compressors import Compressor
from lightning_epipe.strategy.compression.codec_book import AUTO_KEYS, CodecBook, DeltaConfig, resolve_specs
from lightning_epipe.strategy.planning.partition import PLACEMENTS
from lightning_epipe.strategy.engine.replicas import check_replicas

__all__ = ["PipelineConfig", "CompressorArg"]

CompressorArg = Union[str, Compressor, Sequence[Union[str, Compressor]]]

SCHEDULES = ("gpipe", "1f1b")
CHECKPOINTS = ("always", "except_last", "never")
NONFINITE = ("raise", "skip")
START_METHODS = ("popen", "spawn", "fork", "forkserver")


@dataclass(frozen=True)
class PipelineConfig:
    """What the user asked for (see :class:`~lightning_epipe.strategy.epipe.EPipeStrategy` for
    each argument); ``compressor_kwargs`` holds ``bits`` too, ``delta`` is set when
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
    timeout: timedelta = timedelta(minutes=10)
    start_method: str = "popen"
    process_group_backend: Optional[str] = None
    verify_checksum: bool = True

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

    def codec_book(self, num_cuts: Optional[int]) -> CodecBook:
        """The codecs per cut and direction (``num_cuts=None``: validate without a plan)."""
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
        return CodecBook(activation, gradient, self.delta)
