"""The data streams of a CPU pipeline on plain TCP connections, one per stream.

On gloo every message is a rendezvous: the receiver posts its buffer and tells the sender so
(a write that the sender's I/O thread reads), the sender writes once it knows, and the
receiver's I/O thread reads the bytes and wakes the thread that waits. Posting a receive is
itself a write on the connection (a sampled profile of the first stage at width 128, chunks
1, found 6.7% of its samples there), and every message wakes two I/O threads besides the one
that waits.

Here a stream (``streams.py``: one direction, one kind of message, between two ranks) is one
TCP connection, Nagle off. A send writes its frame at once from the sending thread as far as
the kernel takes it (without waiting), and hands what is left to the connection's writer
thread (a frame larger than the kernel's buffers, or one behind another still being
written): sends never block compute. A send counts as complete, when polled, once the peer's
end has acknowledged its last byte (what ``linkrate`` times); waiting on one waits until the
kernel has taken it. A receive is read on the waiting thread when it is waited on (bounded by
the connection's timeout), in the stream's order: the bytes wait in the kernel until then,
so nothing needs posting and no I/O thread is involved. Frames keep their form (``wire.Header`` and payload),
so the transport above is unchanged: a posted receive is a buffer to read into, and a resized
frame follows its notice on the same connection, as it does on gloo under a tag of its own.

Connections (:func:`connect_streams`, every rank of the world together, once per process):
every rank listens on an ephemeral port of the address it reaches ``MASTER_ADDR`` from
(``command_channel.listen_and_gather``), one all-gather on the control group tells every rank
every address, and each stream's sender connects to its receiver and names the stream (a
hello: magic, wire version, global rank, stream index). Errors: a wait past the timeout
raises :class:`TimeoutError`, a peer that closed its end :class:`ConnectionError` (both
``OSError``); the transport names the peer.
"""

from __future__ import annotations

import fcntl
import os
import queue
import socket
import struct
import termios
import threading
from datetime import timedelta
from typing import Any, Optional

import torch

from lightning_epipe.strategy.comm.command_channel import accept_named, bytes_waiting, listen_and_gather, parse_record
from lightning_epipe.strategy.comm.streams import pipeline_streams
from lightning_epipe.strategy.comm.transport import P2PBackend, dist_irecv, dist_isend
from lightning_epipe.strategy.comm.wire import VERSION

__all__ = ["SocketStream", "connect_streams", "SOCKET_BACKEND", "STREAM_HELLO"]

#: What a stream's sender sends first: a magic number, its wire version, its global rank and the stream's index.
STREAM_HELLO = struct.Struct("=qqqq")
_MAGIC = 0x45504950535452  # "EPIPSTR"


class _Write:
    """The part of a frame the sending thread could not hand to the kernel at once, written by
    the connection's writer thread."""

    def __init__(self, data: memoryview, keep: torch.Tensor) -> None:
        self.data, self.keep = data, keep  # keep: the frame stays alive until written
        self.done = threading.Event()
        self.error: Optional[BaseException] = None


class _Send:
    """A send. Complete (``is_completed``, polled) once the peer's end has acknowledged the
    frame's last byte (the stream's byte ``end``), so its completion tells when the bytes
    crossed the link (what ``linkrate`` times), not when the kernel took them; waiting on it
    waits only until the kernel has taken the whole frame (its buffer is free again)."""

    def __init__(self, stream: "SocketStream", end: int, write: Optional[_Write] = None) -> None:
        self.stream, self.end, self.write, self.done = stream, end, write, False

    def is_completed(self) -> bool:
        if not self.done:
            written = self.write is None or (self.write.done.is_set() and self.write.error is None)
            self.done = written and self.stream.acked() >= self.end
        return self.done

    def wait(self, timeout: Any = None) -> bool:
        if self.write is not None:
            seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
            if not self.write.done.wait(seconds):
                raise TimeoutError("timed out writing a frame: the peer reads nothing")
            if self.write.error is not None:
                raise self.write.error
        return True


class _Read:
    """A receive: the next ``frame.numel()`` bytes of the stream, read when waited on, or when
    asked whether it completed and they have all arrived (so an arrival is seen as one)."""

    def __init__(self, stream: "SocketStream", frame: torch.Tensor) -> None:
        self.stream, self.frame, self.done = stream, frame, False

    def is_completed(self) -> bool:
        if not self.done and self.stream.readable() >= self.frame.numel():
            self.stream.read_into(self.frame)
            self.done = True
        return self.done

    def wait(self, timeout: Any = None) -> bool:
        if not self.done:
            self.stream.read_into(self.frame)
            self.done = True
        return True


class SocketStream:
    """One stream's connection: :meth:`isend` on the sender's end, :meth:`irecv` on the receiver's."""

    def __init__(self, conn: socket.socket, timeout: timedelta) -> None:
        self.conn = conn
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        conn.settimeout(timeout.total_seconds())  # non-blocking underneath: os.write below never waits
        self._fd = conn.fileno()
        self._count = bytearray(4)  # FIONREAD's answer
        self._outq = bytearray(4)  # TIOCOUTQ's answer
        self._submitted = 0  # bytes of every frame sent so far
        self._handed = 0  # of those, handed to the kernel
        self._writes: "queue.SimpleQueue[_Write]" = queue.SimpleQueue()
        self._queued = 0  # writes handed to the writer and not finished (this thread's count)
        self._finished = 0  # of those, finished (the writer's count)
        self._writer: Optional[threading.Thread] = None
        self._failed: Optional[BaseException] = None

    # ------------------------------------------------------------------ sending

    def isend(self, frame: torch.Tensor) -> _Send:
        """Send ``frame`` (1-D uint8, host memory): what the kernel takes now from this thread,
        the rest from the writer thread, never waiting; returns the send."""
        if self._failed is not None:
            raise self._failed
        data = memoryview(frame.numpy()).cast("B")
        self._submitted += len(data)
        end = self._submitted
        if self._queued == self._finished:  # nothing ahead of it: write what the kernel takes now
            try:
                sent = os.write(self._fd, data)
            except BlockingIOError:
                sent = 0
            except OSError as err:
                self._failed = ConnectionResetError(f"the connection was closed by peer ({err})")
                raise self._failed from err
            self._handed += sent
            if sent == len(data):
                return _Send(self, end)
            data = data[sent:]
        write = _Write(data, frame)
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="epipe-stream-writer", daemon=True)
            self._writer.start()
        self._queued += 1
        self._writes.put(write)
        return _Send(self, end, write)

    def _write_loop(self) -> None:
        while True:
            write = self._writes.get()
            try:
                if self._failed is not None:
                    raise self._failed
                self.conn.sendall(write.data)
                self._handed += len(write.data)
            except OSError as err:
                self._failed = err
                write.error = err
            write.data = write.keep = None  # type: ignore[assignment]
            self._finished += 1
            write.done.set()

    def acked(self) -> int:
        """Bytes of the stream the peer's end has acknowledged (those handed to the kernel, less
        those still in its send queue)."""
        fcntl.ioctl(self._fd, termios.TIOCOUTQ, self._outq)
        return self._handed - int.from_bytes(self._outq, "little")

    # ------------------------------------------------------------------ receiving

    def irecv(self, frame: torch.Tensor) -> _Read:
        """A receive of the stream's next ``frame.numel()`` bytes into ``frame``, read once waited on."""
        return _Read(self, frame)

    def readable(self) -> int:
        """Bytes that have arrived and wait to be read (polled often: one answer buffer)."""
        return bytes_waiting(self._fd, self._count)

    def read_into(self, frame: torch.Tensor) -> None:
        """Read exactly ``frame.numel()`` bytes into ``frame`` (bounded by the timeout)."""
        view = memoryview(frame.numpy()).cast("B")
        got, size = 0, len(view)
        while got < size:
            n = self.conn.recv_into(view[got:], size - got)
            if n == 0:
                raise ConnectionResetError("the connection was closed by peer")
            got += n
        # acknowledge what comes next at once, not after the delayed-ACK timer (tens of ms for a
        # frame smaller than a segment): the sender times its sends by their acknowledgement
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)



def connect_streams(placement: str, size: int, offset: int, global_rank: int, control_group: Any,
                    timeout: timedelta, main_address: Optional[str]) -> dict[tuple[str, int, int], SocketStream]:
    """This rank's data streams, ``(name, src, dst)`` in pipeline ranks -> connection (a collective
    over ``control_group``, every rank of the world): a listener per rank, one all-gather of the
    addresses, each sender connects and names its stream."""
    me = global_rank - offset
    streams = pipeline_streams(placement, size)
    incoming = {i: s for i, s in enumerate(streams) if s.dst == me}
    listener, records = listen_and_gather(True, len(incoming), control_group, main_address)
    assert listener is not None
    mine: dict[tuple[str, int, int], SocketStream] = {}
    with listener:
        for index, s in enumerate(streams):
            if s.src != me:
                continue
            peer_host, port = parse_record(records[offset + s.dst])
            try:
                conn = socket.create_connection((peer_host, port), timeout=timeout.total_seconds())
                conn.sendall(STREAM_HELLO.pack(_MAGIC, VERSION, global_rank, index))
            except OSError as err:
                raise ConnectionError(f"rank {global_rank}: could not reach rank {offset + s.dst} for the {s.name} stream at"
                                      f" {peer_host}:{port} ({err}); the machines must reach each other on any TCP port,"
                                      " as gloo's own connections do") from err
            mine[(s.name, s.src, s.dst)] = SocketStream(conn, timeout)
        for index, conn in _accept(listener, incoming, offset, timeout).items():
            s = incoming[index]
            mine[(s.name, s.src, s.dst)] = SocketStream(conn, timeout)
    return mine


def _accept(listener: socket.socket, incoming: dict[int, Any], offset: int,
            timeout: timedelta) -> dict[int, socket.socket]:
    """The connection of every stream in ``incoming`` (index -> stream), each named by its
    sender's hello; a connection that names no expected stream is closed."""
    def name(fields: tuple[int, ...]) -> Optional[int]:
        rank, index = fields
        stream = incoming.get(index)
        return index if stream is not None and rank == offset + stream.src else None

    return accept_named(listener, STREAM_HELLO, _MAGIC, name, len(incoming), timeout,
                        lambda named: f"ranks {sorted(offset + incoming[i].src for i in set(incoming) - named)}"
                                      " did not connect their data streams")


def _isend(frame: torch.Tensor, dst: int, group: Any, tag: int = 0) -> Any:
    return group.isend(frame) if isinstance(group, SocketStream) else dist_isend(frame, dst, group, tag)


def _irecv(frame: torch.Tensor, src: int, group: Any, tag: int = 0) -> Any:
    return group.irecv(frame) if isinstance(group, SocketStream) else dist_irecv(frame, src, group, tag)


def _host(device: torch.device) -> bool:
    return device.type == "cpu"


#: Data streams on :class:`SocketStream` connections, everything else (control) on gloo: host
#: frames only. A receive may complete before it is waited on (its bytes have all arrived), and
#: a resized frame follows its notice on the stream's connection (its own FIFO, as a gloo tag).
SOCKET_BACKEND = P2PBackend(isend=_isend, irecv=_irecv, completes_unwaited=_host, tagged=_host)
