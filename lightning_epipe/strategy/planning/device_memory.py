"""How much memory a process may use: what delta caches and ``balance="time"`` are sized by."""

from __future__ import annotations

import os

import torch

__all__ = ["memory_capacity", "default_cache_limit"]


def memory_capacity(device: torch.device, local_processes: int) -> float:
    """Bytes this process may use: the accelerator's memory, or its share of the machine's RAM."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[1])
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return float("inf")
    return float(total) / max(1, local_processes)


def default_cache_limit(device: torch.device, local_processes: int) -> int:
    """A delta cache's default bound: a quarter of what this process may use (4 GiB if unknown)."""
    limit = memory_capacity(device, local_processes) / 4
    return int(limit) if limit != float("inf") else 4 << 30
