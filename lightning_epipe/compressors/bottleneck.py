"""Learned bottlenecks: a trainable encoder before a cut and a decoder after it.

The report's "conv insert": the sending stage ends with an encoder that shrinks the
activation, the receiving stage starts with a decoder that restores its shape, and both
train with the model. What crosses the cut (forward) is the small code ``z``, and so is its
gradient (backward): one bottleneck compresses both directions. ``z`` itself can go through
any codec on the wire (``wire="sortquant"`` and ``bits``, say).

Shapes (legend: B batch, C channels, H x W image, T tokens, D features, s stride):

- ``[B, C, H, W]``: ``Conv2d(C, c, s, stride=s)`` on the input padded to a multiple of s,
  ``ConvTranspose2d(c, C, s, stride=s)`` cropped back: z is ``[B, c, ceil(H/s), ceil(W/s)]``,
  ``c = round(ratio * C * s * s)`` (the report: 32 -> 20 channels, stride 3, ratio 0.07).
- ``[B, D]`` and ``[B, T, D]``: ``Linear(D, d)`` / ``Linear(d, D)`` on the last dimension,
  ``d = round(ratio * D)``.

A stage output that is a tuple (hidden states, attention mask) has its first tensor
compressed and the rest passed through.

Initialization (``init="pca"``): the pair starts as the projection onto the top principal
directions of real activations (randomized power iteration, ``torch.svd_lowrank``), so the
reconstruction ``decoder(encoder(x))`` is the best rank-limited one at step 0 and accuracy
does not dip while the pair learns. For a conv pair the directions are those of the
non-overlapping ``s x s`` patches; means are per channel. ``init="default"`` keeps PyTorch's
initialization.

Nothing here touches processes: the strategy builds the pairs, places the encoder with the
sending rank and the decoder with the receiving one, and trains them with the model.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Bottleneck", "BottleneckPair", "BOTTLENECK_KEYS"]

#: The keyword arguments of ``Bottleneck`` (they go to ``compressor_kwargs`` with
#: ``compressor="bottleneck"``; the others go to the wire codec).
BOTTLENECK_KEYS = ("ratio", "stride", "wire", "init", "lr")
_INITS = ("pca", "default")


def _first(x: Any) -> Tensor:
    return x[0] if isinstance(x, (tuple, list)) else x


def _replace_first(x: Any, y: Tensor) -> Any:
    if isinstance(x, (tuple, list)):
        return type(x)([y, *x[1:]])
    return y


class _OnFirst(nn.Module):
    """Apply ``module`` to a Tensor, or to the first Tensor of a tuple (the rest pass)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Any) -> Any:
        return _replace_first(x, self.module(_first(x)))


class _PadConv(nn.Module):
    """[B, C, H, W] -> pad to multiples of s -> Conv2d(C, c, s, stride=s) -> [B, c, H/s, W/s]."""

    def __init__(self, channels: int, code_channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(channels, code_channels, stride, stride=stride)

    def forward(self, x: Tensor) -> Tensor:
        s = self.stride
        return self.conv(F.pad(x, (0, -x.shape[-1] % s, 0, -x.shape[-2] % s)))


class _CropDeconv(nn.Module):
    """[B, c, h, w] -> ConvTranspose2d(c, C, s, stride=s) -> crop to [B, C, H, W]."""

    def __init__(self, code_channels: int, channels: int, stride: int, size: tuple[int, int]) -> None:
        super().__init__()
        self.size = tuple(size)
        self.deconv = nn.ConvTranspose2d(code_channels, channels, stride, stride=stride)

    def forward(self, z: Tensor) -> Tensor:
        return self.deconv(z)[..., : self.size[0], : self.size[1]]


class BottleneckPair(nn.Module):
    """The encoder (sending side) and decoder (receiving side) of one cut.

    ``expansion`` is ``numel(x) / numel(z)`` per sample: the bytes the cut would carry
    without the bottleneck, per byte of code (1 / ratio).
    """

    def __init__(self, encoder: nn.Module, decoder: nn.Module, expansion: float = 1.0) -> None:
        super().__init__()
        self.encoder = _OnFirst(encoder)
        self.decoder = _OnFirst(decoder)
        self.expansion = float(expansion)
        self.example_shape: Optional[list[int]] = None  # the activation it was built for


class Bottleneck:
    """How to build the learned bottleneck of a cut; ``build`` makes a fresh pair.

    Args:
        ratio: target size of the code over the activation (0 < ratio <= 1).
        stride: conv pairs only: kernel and stride of the encoder (clamped to H and W).
        wire: the codec for the code ``z`` on the wire (a name, e.g. ``"fp16"``).
        init: ``"pca"`` (start from the principal directions of the first activations) or
            ``"default"``.
        encoder, decoder: explicit modules instead (copied for every cut); ``ratio``,
            ``stride`` and ``init`` are then unused.
        lr: the pairs' learning rate (a param group of their own in the first optimizer,
            following its first group's schedule at this rate); ``None``: they train with
            the model's parameters (new layers in a pretrained model usually want more).
        **wire_kwargs: keyword arguments of the wire codec (``bits=8``).

    Example:
        >>> b = Bottleneck(ratio=0.25)
        >>> x = torch.randn(64, 32) @ torch.randn(32, 32)
        >>> pair = b.build(x)
        >>> z = pair.encoder(x); tuple(z.shape), pair.expansion
        ((64, 8), 4.0)
        >>> pair.decoder(z).shape
        torch.Size([64, 32])
    """

    def __init__(self, ratio: float = 0.1, stride: int = 3, wire: str = "none", init: str = "pca",
                 encoder: Optional[nn.Module] = None, decoder: Optional[nn.Module] = None,
                 lr: Optional[float] = None, **wire_kwargs: Any) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ValueError(f"bottleneck: ratio must be a number in (0, 1] (code size over activation size), got {ratio!r}")
        if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
            raise ValueError(f"bottleneck: stride must be a positive integer, got {stride!r}")
        if init not in _INITS:
            raise ValueError(f"bottleneck: init must be one of {_INITS}, got {init!r}")
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0):
            raise ValueError(f"bottleneck: lr must be a positive number (the pairs' learning rate) or None, got {lr!r}")
        if (encoder is None) != (decoder is None):
            raise ValueError("bottleneck: give both encoder and decoder modules, or neither (then they are built from ratio)")
        for name, m in (("encoder", encoder), ("decoder", decoder)):
            if m is not None and not isinstance(m, nn.Module):
                raise TypeError(f"bottleneck: {name} must be an nn.Module, got {type(m).__name__}")
        from .registry import get_compressor

        if wire == "auto":
            raise ValueError("bottleneck: wire='auto' is not supported (compressor='auto' chooses among plain codecs "
                             "only); give a fixed wire codec such as wire='fp16', or keep the bottleneck on activations "
                             "and pass gradient_compressor='auto'")
        get_compressor(wire, **wire_kwargs)  # an unknown wire codec or argument fails now
        self.ratio, self.stride, self.init = float(ratio), stride, init
        self.wire, self.wire_kwargs = wire, dict(wire_kwargs)
        self.encoder, self.decoder = encoder, decoder
        self.lr = None if lr is None else float(lr)

    def build(self, activation: Optional[Any] = None) -> BottleneckPair:
        """A new pair for a cut whose activation looks like ``activation`` (a few real samples).

        activation: the stage output at the cut, ``[B, ...]`` or a tuple whose first tensor
        is compressed; needed unless explicit modules were given.
        """
        if self.encoder is not None:
            pair = BottleneckPair(copy.deepcopy(self.encoder), copy.deepcopy(self.decoder))
            if activation is not None:
                with torch.no_grad():
                    x = _first(activation)
                    pair.expansion = x.numel() / max(1, _first(pair.encoder(activation)).numel())
            return pair
        if activation is None:
            raise ValueError("bottleneck: building from a ratio needs an example activation (its shape and, for"
                             " init='pca', its principal directions)")
        x = _first(activation).detach()
        if not x.is_floating_point() or x.dim() not in (2, 3, 4) or x.shape[0] < 1:
            raise ValueError(
                f"bottleneck: the activation at this cut is {x.dtype} of shape {list(x.shape)}; a built bottleneck takes"
                " a float [B, D], [B, T, D] or [B, C, H, W] (or a tuple starting with one): pass encoder= and decoder="
            )
        x = x.float()
        return self._conv_pair(x) if x.dim() == 4 else self._linear_pair(x)

    def _linear_pair(self, x: Tensor) -> BottleneckPair:
        width = x.shape[-1]
        code = max(1, round(self.ratio * width))
        encoder, decoder = nn.Linear(width, code), nn.Linear(code, width)
        if self.init == "pca":
            rows = x.reshape(-1, width)
            mean = rows.mean(0)
            basis = principal_directions(rows - mean, code)                 # [D, d]
            with torch.no_grad():
                encoder.weight.copy_(basis.T)
                encoder.bias.copy_(-(basis.T @ mean))
                decoder.weight.copy_(basis)
                decoder.bias.copy_(mean)
        return BottleneckPair(encoder, decoder, width / code)

    def _conv_pair(self, x: Tensor) -> BottleneckPair:
        _, channels, height, width = x.shape
        s = max(1, min(self.stride, height, width))
        code = max(1, round(self.ratio * channels * s * s))
        encoder, decoder = _PadConv(channels, code, s), _CropDeconv(code, channels, s, (height, width))
        if self.init == "pca":
            padded = F.pad(x, (0, -width % s, 0, -height % s))
            mean = x.mean(dim=(0, 2, 3))                                     # [C]
            patches = F.unfold(padded, s, stride=s).transpose(1, 2).reshape(-1, channels * s * s)
            patch_mean = mean.repeat_interleave(s * s)                       # [C s s]
            basis = principal_directions(patches - patch_mean, code)         # [C s s, c]
            kernel = basis.T.reshape(code, channels, s, s)
            with torch.no_grad():
                encoder.conv.weight.copy_(kernel)
                encoder.conv.bias.copy_(-(basis.T @ patch_mean))
                decoder.deconv.weight.copy_(kernel)
                decoder.deconv.bias.copy_(mean)
        code_numel = code * math.ceil(height / s) * math.ceil(width / s)
        return BottleneckPair(encoder, decoder, channels * height * width / code_numel)

    def describe(self) -> str:
        if self.encoder is not None:
            return f"bottleneck({type(self.encoder).__name__}->{type(self.decoder).__name__},wire={self.wire})"
        return f"bottleneck(ratio={self.ratio:g},wire={self.wire})"

    def __repr__(self) -> str:
        return (f"Bottleneck(ratio={self.ratio!r}, stride={self.stride!r}, wire={self.wire!r}, init={self.init!r}, "
                f"encoder={self.encoder!r}, decoder={self.decoder!r}, **{self.wire_kwargs!r})")


def principal_directions(rows: Tensor, count: int, iterations: int = 4) -> Tensor:
    """Top ``count`` principal directions of centered ``rows`` [N, F] as orthonormal columns [F, count].

    Randomized power iteration (``torch.svd_lowrank``); where the data has fewer directions
    than asked (N or F small), the rest are random directions orthogonal to them.
    """
    n, features = rows.shape
    count = min(count, features)
    found = min(count, n, features)
    generator = torch.Generator().manual_seed(0)
    parts = []
    if found > 0:
        with torch.random.fork_rng(devices=[]):  # leave the training's random stream alone
            torch.manual_seed(0)
            _, _, v = torch.svd_lowrank(rows, q=min(found + 4, n, features), niter=iterations)
        parts.append(v[:, :found])
    if found < count:
        parts.append(torch.randn(features, count - found, generator=generator))
    basis = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
    return torch.linalg.qr(basis).Q
