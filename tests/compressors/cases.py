"""Codec settings, dtypes and shapes the compressor tests sweep, and small helpers."""

import torch

from lightning_epipe.compressors import Compressor, get_compressor

#: (name, kwargs) covering every codec and its modes.
CODECS = [
    ("none", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("quantize", {"bits": 2}),
    ("quantize", {"bits": 8}),
    ("quantize", {"bits": 13}),
    ("sortquant", {"bits": 8}),
    ("sortquant", {"bits": 12, "boundaries": "exact"}),
    ("sortquant", {"bits": 5, "split": 2}),
    ("topk", {"fraction": 0.3}),
    ("topk", {"fraction": 0.3, "bits": 6}),
    ("powersgd", {"rank": 1}),
    ("delta", {"inner": "quantize", "bits": 4}),  # without sample ids: the whole tensor through `first`
    ("lloydmax", {"bits": 2}),
    ("lloydmax", {"bits": 4}),
    ("lloydmax", {"bits": 8, "iterations": 3}),
    ("hadamard", {"bits": 4}),
    ("hadamard", {"bits": 2, "block": 8}),
]
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
#: Empty, 0-d, one element, odd sizes, 2-D, [B, T, D] and [B, C, H, W].
SHAPES = [(0,), (3, 0, 2), (), (1,), (7,), (5, 3), (2, 3, 5), (2, 3, 4, 5)]


def codec_id(case: tuple[str, dict]) -> str:
    name, kwargs = case
    return name + "".join(f"-{k}={v}" for k, v in kwargs.items())


def make(case: tuple[str, dict]) -> Compressor:
    name, kwargs = case
    return get_compressor(name, **kwargs)


def sample(shape, dtype, seed=0) -> torch.Tensor:
    """Normal values with a few repeats, deterministic."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if x.numel() > 3:
        x.view(-1)[:2] = x.view(-1)[2]
    return x.to(dtype)


def ulp_slack(x: torch.Tensor) -> float:
    """Rounding allowance: a few float32 ulps of the largest |x| plus the dtype's own rounding."""
    big = float(x.float().abs().max()) if x.numel() else 0.0
    return 16 * torch.finfo(torch.float32).eps * big + torch.finfo(x.dtype).eps * big + 1e-30


def shares_exact_code(codec: Compressor, x: torch.Tensor) -> torch.Tensor:
    """[N] bool: elements whose code is an exact value's (they decode to that value, within
    a step instead of half a step). For codecs with a levels payload (quantize, sortquant)."""
    from lightning_epipe.compressors.bitpack import unpack
    from lightning_epipe.compressors.levels import read_levels

    levels = read_levels(codec, codec.encode(x))
    codes = unpack(levels.codes, levels.bits, x.numel()).long()
    return torch.isin(codes, torch.from_numpy(levels.exact_codes))
