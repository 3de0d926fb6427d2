import math

import numpy as np
import pytest
import torch

from lightning_epipe.compressors import HadamardQuant, Packet, PacketError, get_compressor, hadamard, host, kernels
from lightning_epipe.compressors.hadamard import hadamard_nbytes, hadamard_transform, normal_levels, random_signs
from lightning_epipe.compressors.kernels.rotation import NONFINITE
from lightning_epipe.compressors.packet import header_nbytes


def rel_err(codec, x: torch.Tensor) -> float:
    y = codec.decode(Packet.from_bytes(codec.encode(x).to_bytes()))
    return float((y.double() - x.double()).norm() / x.double().norm())


def heavy_tailed(rows: int = 512, width: int = 384, seed: int = 0) -> torch.Tensor:
    """Transformer-like hidden states: Student-t values, a few outlier channels 40x larger."""
    g = torch.Generator().manual_seed(seed)
    normal = torch.randn(rows, width, generator=g)
    chi = torch.randn(rows, width, 3, generator=g).square().sum(-1) / 3
    x = normal / chi.sqrt()                                     # Student-t, 3 degrees of freedom
    x[:, [5, 77, 300]] *= 40
    return x


def sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


@pytest.mark.parametrize("n", [2, 8, 64])
def test_transform_is_the_orthonormal_walsh_hadamard_matrix_and_its_own_inverse(n):
    x = torch.randn(5, n, dtype=torch.float64)
    y = hadamard_transform(x)
    torch.testing.assert_close(y, x @ sylvester(n).double())
    torch.testing.assert_close(hadamard_transform(y), x)


def _stage_by_stage(x: np.ndarray, n: int) -> np.ndarray:
    """The transform's definition in float32: butterflies h = 1, 2, ..., n / 2, then the scale."""
    z = x.reshape(-1, n).copy()
    h = 1
    while h < n:
        pairs = z.reshape(z.shape[0], n // (2 * h), 2, h)
        z = np.stack((pairs[:, :, 0] + pairs[:, :, 1], pairs[:, :, 0] - pairs[:, :, 1]), axis=2).reshape(-1, n)
        h *= 2
    return (z * np.float32(1 / math.sqrt(n))).reshape(-1)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64, 128, 256, 512, 4096])
def test_compiled_and_torch_transforms_are_the_float32_butterflies_bit_for_bit(n, monkeypatch):
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(n))
    x *= torch.logspace(-30, 30, 3 * n).view(3, n)  # magnitudes far apart: rounding shows
    compiled = hadamard_transform(x)
    expected = _stage_by_stage(x.numpy(), n)
    assert np.array_equal(compiled.reshape(-1).numpy().view(np.uint32), expected.view(np.uint32))
    monkeypatch.setattr(hadamard, "_transforms_compiled", lambda x: False)  # torch's ops, as on an accelerator
    assert torch.equal(hadamard_transform(x).view(torch.int32), compiled.view(torch.int32))
    torch.testing.assert_close(compiled.double(), x.double() @ sylvester(n).double(), rtol=1e-5,
                               atol=1e-5 * float(x.abs().max()))


def _splitmix64_sign(seed: int, i: int) -> float:
    mask = (1 << 64) - 1
    z = ((seed << 32) + i + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return 1.0 - 2.0 * ((z ^ (z >> 31)) >> 63)


def test_signs_are_splitmix64s_top_bit_of_seed_and_position():
    for seed in (0, 1, 12345, (1 << 31) - 1):
        signs = random_signs(seed, 300, torch.device("cpu"))
        assert signs.tolist() == [_splitmix64_sign(seed, i) for i in range(300)]
    many = random_signs(7, 1 << 16, torch.device("cpu"))
    assert abs(float(many.sum())) < 1000 and not torch.equal(random_signs(8, 300, torch.device("cpu")), many[:300])


def _normal(n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(n, dtype=dtype, generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("x", [
    _normal(3000) * 1e-42,                                     # float32 subnormals: 2**-e past float32's range
    _normal(3000, torch.float64) * 1e-310,                     # float64 subnormals: the exponent clamped
    _normal(3000, torch.float64) * 1e307,                      # 2**e past float64's range at decode
    torch.full((3000,), 3.0e38),                               # float32's largest values
    torch.cat([torch.zeros(2000), _normal(1000)]),             # zero blocks: scale 0
], ids=["f32-subnormal", "f64-subnormal", "f64-huge", "f32-max", "zero-blocks"])
def test_extreme_magnitudes_write_and_decode_the_same_on_both_paths(x, monkeypatch):
    fast = HadamardQuant(bits=4).encode(x)
    decoded = HadamardQuant(bits=4).decode(fast)
    with monkeypatch.context() as m:
        m.setattr(host, "HOST_MAX", -1)
        m.setattr(host, "COMPILED_MAX", -1)
        m.setattr(hadamard, "_transforms_compiled", lambda x: False)
        slow = HadamardQuant(bits=4).encode(x)
        assert torch.equal(HadamardQuant(bits=4).decode(slow), decoded)
    assert torch.equal(fast.payload, slow.payload)
    assert torch.isfinite(decoded).all()
    unit = x.double() / x.double().abs().max()
    assert float((decoded.double() / x.double().abs().max() - unit).norm() / unit.norm()) < 0.11


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("at", [0, 1500, 2999])
def test_rotation_reports_nan_and_inf_anywhere(bad, at):
    x = np.random.default_rng(at).standard_normal(3000).astype(np.float32)
    x[at] = bad
    u, sigma = np.empty(3072, dtype=np.float32), np.empty(12, dtype=np.uint16)
    assert kernels.hadamard_rotate(x, 0, 256, -1000, u, sigma) == NONFINITE


def test_normal_levels_are_max_1960():
    assert normal_levels(4)[2:].tolist() == pytest.approx([0.4528, 1.510], abs=1e-3)
    assert normal_levels(16)[8:].tolist() == pytest.approx(
        [0.1284, 0.3881, 0.6568, 0.9423, 1.256, 1.618, 2.069, 2.733], abs=1e-3)


@pytest.mark.parametrize("bits, block", [(2, 8), (4, 256), (3, 512), (8, 64)])
@pytest.mark.parametrize("shape", [(1,), (255,), (3, 7, 11), (4, 64, 384)])
def test_nbytes_counts_prefix_levels_scales_and_packed_codes(bits, block, shape):
    x = torch.randn(shape)
    packet = HadamardQuant(bits=bits, block=block).encode(x)
    rows = -(-x.numel() // block)
    payload = 16 + 4 * 2**bits + 2 * rows + -(-rows * block * bits // 8)
    assert packet.payload.numel() == payload == hadamard_nbytes(x.numel(), block, bits)
    assert packet.nbytes == header_nbytes(len(shape)) + payload


def test_four_bits_cost_under_0_13_of_float32_on_hidden_states():
    x = torch.randn(8, 64, 384)
    assert HadamardQuant(bits=4).ratio(x) < 0.13


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_four_bits_stay_under_0_10_on_heavy_tailed_data_where_uniform_codes_fail(seed):
    x = heavy_tailed(seed=seed)
    ours = rel_err(HadamardQuant(bits=4, seed=seed), x)
    assert ours <= 0.10
    assert rel_err(get_compressor("quantize", bits=4), x) > 3 * ours
    assert rel_err(get_compressor("lloydmax", bits=4), x) > ours


@pytest.mark.parametrize("bits, bound", [(2, 0.40), (3, 0.20), (8, 0.01)])
def test_error_falls_with_bits(bits, bound):
    assert rel_err(HadamardQuant(bits=bits), heavy_tailed()) < bound


def test_each_encode_draws_new_signs_and_any_instance_decodes():
    x = torch.randn(1000)
    sender = HadamardQuant(bits=4, seed=5)
    first, second = sender.encode(x), sender.encode(x)
    assert not torch.equal(first.payload, second.payload)
    receiver = HadamardQuant(bits=2, block=8)  # its own settings do not matter: the packet says
    torch.testing.assert_close(receiver.decode(first), sender.decode(first))


def test_stream_state_round_trips_through_a_checkpoint():
    x = torch.randn(3000)
    a = HadamardQuant(bits=4)
    a.encode(x)
    b = HadamardQuant(bits=4)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.encode(x).payload, b.encode(x).payload)
    a.reset()
    assert a.state_dict()["encodes"].item() == 0
    with pytest.raises(ValueError, match="'encodes'"):
        a.load_state_dict({"step": torch.tensor(1)})


def test_zeros_decode_to_zeros_and_huge_values_stay_finite():
    codec = HadamardQuant(bits=4)
    zeros = torch.zeros(2, 300)
    assert torch.equal(codec.decode(codec.encode(zeros)), zeros)
    x = torch.randn(4096, dtype=torch.float64) * 1e300  # any sum of squares overflows
    y = codec.decode(codec.encode(x))
    assert torch.isfinite(y).all() and rel_err(codec, x / 1e300) < 0.11
    assert float(((y - x) / 1e300).norm() / (x / 1e300).norm()) < 0.11


def corrupt(packet: Packet, at: int, value: int | float) -> Packet:
    payload = packet.payload.clone()
    if isinstance(value, float):  # a float32 written at byte `at`
        payload[at: at + 4] = torch.tensor([value]).view(torch.uint8)
    else:
        payload[at] = value
    return Packet(packet.codec, packet.dtype, packet.shape, payload)


@pytest.mark.parametrize("at, value, match", [
    (8, 9, "bad prefix"),          # bits 9
    (4, 0, "bad prefix"),          # log2(block) 0
    (3, 0x80, "bad prefix"),       # negative seed
    (4, 9, "payload bytes"),       # another block size: the length no longer fits
    (16, math.nan, "not finite"),  # level 0 becomes NaN
])
@pytest.mark.parametrize("n", [2000, 5000], ids=["host", "torch"])
def test_corrupted_prefix_or_codebook_is_a_packet_error(at, value, match, n):
    packet = HadamardQuant(bits=4).encode(torch.randn(n))
    with pytest.raises(PacketError, match=match):
        HadamardQuant().decode(corrupt(packet, at, value))


@pytest.mark.parametrize("n", [2000, 5000], ids=["host", "torch"])
def test_scale_outside_zero_one_is_a_packet_error(n):
    packet = HadamardQuant(bits=4).encode(torch.randn(n))
    scale_hi_byte = 16 + 4 * 16 + 1
    with pytest.raises(PacketError, match="scales outside"):
        HadamardQuant().decode(corrupt(packet, scale_hi_byte, 0x40))  # bfloat16 >= 2


def test_finite_cpu_tensors_up_to_the_compiled_limit_take_the_host_path(monkeypatch):
    calls = []
    real = hadamard._encode_host

    def host_encode(*args):  # counts the payloads the host path wrote
        payload = real(*args)
        calls.extend([1] if payload is not None else [])
        return payload

    monkeypatch.setattr(hadamard, "_encode_host", host_encode)
    monkeypatch.setattr(host, "COMPILED_MAX", 5000)
    HadamardQuant(bits=4).encode(torch.randn(5000))
    assert calls == [1]
    HadamardQuant(bits=4).encode(torch.randn(5001))
    x = torch.randn(100)
    x[7] = math.nan
    HadamardQuant(bits=4, check_finite=False).encode(x)  # unchecked NaN: the torch path
    assert calls == [1]


def test_truncated_payload_is_a_packet_error():
    packet = HadamardQuant(bits=4).encode(torch.randn(2000))
    short = Packet(packet.codec, packet.dtype, packet.shape, packet.payload[:-1].clone())
    with pytest.raises(PacketError, match="payload bytes"):
        HadamardQuant().decode(short)


@pytest.mark.parametrize("kwargs, match", [
    ({"bits": 1}, "bits must be an integer in 2..8"),
    ({"bits": 9}, "bits must be an integer in 2..8"),
    ({"block": 384}, "power of two, got 384; e.g. 256 or 512"),
    ({"block": 1}, "block must be an integer"),
    ({"seed": -1}, "seed must be an integer"),
    ({"iterations": 101}, "iterations must be an integer"),
])
def test_bad_arguments_name_what_is_allowed(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HadamardQuant(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("n", [5000, 70_000])
def test_large_cpu_tensors_write_the_torch_paths_payload(n, dtype, monkeypatch):
    x = heavy_tailed(rows=n // 384 + 1).reshape(-1)[:n].to(dtype)
    fast = HadamardQuant(bits=4, seed=3).encode(x)
    decoded = HadamardQuant().decode(fast)
    monkeypatch.setattr(host, "COMPILED_MAX", -1)
    monkeypatch.setattr(hadamard, "_transforms_compiled", lambda x: False)
    slow = HadamardQuant(bits=4, seed=3).encode(x)
    assert torch.equal(fast.payload, slow.payload)
    assert torch.equal(HadamardQuant().decode(slow), decoded)
