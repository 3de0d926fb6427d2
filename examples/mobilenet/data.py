"""CIFAR10, CIFAR100 and Food101 the way the report fed them to MobileNetV2, or generated images."""

from dataclasses import dataclass
from typing import Literal

import torch
from torch.utils.data import Dataset
from torchvision import datasets, transforms

from examples.common import ClassificationDataModule, PairDataset

DatasetName = Literal["cifar10", "cifar100", "food101"]


@dataclass(frozen=True, slots=True)
class _Spec:
    num_classes: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


_SPECS: dict[str, _Spec] = {
    "cifar10": _Spec(10, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": _Spec(100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "food101": _Spec(101, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}


class ImageDataModule(ClassificationDataModule):
    """Images ``[B, 3, image_size, image_size]`` (float32, normalized) and labels ``[B]``.

    The report's pipeline: training images go through ``RandomResizedCrop(image_size)`` and a
    horizontal flip, evaluation images through ``Resize(image_size * 8 // 7)`` and
    ``CenterCrop(image_size)``; CIFAR's 32x32 images are thus upscaled to 224x224, which is
    what makes the first cut's activation ``[B, 32, 112, 112]``. Validation and test both use
    the official test split.

    Args:
        dataset: ``cifar10``, ``cifar100`` or ``food101`` (torchvision downloads it into ``data_dir``).
        synthetic: generate ``synthetic_size`` random images and labels (seeded, no download)
            instead of loading ``dataset``; the class count stays the data set's.

    Example:
        >>> dm = ImageDataModule("cifar100", batch_size=4, num_workers=0, image_size=32,
        ...                      synthetic=True, synthetic_size=8)
        >>> dm.setup("fit")
        >>> images, labels = next(iter(dm.train_dataloader()))
        >>> images.shape, dm.num_classes
        (torch.Size([4, 3, 32, 32]), 100)
    """

    def __init__(
        self,
        dataset: DatasetName = "cifar10",
        data_dir: str = "data",
        batch_size: int = 256,
        num_workers: int = 2,
        image_size: int = 224,
        synthetic: bool = False,
        synthetic_size: int = 64,
        seed: int = 0,
    ) -> None:
        if dataset not in _SPECS:
            raise ValueError(f"unknown dataset {dataset!r}: choose one of {sorted(_SPECS)}")
        super().__init__(_SPECS[dataset].num_classes, batch_size, num_workers)
        self.save_hyperparameters()

    def prepare_data(self) -> None:
        if not self.hparams.synthetic:
            for train in (True, False):
                self._load(train, transform=None, download=True)

    def setup(self, stage: str) -> None:
        if self.hparams.synthetic:
            self.train_set = self._generate(self.hparams.seed)
            self.val_set = self._generate(self.hparams.seed + 1)
        else:
            self.train_set = self._load(True, self._transform(train=True), download=False)
            self.val_set = self._load(False, self._transform(train=False), download=False)
        self.test_set = self.val_set

    def _transform(self, train: bool) -> transforms.Compose:
        size = self.hparams.image_size
        spec = _SPECS[self.hparams.dataset]
        if train:
            resize = [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()]
        else:
            resize = [transforms.Resize(size * 8 // 7), transforms.CenterCrop(size)]
        return transforms.Compose([*resize, transforms.ToTensor(), transforms.Normalize(spec.mean, spec.std)])

    def _load(self, train: bool, transform: transforms.Compose | None, download: bool) -> Dataset:
        root, name = self.hparams.data_dir, self.hparams.dataset
        if name == "food101":
            split = "train" if train else "test"
            return datasets.Food101(root, split=split, transform=transform, download=download)
        cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
        return cls(root, train=train, transform=transform, download=download)

    def _generate(self, seed: int) -> PairDataset:
        generator = torch.Generator().manual_seed(seed)
        n, size = self.hparams.synthetic_size, self.hparams.image_size
        images = torch.randn(n, 3, size, size, generator=generator)
        labels = torch.randint(self.num_classes, (n,), generator=generator)
        return PairDataset(images, labels)
