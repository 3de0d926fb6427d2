"""SampleIdRecorder: the indices of the batches a DataLoader draws, in order, per epoch."""

from __future__ import annotations

import doctest

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from lightning_epipe.strategy.compression import sample_ids
from lightning_epipe.strategy.compression.sample_ids import SampleIdRecorder


def test_doctests():
    assert doctest.testmod(sample_ids, extraglobs={"DataLoader": DataLoader}).failed == 0


def data(n=20):
    return TensorDataset(torch.arange(n) * 10.0)


@pytest.mark.parametrize("workers", [0, 2])
def test_shuffled_batches_pop_their_own_indices(workers):
    recorder = SampleIdRecorder()
    loader = recorder.wrap(DataLoader(data(), batch_size=6, shuffle=True, num_workers=workers,
                                      generator=torch.Generator().manual_seed(0)))
    for epoch in range(2):                         # a new epoch's iterator starts a new queue
        seen = []
        for (values,) in loader:
            ids = recorder.pop(len(values))
            assert torch.equal(values, ids.float() * 10)
            seen += ids.tolist()
        assert sorted(seen) == list(range(20))
    assert recorder.num_samples == 20 and len(loader) == 4 and loader.batch_sampler.batch_size == 6


def test_an_abandoned_epoch_leaves_nothing_behind():
    recorder = SampleIdRecorder()
    loader = recorder.wrap(DataLoader(data(), batch_size=4))
    next(iter(loader))
    (values,) = next(iter(loader))
    assert recorder.pop(len(values)).tolist() == [0, 1, 2, 3] and not recorder.queue


def test_wrong_row_count_and_empty_queue():
    recorder = SampleIdRecorder()
    loader = recorder.wrap(DataLoader(data(), batch_size=4))
    next(iter(loader))
    with pytest.raises(RuntimeError, match="has 3 rows but its sampler drew 4 indices"):
        recorder.pop(3)
    with pytest.raises(RuntimeError, match="found no recorded sample indices"):
        recorder.pop(4)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(5))


@pytest.mark.parametrize("loader", [DataLoader(Stream(), batch_size=2), DataLoader(data(), batch_size=None), [1, 2]])
def test_loaders_without_sample_indices_are_refused(loader):
    with pytest.raises(ValueError, match="map-style dataset"):
        SampleIdRecorder().wrap(loader)
