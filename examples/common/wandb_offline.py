"""Read an offline W&B run back from its ``run-<id>.wandb`` file: no account, no network.

The file is a LevelDB-style log (after a 7-byte ``:W&B`` header, 32 KiB blocks of records,
each ``crc32c: u32, length: u16, type: u8`` then its bytes; a record split over blocks comes
as FIRST, MIDDLE..., LAST pieces) of ``wandb_internal_pb2.Record`` messages. Checksums are
not verified: the file is the one this machine just wrote.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

__all__ = ["run_file", "records", "history", "config", "metric_axes"]

_HEADER = 7
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def run_file(run_dir: str | Path) -> Path:
    """The ``.wandb`` file of a run directory (e.g. ``runs/wandb/offline-run-<time>-<id>``)."""
    found = sorted(Path(run_dir).glob("run-*.wandb"))
    if not found:
        raise FileNotFoundError(f"no run-*.wandb file in {run_dir}: pass an offline-run-* directory of a W&B run")
    return found[0]


def _payloads(data: bytes) -> Iterator[bytes]:
    if data[:4] != b":W&B":
        raise ValueError(f"not a W&B run file (starts with {data[:4]!r}, expected b':W&B')")
    pos, pieces = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a record header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0:  # zero padding up to the end of the block
            pos += left
            continue
        body = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            yield body
        elif kind == _FIRST:
            pieces = body
        elif kind == _MIDDLE:
            pieces += body
        elif kind == _LAST:
            yield pieces + body


def records(run_dir: str | Path) -> Iterator[Any]:
    """Every ``Record`` of the run, in the order it was written."""
    from wandb.proto import wandb_internal_pb2

    for payload in _payloads(run_file(run_dir).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def _items(items: Any) -> dict[str, Any]:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows ``run.log`` wrote (``_step``, ``_runtime`` and ``_timestamp`` included)."""
    return [_items(r.history.item) for r in records(run_dir) if r.WhichOneof("record_type") == "history"]


def config(run_dir: str | Path) -> dict[str, Any]:
    """The run config as last updated (``wandb.init(config=...)`` and ``run.config.update``)."""
    out: dict[str, Any] = {}
    for r in records(run_dir):
        kind = r.WhichOneof("record_type")
        update = r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
        out.update(_items(update))
    return out


def metric_axes(run_dir: str | Path) -> dict[str, str]:
    """``define_metric``'s step metric per name or glob, e.g. ``{"epipe/*": "trainer/global_step"}``."""
    out = {}
    for r in records(run_dir):
        if r.WhichOneof("record_type") == "metric" and r.metric.step_metric:
            out[r.metric.name or r.metric.glob_name] = r.metric.step_metric
    return out
