"""Cache-sized blocks for chains of element-wise ops on CPU.

Eager torch gives every op a fresh output; a fresh multi-megabyte buffer costs page faults
on every call and a chain of ops streams the whole tensor through memory once per op.
Running the chain over chunks of ``CHUNK`` elements keeps the temporaries in cache and
lets the allocator recycle them (uniform 8-bit quantization of a 12.8M-element tensor on
2 cores: ~45 ms whole, ~14 ms chunked). Other devices get one chunk: one launch per op.
"""

from __future__ import annotations

import torch

__all__ = ["CHUNK", "cache_blocks"]

#: Elements per chunk on CPU; a multiple of 8, so a chunk of packed codes starts on a byte.
CHUNK = 1 << 18


def cache_blocks(n: int, device: torch.device) -> list[tuple[int, int]]:
    """[start, stop) ranges covering ``range(n)``: cache-sized on CPU, one range elsewhere."""
    step = CHUNK if device.type == "cpu" else max(n, 1)
    return [(start, min(start + step, n)) for start in range(0, n, step)]
