"""Codecs for what crosses a pipeline cut: ``encode(tensor) -> Packet -> decode``.

    >>> from lightning_epipe.compressors import get_compressor
    >>> c = get_compressor("sortquant", bits=8)
    >>> x = torch.randn(64, 128)
    >>> packet = c.encode(x)           # packet.to_bytes() is what travels
    >>> y = c.decode(packet)           # same shape, dtype and device as x
    >>> round(packet.nbytes / (x.numel() * 4), 3), y.shape
    (0.252, torch.Size([64, 128]))

Codecs: ``none``, ``fp16``, ``bf16``, ``quantize``, ``sortquant``, ``topk``, ``powersgd``,
``lloydmax``, ``hadamard`` (``available_compressors()``); add one with ``register_compressor``.
"""

import torch  # noqa: F401  (for the example above)

from .base import Compressor, NonFiniteError
from .bottleneck import Bottleneck, BottleneckPair
from .cast import Bf16, Fp16, NoCompression
from .feedback import ErrorFeedback
from .hadamard import HadamardQuant
from .lloydmax import LloydMax
from .packet import Packet, PacketError
from .powersgd import PowerSGD
from .quantize import Quantize
from .registry import available_compressors, get_compressor, register_compressor
from .sortquant import SortQuant
from .topk import TopK

__all__ = [
    "Compressor",
    "Packet",
    "PacketError",
    "NonFiniteError",
    "get_compressor",
    "available_compressors",
    "register_compressor",
    "NoCompression",
    "Fp16",
    "Bf16",
    "Quantize",
    "SortQuant",
    "TopK",
    "PowerSGD",
    "LloydMax",
    "HadamardQuant",
    "ErrorFeedback",
    "Bottleneck",
    "BottleneckPair",
]
