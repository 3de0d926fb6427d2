"""The transport header: a fixed-length int64 vector at the front of every frame.

A message on a link is one *frame*: this header (``HEADER_NBYTES`` bytes) followed, for
data messages, by one contiguous uint8 payload holding a compressor
:class:`~lightning_epipe.compressors.Packet`, in one buffer (see ``transport``). The receiver
validates every field against what its schedule expects before it reads the payload, so a
corrupted or out-of-order message is a :class:`WireError` naming the link, never garbage.
Nothing on the wire is ever unpickled.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

import numpy
import torch
import xxhash
from torch import Tensor

__all__ = ["Kind", "Direction", "Flag", "BARE_BIT", "REQUIRES_GRAD_BIT", "RESIZE_BIT", "StepFlag", "Command",
           "ClipAlgorithm", "Header", "WireError", "HEADER_LEN", "HEADER_NBYTES", "MAX_PAYLOAD", "checksum",
           "host_checksum", "command_name"]

MAGIC = 0x45504950  # "EPIP"
VERSION = 8  # 8: hadamard's signs by a counter hash, its transform by butterflies (kernels/rotation); 7: host data streams on connections of their own (socket_streams); 6: commands on a connection of their own (command_channel); 5: an input message holds `arg` micro-batches (no WHOLE_BATCH flag); 4: CLIP_GRADIENTS (3: every training batch starts with BATCH_START or STOP; 2: payload checksums are XXH3-64; 1: CRC32)
HEADER_LEN = 12
HEADER_NBYTES = 8 * HEADER_LEN  # 96: a frame's header, a multiple of 8 so payloads stay aligned
_HEADER = struct.Struct(f"={HEADER_LEN}q")  # native int64s, as the tensor view of a frame reads them
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


class Direction(enum.StrEnum):
    """Which way a tensor crosses a cut: what a codec, a link counter and a stream are named by."""

    ACTIVATION = "activation"
    GRADIENT = "gradient"
    INPUT = "input"  # the chain placement's raw inputs, client -> first stage

    @classmethod
    def of(cls, kind: int) -> "Direction":
        """The direction of a data message ``kind`` (ACTIVATION, GRADIENT or INPUT)."""
        return _DIRECTIONS[kind]


class Flag(enum.IntFlag):
    NONE = 0
    REQUIRES_GRAD = 1  # the receiver makes the tensor a leaf that requires grad
    BARE = 2  # the stage output was a bare Tensor, not a tuple
    NO_GRAD = 4  # a gradient message for a leaf that got no gradient: zeros, no payload
    NONFINITE = 8  # the sender found NaN/Inf here; no payload
    RESIZE = 16  # a notice: the next frame of this key has another size (payload_nbytes: its capacity); it follows
    LAYOUT = 32  # an input's first message: the JSON layout of its tensors (sent when it changes), tensors follow


#: The flags every message is tested for, as plain ints: an int ``&`` a ``Flag`` member runs the
#: enum's Python ``__rand__``, once per test of every message.
BARE_BIT, REQUIRES_GRAD_BIT, RESIZE_BIT = int(Flag.BARE), int(Flag.REQUIRES_GRAD), int(Flag.RESIZE)


class StepFlag(enum.IntFlag):
    """What a ``FORWARD`` command says about the step (in its header's ``flags``)."""

    NONE = 0
    GRAD_ENABLED = 1
    SAMPLE_IDS = 2  # the client's sample ids of this batch follow (delta compression)
    ONE_F_ONE_B = 4  # run the whole step (forwards and backwards) as 1F1B


class Command(enum.IntEnum):
    """What the client asks of every server (``engine/server_loop.serve_step`` follows them)."""

    FORWARD = 1  # num_microbatches and the step's flags follow in the header
    BACKWARD = 2
    OPTIMIZER_STEP = 3
    FINISH_STEP = 4
    SKIP_STEP = 5
    STOP = 6  # the client stopped on SIGTERM (before a training batch, or between evaluation batches): stop where you wait
    BATCH_START = 7  # a training batch begins, where Lightning would broadcast rank 0's SIGTERM flag: go on
    CLIP_GRADIENTS = 8  # manual optimization's clip_gradients: optimizer index, ClipAlgorithm in flags, the value


class ClipAlgorithm(enum.IntEnum):
    """How a ``CLIP_GRADIENTS`` command clips (in its header's ``flags``), as Lightning's
    ``gradient_clip_algorithm``."""

    NORM = 0
    VALUE = 1


_DIRECTIONS = {Kind.ACTIVATION: Direction.ACTIVATION, Kind.GRADIENT: Direction.GRADIENT, Kind.INPUT: Direction.INPUT}


class Header(NamedTuple):
    """One message's header. Build it with the constructor of its kind (:meth:`data`,
    :meth:`command`, :meth:`sample_ids`, :meth:`state`); the transport fills in
    ``payload_nbytes`` and ``checksum`` (:meth:`framed`). A named tuple: built and read for
    every message, at a fraction of a frozen dataclass's cost."""

    kind: int
    step: int
    microbatch: int
    num_microbatches: int
    index: int
    count: int
    flags: int
    payload_nbytes: int = 0
    checksum: int = 0  # of the payload (:func:`checksum`); 0: not taken
    arg: int = 0

    @classmethod
    def data(cls, kind: Kind, step: int, microbatch: int, num_microbatches: int, index: int, count: int,
             flags: int = 0, microbatches: int = 0) -> "Header":
        """Tensor ``index`` of the ``count`` an activation, gradient or input message of micro-batch ``microbatch``
        holds; an input message's ``microbatches``: how many micro-batches from ``microbatch`` on it holds, joined
        along dim 0 (in ``arg``)."""
        return cls(kind, step, microbatch, num_microbatches, index, count, flags, arg=microbatches)

    @classmethod
    def command(cls, command: "Command", step: int, num_microbatches: int = 0, flags: int = 0,
                optimizer: int = 0) -> "Header":
        """The client's ``command`` for ``step``: a FORWARD carries the step's micro-batch count and
        :class:`StepFlag` bits, an OPTIMIZER_STEP its optimizer's index (in the micro-batch field)."""
        return cls(Kind.CONTROL, step, optimizer, num_microbatches, 0, 1, flags, arg=command)

    @classmethod
    def clip(cls, step: int, optimizer: int, algorithm: "ClipAlgorithm", value: float) -> "Header":
        """Manual optimization's ``clip_gradients`` of optimizer ``optimizer`` at ``step``: ``value``
        (> 0: Lightning clips nothing otherwise) travels as its float64 bits, a non-negative int64,
        in the micro-batch count field (:meth:`clip_args` reads it back)."""
        if not value > 0:
            raise ValueError(f"a clip value must be positive, got {value}")
        bits = struct.unpack("=q", struct.pack("=d", float(value)))[0]
        return cls(Kind.CONTROL, step, optimizer, bits, 0, 1, int(algorithm), arg=Command.CLIP_GRADIENTS)

    def clip_args(self, link: str) -> tuple["ClipAlgorithm", float]:
        """The algorithm and value of a :meth:`clip` header; :class:`WireError` if they are not ones it writes."""
        value = struct.unpack("=d", struct.pack("=q", self.num_microbatches))[0]
        if self.flags not in ClipAlgorithm._value2member_map_ or not value > 0:
            raise WireError(f"{link}: CLIP_GRADIENTS with algorithm {self.flags} and value {value}: the stream is corrupted")
        return ClipAlgorithm(self.flags), value

    @classmethod
    def sample_ids(cls, step: int, num_microbatches: int, num_samples: int) -> "Header":
        """The dataset indices of ``step``'s batch follow (int64 payload); ``num_samples``: the training set's size."""
        return cls(Kind.SAMPLES, step, 0, num_microbatches, 0, 1, 0, arg=num_samples)

    @classmethod
    def state(cls, index: int, count: int) -> "Header":
        """Part ``index`` of a server's checkpoint state (0: its JSON description, 1: the packed tensors)."""
        return cls(Kind.STATE, 0, 0, 0, index, count, 0)

    def framed(self, payload_nbytes: int, checksum: int = 0, flags: int = 0) -> "Header":
        """This header as the frame that carries ``payload_nbytes`` bytes sends it (``flags`` added)."""
        return Header(self.kind, self.step, self.microbatch, self.num_microbatches, self.index, self.count,
                      self.flags | flags, payload_nbytes, checksum, self.arg)

    def to_tensor(self, device: torch.device | str = "cpu") -> Tensor:
        return torch.tensor(self.values(), dtype=torch.int64, device=device)

    def values(self) -> list[int]:
        return [MAGIC, VERSION, self.kind, self.step, self.microbatch, self.num_microbatches, self.index, self.count,
                self.flags, self.payload_nbytes, self.checksum, self.arg]

    def write(self, frame: Tensor) -> None:
        """Write this header into the first ``HEADER_NBYTES`` bytes of a uint8 ``frame`` (any device)."""
        if frame.device.type == "cpu":
            self.write_host(frame.numpy())
        else:
            frame[:HEADER_NBYTES].view(torch.int64).copy_(self.to_tensor(), non_blocking=True)

    def write_host(self, buf: numpy.ndarray) -> None:
        """The same into a host frame's bytes (a uint8 array)."""
        _HEADER.pack_into(buf, 0, *self.values())

    def to_bytes(self) -> bytes:
        """This header as the ``HEADER_NBYTES`` bytes of a frame (a command travels as nothing else)."""
        return _HEADER.pack(*self.values())

    @classmethod
    def read(cls, frame: Tensor, link: str) -> "Header":
        """Parse the header at the front of a uint8 ``frame`` (a host sync where the frame is on an accelerator)."""
        if frame.numel() < HEADER_NBYTES:
            raise WireError(f"{link}: a frame of {frame.numel()} bytes is shorter than the {HEADER_NBYTES}-byte header")
        if frame.device.type == "cpu":
            return cls.from_values(list(_HEADER.unpack_from(frame.numpy(), 0)), link)
        return cls.from_tensor(frame[:HEADER_NBYTES].view(torch.int64), link)

    @classmethod
    def from_bytes(cls, data: bytes, link: str) -> "Header":
        """Parse :meth:`to_bytes`' ``HEADER_NBYTES`` bytes."""
        return cls.from_values(list(_HEADER.unpack(data)), link)

    @classmethod
    def from_tensor(cls, t: Tensor, link: str) -> "Header":
        return cls.from_values(t.tolist(), link)

    @classmethod
    def from_values(cls, v: list[int], link: str) -> "Header":
        if len(v) != HEADER_LEN or v[0] != MAGIC:
            raise WireError(f"{link}: not an epipe header (magic {v[0]:#x} != {MAGIC:#x}); the stream is corrupted")
        if v[1] != VERSION:
            raise WireError(f"{link}: wire version {v[1]} but this process speaks {VERSION}: install the same version everywhere")
        h = cls(*v[2:])
        if h.kind not in Kind._value2member_map_:
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
    return command_name(value) if field == "arg" else str(value)


def command_name(value: int) -> str:
    """The name of the command a header's ``arg`` holds (the number itself if it names none)."""
    return Command(value).name if value in Command._value2member_map_ else str(value)


def checksum(payload: Tensor) -> int:
    """XXH3-64 of a CPU uint8 payload as a signed int64, the header's word (0 for payloads on
    an accelerator: NCCL links are checked by NCCL). A hash, not CRC32: ~10 GB/s a core where
    zlib's CRC32 takes ~0.1 ms per 512 KiB, so every frame can carry one."""
    if payload.device.type != "cpu" or payload.numel() == 0:
        return 0
    return host_checksum(payload.numpy())


def host_checksum(payload: numpy.ndarray) -> int:
    """:func:`checksum` of a payload's bytes in host memory (a 1-D uint8 array)."""
    digest = xxhash.xxh3_64_intdigest(payload.data)
    return digest - (1 << 64) if digest >= 1 << 63 else digest
