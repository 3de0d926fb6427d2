"""Frames between ranks: one message per tensor, receives posted ahead, every wait bounded.

A *frame* is one uint8 buffer: the 96-byte :class:`~lightning_epipe.strategy.comm.wire.Header`
followed by the payload. Messages travel on *streams* (``streams.py``: one process group
per direction of a link and kind of message), each a FIFO whose order both ends know.

Frame sizes: both ends remember, per stream, the frame size of each message *key* (kind,
micro-batch, tensor index), starting at a bare header. A payload that fits the remembered
frame (:func:`frame_capacity`: no larger, and at least 3/4 of it, or smaller once) goes in a
frame of that size, padded, as one message: in steady state a tensor is one message and its
receive can be posted before it is sent (:meth:`prepost`), even where a codec's payload
varies by a few bytes from message to message (sort quantization's exact levels), and so
does an epoch's smaller last batch. Any other payload (the first step, one that stays
smaller, a codec that changed) is announced by a notice of the remembered size with the
``RESIZE`` flag and the new frame's payload capacity, then sent: on gloo under a tag of
its own (``RESIZED_TAG``: a FIFO of its own within the stream's group), so the stream's FIFO
only holds frames of the sizes both ends expect and a receiver may post a whole phase's
receives at once (``prepost(behind=True)``); on NCCL, whose messages match in posting order
whatever their tag, on the stream itself, where the receiver posts the next frame only
after it has read the one before, so a notice is never mistaken for a frame. A notice costs a whole frame
of the old size on the wire, which is why a payload that grew gets 1/64 of headroom, and why
a codec switch restarts the stream's sizes on both ends (:meth:`Transport.restart_frames`).

Copies: a sender writes a packet's header and payload straight into the frame (``prefix``),
one copy of the encoded tensor; every receive lands in a frame of its own that is never
reused, so its payload is handed out as a view and ``none`` decodes it without a copy
(``Packet.owned``).

Checksums: XXH3-64 of the payload (``wire.checksum``), computed where the payload is in host memory (gloo);
on accelerator links the header says 0 and NCCL's own integrity checks stand.

Link rates: every data frame's send is timed from its post to its completion, as the
sender sees it (where a backend reports a send's completion before it is waited on, NCCL and
the in-memory fabric, pending sends are polled before every send and around every receive;
gloo marks a send complete only when it is waited on, at the flush that ends a phase), and
kept per peer in a :class:`~lightning_epipe.strategy.comm.linkrate.TransferWindow` (``rates``),
marked *queued* when the next frame to that peer was posted before it completed; and every
data frame received is counted per stream and peer in ``arrivals``, with whether it had
landed before the receiver came to wait for it (``is_completed()`` before the wait on NCCL and
the in-memory fabric; on gloo, whose ``is_completed()`` stays False until a work is waited on,
a wait that returned within ``ARRIVED_S``) (:class:`~lightning_epipe.strategy.comm.linkrate.Arrivals`):
what ``compressor="auto"`` decides from. A frame announced by a ``RESIZE`` notice is left out:
its receive is posted only when the receiver reads the notice, so its time is mostly the
receiver's (every frame of the first step, and of the step after a codec changes size).

Host staging (``host_staged=True``: gloo between GPUs, e.g. a TCP link between sites): frames
live in pinned host memory; a payload is copied off the GPU into its frame before the send
and back onto it after the receive (asynchronously, from pinned memory). Every wait
is bounded by ``timeout``; a dead or stalled peer is a :class:`PeerError` that names it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping, Optional

import numpy
import torch
import torch.distributed as dist
from torch import Tensor

from lightning_epipe.strategy.comm.command_channel import CommandChannel
from lightning_epipe.strategy.comm.linkrate import MIN_BYTES, WINDOW_BYTES, Arrivals, Transfer, TransferWindow
from lightning_epipe.strategy.engine.stats import LinkKey, PipelineStats
from lightning_epipe.strategy.comm.streams import CONTROL, stream_name
from lightning_epipe.strategy.comm.wire import (HEADER_NBYTES, RESIZE_BIT, Flag, Header, Kind, WireError, checksum,
                                                command_name, host_checksum)

__all__ = ["PeerError", "Transport", "Received", "P2PBackend", "DIST_BACKEND", "frame_capacity"]

Key = tuple[int, int, int]  # (kind, micro-batch, tensor index)

#: A command's kind as a plain int (tested on every message: an int compared with an enum member costs more)
_COMMAND = int(Kind.CONTROL)

#: A host-memory receive on a backend that completes it only once waited on (gloo) whose wait
#: returns within this many seconds had landed before it was needed (elsewhere ``is_completed`` tells).
ARRIVED_S = 100e-6


class PeerError(RuntimeError):
    """A peer died, stalled past the timeout, or broke the protocol."""


@dataclass
class Received:
    header: Header
    payload: Optional[Tensor]
    nbytes: int  # bytes it took on the wire: the frame's and a size notice's


@dataclass
class _Sent:
    work: Any
    frame: Tensor  # kept alive until the send completes
    peer: int
    header: Header  # what it carried (named in errors)
    posted_at: float
    link: Optional[LinkKey]  # where the transfer's time goes (None: control messages)
    timed: bool = False
    queued: bool = False  # another data frame to the same peer was posted before this one completed
    resized: bool = False  # announced by a RESIZE notice: its receive was not posted ahead


def _always(device: torch.device) -> bool:
    return True


def _never(device: torch.device) -> bool:
    return False


@dataclass
class P2PBackend:
    """Point-to-point primitives: ``torch.distributed`` or the in-memory ``memory_backend``;
    ``isend(tensor, dst, group, tag)`` and ``irecv(tensor, src, group, tag)``.
    ``completes_unwaited(device)``: whether a send or receive of frames on ``device`` may report
    completion (``is_completed()``) before it is waited on; where it never does, nothing asks.
    ``tagged(device)``: whether messages of another ``tag`` on a group form a FIFO of their own
    there (gloo's; NCCL matches in posting order whatever the tag)."""

    isend: Callable[[Tensor, int, Any, int], Any]
    irecv: Callable[[Tensor, int, Any, int], Any]
    completes_unwaited: Callable[[torch.device], bool] = _always
    tagged: Callable[[torch.device], bool] = _never


def dist_isend(t: Tensor, dst: int, group: Any, tag: int = 0) -> Any:
    """``dist.isend`` minus its per-call argument checks (the frames are always contiguous uint8)."""
    pg = dist.group.WORLD if group is None else group
    return pg.send([t], dist.get_group_rank(pg, dst), tag)


def dist_irecv(t: Tensor, src: int, group: Any, tag: int = 0) -> Any:
    pg = dist.group.WORLD if group is None else group
    return pg.recv([t], dist.get_group_rank(pg, src), tag)


def _nccl_frames(device: torch.device) -> bool:
    """NCCL (frames on an accelerator) completes a send or receive on its own; gloo (host
    frames) marks one complete only in ``wait()``."""
    return device.type != "cpu"


def _gloo_frames(device: torch.device) -> bool:
    """Host frames travel on gloo, whose tags are separate FIFOs within a group."""
    return device.type == "cpu"


DIST_BACKEND = P2PBackend(isend=dist_isend, irecv=dist_irecv, completes_unwaited=_nccl_frames, tagged=_gloo_frames)

#: The tag of a frame announced by a ``RESIZE`` notice, where the backend keeps tags apart: the
#: stream's own FIFO (tag 0) then only ever holds frames of the sizes both ends expect.
RESIZED_TAG = 1


@dataclass
class _Posted:
    key: Key
    frame: Tensor
    work: Any


def fills(payload_nbytes: int, capacity: int) -> bool:
    """Whether a payload fills at least 3/4 of a frame's capacity (else it is *short*)."""
    return payload_nbytes >= capacity * 3 // 4


def frame_capacity(payload_nbytes: int, capacity: int, short_before: bool = False) -> int:
    """The payload capacity of the frame that carries ``payload_nbytes`` where the peer expects
    ``capacity``: ``capacity`` itself while the payload fits it and fills at least 3/4 of it
    (no notice, a few bytes of padding), or fits it once after a message that did fill it
    (``short_before`` False: an epoch's smaller last batch travels padded, for what a notice
    there and another one back would cost); else the payload's size, with 1/64 of headroom
    when it outgrew its frame by a little (sizes that vary stop costing a notice each).

        >>> frame_capacity(32836, 0), frame_capacity(32856, 32836), frame_capacity(32836, 33370)
        (32836, 33370, 33370)
        >>> frame_capacity(4128, 30)   # another message on the same key
        4128
        >>> frame_capacity(16384, 33370), frame_capacity(16384, 33370, short_before=True)  # a codec of half the bits
        (33370, 16384)
    """
    if payload_nbytes <= capacity and (fills(payload_nbytes, capacity) or not short_before):
        return capacity
    if capacity < payload_nbytes <= capacity * 9 // 8:
        return payload_nbytes + -(-payload_nbytes // 64)
    return payload_nbytes


def _write_bytes(frame: Tensor, offset: int, data: bytes) -> None:
    """Copy host ``data`` into ``frame`` (uint8, any device) at ``offset``."""
    if frame.device.type == "cpu":
        frame.numpy()[offset:offset + len(data)] = numpy.frombuffer(data, dtype=numpy.uint8)
    else:
        frame[offset:offset + len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def _key(kind: int, microbatch: int, index: int) -> Key:
    # a control message's micro-batch field carries an argument: control keys ignore it
    return (int(kind), int(microbatch) if stream_name(kind) != CONTROL else 0, int(index))


class Transport:
    """Send and receive frames to and from peers of one pipeline.

    Ranks are counted from ``offset``: a pipeline replica whose ranks are global ranks
    ``offset .. offset + size - 1`` talks in its own ranks ``0 .. size - 1``; messages and
    errors name global ranks. ``groups`` maps ``(stream name, src, dst)`` (pipeline ranks)
    to the process group of that stream; ``control_group`` carries sample ids and checkpoint
    state, in host memory on ``control_device``, and commands too unless ``commands`` carries
    them (``command_channel``: a plain connection per client-server pair). A stream without a
    group uses the default group.
    """

    def __init__(
        self,
        rank: int,
        device: torch.device,
        timeout: timedelta,
        verify_checksum: bool = True,
        stats: Optional[PipelineStats] = None,
        offset: int = 0,
        groups: Optional[Mapping[tuple[str, int, int], Any]] = None,
        control_group: Any = None,
        control_device: Optional[torch.device] = None,
        backend: P2PBackend = DIST_BACKEND,
        host_staged: bool = False,
        commands: Optional[CommandChannel] = None,
    ) -> None:
        self.rank = rank
        self.offset = offset
        self.device = device
        self.control_device = control_device or device
        self.timeout = timeout
        self.verify_checksum = verify_checksum
        self.stats = stats if stats is not None else PipelineStats()  # receives the blocked time
        self.groups = dict(groups or {})
        self.control_group = control_group
        self.backend = backend
        self.commands = commands  # the client's commands (CONTROL headers) to and from peers, off the process groups
        self.host_staged = host_staged and device.type != "cpu"
        self.wire_device = torch.device("cpu") if self.host_staged else device
        self._completes_unwaited = backend.completes_unwaited(self.wire_device)  # else sends are timed when flushed
        self._frame_sizes: dict[tuple[str, int, int, Key], int] = {}  # (stream, src, dst, key) -> bytes
        self._short: set[tuple[str, int, int, Key]] = set()  # keys whose last payload filled < 3/4 of its frame
        self._posted: dict[tuple[str, int], list[_Posted]] = {}  # (stream, peer) -> receives posted ahead, in order
        self._tagged = backend.tagged(self.wire_device)  # resized frames off the stream: receives may queue
        self._pending: list[_Sent] = []
        self.rates: dict[int, TransferWindow] = {}  # peer -> the latest data transfers to it
        self.arrivals: dict[tuple[str, int], Arrivals] = {}  # (stream, peer) -> data frames received, how many in time
        self.rate_window_bytes = WINDOW_BYTES  # how much of them each window keeps
        self._links: dict[tuple[int, bool], str] = {}  # (peer, outgoing) -> :meth:`link`
        self._routes: dict[tuple[int, int, int], tuple[str, Any, torch.device]] = {}  # (kind, src, dst) -> :meth:`_route`

    def link(self, peer: int, outgoing: bool) -> str:
        """How errors name the link to or from ``peer`` (global ranks)."""
        name = self._links.get((peer, outgoing))
        if name is None:
            me, other = self.offset + self.rank, self.offset + peer
            name = f"link rank {me} -> rank {other}" if outgoing else f"link rank {other} -> rank {me}"
            self._links[(peer, outgoing)] = name
        return name

    def _route(self, kind: int, src: int, dst: int) -> tuple[str, Any, torch.device]:
        """(stream name, process group, device of its frames) of ``kind``'s messages from ``src`` to ``dst``."""
        route = self._routes.get((kind, src, dst))
        if route is None:
            name = stream_name(kind)
            if name == CONTROL:
                route = (name, self.control_group, self.control_device)
            else:
                route = (name, self.groups.get((name, src, dst)), self.wire_device)
            self._routes[(kind, src, dst)] = route
        return route

    # ------------------------------------------------------------------ sending

    def send(self, peer: int, header: Header, payload: Optional[Tensor] = None, prefix: bytes = b"") -> int:
        """Post ``header`` and ``prefix + payload`` (``payload``: 1-D uint8) to ``peer`` as one frame;
        returns the bytes it put on the wire: the frame's, padding included, and a size notice's
        when one goes first. ``prefix``: bytes that lead the payload in the frame (a packet's
        header), so an encoded tensor is copied once on its way out: into its frame."""
        if header.kind == _COMMAND and self.commands is not None:
            return self._send_command(peer, header)
        name, group, device = self._route(header.kind, self.rank, peer)
        if payload is not None and (payload.dtype != torch.uint8 or payload.dim() != 1):
            raise TypeError(f"payload must be a 1-D uint8 tensor, got {payload.dtype} {tuple(payload.shape)}")
        size = len(prefix) + (0 if payload is None else payload.numel())
        slot = (name, self.rank, peer, _key(header.kind, header.microbatch, header.index))
        expected = self._frame_sizes.get(slot, HEADER_NBYTES)
        capacity = frame_capacity(size, expected - HEADER_NBYTES, slot in self._short)
        if fills(size, capacity):
            self._short.discard(slot)
        else:
            self._short.add(slot)
        frame = self._frame(HEADER_NBYTES + capacity, device)
        if device.type == "cpu" and (payload is None or payload.device.type == "cpu"):
            buf = frame.numpy()  # one view of the host frame for every write
            header = header.framed(size, self._fill_host_frame(buf, prefix, payload, size))
            header.write_host(buf)
        else:
            header = header.framed(size, self._fill_frame(frame, prefix, payload, size))
            header.write(frame)
        nbytes = frame.numel()
        resized = expected != nbytes
        if resized:  # announce the new frame in a frame of the size the peer expects
            notice = torch.zeros(expected, dtype=torch.uint8, device=device)
            header.framed(capacity, 0, Flag.RESIZE).write(notice)
            self._post(notice, peer, group, header)
            self._frame_sizes[slot] = nbytes
        self._poll_sends()
        self._post(frame, peer, group, header, None if name == CONTROL else LinkKey("send", peer, name), resized,
                   RESIZED_TAG if resized and self._tagged else 0)
        return nbytes + (expected if resized else 0)

    def _send_command(self, peer: int, header: Header) -> int:
        """A command: its bare header on the command channel."""
        try:
            self.commands.send(self.offset + peer, header.framed(0).to_bytes())
        except OSError as err:
            raise self._peer_error(err, peer, f"the send of command {command_name(header.arg)}") from err
        return HEADER_NBYTES

    def _fill_host_frame(self, buf: numpy.ndarray, prefix: bytes, payload: Optional[Tensor], size: int) -> int:
        """Write ``prefix + payload`` (``size`` bytes, host memory) after the header of the host
        frame ``buf`` and zero its padding; the payload's checksum (0: not taken)."""
        start, end = HEADER_NBYTES + len(prefix), HEADER_NBYTES + size
        if prefix:
            buf[HEADER_NBYTES:start] = numpy.frombuffer(prefix, dtype=numpy.uint8)
        if end > start:
            buf[start:end] = payload.numpy()
        buf[end:] = 0  # padding
        return host_checksum(buf[HEADER_NBYTES:end]) if self.verify_checksum and size else 0

    def _fill_frame(self, frame: Tensor, prefix: bytes, payload: Optional[Tensor], size: int) -> int:
        """The same for a frame or a payload on an accelerator (the checksum is then 0)."""
        start, end = HEADER_NBYTES + len(prefix), HEADER_NBYTES + size
        if prefix:
            _write_bytes(frame, HEADER_NBYTES, prefix)
        if end > start:
            frame[start:end].copy_(payload, non_blocking=True)
            if payload.device != frame.device and payload.device.type == "cuda":
                torch.cuda.current_stream(payload.device).synchronize()  # gloo reads the host copy at once
        if frame.numel() > end:
            frame[end:].zero_()  # padding
        return checksum(frame[HEADER_NBYTES:end]) if self.verify_checksum and size else 0

    def restart_frames(self, stream: str, src: int, dst: int) -> None:
        """Forget the frame sizes of ``stream`` from pipeline rank ``src`` to ``dst`` (this rank is
        one of them): its next message starts from a bare header, as on the first step.

        Both ends call it at the same point of the stream, between two steps (``compressor="auto"``
        switching that link's codec): the new codec's first frames then cost a header-sized size
        notice each, instead of a frame padded to the old codec's size and then a notice of that
        size. Raises RuntimeError if a receive on that stream is posted (its size is committed).
        """
        if self._posted.get((stream, src)) and dst == self.rank:
            raise RuntimeError(f"{self.link(src, outgoing=False)}: the {stream} stream has a receive posted; "
                               "restart its frames between steps")
        for slot in [slot for slot in self._frame_sizes if slot[:3] == (stream, src, dst)]:
            del self._frame_sizes[slot]
            self._short.discard(slot)

    def _frame(self, nbytes: int, device: torch.device) -> Tensor:
        """A frame buffer: pinned host memory when it stages a GPU's tensors."""
        return torch.empty(nbytes, dtype=torch.uint8, device=device, pin_memory=self.host_staged and device.type == "cpu")

    def _post(self, frame: Tensor, peer: int, group: Any, header: Header, link: Optional[LinkKey] = None,
              resized: bool = False, tag: int = 0) -> None:
        if link is not None:  # sends still in flight to this peer now queue behind one more
            for sent in self._pending:
                if sent.link is not None and sent.peer == peer and not sent.timed:
                    sent.queued = True
        work = self.backend.isend(frame, self.offset + peer, group, tag)
        self._pending.append(_Sent(work, frame, peer, header, time.perf_counter(), link, resized=resized))

    def _poll_sends(self) -> None:
        """Time the sends that completed since the last look (their rate is a lower bound)."""
        if not self._completes_unwaited:
            return
        for sent in self._pending:
            if not sent.timed and sent.work.is_completed():
                self._time(sent)

    def _time(self, sent: _Sent) -> None:
        sent.timed = True
        if sent.link is not None:
            now = time.perf_counter()
            self.stats.link(sent.link).add_transfer(sent.frame.numel(), now - sent.posted_at)
            if sent.resized:
                return
            window = self.rates.get(sent.peer)
            if window is None:
                size = self.rate_window_bytes
                window = self.rates[sent.peer] = TransferWindow(size, min(MIN_BYTES, size))
            window.add(Transfer(sent.posted_at, now, sent.frame.numel(), sent.queued))

    @property
    def sends_in_flight(self) -> int:
        """Sends posted since the last :meth:`flush` (each holds its frame until then)."""
        return len(self._pending)

    def flush(self) -> None:
        """Wait until every posted send has left (bounded by the timeout)."""
        pending, self._pending = self._pending, []
        for sent in pending:
            what = f"send of {Kind(sent.header.kind).name.lower()} of step {sent.header.step}, micro-batch {sent.header.microbatch}"
            self._wait(sent.work, sent.peer, what, blocking=False)
            if not sent.timed:
                self._time(sent)

    # ------------------------------------------------------------------ receiving

    @property
    def tags_apart(self) -> bool:
        """Whether the data streams' tags are FIFOs of their own (gloo), so receives may queue
        on a stream ahead of the message read next (:meth:`prepost`'s ``behind``)."""
        return self._tagged

    def prepost(self, peer: int, kind: int, microbatch: int = 0, index: int = 0, behind: bool = False) -> None:
        """Post the receive of the next message from ``peer`` on ``kind``'s stream now, so it
        lands while this rank computes (no-op if that stream already has one posted).

        ``behind``: post it after those already posted on the stream (no-op if this message is
        among them), so that a whole phase's receives are posted at once and each message is
        written by its sender as soon as it is sent, not when the receiver comes to it. The
        caller posts in the stream's order. Only where the backend keeps tags apart (gloo):
        there a frame announced by a ``RESIZE`` notice travels on its own tag and can never
        land in a receive posted for a later message; elsewhere (NCCL) a stream holds one
        posted receive at a time, and ``behind`` posts only on a stream with none."""
        name, group, device = self._route(kind, peer, self.rank)
        key = _key(kind, microbatch, index)
        queue = self._posted.setdefault((name, peer), [])
        if not queue or (behind and self._tagged and all(p.key != key for p in queue)):
            queue.append(self._post_recv(name, group, device, peer, key))

    def _post_recv(self, name: str, group: Any, device: torch.device, peer: int, key: Key, tag: int = 0) -> _Posted:
        size = self._frame_sizes.get((name, peer, self.rank, key), HEADER_NBYTES)
        frame = self._frame(size, device)
        return _Posted(key, frame, self.backend.irecv(frame, self.offset + peer, group, tag))

    def recv(self, peer: int, what: str, idle: bool = False, **expect: int) -> Received:
        """Receive the next message from ``peer`` on the stream of ``expect["kind"]``; its header
        must match ``expect``. ``idle``: waiting for it is time between steps, not pipeline wait."""
        kind = expect["kind"]
        link = self.link(peer, outgoing=False)
        if kind == _COMMAND and self.commands is not None:
            return self._recv_command(peer, what, idle, link, expect)
        name, group, device = self._route(kind, peer, self.rank)
        key = _key(kind, expect.get("microbatch", 0), expect.get("index", 0))
        queue = self._posted.get((name, peer))
        posted = queue.pop(0) if queue else None
        if posted is None:
            posted = self._post_recv(name, group, device, peer, key)
        elif posted.key != key:
            raise WireError(f"{link}: {what}: the {name} stream was posted for message {posted.key}, not {key}")
        self._poll_sends()  # completions seen sooner: the rates in ``rates`` are closer to the truth
        # NCCL and the in-memory fabric tell at once (gloo only once waited on: see below)
        landed = name != CONTROL and self._completes_unwaited and posted.work.is_completed()
        waited = self._wait(posted.work, peer, what, blocking=not idle)
        if name != CONTROL:  # gloo tells only once waited on: a wait on the host that returns at once
            ready = landed or (device.type == "cpu" and waited < ARRIVED_S)
            arrivals = self.arrivals.get((name, peer))
            if arrivals is None:
                arrivals = self.arrivals[(name, peer)] = Arrivals()
            arrivals.add(ready)
        self._poll_sends()
        header = Header.read(posted.frame, link)
        header.expect(link, **expect)
        frame, nbytes = posted.frame, posted.frame.numel()
        if header.flags & RESIZE_BIT:
            self._frame_sizes[(name, peer, self.rank, key)] = HEADER_NBYTES + header.payload_nbytes
            resized = self._post_recv(name, group, device, peer, key, RESIZED_TAG if self._tagged else 0)
            self._wait(resized.work, peer, what, blocking=not idle)
            frame = resized.frame
            nbytes += frame.numel()
            header = Header.read(frame, link)
            header.expect(link, **expect)
        end = HEADER_NBYTES + header.payload_nbytes
        if end > frame.numel():
            raise WireError(f"{link}: {what}: the header announces {header.payload_nbytes} payload bytes in a frame of {frame.numel()}")
        payload = frame[HEADER_NBYTES:end] if header.payload_nbytes else None
        if payload is not None and self.verify_checksum and header.checksum and checksum(payload) != header.checksum:
            raise WireError(f"{link}: {what}: payload checksum mismatch ({header.payload_nbytes} bytes corrupted in transit)")
        if payload is not None and name != CONTROL and payload.device != self.device:
            payload = payload.to(self.device, non_blocking=True)  # host-staged: onto the GPU, from pinned memory
        return Received(header, payload, nbytes)

    def commands_arrived(self, peer: int, count: int) -> list[Header]:
        """The headers of ``peer``'s next ``count`` commands, as many of them as have arrived
        whole, left unread: never waits (none without a command channel)."""
        if self.commands is None:
            return []
        data = self.commands.arrived(self.offset + peer, count * HEADER_NBYTES)
        link = self.link(peer, outgoing=False)
        whole = len(data) - len(data) % HEADER_NBYTES
        return [Header.from_bytes(data[i:i + HEADER_NBYTES], link) for i in range(0, whole, HEADER_NBYTES)]

    def _recv_command(self, peer: int, what: str, idle: bool, link: str, expect: Mapping[str, int]) -> Received:
        """The next command from ``peer`` on the command channel."""
        start = time.perf_counter()
        try:
            data = self.commands.recv(self.offset + peer, HEADER_NBYTES)
        except OSError as err:
            raise self._peer_error(err, peer, what) from err
        if not idle:
            self.stats.wait_seconds += time.perf_counter() - start
        header = Header.from_bytes(data, link)
        header.expect(link, **expect)
        return Received(header, None, HEADER_NBYTES)

    def _peer_error(self, err: BaseException, peer: int, what: str) -> PeerError:
        """What a failed wait on ``peer`` raises: which rank, what happened, what this rank waited for."""
        self._pending.clear()
        self._posted.clear()
        peer, me = self.offset + peer, self.offset + self.rank  # errors name global ranks
        text = str(err) or type(err).__name__
        if isinstance(err, TimeoutError) or "Timed out" in text or "timed out" in text.lower():
            cause = f"rank {peer} sent nothing for {self.timeout} (it stalled or died); raise EPipeStrategy(timeout=...) if its work is this slow"
        elif (isinstance(err, ConnectionError) or "closed by peer" in text or "Connection reset" in text
              or "Broken pipe" in text):
            cause = f"rank {peer} closed the connection (it died or exited)"
        else:
            cause = f"the link to rank {peer} failed"
        return PeerError(f"rank {me}: {cause} while waiting for {what}. ({text.splitlines()[0][:200]})")

    def _wait(self, work: Any, peer: int, what: str, blocking: bool) -> float:
        """Wait for ``work`` (bounded by the timeout); the seconds it took. ``blocking`` time counts
        as pipeline wait."""
        start = time.perf_counter()
        try:
            work.wait(self.timeout)
        except (RuntimeError, OSError) as err:  # gloo's errors, a socket stream's
            raise self._peer_error(err, peer, what) from err
        waited = time.perf_counter() - start
        if blocking:
            self.stats.wait_seconds += waited
        return waited
