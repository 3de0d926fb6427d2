"""Frame sizes on the in-memory fabric (which, like NCCL and gloo, fails a receive of another
size than its send): payloads whose size varies by a few bytes from message to message (sort
quantization's exact levels) travel in padded frames of one size, without a size notice each;
a smaller payload travels padded once (an epoch's last batch) and gets a frame of its own size
when it stays smaller; every payload arrives intact."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch

from lightning_epipe.strategy.comm.memory_backend import MemoryFabric
from lightning_epipe.strategy.comm import memory_backend, transport
from lightning_epipe.strategy.comm.transport import Transport, frame_capacity
from lightning_epipe.strategy.comm.wire import HEADER_NBYTES, Command, Header, Kind
from tests.helpers import run_two_gloo_ranks


def _exchange(sizes: list[int]) -> tuple[list[int], list[int]]:
    """Send one payload of each size in turn on one message key; returns the frame sizes rank 0
    posted (notices included) and the wire bytes ``send`` reported per message."""
    fabric = MemoryFabric(2, rule="nccl")
    ends = [Transport(r, torch.device("cpu"), timedelta(seconds=5), backend=fabric.backend(r)) for r in (0, 1)]
    reported = []
    for step, size in enumerate(sizes, start=1):
        payload = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(step))
        reported.append(ends[0].send(1, Header.data(Kind.ACTIVATION, step, 0, 1, 0, 1), payload))
        got = ends[1].recv(0, "test", kind=Kind.ACTIVATION, step=step, microbatch=0)
        assert got.header.payload_nbytes == size and torch.equal(got.payload, payload)
        assert got.nbytes == reported[-1]  # both ends count the same wire bytes
        ends[0].flush()
    return [n for rank, op, _peer, _group, n in fabric.log if rank == 0 and op == "send"], reported


def test_sizes_that_vary_by_a_few_bytes_share_one_padded_frame():
    sizes = [32836, 32856, 32846, 32836, 32856, 32846]
    frames, reported = _exchange(sizes)
    grown = HEADER_NBYTES + 32856 + -(-32856 // 64)  # the second payload outgrew the first: 1/64 of headroom
    # step 1: a bare notice, then the exact frame; step 2: a notice of that size, then the grown frame; then one frame each
    assert frames == [HEADER_NBYTES, HEADER_NBYTES + 32836, HEADER_NBYTES + 32836, grown, *[grown] * 4]
    assert reported == [HEADER_NBYTES * 2 + 32836, HEADER_NBYTES + 32836 + grown, *[grown] * 4]


def test_a_payload_that_shrinks_for_good_gets_a_frame_of_its_size():
    frames, _ = _exchange([4000, 4000, 2000, 2000, 2000, 3900])
    assert frames == [HEADER_NBYTES, HEADER_NBYTES + 4000, HEADER_NBYTES + 4000,  # steps 1-2
                      HEADER_NBYTES + 4000,  # smaller once: padded
                      HEADER_NBYTES + 4000, HEADER_NBYTES + 2000, HEADER_NBYTES + 2000,  # smaller again: resized
                      HEADER_NBYTES + 2000, HEADER_NBYTES + 3900]  # much larger again: exact, no headroom


def test_a_smaller_last_batch_travels_padded():
    frames, _ = _exchange([4000, 4000, 2000, 4000, 4000])
    assert frames == [HEADER_NBYTES, *[HEADER_NBYTES + 4000] * 5]  # one notice, on the first step only


@pytest.mark.parametrize(("payload", "capacity", "short_before", "frame"), [
    (0, 0, False, 0), (100, 0, False, 100), (100, 100, False, 100), (75, 100, True, 100), (74, 100, False, 100),
    (74, 100, True, 74), (101, 100, False, 101 + 2), (112, 100, True, 112 + 2), (113, 100, False, 113),
    (50, 200, True, 50),
])
def test_frame_capacity(payload, capacity, short_before, frame):
    assert frame_capacity(payload, capacity, short_before) == frame


def test_a_prefix_leads_the_payload_in_one_frame_under_one_checksum():
    fabric = MemoryFabric(2, rule="nccl")
    ends = [Transport(r, torch.device("cpu"), timedelta(seconds=5), backend=fabric.backend(r)) for r in (0, 1)]
    prefix, payload = bytes(range(24)), torch.arange(200, dtype=torch.uint8)
    for step in (1, 2):  # a notice then the frame; then the frame alone
        sent = ends[0].send(1, Header.data(Kind.ACTIVATION, step, 0, 1, 0, 1), payload, prefix=prefix)
        got = ends[1].recv(0, "test", kind=Kind.ACTIVATION, step=step, microbatch=0)
        assert got.header.payload_nbytes == 224 and got.nbytes == sent
        assert bytes(got.payload[:24].tolist()) == prefix and torch.equal(got.payload[24:], payload)
        ends[0].flush()
    frames = [n for rank, op, _peer, _group, n in fabric.log if rank == 0 and op == "send"]
    assert frames == [HEADER_NBYTES, HEADER_NBYTES + 224, HEADER_NBYTES + 224]


@pytest.mark.parametrize("sign", ["is-completed", "wait-time"])
def test_the_receiver_counts_which_frames_had_landed_before_it_came_to_them(sign, monkeypatch):
    """What auto tells a slow link from a busy receiver by: a frame sent before its receiver got
    to it counts as in time; one the receiver had to wait for does not; commands are not counted.
    Either sign suffices: a work complete before the wait (NCCL, this fabric; the wait-time sign
    switched off), or a host wait that returned at once (gloo, whose works report completion only
    once waited on: the fabric made to say the same)."""
    if sign == "is-completed":
        monkeypatch.setattr(transport, "ARRIVED_S", 0.0)
    else:
        monkeypatch.setattr(memory_backend._Op, "is_completed", lambda self: False)
    fabric = MemoryFabric(2, rule="gloo")
    ends = [Transport(r, torch.device("cpu"), timedelta(seconds=5), backend=fabric.backend(r)) for r in (0, 1)]
    payload = torch.zeros(64, dtype=torch.uint8)

    def send(mb: int) -> None:
        ends[0].send(1, Header.data(Kind.ACTIVATION, 1, mb, 2, 0, 1), payload)

    send(0)  # sent before the receiver looks: in time
    ends[1].recv(0, "mb 0", kind=Kind.ACTIVATION, step=1, microbatch=0)
    late = threading.Timer(0.05, send, args=(1,))  # sent while the receiver waits for it: late
    late.start()
    ends[1].recv(0, "mb 1", kind=Kind.ACTIVATION, step=1, microbatch=1)
    late.join()
    ends[0].send(1, Header.command(Command.FINISH_STEP, 1), None)
    ends[1].recv(0, "command", kind=Kind.CONTROL)
    assert {key: (a.ready, a.total) for key, a in ends[1].arrivals.items()} == {("activation", 0): (1, 2)}
    assert ends[0].arrivals == {}


def test_restarted_frames_announce_a_new_codecs_size_with_a_bare_header():
    """compressor="auto" switching a link's codec between steps: both ends forget the stream's
    frame sizes, so the first smaller payload costs a header-sized notice, not a frame padded to
    the old size and then a notice of that size."""
    fabric = MemoryFabric(2, rule="nccl")
    ends = [Transport(r, torch.device("cpu"), timedelta(seconds=5), backend=fabric.backend(r)) for r in (0, 1)]

    def exchange(step: int, size: int) -> None:
        payload = torch.full((size,), step, dtype=torch.uint8)
        ends[0].send(1, Header.data(Kind.ACTIVATION, step, 0, 1, 0, 1), payload)
        got = ends[1].recv(0, "test", kind=Kind.ACTIVATION, step=step, microbatch=0)
        assert torch.equal(got.payload, payload)
        ends[0].flush()

    exchange(1, 4000)
    exchange(2, 4000)
    for end in ends:
        end.restart_frames("activation", 0, 1)
    exchange(3, 1000)
    exchange(4, 1000)
    frames = [n for rank, op, _peer, _group, n in fabric.log if rank == 0 and op == "send"]
    assert frames == [HEADER_NBYTES, HEADER_NBYTES + 4000, HEADER_NBYTES + 4000,
                      HEADER_NBYTES, HEADER_NBYTES + 1000, HEADER_NBYTES + 1000]
    ends[1].prepost(0, Kind.ACTIVATION)
    with pytest.raises(RuntimeError, match="the activation stream has a receive posted"):
        ends[1].restart_frames("activation", 0, 1)


# Step 1: every frame new (a notice each); step 2: micro-batch 2's payload grew (a notice, then its
# frame), the others fill the frames both ends remember.
PHASE_SIZES = {1: [1000, 1000, 1000, 1000], 2: [1000, 1000, 5000, 1000]}


def _payload(step: int, mb: int) -> torch.Tensor:
    n = PHASE_SIZES[step][mb]
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(10 * step + mb))


def _post_phase(end: Transport) -> None:
    """The receiver posts a phase's 4 receives at once."""
    for mb in range(4):
        end.prepost(0, Kind.ACTIVATION, mb, behind=True)


def _send_phase(end: Transport, step: int) -> None:
    for mb in range(4):
        end.send(1, Header.data(Kind.ACTIVATION, step, mb, 4, 0, 1), _payload(step, mb))


def _read_phase(end: Transport, step: int) -> list[bool]:
    """Whether each of the phase's payloads arrived intact."""
    intact = []
    for mb in range(4):
        got = end.recv(0, f"mb {mb}", kind=Kind.ACTIVATION, step=step, microbatch=mb)
        intact.append(got.header.payload_nbytes == PHASE_SIZES[step][mb] and torch.equal(got.payload, _payload(step, mb)))
    return intact


@pytest.mark.parametrize(("rule", "posted_at_once"), [("gloo", 4), ("nccl", 1)])
def test_a_phase_of_receives_posted_at_once_survives_a_frame_that_grew(rule, posted_at_once):
    """Where tags are FIFOs of their own (gloo), a receiver posts a whole phase's receives before
    the first message arrives, and a frame announced by a size notice travels on its own tag, so
    it cannot land in a receive posted for a later micro-batch; under NCCL's rule (one FIFO
    whatever the tag) a stream keeps one receive posted, and the frame follows its notice."""
    fabric = MemoryFabric(2, rule=rule)
    ends = [Transport(r, torch.device("cpu"), timedelta(seconds=5), backend=fabric.backend(r)) for r in (0, 1)]
    for step in (1, 2):
        start = len(fabric.log)
        _post_phase(ends[1])
        _send_phase(ends[0], step)
        assert _read_phase(ends[1], step) == [True] * 4
        ends[0].flush()
        ops = [(rank, op) for rank, op, *_ in fabric.log[start:]]
        assert ops[:ops.index((0, "send"))].count((1, "recv")) == posted_at_once
    resized = [group for rank, op, _peer, group, _n in fabric.log if rank == 0 and op == "send" and "tag" in str(group)]
    assert len(resized) == (5 if rule == "gloo" else 0)  # step 1's four frames and step 2's grown one


def _gloo_phases(rank: int) -> list[bool]:
    import torch.distributed as dist

    group = dist.new_group([0, 1], backend="gloo")
    end = Transport(rank, torch.device("cpu"), timedelta(seconds=20), groups={("activation", 0, 1): group})
    intact = []
    for step in (1, 2):
        if rank == 1:
            _post_phase(end)
            intact += _read_phase(end, step)
        else:
            _send_phase(end, step)
            end.flush()
    return intact


def test_gloo_keeps_a_resized_frame_apart_from_the_receives_posted_ahead():
    """The same on real gloo between two processes: its tags are FIFOs of their own."""
    results = run_two_gloo_ranks(_gloo_phases)
    assert results[1] == [True] * 8 and results[0] == []
