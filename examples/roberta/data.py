"""GLUE RTE and CoLA tokenized for RoBERTa, or generated token ids of the same shape."""

from typing import Literal

import torch

from examples.common import ClassificationDataModule, PairDataset

# roberta-base's special token ids
BOS, PAD, EOS = 0, 1, 2
_TEXT_COLUMNS = {"rte": ("sentence1", "sentence2"), "cola": ("sentence",)}


def synthetic_glue(n: int, max_length: int, vocab_size: int, num_classes: int, seed: int) -> PairDataset:
    """``n`` random sentences ``<s> tokens </s> <pad>...`` of random lengths, with random labels.

    Returns ``((input_ids [n, max_length] int64, attention_mask [n, max_length] int64), labels [n])``.
    """
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, max_length + 1, (n,), generator=generator)
    attention_mask = (torch.arange(max_length) < lengths[:, None]).long()
    tokens = torch.randint(EOS + 1, vocab_size, (n, max_length), generator=generator)
    input_ids = torch.where(attention_mask.bool(), tokens, PAD)
    input_ids[:, 0] = BOS
    input_ids[torch.arange(n), lengths - 1] = EOS
    labels = torch.randint(num_classes, (n,), generator=generator)
    return PairDataset((input_ids, attention_mask), labels)


class GlueDataModule(ClassificationDataModule):
    """Batches ``((input_ids [B, T], attention_mask [B, T]), labels [B])`` with ``T = max_length``.

    The real path downloads the task with HF ``datasets`` (``nyu-mll/glue``) and the tokenizer
    of ``tokenizer``, pads every sentence (pair) to ``max_length`` and truncates longer ones;
    validation and test are both GLUE's validation split (the test labels are hidden).

    Args:
        task: ``rte`` (sentence pairs, entailment) or ``cola`` (single sentences, acceptability).
        synthetic: generate ``synthetic_size`` random sentences instead (seeded, no download,
            no tokenizer); token ids stay below ``vocab_size``.

    Example:
        >>> dm = GlueDataModule("cola", batch_size=4, num_workers=0, synthetic=True, synthetic_size=8)
        >>> dm.setup("fit")
        >>> (input_ids, attention_mask), labels = next(iter(dm.train_dataloader()))
        >>> input_ids.shape, attention_mask.dtype, labels.shape
        (torch.Size([4, 128]), torch.int64, torch.Size([4]))
    """

    def __init__(
        self,
        task: Literal["rte", "cola"] = "rte",
        tokenizer: str = "roberta-base",
        max_length: int = 128,
        batch_size: int = 32,
        num_workers: int = 2,
        synthetic: bool = False,
        synthetic_size: int = 64,
        vocab_size: int = 50265,
        seed: int = 0,
    ) -> None:
        if task not in _TEXT_COLUMNS:
            raise ValueError(f"unknown task {task!r}: choose one of {sorted(_TEXT_COLUMNS)}")
        super().__init__(2, batch_size, num_workers)
        self.save_hyperparameters()

    def prepare_data(self) -> None:
        if not self.hparams.synthetic:
            self._download()

    def setup(self, stage: str) -> None:
        hp = self.hparams
        if hp.synthetic:
            generate = (hp.synthetic_size, hp.max_length, hp.vocab_size, self.num_classes)
            self.train_set = synthetic_glue(*generate, seed=hp.seed)
            self.val_set = synthetic_glue(*generate, seed=hp.seed + 1)
        else:
            splits, tokenizer = self._download()
            self.train_set = self._encode(splits["train"], tokenizer)
            self.val_set = self._encode(splits["validation"], tokenizer)
        self.test_set = self.val_set

    def _download(self):
        """The task's splits and the tokenizer (downloaded once, then from the HF cache)."""
        from datasets import load_dataset
        from transformers import AutoTokenizer

        splits = load_dataset("nyu-mll/glue", self.hparams.task)
        return splits, AutoTokenizer.from_pretrained(self.hparams.tokenizer)

    def _encode(self, split, tokenizer) -> PairDataset:
        texts = [list(split[column]) for column in _TEXT_COLUMNS[self.hparams.task]]
        encoded = tokenizer(
            *texts, truncation=True, padding="max_length", max_length=self.hparams.max_length, return_tensors="pt"
        )
        labels = torch.tensor(list(split["label"]), dtype=torch.long)
        return PairDataset((encoded["input_ids"], encoded["attention_mask"].long()), labels)
