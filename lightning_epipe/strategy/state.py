"""Move named tensors between ranks for checkpoints, without pickle.

A rank's share is a flat ``{name: Tensor}`` dict; it travels as one JSON description
(names, dtypes, shapes) and one concatenated uint8 payload. Optimizer and codec state are
nested dicts: :func:`flatten_state` and :func:`unflatten_state` turn them into flat ones.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_epipe.strategy.transport import Transport
from lightning_epipe.strategy.wire import Header, Kind, WireError

__all__ = ["gather_tensors", "flatten_state", "unflatten_state", "json_to_bytes", "bytes_to_json"]

_DTYPES = {str(d): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
)}


def json_to_bytes(value: Any) -> Tensor:
    return torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8)


def bytes_to_json(payload: Tensor) -> Any:
    return json.loads(bytes(payload.cpu().numpy()).decode())


def flatten_state(state: Any, prefix: str = "") -> dict[str, Tensor]:
    """``{"a": {"b": t}}`` -> ``{"a/b": t}``; Python numbers become 0-d tensors tagged by dtype."""
    out: dict[str, Tensor] = {}
    if isinstance(state, dict):
        for key, value in state.items():
            out.update(flatten_state(value, f"{prefix}{key}/"))
    elif isinstance(state, Tensor):
        out[prefix[:-1]] = state
    elif isinstance(state, bool):
        out[prefix[:-1] + "#bool"] = torch.tensor(state)
    elif isinstance(state, int):
        out[prefix[:-1] + "#int"] = torch.tensor(state, dtype=torch.int64)
    elif isinstance(state, float):
        out[prefix[:-1] + "#float"] = torch.tensor(state, dtype=torch.float64)
    elif state is not None:
        raise TypeError(f"cannot move state entry {prefix[:-1]!r} of type {type(state).__name__} between ranks")
    return out


def unflatten_state(flat: dict[str, Tensor], int_keys: bool = False) -> dict[str, Any]:
    """Inverse of :func:`flatten_state` (``int_keys`` turns digit keys back into ints)."""
    out: dict[Any, Any] = {}
    for name, value in flat.items():
        if "#" in name:
            name, tag = name.rsplit("#", 1)
            value = {"bool": bool, "int": int, "float": float}[tag](value.item())
        parts = name.split("/")
        node = out
        for part in parts[:-1]:
            key = int(part) if int_keys and part.isdigit() else part
            node = node.setdefault(key, {})
        last = parts[-1]
        node[int(last) if int_keys and last.isdigit() else last] = value
    return out


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
