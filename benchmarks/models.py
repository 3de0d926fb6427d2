"""The benchmark models: ``nn.Sequential`` stacks wrapped in a LightningModule.

Every model exposes its stack as ``layers`` (what EPipeStrategy pipelines, what DDP
replicates and what ``torch.distributed.pipelining`` splits) and trains on synthetic
regression data (MSE against a fixed random target), so no download is needed. ``mlp``
and ``transformer`` are stacks of equal blocks; ``mobilenet`` is the report's MobileNetV2
(``examples/mobilenet``: 19 feature blocks and the head, on CIFAR-sized images), whose
compute sits in its early blocks and its parameters in its late ones.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

import lightning as L

#: name -> (builder kwargs for quick mode, for --full)
MODELS = {
    "mlp": {"quick": dict(width=1024, depth=8), "full": dict(width=1024, depth=8)},
    "transformer": {"quick": dict(dim=128, seq=16, heads=4, depth=8), "full": dict(dim=256, seq=64, heads=8, depth=8)},
    "mobilenet": {"quick": dict(image=32, classes=10), "full": dict(image=64, classes=10)},
}


class Block(nn.Module):
    """A pre-norm transformer encoder block on ``[B, T, D]``: attention then a 4x MLP, residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def build_layers(name: str, full: bool = False,
                 **overrides: int) -> tuple[nn.Sequential, tuple[int, ...], tuple[int, ...]]:
    """The stack, the shape of one sample and the shape of its target (both without the batch
    dimension); ``overrides`` replace builder settings (e.g. ``width=512``)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}, expected one of {sorted(MODELS)}")
    cfg = {**MODELS[name]["full" if full else "quick"], **overrides}
    torch.manual_seed(0)
    if name == "mlp":
        blocks = []
        for _ in range(cfg["depth"]):
            blocks.append(nn.Sequential(nn.Linear(cfg["width"], cfg["width"]), nn.ReLU()))
        return nn.Sequential(*blocks), (cfg["width"],), (cfg["width"],)
    if name == "transformer":
        shape = (cfg["seq"], cfg["dim"])
        return nn.Sequential(*[Block(cfg["dim"], cfg["heads"]) for _ in range(cfg["depth"])]), shape, shape
    from examples.mobilenet.model import mobilenet_layers

    return mobilenet_layers(cfg["classes"]), (3, cfg["image"], cfg["image"]), (cfg["classes"],)


def make_data(shape: tuple[int, ...], samples: int, seed: int = 0,
              target_shape: tuple[int, ...] | None = None) -> TensorDataset:
    """``samples`` random inputs of ``shape`` and random targets of ``target_shape`` (default:
    ``shape``)."""
    g = torch.Generator().manual_seed(seed)
    target = shape if target_shape is None else target_shape
    return TensorDataset(torch.randn(samples, *shape, generator=g), 0.5 * torch.randn(samples, *target, generator=g))


class StackRegressor(L.LightningModule):
    """``layers`` trained with MSE and SGD; the same module for every strategy."""

    def __init__(self, layers: nn.Sequential, lr: float = 1e-3) -> None:
        super().__init__()
        self.layers = layers
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layers(x), y)

    def pipeline_loss(self, output, batch):
        """One micro-batch's loss, for EPipeStrategy(schedule="1f1b")."""
        return nn.functional.mse_loss(output, batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class RowBatches(Sampler):
    """Batch ``s`` is rows ``s * batch_size + rank * per_rank`` onward (``per_rank = batch_size /
    world``) taken as one slice: no per-sample indexing or collation, so the input path costs
    the same under every strategy (torch pipelining's loop slices its tensors the same way)."""

    def __init__(self, rows: int, batch_size: int, rank: int = 0, world: int = 1) -> None:
        self.steps, self.batch_size, self.per_rank, self.rank = rows // batch_size, batch_size, batch_size // world, rank

    def __iter__(self):
        for step in range(self.steps):
            start = step * self.batch_size + self.rank * self.per_rank
            yield slice(start, start + self.per_rank)

    def __len__(self) -> int:
        return self.steps


def loader(dataset: TensorDataset, batch_size: int, rank: int = 0, world: int = 1) -> DataLoader:
    """Global batches of ``batch_size`` rows in order; this rank's ``1 / world`` of each (DDP)."""
    return DataLoader(dataset, sampler=RowBatches(len(dataset), batch_size, rank, world), batch_size=None)
