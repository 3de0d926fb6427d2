"""Split a batch into micro-batches and join stage outputs back (pure tensor code).

A batch is a Tensor, a tuple/list of Tensors or a dict of Tensors (HF-style batches with
``input_ids`` and ``attention_mask``); every tensor is split along dim 0. ``B`` rows in
``chunks`` micro-batches give ``min(chunks, B)`` micro-batches whose sizes differ by at
most one, so the last, smaller batch of an epoch runs as fewer micro-batches.
"""

from __future__ import annotations

from typing import Any, Union

import torch
from torch import Tensor

__all__ = ["Batch", "tensors_of", "batch_size", "scatter", "join", "gather", "flatten", "unflatten", "input_groups"]

Batch = Union[Tensor, tuple, list, dict]


def tensors_of(batch: Batch) -> list[Tensor]:
    """A batch's tensors in order (a dict's in key order); raises on anything else."""
    if isinstance(batch, Tensor):
        return [batch]
    if isinstance(batch, dict):
        values = list(batch.values())
    elif isinstance(batch, (tuple, list)):
        values = list(batch)
    else:
        raise TypeError(f"a pipeline input must be a Tensor, tuple, list or dict of Tensors, got {type(batch).__name__}")
    for v in values:
        if not isinstance(v, Tensor):
            raise TypeError(
                f"every element of a pipeline input must be a Tensor, got {type(v).__name__}:"
                " move non-tensor arguments into the layers' constructor"
            )
    return values


def batch_size(batch: Batch) -> int:
    """Rows along dim 0 shared by every tensor of ``batch``."""
    sizes = {t.shape[0] if t.dim() else None for t in tensors_of(batch)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(f"all tensors of a pipeline input must share dim 0 to be split into micro-batches, got {sizes}")
    return sizes.pop()


def scatter(batch: Batch, chunks: int) -> list[Batch]:
    """Split ``batch`` ([B, ...] tensors) into ``min(chunks, B)`` micro-batches."""
    n = min(chunks, batch_size(batch))
    if n == 0:
        raise ValueError("cannot pipeline an empty batch")
    if isinstance(batch, Tensor):
        return list(torch.tensor_split(batch, n))
    if isinstance(batch, dict):
        parts = {k: torch.tensor_split(v, n) for k, v in batch.items()}
        return [{k: parts[k][i] for k in batch} for i in range(n)]
    parts = [torch.tensor_split(v, n) for v in batch]
    return [type(batch)(p[i] for p in parts) for i in range(n)]


def join(microbatches: list[Batch]) -> Batch:
    """The batch ``scatter`` split (tensors concatenated along dim 0, a copy)."""
    first = microbatches[0]
    if isinstance(first, Tensor):
        return torch.cat(microbatches)
    if isinstance(first, dict):
        return {k: torch.cat([mb[k] for mb in microbatches]) for k in first}
    return type(first)(torch.cat([mb[i] for mb in microbatches]) for i in range(len(first)))


def input_groups(sizes: list[int], limit: int) -> list[range]:
    """Which micro-batches cross together, as one message per tensor, where ``sizes`` are their
    bytes: all of them when they add up to at most ``limit``; else micro-batch 0 alone (the
    receiver starts on it), then groups of 1, 2, 4, ... micro-batches (each group's transfer
    overlaps the compute of as many micro-batches before it), none over ``limit`` bytes unless
    one micro-batch alone is. The receiver splits a group with :func:`scatter`, which gives
    back the micro-batches it was joined from (their sizes differ by at most one row, the larger
    first).

        >>> input_groups([64] * 8, 512)
        [range(0, 8)]
        >>> input_groups([64] * 8, 256)
        [range(0, 1), range(1, 2), range(2, 4), range(4, 8)]
        >>> input_groups([128] * 8, 256)
        [range(0, 1), range(1, 2), range(2, 4), range(4, 6), range(6, 8)]
        >>> input_groups([512] * 3, 256)
        [range(0, 1), range(1, 2), range(2, 3)]
    """
    if sum(sizes) <= limit:
        return [range(len(sizes))]
    groups: list[range] = []
    start = 0
    while start < len(sizes):
        want = 2 ** (len(groups) - 1) if groups else 1
        end, nbytes = start + 1, sizes[start]
        while end < len(sizes) and end - start < want and nbytes + sizes[end] <= limit:
            nbytes += sizes[end]
            end += 1
        groups.append(range(start, end))
        start = end
    return groups


def gather(outputs: list[Any]) -> Any:
    """Concatenate micro-batch outputs (Tensors or tuples of Tensors) along dim 0: :func:`join`."""
    return join(outputs)


def flatten(value: Any) -> tuple[list[Tensor], bool]:
    """A stage output as a list of tensors, and whether it was a bare Tensor."""
    if isinstance(value, Tensor):
        return [value], True
    if isinstance(value, (tuple, list)) and all(isinstance(v, Tensor) for v in value):
        return list(value), False
    raise TypeError(
        f"a pipeline stage must return a Tensor or a tuple of Tensors to cross a cut, got {type(value).__name__}"
        + ("" if not isinstance(value, (tuple, list)) else f" of {[type(v).__name__ for v in value]}")
    )


def unflatten(tensors: list[Tensor], bare: bool) -> Any:
    """Inverse of :func:`flatten`."""
    return tensors[0] if bare else tuple(tensors)
