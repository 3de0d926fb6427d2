"""Learned bottleneck pairs: shapes, PCA start, tuples, explicit modules, bad arguments."""

from __future__ import annotations

import doctest

import pytest
import torch
from torch import nn

from lightning_epipe.compressors import bottleneck
from lightning_epipe.compressors.bottleneck import Bottleneck, principal_directions


def low_rank(*shape: int, rank: int, seed: int = 0) -> torch.Tensor:
    """[..., D] rows spanning ``rank`` directions plus a mean offset."""
    g = torch.Generator().manual_seed(seed)
    *lead, width = shape
    coeffs = torch.randn(*lead, rank, generator=g)
    return coeffs @ torch.randn(rank, width, generator=g) + torch.randn(width, generator=g)


def test_doctests():
    assert doctest.testmod(bottleneck, extraglobs={"torch": torch}).failed == 0


@pytest.mark.parametrize("shape", [(64, 32), (8, 10, 32)])
def test_linear_pair_shapes_and_ratio(shape):
    x = low_rank(*shape, rank=4)
    pair = Bottleneck(ratio=0.25).build(x)
    z = pair.encoder(x)
    assert z.shape == (*shape[:-1], 8)
    assert pair.expansion == 4.0
    assert pair.decoder(z).shape == x.shape


def test_pca_start_reconstructs_what_fits_in_the_code():
    """Activations of rank 4 through an 8-wide code: the PCA start loses nothing."""
    x = low_rank(128, 32, rank=4)
    pca = Bottleneck(ratio=0.25).build(x)
    torch.testing.assert_close(pca.decoder(pca.encoder(x)), x, rtol=1e-4, atol=1e-4)
    torch.manual_seed(0)
    default = Bottleneck(ratio=0.25, init="default").build(x)
    assert (default.decoder(default.encoder(x)) - x).norm() > 0.5 * x.norm()


def test_pca_start_beats_default_init_on_full_rank_data():
    x = torch.nn.functional.relu6(2 * torch.randn(32, 16, 9, 9))
    pca = Bottleneck(ratio=0.3).build(x)
    err = ((pca.decoder(pca.encoder(x)) - x).norm() / x.norm()).item()
    torch.manual_seed(0)
    default = Bottleneck(ratio=0.3, init="default").build(x)
    assert err < 0.9 * ((default.decoder(default.encoder(x)) - x).norm() / x.norm()).item()


def test_conv_pair_pads_and_crops_odd_sizes():
    x = torch.randn(4, 32, 10, 7)
    pair = Bottleneck(ratio=20 / 288, stride=3).build(x)   # the report's 32 -> 20 channels
    z = pair.encoder(x)
    assert z.shape == (4, 20, 4, 3)                        # ceil(10/3), ceil(7/3)
    assert pair.decoder(z).shape == x.shape
    assert pair.expansion == pytest.approx(32 * 10 * 7 / (20 * 4 * 3))


def test_conv_pair_at_full_ratio_is_exact():
    x = torch.randn(6, 4, 6, 6)
    pair = Bottleneck(ratio=1.0, stride=2).build(x)
    torch.testing.assert_close(pair.decoder(pair.encoder(x)), x, rtol=1e-4, atol=1e-4)


def test_stride_is_clamped_to_small_images():
    x = torch.randn(4, 8, 2, 2)
    pair = Bottleneck(ratio=0.5, stride=3).build(x)
    assert pair.encoder(x).shape == (4, 16, 1, 1)  # stride 2: 0.5 * 8 channels * 2 * 2 = 16 code channels
    assert pair.expansion == 2.0
    assert pair.decoder(pair.encoder(x)).shape == x.shape


def test_tuple_activations_compress_their_first_tensor_only():
    hidden, mask = low_rank(4, 6, 16, rank=3), torch.ones(4, 6, dtype=torch.long)
    pair = Bottleneck(ratio=0.25).build((hidden, mask))
    code = pair.encoder((hidden, mask))
    assert isinstance(code, tuple) and code[0].shape == (4, 6, 4) and code[1] is mask
    out = pair.decoder(code)
    assert out[0].shape == hidden.shape and out[1] is mask


def test_explicit_modules_are_copied_for_every_build():
    enc, dec = nn.Linear(16, 4), nn.Linear(4, 16)
    spec = Bottleneck(encoder=enc, decoder=dec)
    a, b = spec.build(torch.randn(3, 16)), spec.build()
    assert a.encoder.module is not enc and a.encoder.module is not b.encoder.module
    torch.testing.assert_close(a.encoder.module.weight, enc.weight)
    assert a.expansion == 4.0


def test_principal_directions_fill_up_with_orthonormal_columns():
    rows = torch.randn(3, 10)           # only 3 samples, 6 directions asked
    basis = principal_directions(rows - rows.mean(0), 6)
    assert basis.shape == (10, 6)
    torch.testing.assert_close(basis.T @ basis, torch.eye(6), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(ratio=0), "ratio must be a number in"),
    (dict(ratio=1.5), "ratio must be a number in"),
    (dict(stride=0), "stride must be a positive integer"),
    (dict(init="svd"), "init must be one of"),
    (dict(encoder=nn.Linear(2, 1)), "give both encoder and decoder"),
    (dict(wire="zip"), "unknown compressor 'zip'"),
    (dict(wire="quantize", bits=1), "bits must be an integer in"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Bottleneck(**kwargs)


@pytest.mark.parametrize("x", [torch.randn(4), torch.randn(2, 3, 4, 5, 6), torch.ones(4, 8, dtype=torch.long)])
def test_activations_a_built_pair_cannot_take(x):
    with pytest.raises(ValueError, match="pass encoder= and decoder="):
        Bottleneck().build(x)
