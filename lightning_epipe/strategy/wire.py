"""The transport header: a fixed-length int64 vector sent before every payload.

A message on a link is this header, then (for data messages) one contiguous uint8
payload holding a compressor :class:`~lightning_epipe.compressors.Packet`. The receiver
validates every field against what its schedule expects before it reads the payload, so a
corrupted or out-of-order message is a :class:`WireError` naming the link, never garbage.
Nothing on the wire is ever unpickled.
"""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Kind", "Flag", "Command", "Header", "WireError", "HEADER_LEN", "MAX_PAYLOAD", "checksum"]

MAGIC = 0x45504950  # "EPIP"
VERSION = 1
HEADER_LEN = 12
MAX_PAYLOAD = 1 << 40


class WireError(RuntimeError):
    """A message whose header or payload does not match what the schedule expects."""


class Kind(enum.IntEnum):
    CONTROL = 1
    ACTIVATION = 2
    GRADIENT = 3
    INPUT = 4
    STATE = 5
    SAMPLES = 6  # the dataset indices of a training batch (delta compression)


class Flag(enum.IntFlag):
    NONE = 0
    REQUIRES_GRAD = 1  # the receiver makes the tensor a leaf that requires grad
    BARE = 2  # the stage output was a bare Tensor, not a tuple
    NO_GRAD = 4  # a gradient message for a leaf that got no gradient: zeros, no payload
    NONFINITE = 8  # the sender found NaN/Inf here; no payload


class Command(enum.IntEnum):
    """What the client asks of every server; see ``runtime.ServerLoop``."""

    FORWARD = 1
    BACKWARD = 2
    OPTIMIZER_STEP = 3
    FINISH_STEP = 4
    SKIP_STEP = 5
    SHUTDOWN = 6


@dataclass(frozen=True)
class Header:
    kind: int
    step: int
    microbatch: int
    num_microbatches: int
    index: int
    count: int
    flags: int
    payload_nbytes: int
    crc: int
    arg: int = 0

    def to_tensor(self, device: torch.device | str = "cpu") -> Tensor:
        values = [
            MAGIC,
            VERSION,
            self.kind,
            self.step,
            self.microbatch,
            self.num_microbatches,
            self.index,
            self.count,
            self.flags,
            self.payload_nbytes,
            self.crc,
            self.arg,
        ]
        return torch.tensor(values, dtype=torch.int64, device=device)

    @classmethod
    def from_tensor(cls, t: Tensor, link: str) -> "Header":
        v = t.tolist()
        if len(v) != HEADER_LEN or v[0] != MAGIC:
            raise WireError(f"{link}: not an epipe header (magic {v[0]:#x} != {MAGIC:#x}); the stream is corrupted")
        if v[1] != VERSION:
            raise WireError(f"{link}: wire version {v[1]} but this process speaks {VERSION}: install the same version everywhere")
        h = cls(*v[2:])
        if h.kind not in Kind.__members__.values():
            raise WireError(f"{link}: unknown message kind {h.kind}")
        if not 0 <= h.payload_nbytes <= MAX_PAYLOAD:
            raise WireError(f"{link}: payload size {h.payload_nbytes} out of range")
        if not (0 <= h.index < max(h.count, 1)) or h.microbatch < 0 or h.num_microbatches < 0:
            raise WireError(f"{link}: inconsistent header {h}")
        return h

    def expect(self, link: str, **fields: int) -> None:
        """Raise :class:`WireError` unless every given field has the expected value."""
        wrong = {k: (getattr(self, k), v) for k, v in fields.items() if getattr(self, k) != v}
        if wrong:
            detail = ", ".join(
                f"{k}={_name(k, got)} (expected {_name(k, want)})" for k, (got, want) in wrong.items()
            )
            raise WireError(f"{link}: unexpected message: {detail}")


def _name(field: str, value: int) -> str:
    if field == "kind" and value in Kind._value2member_map_:
        return Kind(value).name
    if field == "arg" and value in Command._value2member_map_:
        return Command(value).name
    return str(value)


def checksum(payload: Tensor) -> int:
    """CRC32 of a CPU uint8 payload (0 for payloads on an accelerator: NCCL links are checked by NCCL)."""
    if payload.device.type != "cpu" or payload.numel() == 0:
        return 0
    return zlib.crc32(payload.numpy().data)
