"""``ErrorFeedback``: carry each compression's error into the next call of the stream.

For a stream of tensors ``x_1, x_2, ...`` through a lossy codec ``C`` (decode o encode):

    1. v_t = x_t + e_{t-1}        (e_0 = 0)
    2. send encode(v_t)
    3. e_t = v_t - C(v_t)         (what the receiver did not get)

so what is lost once is sent later instead of being lost for good: the sum of what the
receiver decodes tracks the sum of the inputs up to one residual, ``sum C(v) = sum x - e_t``.
This is the error feedback of PowerSGD and 1-bit SGD, kept per stream: the strategy makes
one instance per (cut, direction, micro-batch slot, tensor), so a residual is only ever
added to the same slot of the next step.

The wrapper changes nothing on the wire: its packets are the inner codec's (same codec id),
and the receiver decodes them with any instance. Costs one extra ``decode`` per call on the
sender and one tensor of the input's shape and dtype (the residual). A stream whose shape
changes (a smaller last batch) restarts from a zero residual.
"""

from __future__ import annotations

import copy
from typing import Union

import torch

from .base import Compressor
from .packet import Packet
from .registry import get_compressor

__all__ = ["ErrorFeedback"]


class ErrorFeedback(Compressor):
    """Wrap ``inner`` (a codec instance or name) with error feedback.

    Example:
        >>> c = ErrorFeedback("topk", fraction=0.25)
        >>> x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
        >>> sent = sum(c.decode(c.encode(x)) for _ in range(8))   # the same x, eight times
        >>> # one residual behind (1.3-1.5 |x|); without feedback 8 |x - topk(x)| (4.0-4.5 |x|)
        >>> bool((sent - 8 * x).norm() < 2 * x.norm())
        True
    """

    name = "errorfeedback"

    def __init__(self, inner: Union[Compressor, str] = "topk", **kwargs: object) -> None:
        if isinstance(inner, str):
            inner = get_compressor(inner, **kwargs)
        elif kwargs:
            raise ValueError(f"{self.name}: keyword arguments {sorted(kwargs)} go with an inner codec "
                             "given by name, not with an instance")
        if not isinstance(inner, Compressor) or isinstance(inner, ErrorFeedback):
            raise TypeError(f"{self.name} wraps one codec (a name or a Compressor that is not "
                            f"itself an ErrorFeedback), got {inner!r}")
        super().__init__(check_finite=inner.check_finite)
        self.inner = inner
        self.codec_id = inner.codec_id          # the wire sees the inner codec's packets
        self.floats_only = inner.floats_only
        self._residual: torch.Tensor | None = None

    def encode(self, x: torch.Tensor) -> Packet:
        """Encode ``x`` plus the residual of the previous call, and keep the new residual."""
        if self.inner.lossless or not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            return self.inner.encode(x)
        x = x.detach()
        residual = self._residual
        if residual is not None and residual.shape == x.shape and residual.dtype == x.dtype:
            x = x + residual.to(x.device)
        packet = self.inner.encode(x)
        self._residual = x - self.inner.decode(packet)
        return packet

    def decode(self, packet: Packet) -> torch.Tensor:
        return self.inner.decode(packet)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - encode is overridden
        raise NotImplementedError

    def _decode(self, packet: Packet) -> torch.Tensor:  # pragma: no cover - decode is overridden
        raise NotImplementedError

    @property
    def lossless(self) -> bool:
        return self.inner.lossless

    def ratio(self, x: torch.Tensor) -> float:
        return self.inner.ratio(x)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``{"residual": e}`` after the first lossy call, plus the inner codec's state as ``inner.*``."""
        state = {f"inner.{k}": v for k, v in self.inner.state_dict().items()}
        if self._residual is not None:
            state["residual"] = self._residual
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        unknown = sorted(k for k in state if k != "residual" and not k.startswith("inner."))
        residual = state.get("residual")
        if unknown or (residual is not None and not (isinstance(residual, torch.Tensor)
                                                     and residual.is_floating_point())):
            raise ValueError(f"{self.name}: state must hold 'residual' (a float tensor) and "
                             f"'inner.*' keys, got {sorted(state)}")
        self.inner.load_state_dict({k[len("inner."):]: v for k, v in state.items()
                                    if k.startswith("inner.")})
        self._residual = residual

    def reset(self) -> None:
        self._residual = None
        self.inner.reset()

    def __deepcopy__(self, memo: dict) -> "ErrorFeedback":
        fresh = ErrorFeedback(copy.deepcopy(self.inner, memo))
        fresh._residual = None if self._residual is None else self._residual.clone()
        return fresh

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.inner!r})"
