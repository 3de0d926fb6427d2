"""Docstrings of installed packages, tokenized for MiniLM, as a LightningDataModule."""

from pathlib import Path

import torch

from examples.common import ClassificationDataModule, PairDataset
from examples.docstrings.corpus import LABELS, collect, split_of
from examples.docstrings.pretrained import tokenizer


class DocstringsDataModule(ClassificationDataModule):
    """Batches ``((input_ids [B, T], attention_mask [B, T]) int64, labels [B])``, ``T = max_length``.

    Which package a docstring documents (``corpus.py``): ``per_class`` docstrings of each of
    ``labels``, split by a hash of the text into about 80% train, 10% val, 10% test. No
    download: the text is read from the installed sources, the tokenizer ships with the
    pretrained MiniLM package.

    Args:
        labels: the classes (names of ``corpus.LABELS``); all ten by default.
        per_class: docstrings per class (all ten classes have at least 1500).
        max_length: tokens per docstring, ``[CLS] ... [SEP]`` padded or truncated.
        cache_dir: where the parsed corpus is kept (parsing all sources takes ~40 s).

    Example:
        >>> dm = DocstringsDataModule(labels=("numpy", "networkx"), per_class=50, max_length=16)
        >>> dm.setup("fit")
        >>> (ids, mask), labels = next(iter(dm.train_dataloader()))
        >>> ids.shape, dm.num_classes
        (torch.Size([32, 16]), 2)
    """

    def __init__(
        self,
        labels: tuple[str, ...] = tuple(LABELS),
        per_class: int = 800,
        max_length: int = 64,
        min_chars: int = 60,
        batch_size: int = 32,
        num_workers: int = 0,
        cache_dir: str = "~/.cache/lightning-epipe",
    ) -> None:
        labels = tuple(labels)
        unknown = sorted(set(labels) - set(LABELS))
        if unknown:
            raise ValueError(f"unknown docstring classes {unknown}; known: {list(LABELS)}")
        if not 2 <= max_length <= 512:
            raise ValueError(f"max_length must be in 2..512 (MiniLM's positions), got {max_length}")
        super().__init__(len(labels), batch_size, num_workers)
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        hp = self.hparams
        examples = collect(tuple(hp.labels), hp.per_class, hp.min_chars, Path(hp.cache_dir))
        tok = tokenizer(hp.max_length)
        split = {"train": [], "val": [], "test": []}
        for example in examples:
            split[split_of(example.text)].append(example)
        for name, rows in split.items():
            encoded = tok.encode_batch([row.text for row in rows])
            ids = torch.tensor([e.ids for e in encoded], dtype=torch.long).reshape(len(rows), hp.max_length)
            mask = torch.tensor([e.attention_mask for e in encoded], dtype=torch.long).reshape(ids.shape)
            labels = torch.tensor([row.label for row in rows], dtype=torch.long)
            setattr(self, f"{name}_set", PairDataset((ids, mask), labels))
