"""Data pieces the examples share: an in-memory pair dataset and a train/val/test data module."""

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

Inputs = torch.Tensor | tuple[torch.Tensor, ...]


class PairDataset(Dataset):
    """Item ``i`` is ``(inputs[i], labels[i])``; ``inputs`` may be a tuple of tensors.

    ``inputs`` is a Tensor ``[N, ...]`` or a tuple of Tensors ``[N, ...]``, ``labels`` int64 ``[N]``.
    The default collate turns items into ``(inputs [B, ...] or a tuple of [B, ...], labels [B])``.

    Example:
        >>> ds = PairDataset((torch.zeros(5, 3), torch.ones(5, 3)), torch.arange(5))
        >>> len(ds), ds[2][1]
        (5, tensor(2))
    """

    def __init__(self, inputs: Inputs, labels: torch.Tensor) -> None:
        columns = inputs if isinstance(inputs, tuple) else (inputs,)
        if any(len(column) != len(labels) for column in columns):
            sizes = [len(column) for column in columns]
            raise ValueError(f"inputs and labels differ in length (inputs: {sizes}, labels: {len(labels)})")
        self.inputs = inputs
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Inputs, torch.Tensor]:
        if isinstance(self.inputs, tuple):
            return tuple(column[index] for column in self.inputs), self.labels[index]
        return self.inputs[index], self.labels[index]


class ClassificationDataModule(L.LightningDataModule):
    """Serves ``train_set``, ``val_set`` and ``test_set`` in batches of ``(inputs, labels)``.

    A subclass fills the three sets in ``setup``. Training batches are shuffled and the last
    incomplete one is dropped (every training batch has ``batch_size`` samples, so it splits
    into the same micro-batches); evaluation keeps every sample.

    Args:
        num_classes: how many classes the labels count (the CLI hands it to the model).
        batch_size: samples per batch, the whole batch the pipeline splits into micro-batches.
        num_workers: DataLoader worker processes.
    """

    def __init__(self, num_classes: int, batch_size: int, num_workers: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)

    def _loader(self, dataset: Dataset | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() has not run: no data set to load yet")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=train,
            drop_last=train,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )
