"""scikit-learn's 8x8 handwritten digits (1797 images, no download) as a LightningDataModule."""

import torch
from sklearn.datasets import load_digits

from examples.common import ClassificationDataModule, PairDataset


class DigitsDataModule(ClassificationDataModule):
    """Batches ``(pixels [B, 64] float32, labels [B] int64)`` of the 1797 digits, 10 classes.

    A fixed split (a seeded permutation): ``test_size`` images for testing, ``val_size`` for
    validation, the rest for training. Pixels are standardized with the training images' mean
    and standard deviation (pixels constant over the training images are only centered).

    Example:
        >>> dm = DigitsDataModule(batch_size=32)
        >>> dm.setup("fit")
        >>> pixels, labels = next(iter(dm.train_dataloader()))
        >>> pixels.shape, len(dm.train_set), len(dm.val_set), len(dm.test_set)
        (torch.Size([32, 64]), 1197, 300, 300)
    """

    def __init__(
        self, batch_size: int = 64, num_workers: int = 0, val_size: int = 300, test_size: int = 300, seed: int = 0
    ) -> None:
        super().__init__(10, batch_size, num_workers)
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        digits = load_digits()
        pixels = torch.tensor(digits.data, dtype=torch.float32)
        labels = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.hparams.seed))
        test_end = self.hparams.test_size
        val_end = test_end + self.hparams.val_size
        test, val, train = order[:test_end], order[test_end:val_end], order[val_end:]
        mean, std = pixels[train].mean(dim=0), pixels[train].std(dim=0)
        pixels = (pixels - mean) / torch.where(std > 0, std, 1.0)
        self.train_set = PairDataset(pixels[train], labels[train])
        self.val_set = PairDataset(pixels[val], labels[val])
        self.test_set = PairDataset(pixels[test], labels[test])
