"""The client's commands to its servers, on one plain TCP connection per server.

A command (``FORWARD``, ``FINISH_STEP``, ``BATCH_START``, ...) is a bare 96-byte
:class:`~lightning_epipe.strategy.comm.wire.Header`, three or more of them per server and
step. On gloo every message is a rendezvous: the receiver posts its buffer and tells the
sender so (a write on the connection, read by the sender's I/O thread), the sender writes,
the receiver's I/O thread reads and wakes the thread that waits; four thread wake-ups on two
processes for 96 bytes, on the critical path of a pipeline with few micro-batches. Here a
command is one ``send`` on the client and one blocking ``recv`` on the server: nothing to post,
no I/O thread. The data streams, sample ids and checkpoint state stay on the process groups.

Connections (:func:`connect_commands`, every rank of the world together, once per process):
each pipeline's client listens on an ephemeral port of the address its machine reaches the
rendezvous host (``MASTER_ADDR``) from (:func:`advertised_host`); one all-gather on the
control group tells every rank every client's address; each server connects to its client
and names itself and its wire version (:data:`HELLO`; another version is a ``WireError``). Like
gloo's own connections, this needs the ports between the machines open.

Errors: a read or write that waits past the timeout raises :class:`TimeoutError`, a peer that
closed its end :class:`ConnectionError` (both ``OSError``); the transport turns them into a
``PeerError`` that names the peer.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
import termios
from datetime import timedelta
from typing import Any, Callable, Optional, Protocol

import torch
import torch.distributed as dist

from lightning_epipe.strategy.comm.wire import VERSION, WireError

__all__ = ["CommandChannel", "SocketCommands", "connect_commands", "advertised_host", "accept_named", "address_record",
           "listen_and_gather", "parse_record", "read_exactly", "bytes_waiting", "ADDRESS_BYTES"]

#: What a server sends first on its connection: a magic number, its wire version and its global rank.
HELLO = struct.Struct("=qqq")
_HELLO_MAGIC = 0x45504950434D44  # "EPIPCMD"
#: The bytes of one client's "host port" in the all-gather (a zero-padded ASCII string).
ADDRESS_BYTES = 128


class CommandChannel(Protocol):
    """Fixed-size messages between ranks (global ranks), in order per pair, every wait bounded."""

    def send(self, peer: int, data: bytes) -> None:
        """Send ``data`` to ``peer``; raises ``OSError`` if the peer is gone."""

    def recv(self, peer: int, nbytes: int) -> bytes:
        """The next ``nbytes`` from ``peer``; ``TimeoutError`` past the timeout, ``ConnectionError`` if it closed."""

    def arrived(self, peer: int, nbytes: int) -> bytes:
        """Up to ``nbytes`` of what ``peer`` sent that has arrived and is still unread, left
        unread (never waits; empty when nothing has arrived or the peer closed)."""


class SocketCommands:
    """One TCP connection per peer (global rank -> socket), Nagle off, every call bounded by ``timeout``."""

    def __init__(self, connections: dict[int, socket.socket], timeout: timedelta) -> None:
        self.connections = connections
        for conn in connections.values():
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(timeout.total_seconds())
        self._count = bytearray(4)  # FIONREAD's answer (``arrived``, once a step)

    def send(self, peer: int, data: bytes) -> None:
        self.connections[peer].sendall(data)

    def recv(self, peer: int, nbytes: int) -> bytes:
        return read_exactly(self.connections[peer], nbytes)

    def arrived(self, peer: int, nbytes: int) -> bytes:
        conn = self.connections[peer]
        readable = min(nbytes, bytes_waiting(conn.fileno(), self._count))  # a recv on a socket with a timeout would wait for more
        return conn.recv(readable, socket.MSG_PEEK) if readable else b""


def bytes_waiting(fd: int, answer: bytearray) -> int:
    """Bytes that have arrived on the socket ``fd`` and wait to be read (``FIONREAD``, its
    answer written into the 4 bytes of ``answer``: a caller that polls keeps one)."""
    fcntl.ioctl(fd, termios.FIONREAD, answer)
    return int.from_bytes(answer, "little")


def read_exactly(conn: socket.socket, nbytes: int) -> bytes:
    """``nbytes`` from ``conn`` (a command almost always arrives in one piece)."""
    data = conn.recv(nbytes)
    if len(data) == nbytes:
        return data
    buf = bytearray(data)
    while len(buf) < nbytes:
        more = conn.recv(nbytes - len(buf))
        if not more:
            raise ConnectionResetError("the connection was closed by peer")
        buf += more
    return bytes(buf)


def advertised_host(main_address: Optional[str]) -> str:
    """The address of this machine that the other machines of the job reach it at: the local
    end of its route to the rendezvous host ``main_address`` (the loopback address when that
    is this machine's loopback, or when no route is known).

        >>> advertised_host("127.0.0.1"), advertised_host("localhost"), advertised_host(None)
        ('127.0.0.1', '127.0.0.1', '127.0.0.1')
    """
    if not main_address or main_address == "localhost":
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(main_address).is_loopback:
            return main_address
    except ValueError:  # a host name: resolved below
        pass
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(main_address, 1, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:  # UDP: connect only picks the route, sends nothing
            probe.connect(sockaddr)
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def address_record(host: str, port: int) -> torch.Tensor:
    text = f"{host} {port}".encode()
    if len(text) > ADDRESS_BYTES:
        raise ValueError(f"address {text!r} longer than {ADDRESS_BYTES} bytes")
    record = torch.zeros(ADDRESS_BYTES, dtype=torch.uint8)
    record[:len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    return record


def parse_record(record: torch.Tensor) -> tuple[str, int]:
    host, port = bytes(record.numpy()).rstrip(b"\0").decode().rsplit(" ", 1)
    return host, int(port)


def listen_and_gather(listen: bool, backlog: int, control_group: Any,
                      main_address: Optional[str]) -> tuple[Optional[socket.socket], list[torch.Tensor]]:
    """A collective over ``control_group``: where ``listen``, a listener on an ephemeral port of
    :func:`advertised_host`; then every rank's address record (``parse_record``; all zeros where a
    rank does not listen), indexed by rank in the group."""
    listener, record = None, torch.zeros(ADDRESS_BYTES, dtype=torch.uint8)
    if listen:
        host = advertised_host(main_address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.create_server((host, 0), family=family, backlog=max(1, backlog))
        record = address_record(host, listener.getsockname()[1])
    records = [torch.zeros_like(record) for _ in range(dist.get_world_size(control_group))]
    dist.all_gather(records, record, group=control_group)
    return listener, records


def connect_commands(pipeline_rank: int, size: int, offset: int, global_rank: int, control_group: Any,
                     timeout: timedelta, main_address: Optional[str]) -> Optional[SocketCommands]:
    """This rank's command connections (a collective over ``control_group``, every rank of the
    world): a client's to each of its ``size - 1`` servers (global ranks ``offset + 1 ..``), a
    server's to its client; ``None`` for a pipeline of one rank."""
    listener, records = listen_and_gather(pipeline_rank == 0 and size > 1, size, control_group, main_address)
    if size == 1:
        return None
    if listener is not None:
        with listener:
            return SocketCommands(_accept_servers(listener, set(range(offset + 1, offset + size)), timeout), timeout)
    host, port = parse_record(records[offset])
    try:
        conn = socket.create_connection((host, port), timeout=timeout.total_seconds())
        conn.sendall(HELLO.pack(_HELLO_MAGIC, VERSION, global_rank))
    except OSError as err:
        raise ConnectionError(f"rank {global_rank}: could not reach its pipeline's client, rank {offset}, for commands at"
                              f" {host}:{port} ({err}); the machines must reach each other on any TCP port, as gloo's"
                              " own connections do") from err
    return SocketCommands({offset: conn}, timeout)


def _accept_servers(listener: socket.socket, expected: set[int], timeout: timedelta) -> dict[int, socket.socket]:
    """The connection of every server in ``expected`` (global ranks), each named by its hello;
    a connection that is not one of them is closed."""
    return accept_named(listener, HELLO, _HELLO_MAGIC, lambda fields: fields[0] if fields[0] in expected else None,
                        len(expected), timeout,
                        lambda named: f"ranks {sorted(expected - set(named))} did not connect for the pipeline's commands")


def accept_named(listener: socket.socket, hello: struct.Struct, magic: int, name: Callable[[tuple[int, ...]], Any],
                 count: int, timeout: timedelta, missing: Callable[[set[Any]], str]) -> dict[Any, socket.socket]:
    """Accept connections until ``count`` of them are named: each first sends ``hello`` (``magic``,
    its wire version, its global rank, then any other fields); ``name(fields after the version)``
    names it, or is None for a stranger, which is closed as is a second connection of one name.
    Another wire version is a ``WireError``; past the timeout, ``TimeoutError(missing(names so far))``."""
    connections: dict[Any, socket.socket] = {}
    listener.settimeout(timeout.total_seconds())
    while len(connections) < count:
        try:
            conn, _ = listener.accept()
        except TimeoutError as err:
            raise TimeoutError(f"{missing(set(connections))} within {timeout}") from err
        conn.settimeout(timeout.total_seconds())
        try:
            got, version, *fields = hello.unpack(read_exactly(conn, hello.size))
        except (OSError, struct.error):
            conn.close()
            continue
        key = name(tuple(fields)) if got == magic else None
        if key is None or key in connections:
            conn.close()
            continue
        if version != VERSION:
            conn.close()
            raise WireError(f"rank {fields[0]} speaks wire version {version} but this process speaks {VERSION}:"
                            " install the same version everywhere")
        connections[key] = conn
    return connections
