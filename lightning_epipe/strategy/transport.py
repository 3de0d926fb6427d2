"""Point-to-point messages between pipeline ranks on ``torch.distributed`` (gloo or NCCL).

Every message is a fixed-length int64 :class:`~.wire.Header`, then, if the header says so,
one uint8 payload. Sends are asynchronous (``isend``) and kept alive until :meth:`flush`;
every receive waits at most ``timeout`` and turns a dead or stalled peer into a
:class:`PeerError` that names the peer and what was awaited. Links are FIFO: both ends post
their messages in the order the schedule dictates, so no tags are needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_epipe.strategy.stats import PipelineStats
from lightning_epipe.strategy.wire import HEADER_LEN, Header, Kind, WireError, checksum

__all__ = ["PeerError", "Transport", "Received"]


class PeerError(RuntimeError):
    """A peer died, stalled past the timeout, or broke the protocol."""


@dataclass
class Received:
    header: Header
    payload: Optional[Tensor]
    transfer_seconds: float  # header arrival -> payload arrival
    nbytes: int  # header + payload bytes


class Transport:
    """Send and receive headers and payloads to and from peers.

    Ranks are counted from ``offset``: a pipeline replica whose ranks are global ranks
    ``offset .. offset + size - 1`` talks in its own ranks ``0 .. size - 1``; messages and
    errors name global ranks.
    """

    def __init__(
        self,
        rank: int,
        device: torch.device,
        timeout: timedelta,
        verify_checksum: bool = True,
        stats: Optional[PipelineStats] = None,
        offset: int = 0,
    ) -> None:
        self.rank = rank
        self.offset = offset
        self.device = device
        self.timeout = timeout
        self.verify_checksum = verify_checksum
        self.stats = stats if stats is not None else PipelineStats()  # receives the blocked time
        self._pending: list[tuple[dist.Work, tuple[Tensor, ...], int, str]] = []

    def link(self, peer: int, outgoing: bool) -> str:
        me, other = self.offset + self.rank, self.offset + peer
        return f"link rank {me} -> rank {other}" if outgoing else f"link rank {other} -> rank {me}"

    def send(self, peer: int, header: Header, payload: Optional[Tensor] = None) -> int:
        """Post ``header`` (and ``payload``) to ``peer``; returns the bytes put on the wire."""
        if payload is not None:
            if payload.dtype != torch.uint8 or payload.dim() != 1:
                raise TypeError(f"payload must be a 1-D uint8 tensor, got {payload.dtype} {tuple(payload.shape)}")
            payload = payload.to(self.device).contiguous()
        header_t = header.to_tensor(self.device)
        what = f"{Kind(header.kind).name.lower()} of step {header.step}, micro-batch {header.microbatch}"
        self._post(dist.isend(header_t, dst=self.offset + peer), (header_t,), peer, what)
        nbytes = HEADER_LEN * 8
        if payload is not None and payload.numel():
            self._post(dist.isend(payload, dst=self.offset + peer), (payload,), peer, what)
            nbytes += payload.numel()
        return nbytes

    def _post(self, work: dist.Work, keep: tuple[Tensor, ...], peer: int, what: str) -> None:
        self._pending.append((work, keep, peer, what))

    def recv(self, peer: int, what: str, idle: bool = False, **expect: int) -> Received:
        """Receive the next message from ``peer``; its header must match ``expect``.

        ``idle``: waiting for it is time between steps, not pipeline wait (not counted)."""
        link = self.link(peer, outgoing=False)
        header_t = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.device)
        self._wait(dist.irecv(header_t, src=self.offset + peer), peer, what, blocking=not idle)
        arrived = time.perf_counter()
        header = Header.from_tensor(header_t.cpu(), link)
        header.expect(link, **expect)
        payload = None
        if header.payload_nbytes:
            payload = torch.empty(header.payload_nbytes, dtype=torch.uint8, device=self.device)
            self._wait(dist.irecv(payload, src=self.offset + peer), peer, what, blocking=True)
            if self.verify_checksum and header.crc and checksum(payload) != header.crc:
                raise WireError(f"{link}: {what}: payload checksum mismatch ({header.payload_nbytes} bytes corrupted in transit)")
        seconds = time.perf_counter() - arrived
        return Received(header, payload, seconds, HEADER_LEN * 8 + header.payload_nbytes)

    def flush(self) -> None:
        """Wait until every posted send has left (bounded by the timeout)."""
        pending, self._pending = self._pending, []
        for work, _keep, peer, what in pending:
            self._wait(work, peer, f"send of {what}", blocking=False)

    def _wait(self, work: dist.Work, peer: int, what: str, blocking: bool) -> None:
        start = time.perf_counter()
        peer, me = self.offset + peer, self.offset + self.rank  # errors name global ranks
        try:
            work.wait(self.timeout)
        except RuntimeError as err:
            self._pending.clear()
            text = str(err)
            if "closed by peer" in text or "Connection reset" in text or "Broken pipe" in text:
                cause = f"rank {peer} closed the connection (it died or exited)"
            elif "Timed out" in text or "timed out" in text.lower():
                cause = f"rank {peer} sent nothing for {self.timeout} (it stalled or died); raise EPipeStrategy(timeout=...) if its work is this slow"
            else:
                cause = f"the link to rank {peer} failed"
            raise PeerError(f"rank {me}: {cause} while waiting for {what}. ({text.splitlines()[0][:200]})") from err
        finally:
            if blocking:
                self.stats.wait_seconds += time.perf_counter() - start
