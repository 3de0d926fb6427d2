"""Commands on plain TCP connections (``command_channel``): exact bytes in order, every wait
bounded, a dead or silent peer a PeerError that names it, strangers turned away."""

from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest
import torch

from lightning_epipe.strategy.comm.command_channel import (HELLO, SocketCommands, _HELLO_MAGIC, _accept_servers,
                                                           address_record, parse_record, advertised_host)
from lightning_epipe.strategy.comm.transport import PeerError, Transport
from lightning_epipe.strategy.comm.wire import VERSION, Command, Header, Kind, WireError

TIMEOUT = timedelta(seconds=0.5)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return a, b


def _ends(offset: int = 0) -> list[Transport]:
    """Rank 0 (the client) and rank 1 of a pipeline whose ranks start at global rank ``offset``,
    their commands on one loopback connection."""
    a, b = _tcp_pair()
    return [Transport(rank, torch.device("cpu"), TIMEOUT, offset=offset,
                      commands=SocketCommands({offset + 1 - rank: conn}, TIMEOUT)) for rank, conn in ((0, a), (1, b))]


def test_commands_arrive_whole_and_in_order_with_their_fields():
    client, server = _ends(offset=4)
    sent = [Header.command(Command.BATCH_START, 3), Header.command(Command.FORWARD, 4, 8, flags=5),
            Header.clip(4, 1, 0, 0.5), Header.command(Command.FINISH_STEP, 4)]
    assert [client.send(1, h) for h in sent] == [96] * 4
    got = [server.recv(0, "a command", idle=True, kind=Kind.CONTROL).header for _ in sent]
    assert got == [h.framed(0) for h in sent]
    assert got[2].clip_args("link") == (0, 0.5)
    assert client.sends_in_flight == 0  # nothing for flush to wait on


def test_commands_that_arrived_are_seen_whole_and_left_unread_without_waiting():
    """``Transport.commands_arrived``: what a server looks at to start the next step ahead."""
    client, server = _ends(offset=2)
    assert server.commands_arrived(0, 2) == []  # nothing yet: at once, no timeout
    first, second = Header.command(Command.BATCH_START, 3), Header.command(Command.FORWARD, 4, 8, flags=5)
    client.send(1, first)
    _settle(server, 1)
    assert server.commands_arrived(0, 2) == [first.framed(0)]  # one of the two asked for
    client.send(1, second)
    _settle(server, 2)
    assert server.commands_arrived(0, 2) == server.commands_arrived(0, 3) == [first.framed(0), second.framed(0)]
    got = [server.recv(0, "a command", idle=True, kind=Kind.CONTROL).header for _ in range(2)]
    assert got == [first.framed(0), second.framed(0)]  # still there to read, in order
    assert server.commands_arrived(0, 2) == []


def _settle(server: Transport, count: int) -> None:
    """Wait until ``count`` commands have reached ``server`` (loopback: at once, nearly)."""
    for _ in range(1000):
        if len(server.commands_arrived(0, count)) == count:
            return
        threading.Event().wait(0.001)
    raise AssertionError(f"{count} commands never arrived")


def test_a_silent_client_is_an_error_within_the_timeout_that_names_it():
    _, server = _ends(offset=2)
    with pytest.raises(PeerError, match=r"rank 3: rank 2 sent nothing for 0:00:00.5.* while waiting for the next command"):
        server.recv(0, "the next command", idle=True, kind=Kind.CONTROL)


def test_a_client_that_died_is_an_error_at_once_and_so_is_a_send_to_a_dead_server():
    client, server = _ends()
    client.commands.connections[1].close()
    with pytest.raises(PeerError, match="rank 0 closed the connection"):
        server.recv(0, "the next command", kind=Kind.CONTROL)
    client, server = _ends()
    server.commands.connections[0].close()
    with pytest.raises(PeerError, match="rank 1 closed the connection .* command STOP"):
        for _ in range(1000):  # the first sends may still land in the socket's buffer
            client.send(1, Header.command(Command.STOP, 1))


def test_a_corrupted_or_unexpected_command_is_a_wire_error():
    client, server = _ends()
    client.commands.send(1, b"\x07" * 96)
    with pytest.raises(WireError, match="not an epipe header"):
        server.recv(0, "a command", kind=Kind.CONTROL)
    client.send(1, Header.command(Command.FORWARD, 9))
    with pytest.raises(WireError, match="step=9 .expected 1."):
        server.recv(0, "a command", kind=Kind.CONTROL, step=1)


def test_a_client_accepts_its_servers_by_their_hello_and_turns_strangers_away():
    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()
    results: dict = {}
    accepting = threading.Thread(target=lambda: results.update(_accept_servers(listener, {5, 6}, timedelta(seconds=5))))
    accepting.start()
    stranger = socket.create_connection(address)
    stranger.sendall(b"GET / HTTP/1.1\r\n\r\n")
    servers = {}
    for rank in (6, 5):
        servers[rank] = socket.create_connection(address)
        servers[rank].sendall(HELLO.pack(_HELLO_MAGIC, VERSION, rank))
    accepting.join(10)
    assert sorted(results) == [5, 6]
    try:
        closed = stranger.recv(1) == b""
    except ConnectionResetError:  # closed with bytes of its "hello" unread
        closed = True
    assert closed
    servers[5].sendall(b"x")
    assert results[5].recv(1) == b"x"
    for conn in [*results.values(), *servers.values(), stranger, listener]:
        conn.close()


def test_a_server_of_another_wire_version_is_named_at_once():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        server = socket.create_connection(listener.getsockname())
        server.sendall(HELLO.pack(_HELLO_MAGIC, VERSION - 1, 3))
        with pytest.raises(WireError, match=f"rank 3 speaks wire version {VERSION - 1} but this process speaks {VERSION}"):
            _accept_servers(listener, {3}, timedelta(seconds=5))
        server.close()


def test_a_server_that_never_connects_is_named_when_the_client_gives_up():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with pytest.raises(TimeoutError, match=r"ranks \[2\] did not connect"):
            _accept_servers(listener, {2}, timedelta(seconds=0.2))


def test_anaddress_record_round_trips_and_the_route_to_a_remote_host_is_not_loopback():
    assert parse_record(address_record("10.1.2.3", 29500)) == ("10.1.2.3", 29500)
    assert parse_record(address_record("fe80::1", 7)) == ("fe80::1", 7)
    with pytest.raises(ValueError, match="longer than"):
        address_record("h" * 200, 1)
    assert advertised_host("::1") == "::1"
    host = advertised_host("192.0.2.1")  # TEST-NET-1: no packet is sent, only the route is read
    assert host == "127.0.0.1" or not host.startswith("127.")
