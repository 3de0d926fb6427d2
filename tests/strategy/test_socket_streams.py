"""Data streams on plain TCP connections (CPU): frames in order, sends that never wait for the
reader, receives read when waited on, and a dead or silent peer named within the timeout.
Every multi-process test of the suite runs its data streams over these connections too."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
import torch

from lightning_epipe.strategy.comm import socket_streams
from lightning_epipe.strategy.comm.socket_streams import STREAM_HELLO, SocketStream, _accept
from lightning_epipe.strategy.comm.streams import pipeline_streams
from lightning_epipe.strategy.comm.wire import VERSION, WireError

TIMEOUT = timedelta(seconds=5)


def _pair(timeout: timedelta = TIMEOUT) -> tuple[SocketStream, SocketStream]:
    """(sender end, receiver end) of one loopback connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        out = socket.create_connection(listener.getsockname())
        inc, _ = listener.accept()
    return SocketStream(out, timeout), SocketStream(inc, timeout)


def _frame(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_frames_arrive_whole_and_in_order_and_a_big_one_does_not_hold_the_sender():
    sender, receiver = _pair()
    sizes = [96, 131072, 8 << 20, 96, 4096]  # 8 MiB: more than the kernel buffers hold
    frames = [_frame(n, i) for i, n in enumerate(sizes)]
    start = time.perf_counter()
    works = [sender.isend(f) for f in frames]  # nobody reads yet
    assert time.perf_counter() - start < 2.0
    assert not works[2].is_completed()  # the 8 MiB frame waits for the reader, in the writer thread
    received = [torch.empty(n, dtype=torch.uint8) for n in sizes]
    reads = [receiver.irecv(r) for r in received]
    for read in reads:
        read.wait(TIMEOUT)
    for work in works:
        assert work.wait(TIMEOUT)
    assert all(torch.equal(f, r) for f, r in zip(frames, received))
    sender.conn.close(), receiver.conn.close()


def test_a_receive_completes_unwaited_once_its_bytes_have_all_arrived():
    sender, receiver = _pair()
    frame, into = _frame(4096, 0), torch.empty(4096, dtype=torch.uint8)
    read = receiver.irecv(into)
    assert not read.is_completed()  # nothing sent yet
    sender.isend(frame).wait(TIMEOUT)
    deadline = time.monotonic() + 5
    while not read.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert read.is_completed() and torch.equal(into, frame)
    sender.conn.close(), receiver.conn.close()


def test_a_closed_sender_and_a_silent_one_are_errors_within_the_timeout():
    sender, receiver = _pair(timedelta(seconds=0.5))
    start = time.perf_counter()
    with pytest.raises(TimeoutError):
        receiver.irecv(torch.empty(96, dtype=torch.uint8)).wait()
    assert time.perf_counter() - start < 3
    sender.isend(_frame(50, 1)).wait(TIMEOUT)
    sender.conn.close()
    with pytest.raises(ConnectionError, match="closed"):
        receiver.irecv(torch.empty(96, dtype=torch.uint8)).wait()  # 50 bytes, then the end
    receiver.conn.close()


def test_a_send_to_a_closed_reader_fails_instead_of_hanging():
    sender, receiver = _pair(timedelta(seconds=1))
    receiver.conn.close()
    with pytest.raises(OSError):
        for i in range(64):  # the first writes may still land in the kernel's buffers
            sender.isend(_frame(1 << 20, i)).wait(TIMEOUT)
    sender.conn.close()


def _hello(port: int, rank: int, index: int, version: int = VERSION) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port))
    conn.sendall(STREAM_HELLO.pack(socket_streams._MAGIC, version, rank, index))
    return conn


def _closed(conn: socket.socket) -> bool:
    """Whether the other end closed ``conn`` (an end, or a reset where bytes were left unread)."""
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


def test_the_receiver_takes_each_stream_by_its_hello_and_closes_strangers():
    streams = pipeline_streams("chain", 3)
    incoming = {i: s for i, s in enumerate(streams) if s.dst == 1}
    with socket.create_server(("127.0.0.1", 0), backlog=8) as listener:
        port = listener.getsockname()[1]
        stranger = socket.create_connection(("127.0.0.1", port))
        stranger.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(32))
        senders = [_hello(port, 10 + s.src, i) for i, s in incoming.items()]  # offset 10
        got = _accept(listener, incoming, 10, TIMEOUT)
    assert sorted(got) == sorted(incoming)
    assert _closed(stranger)
    for conn in [stranger, *senders, *got.values()]:
        conn.close()


def test_another_wire_version_is_named():
    streams = pipeline_streams("chain", 2)
    incoming = {i: s for i, s in enumerate(streams) if s.dst == 0}
    index, stream = next(iter(incoming.items()))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        conn = _hello(listener.getsockname()[1], stream.src, index, VERSION + 1)
        with pytest.raises(WireError, match=f"wire version {VERSION + 1}"):
            _accept(listener, incoming, 0, TIMEOUT)
    conn.close()


def test_a_stream_that_never_connects_is_named_within_the_timeout():
    streams = pipeline_streams("chain", 2)
    incoming = {i: s for i, s in enumerate(streams) if s.dst == 0}
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with pytest.raises(TimeoutError, match=r"ranks \[1\]"):
            _accept(listener, incoming, 0, timedelta(seconds=0.3))


def test_the_writer_keeps_the_order_of_frames_sent_while_it_writes():
    sender, receiver = _pair()
    frames = [_frame(n, i) for i, n in enumerate([6 << 20, 100, 3 << 20, 7])]
    works = [sender.isend(f) for f in frames]
    received = []

    def read() -> None:
        for f in frames:
            into = torch.empty(f.numel(), dtype=torch.uint8)
            receiver.irecv(into).wait()
            received.append(into)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(10)
    assert all(w.wait(TIMEOUT) for w in works)
    assert len(received) == len(frames) and all(torch.equal(a, b) for a, b in zip(frames, received))
    sender.conn.close(), receiver.conn.close()


def test_a_send_completes_once_the_peer_has_the_bytes_not_when_the_kernel_took_them():
    """What ``linkrate`` times: a frame the reader's kernel cannot take yet (its buffer full of
    an earlier one nobody reads) is in flight, not complete, until the reader reads."""
    sender, receiver = _pair()
    big, small = _frame(32 << 20, 0), _frame(4096, 1)
    first, second = sender.isend(big), sender.isend(small)
    time.sleep(0.2)
    assert not second.is_completed()
    for frame in (torch.empty(big.numel(), dtype=torch.uint8), torch.empty(small.numel(), dtype=torch.uint8)):
        receiver.irecv(frame).wait()
    assert first.wait(TIMEOUT) and second.wait(TIMEOUT) and second.is_completed()
    sender.conn.close(), receiver.conn.close()
