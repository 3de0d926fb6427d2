"""Point-to-point messages between threads of one process, under NCCL's or gloo's rules.

The runtime's ranks can run as threads of one process on :class:`MemoryFabric` instead of
``torch.distributed``: the same ``Transport``, ``PipelineRuntime`` and schedules, with the
completion rule of the backend chosen:

- ``"nccl"``: every rank runs the operations it posts on one communicator (a process
  group; with ``shared_streams=True`` one per pair of ranks, as NCCL's default for all p2p
  between two ranks) strictly in posting order, and a send completes only when the peer's
  stream reaches the matching receive (no buffering at all, the worst case of a send
  larger than NCCL's link buffer). Two ranks whose streams both start with a send to the
  other stall: a wait then times out naming what it waited for.
- ``"gloo"``: sends are buffered; a receive completes once a send from its peer on the
  same group and tag has been posted (FIFO per group, tag and direction).

Sizes must match exactly, as on NCCL and gloo. Commands travel as on their TCP
connections (``command_channel``): buffered, in order per pair of ranks. Example::

    fabric = MemoryFabric(world_size=2, rule="nccl")
    transport = Transport(rank, torch.device("cpu"), timeout, backend=fabric.backend(rank), groups=...,
                          commands=fabric.commands(rank, timeout))
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Hashable, Optional

from torch import Tensor

from lightning_epipe.strategy.comm.transport import P2PBackend

__all__ = ["MemoryFabric", "MemoryCommands"]


@dataclass(eq=False)
class _Op:
    """One posted send (``dst`` set) or receive (``src`` set) of ``rank``."""

    fabric: "MemoryFabric"
    rank: int
    tensor: Tensor
    group: Hashable
    src: Optional[int] = None
    dst: Optional[int] = None
    done: bool = False
    error: Optional[str] = None

    @property
    def peer(self) -> int:
        return self.dst if self.dst is not None else self.src

    def is_completed(self) -> bool:
        with self.fabric.cond:
            return self.done

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        seconds = timeout.total_seconds() if timeout is not None else None
        with self.fabric.cond:
            if not self.fabric.cond.wait_for(lambda: self.done or self.fabric.failed is not None, seconds):
                what = f"send to rank {self.dst}" if self.dst is not None else f"receive from rank {self.src}"
                self.fabric.failed = f"rank {self.rank} stalled on a {what} on {self.group!r}"
                self.fabric.cond.notify_all()
                raise RuntimeError(f"Timed out: rank {self.rank} waited {seconds} s for a {what} on {self.group!r}")
            if self.error:
                raise RuntimeError(self.error)
            if not self.done:
                raise RuntimeError(f"Connection reset: {self.fabric.failed}")
        return True


class MemoryFabric:
    """The in-memory network of ``world_size`` ranks (threads); see the module docstring."""

    def __init__(self, world_size: int, rule: str = "nccl", shared_streams: bool = False) -> None:
        if rule not in ("nccl", "gloo"):
            raise ValueError(f"rule must be 'nccl' or 'gloo', got {rule!r}")
        self.world_size = world_size
        self.rule = rule
        self.shared_streams = shared_streams
        self.cond = threading.Condition()
        self.failed: Optional[str] = None
        # per (stream, rank): that rank's operations on the stream not yet completed, in posting order
        self._streams: dict[tuple[Hashable, int], deque[_Op]] = defaultdict(deque)
        self.log: list[tuple[int, str, int, Hashable, int]] = []  # (rank, "send"|"recv", peer, group, bytes) as posted
        self.command_queues: dict[tuple[int, int], deque[bytes]] = defaultdict(deque)  # (src, dst) -> commands sent, unread

    def commands(self, rank: int, timeout: timedelta) -> "MemoryCommands":
        """The command channel of ``rank``, for ``Transport(commands=...)``."""
        return MemoryCommands(self, rank, timeout)

    def backend(self, rank: int) -> P2PBackend:
        """The point-to-point primitives of ``rank``, for ``Transport(backend=...)``."""
        return P2PBackend(
            isend=lambda t, dst, group, tag=0: self._post(_Op(self, rank, t, self._tagged(group, tag), dst=dst)),
            irecv=lambda t, src, group, tag=0: self._post(_Op(self, rank, t, self._tagged(group, tag), src=src)),
            tagged=lambda device: self.rule == "gloo",
        )

    def _tagged(self, group: Hashable, tag: int) -> Hashable:
        """Under gloo's rule another tag is a FIFO of its own; NCCL matches whatever the tag."""
        return (group, "tag", tag) if tag and self.rule == "gloo" else group

    def _stream(self, op: _Op) -> Hashable:
        pair = (min(op.rank, op.peer), max(op.rank, op.peer))
        return ("pair", pair) if self.shared_streams else (op.group, pair)

    def _post(self, op: _Op) -> _Op:
        if not 0 <= op.peer < self.world_size or op.peer == op.rank:
            raise ValueError(f"rank {op.rank}: no peer {op.peer} in a world of {self.world_size}")
        with self.cond:
            self.log.append((op.rank, "send" if op.dst is not None else "recv", op.peer, op.group, op.tensor.numel()))
            self._streams[(self._stream(op), op.rank)].append(op)
            self._match(self._stream(op), op.rank, op.peer)
            self.cond.notify_all()
        return op

    def _match(self, stream: Hashable, a: int, b: int) -> None:
        """Complete what can complete on ``stream`` between ranks ``a`` and ``b``."""
        if self.rule == "gloo":
            self._match_buffered(stream, a, b)
            self._match_buffered(stream, b, a)
            return
        qa, qb = self._streams[(stream, a)], self._streams[(stream, b)]
        while qa and qb:  # the heads of both streams must be each other's match
            x, y = qa[0], qb[0]
            send, recv = (x, y) if x.dst is not None else (y, x)
            if send.dst is None or recv.src is None:
                return  # both send or both receive: stalled until one side's wait gives up
            self._complete(send, recv)
            qa.popleft()
            qb.popleft()

    def _match_buffered(self, stream: Hashable, receiver: int, sender: int) -> None:
        recvs = [op for op in self._streams[(stream, receiver)] if op.src == sender]
        sends = [op for op in self._streams[(stream, sender)] if op.dst == receiver]
        for send in sends:
            send.done = True  # buffered
        for send, recv in zip(sends, recvs):
            self._complete(send, recv)
            self._streams[(stream, sender)].remove(send)
            self._streams[(stream, receiver)].remove(recv)

    def _complete(self, send: _Op, recv: _Op) -> None:
        if send.tensor.numel() != recv.tensor.numel() or send.tensor.dtype != recv.tensor.dtype:
            recv.error = send.error = (
                f"size mismatch on {send.group!r}: rank {send.rank} sent {send.tensor.numel()} x {send.tensor.dtype},"
                f" rank {recv.rank} expected {recv.tensor.numel()} x {recv.tensor.dtype}"
            )
        else:
            recv.tensor.copy_(send.tensor)
        send.done = recv.done = True


class MemoryCommands:
    """One rank's commands on the fabric, as on their TCP connections: a send never waits, a
    read waits for the peer's next one, bounded by ``timeout``."""

    def __init__(self, fabric: MemoryFabric, rank: int, timeout: timedelta) -> None:
        self.fabric, self.rank, self.seconds = fabric, rank, timeout.total_seconds()

    def send(self, peer: int, data: bytes) -> None:
        fabric = self.fabric
        with fabric.cond:
            if fabric.failed is not None:
                raise ConnectionResetError(f"Connection reset: {fabric.failed}")
            fabric.command_queues[(self.rank, peer)].append(bytes(data))
            fabric.cond.notify_all()

    def recv(self, peer: int, nbytes: int) -> bytes:
        fabric = self.fabric
        queue = fabric.command_queues[(peer, self.rank)]
        with fabric.cond:
            if not fabric.cond.wait_for(lambda: queue or fabric.failed is not None, self.seconds):
                fabric.failed = f"rank {self.rank} stalled on a command from rank {peer}"
                fabric.cond.notify_all()
                raise TimeoutError(f"Timed out: rank {self.rank} waited {self.seconds} s for a command from rank {peer}")
            if not queue:
                raise ConnectionResetError(f"Connection reset: {fabric.failed}")
            data = queue.popleft()
        if len(data) != nbytes:
            raise ConnectionError(f"a command of {len(data)} bytes where {nbytes} were expected")
        return data

    def arrived(self, peer: int, nbytes: int) -> bytes:
        with self.fabric.cond:
            return b"".join(self.fabric.command_queues[(peer, self.rank)])[:nbytes]
