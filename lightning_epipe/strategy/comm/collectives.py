"""What every rank calls together: plain data and named tensors between ranks, never pickled.

- :func:`broadcast_json`: a JSON value from one rank to all (``torch.distributed.broadcast``);
  :func:`broadcast_plain` the same for JSON values and paths (Lightning's ``strategy.broadcast``).
- :func:`agree`: whether every (or any) rank decided yes.
- :func:`gather_tensors`: every rank's ``{name: Tensor}`` on rank 0, as one JSON description
  (names, dtypes, shapes) and one uint8 payload per rank, through the control stream.
- :func:`probe_bandwidth`: a ping-pong between two ranks (what ``balance="time"`` sizes cuts by).
- :func:`start_process_group`, :func:`set_collective_timeout`: the default group and its bound.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path, PurePath
from typing import Any, Optional

import torch
import torch.distributed as dist
from lightning.fabric.utilities.distributed import _init_dist_connection
from torch import Tensor

from lightning_epipe.strategy.engine.timing import synchronize
from lightning_epipe.strategy.comm.transport import Transport
from lightning_epipe.strategy.comm.wire import Header, Kind, WireError

__all__ = ["agree", "broadcast_json", "broadcast_plain", "gather_tensors", "probe_bandwidth", "json_to_bytes", "bytes_to_json", "set_collective_timeout",
           "start_process_group"]

RENDEZVOUS_TIMEOUT = timedelta(minutes=10)

_DTYPES = {str(d): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
)}


def start_process_group(cluster_environment: Any, backend: str, timeout: timedelta) -> None:
    """Join the default process group. Processes start at different speeds (imports, data
    set-up): the rendezvous gets at least the default 10 minutes; afterwards every collective
    is bounded by ``timeout``."""
    _init_dist_connection(cluster_environment, backend, timeout=max(timeout, RENDEZVOUS_TIMEOUT))
    if timeout < RENDEZVOUS_TIMEOUT:
        set_collective_timeout(timeout)


def set_collective_timeout(timeout: timedelta) -> None:
    """Bound every later collective of the default process group by ``timeout``."""
    if hasattr(dist, "set_timeout"):
        dist.set_timeout(timeout)
    else:  # torch < 2.6
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timeout)


def json_to_bytes(value: Any) -> Tensor:
    return torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8)


def bytes_to_json(payload: Tensor) -> Any:
    return json.loads(bytes(payload.cpu().numpy()).decode())


def broadcast_json(value: Any, device: torch.device, src: int = 0) -> Any:
    """Broadcast a JSON-serializable value from ``src`` to every rank (a collective)."""
    is_src = dist.get_rank() == src
    payload, error = None, None
    if is_src:
        try:
            payload = json_to_bytes(value).to(device)
        except (TypeError, ValueError) as err:
            error = err
    size = torch.tensor([-1 if error else (payload.numel() if is_src else 0)], dtype=torch.int64, device=device)
    dist.broadcast(size, src)
    if int(size.item()) < 0:
        what = f"{type(value).__name__} ({error})" if is_src else f"a value JSON cannot carry (rank {src} says which)"
        raise TypeError(
            f"EPipeStrategy broadcasts only plain data (JSON types and paths), never pickles: rank {src} tried to"
            f" broadcast {what}"
        )
    if not is_src:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src)
    return bytes_to_json(payload)


def broadcast_plain(obj: Any, device: torch.device, src: int = 0) -> Any:
    """``obj`` (JSON types or a path) from ``src`` to every rank (a collective); nothing is pickled."""
    payload = {"path": str(obj)} if isinstance(obj, PurePath) else {"value": obj}
    value = broadcast_json(payload if dist.get_rank() == src else None, device, src)
    return Path(value["path"]) if "path" in value else value["value"]


def agree(decision: bool, device: torch.device, every: bool = True) -> bool:
    """Whether every rank (``every``) or any rank decided ``True`` (a collective)."""
    flag = torch.tensor([int(decision)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.SUM)
    return bool(flag.item() == dist.get_world_size()) if every else bool(flag.item() > 0)


def gather_tensors(transport: Transport, world_size: int, local: dict[str, Tensor]) -> Optional[dict[str, Tensor]]:
    """Collect every rank's ``local`` tensors on rank 0 (a collective: every rank calls it)."""
    if transport.rank != 0:
        items = [(k, v.detach()) for k, v in local.items()]
        desc = [[k, str(v.dtype), list(v.shape)] for k, v in items]
        blob = [v.reshape(-1).contiguous().view(torch.uint8) if v.numel() else torch.empty(0, dtype=torch.uint8) for _, v in items]
        payload = torch.cat([b.cpu() for b in blob]) if blob else torch.empty(0, dtype=torch.uint8)  # through host memory
        meta = json_to_bytes(desc)
        transport.send(0, Header.state(0, 2), meta)
        transport.send(0, Header.state(1, 2), payload)
        transport.flush()
        return None
    merged = dict(local)
    for peer in range(1, world_size):
        what = f"checkpoint state of rank {peer}"
        desc = bytes_to_json(transport.recv(peer, what, kind=Kind.STATE, index=0).payload)
        blob = transport.recv(peer, what, kind=Kind.STATE, index=1).payload
        blob = blob if blob is not None else torch.empty(0, dtype=torch.uint8)
        offset = 0
        for name, dtype_name, shape in desc:
            dtype = _DTYPES.get(dtype_name)
            if dtype is None:
                raise WireError(f"{what}: unsupported dtype {dtype_name} for {name}")
            numel = 1
            for d in shape:
                numel *= d
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            chunk = blob[offset : offset + nbytes]
            offset += nbytes
            merged[name] = chunk.clone().view(dtype).reshape(shape) if numel else torch.empty(shape, dtype=dtype)
        if offset != blob.numel():
            raise WireError(f"{what}: {blob.numel()} bytes received but the description accounts for {offset}")
    return merged


_PROBE_ROUNDS = 3


def probe_bandwidth(src: int, dst: int, nbytes: int, rank: int, device: torch.device, rounds: int = _PROBE_ROUNDS) -> Optional[float]:
    """Bytes/s from ``src`` to ``dst`` for ``nbytes`` messages (best of ``rounds`` ping-pongs);
    ``None`` on ranks other than ``src``. Both ``src`` and ``dst`` must call it, others must not.
    On gloo the messages are in host memory whatever ``device`` is (gloo sends nothing else; the
    pipeline's frames between GPUs are staged there too)."""
    if dist.get_backend() == "gloo":
        device = torch.device("cpu")
    size = torch.tensor([nbytes], dtype=torch.int64, device=device)
    ack = torch.zeros(1, dtype=torch.uint8, device=device)
    if rank == src:
        dist.send(size, dst)
        payload = torch.zeros(max(1, nbytes), dtype=torch.uint8, device=device)
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            dist.send(payload, dst)
            dist.recv(ack, dst)
            synchronize(device)  # NCCL returns once the operations are queued
            best = min(best, time.perf_counter() - start)
        return max(1, nbytes) / max(best, 1e-9)
    dist.recv(size, src)
    payload = torch.empty(max(1, int(size.item())), dtype=torch.uint8, device=device)
    for _ in range(rounds):
        dist.recv(payload, src)
        dist.send(ack, src)
    return None
