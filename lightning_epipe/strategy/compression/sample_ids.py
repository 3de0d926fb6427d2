"""Which dataset samples each training batch holds, for delta compression.

Delta compression keys its per-sample caches by the index of each sample in the training
set. The client's ``DataLoader`` knows them: its batch sampler yields the index lists that
become the batches, in order (worker processes included: indices are drawn in the main
process). :class:`SampleIdRecorder` wraps the batch sampler and queues each list as it is
drawn; the pipelined forward pops one list per training batch. Lightning fetches a batch
ahead, so the queue holds one or two lists at a time; a new epoch's iterator clears it.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterator

import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

__all__ = ["SampleIdRecorder"]


class _RecordingBatchSampler:
    """Yields what ``inner`` yields and queues it on ``recorder``; other attributes are inner's."""

    def __init__(self, inner: Any, recorder: "SampleIdRecorder") -> None:
        self.inner = inner
        self.recorder = recorder

    def __iter__(self) -> Iterator[list[int]]:
        self.recorder.queue.clear()
        for indices in self.inner:
            self.recorder.queue.append(torch.as_tensor(list(indices), dtype=torch.int64))
            yield indices

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:  # batch_size, drop_last, sampler: Lightning reads them
        return getattr(self.inner, name)


class SampleIdRecorder:
    """The dataset indices of the client's training batches, in the order they are drawn.

    Example:
        >>> loader = DataLoader(list(range(10)), batch_size=4, shuffle=False)
        >>> recorder = SampleIdRecorder()
        >>> loader = recorder.wrap(loader)
        >>> batches = iter(loader); first = next(batches)
        >>> recorder.pop(len(first)).tolist(), recorder.num_samples
        ([0, 1, 2, 3], 10)
    """

    def __init__(self) -> None:
        self.queue: deque[Tensor] = deque()
        self.num_samples = 0

    def wrap(self, dataloader: Any) -> Any:
        """Record the indices ``dataloader`` draws (it is changed in place and returned)."""
        sampler = getattr(dataloader, "batch_sampler", None)
        if not isinstance(dataloader, DataLoader) or sampler is None or isinstance(dataloader.dataset, IterableDataset):
            raise ValueError(
                "delta compression keys its caches by each sample's index in the training set: the training data"
                f" must be a torch DataLoader over a map-style dataset with a batch size, got {type(dataloader).__name__}"
                f"{'' if sampler is not None else ' without a batch sampler'}; or turn delta_compression off"
            )
        if not isinstance(sampler, _RecordingBatchSampler):
            # DataLoader forbids setting batch_sampler after construction; the iterator reads it anew each epoch
            object.__setattr__(dataloader, "batch_sampler", _RecordingBatchSampler(sampler, self))
        self.num_samples = len(dataloader.dataset)  # type: ignore[arg-type]
        return dataloader

    def pop(self, rows: int) -> Tensor:
        """The ``[rows]`` indices of the batch the training step is running."""
        if not self.queue:
            raise RuntimeError(
                "delta compression found no recorded sample indices for this training batch: was the batch made by"
                " the training DataLoader the strategy saw (not modified or produced elsewhere)?"
            )
        ids = self.queue.popleft()
        if ids.numel() != rows:
            raise RuntimeError(
                f"the training batch has {rows} rows but its sampler drew {ids.numel()} indices: delta compression"
                " needs one row per sample (a collate_fn that adds or drops rows breaks this)"
            )
        return ids
