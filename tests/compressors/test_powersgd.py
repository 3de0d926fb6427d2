import math

import numpy as np
import pytest
import torch

from lightning_epipe.compressors import NonFiniteError, Packet, PacketError, PowerSGD, powersgd
from lightning_epipe.compressors.packet import DTYPE_CODES, header_nbytes
from lightning_epipe.compressors.powersgd import matrix_shape


@pytest.mark.parametrize("shape, matrices", [
    ((), (1, 1, 1)),
    ((5,), (1, 1, 5)),
    ((4, 6), (1, 4, 6)),
    ((2, 8, 16), (2, 8, 16)),
    ((2, 3, 4, 5), (2, 3, 20)),
    ((2, 3, 4, 5, 6), (2, 3, 120)),
])
def test_matrix_shape(shape, matrices):
    assert matrix_shape(torch.Size(shape)) == matrices


def low_rank(b=3, m=8, n=50, r=2, seed=0, decay=None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(b, m, m, generator=g)).Q
    v = torch.linalg.qr(torch.randn(b, n, m, generator=g)).Q
    s = torch.zeros(m)
    s[:r] = 1.0
    if decay is not None:
        s = decay ** torch.arange(m, dtype=torch.float32)
    return u @ torch.diag(s) @ v.transpose(1, 2)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-6),
                                        (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
def test_exact_on_a_low_rank_tensor(dtype, tol):
    x = low_rank(r=2).to(dtype)
    y = PowerSGD(rank=2, iterations=1).decode(PowerSGD(rank=2, iterations=1).encode(x))
    assert y.dtype == dtype
    assert float((y.double() - x.double()).norm() / x.double().norm()) < tol


def test_warm_start_improves_the_error_over_calls():
    x = low_rank(decay=0.5)
    codec = PowerSGD(rank=2, iterations=1)
    errors = [float((codec.decode(codec.encode(x)) - x).norm() / x.norm()) for _ in range(6)]
    best = float(torch.linalg.svdvals(x)[:, 2:].norm() / x.norm())  # the rank-2 optimum
    assert errors[-1] < 0.9 * errors[0]
    assert errors[-1] < 1.01 * best
    assert all(b <= a * 1.001 for a, b in zip(errors, errors[1:]))


def test_state_dict_round_trip_continues_the_stream():
    x = low_rank(decay=0.6)
    codec = PowerSGD(rank=3, iterations=1)
    assert codec.state_dict() == {}
    for _ in range(3):
        codec.encode(x)
    state = codec.state_dict()
    assert list(state) == ["q"] and state["q"].shape == (3, 50, 3)
    other = PowerSGD(rank=3, iterations=1)
    other.load_state_dict(state)
    assert torch.equal(other.encode(x).payload, codec.encode(x).payload)


def test_reset_forgets_the_warm_start():
    x = low_rank(decay=0.6)
    codec = PowerSGD(rank=3)
    first = codec.encode(x).payload
    codec.encode(x)
    codec.reset()
    assert codec.state_dict() == {}
    assert torch.equal(codec.encode(x).payload, first)
    codec.load_state_dict({})
    assert codec.state_dict() == {}


def test_a_new_batch_size_restarts_the_stream():
    codec = PowerSGD(rank=2)
    codec.encode(low_rank(b=3))
    y = codec.decode(codec.encode(low_rank(b=2)))  # the last, smaller batch of an epoch
    assert y.shape == (2, 8, 50) and codec.state_dict()["q"].shape == (2, 50, 2)


def test_nbytes_and_decode_on_an_instance_of_another_rank():
    x = torch.randn(2, 6, 4, 5, dtype=torch.bfloat16)
    packet = PowerSGD(rank=3).encode(x)
    assert packet.nbytes == header_nbytes(4) + 8 + (2 * 6 * 3 + 2 * 20 * 3) * 2
    assert PowerSGD(rank=1).decode(packet).shape == x.shape


def test_float16_wire_widens_when_q_would_overflow():
    x = torch.full((1, 64, 64), 6e4, dtype=torch.float16)
    packet = PowerSGD(rank=1).encode(x)
    assert packet.payload[0] == DTYPE_CODES[torch.float32]
    y = PowerSGD(rank=1).decode(packet)
    assert y.dtype == torch.float16 and torch.allclose(y.float(), x.float(), rtol=1e-3)


def test_rank_larger_than_the_matrix_is_clamped_and_exact():
    # a small last micro-batch: 2 matrices of 8 x 9 cannot carry rank 9, rank 8 is exact
    x = torch.randn(2, 8, 3, 3)
    packet = PowerSGD(rank=9).encode(x)
    torch.testing.assert_close(PowerSGD(rank=9).decode(packet), x, rtol=1e-4, atol=1e-4)
    assert packet.nbytes < PowerSGD(rank=9).encode(torch.randn(2, 16, 3, 3)).nbytes


@pytest.mark.parametrize("kwargs, message", [
    ({"rank": 0}, "rank must be an integer in 1.."),
    ({"rank": 2.5}, "rank must be an integer"),
    ({"iterations": 0}, "iterations must be an integer in 1..1000"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PowerSGD(**kwargs)


@pytest.mark.parametrize("state", [{"p": torch.zeros(1, 2, 2)}, {"q": torch.zeros(2, 2)},
                                   {"q": torch.zeros(1, 5, 3)}])
def test_bad_state(state):
    with pytest.raises(ValueError, match=r"powersgd: state must be \{\} or \{'q'"):
        PowerSGD(rank=2).load_state_dict(state)


def test_payload_rank_beyond_the_matrix_is_refused():
    packet = PowerSGD(rank=2).encode(torch.randn(4, 6))
    payload = packet.payload.clone()
    payload[4] = 5
    with pytest.raises(PacketError, match="rank 5"):
        PowerSGD().decode(Packet(packet.codec, packet.dtype, packet.shape, payload))


def torch_path(monkeypatch) -> None:
    monkeypatch.setattr(powersgd, "COMPILED_MAX", -1)


@pytest.mark.parametrize("shape, rank", [((3, 8, 50), 3), ((16, 256), 4), ((1, 256), 4), ((2, 4, 4), 4),
                                         ((4, 5, 6), 2), ((5,), 1), ((32, 1024), 4), ((2, 32, 32, 32), 4)])
def test_host_path_is_the_torch_paths_factors_up_to_rounding_signs_included(shape, rank, monkeypatch):
    b, m, n = matrix_shape(torch.Size(shape))
    x = low_rank(b, m, n, decay=0.5).reshape(shape)  # singular values apart: factors well defined
    fast, slow = PowerSGD(rank=rank), PowerSGD(rank=rank)
    for _ in range(3):  # the warm start carries over calls on both paths
        mine = fast.encode(x)
        with monkeypatch.context() as m:
            torch_path(m)
            theirs = slow.encode(x)
        a, b = mine.payload[8:].view(torch.float32), theirs.payload[8:].view(torch.float32)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))  # P's columns: the same signs
        torch.testing.assert_close(fast.decode(mine), slow.decode(theirs), rtol=1e-4, atol=1e-5)
    assert mine.payload[:8].tolist() == theirs.payload[:8].tolist()


@pytest.mark.parametrize("columns", [
    torch.randn(7, 3, dtype=torch.float64),
    torch.zeros(5, 2, dtype=torch.float64),                                  # no reflection at all
    torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64),  # zero below the diagonal
    torch.tensor([[-2.0], [0.0]], dtype=torch.float64),                      # negative, nothing below
    torch.randn(4, 4, dtype=torch.float64),                                  # square
    torch.randn(1, 1, dtype=torch.float64),
], ids=["random", "zeros", "first-column-done", "negative-alone", "square", "one-by-one"])
def test_householder_factor_is_lapacks(columns):
    from lightning_epipe.compressors.kernels.lowrank import _householder_q

    m, r = columns.shape
    q = np.empty((m, r))
    _householder_q(columns.numpy().copy(), m, r, q)
    np.testing.assert_allclose(q, torch.linalg.qr(columns).Q.numpy(), atol=1e-12)


def test_non_finite_values_are_refused_on_the_host_path_before_the_state_moves():
    codec = PowerSGD(rank=2)
    x = torch.randn(16, 64)
    codec.encode(x)
    state = codec.state_dict()["q"].clone()
    bad = x.clone()
    bad[3, 7] = math.inf
    with pytest.raises(NonFiniteError, match="1 of 1024 values are not finite"):
        codec.encode(bad)
    assert torch.equal(codec.state_dict()["q"], state)


def test_a_payload_at_any_alignment_decodes_the_same():
    x = low_rank(b=1, m=16, n=64, r=4).reshape(16, 64)
    packet = PowerSGD(rank=4).encode(x)
    shifted = torch.zeros(packet.payload.numel() + 3, dtype=torch.uint8)
    shifted[3:] = packet.payload
    moved = Packet(packet.codec, packet.dtype, packet.shape, shifted[3:])
    assert torch.equal(PowerSGD().decode(moved), PowerSGD().decode(packet))
    torch.testing.assert_close(PowerSGD().decode(packet), x, rtol=1e-4, atol=1e-5)
