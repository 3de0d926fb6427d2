"""The CUDA path, where there is a GPU: skipped (with the reason in pytest's summary) elsewhere.

    python -m pytest tests/gpu -rs        # NCCL needs 2 GPUs; one GPU runs the rest

The strategy tests start real processes (``tests/strategy/scenario.py`` with ``--accelerator
gpu``) and compare with the same training in one CPU process (float tolerance across devices).
On one GPU, two ranks share it as two one-device "nodes" on loopback, gloo between them
(NCCL refuses two ranks on one device): the CUDA path of the engine (host-staged frames,
autocast, GradScalers, codecs, ``balance="time"``, ``auto`` and checkpoints on the GPU) end to
end. The codec tests encode on the GPU and decode on both the GPU and the host.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from lightning_epipe.compressors import Packet, TopK
from tests.compressors.cases import CODECS, codec_id, make, sample, ulp_slack
from tests.helpers import ROOT, run_nodes, run_ranks
from tests.strategy.scenario import reference

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs, this machine has {GPUS}")
one_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")


def _train(tmp_path, *args, steps=4):
    out = tmp_path / "result.pt"
    run_ranks(SCRIPT, "--out", out, "--steps", steps, "--batch-size", 16, "--accelerator", "gpu",
              "--start-method", "popen", *args, timeout=300)
    return torch.load(out, weights_only=False, map_location="cpu")


def _train_sharing_one_gpu(tmp_path, *args, steps=4):
    """Two ranks on cuda:0, started as two nodes of one device each (the way a cluster
    launcher starts them), gloo between them; rank 0's result."""
    _share_one_gpu(tmp_path / "node0.pt", "--steps", steps, "--batch-size", 16, *args)
    got = torch.load(tmp_path / "node0.pt", weights_only=False, map_location="cpu")
    assert got["device"] == "cuda:0"
    return got


def _share_one_gpu(out, *args):
    """``scenario.py args`` in two ranks sharing cuda:0 (two one-device nodes, gloo); rank 0's
    result written to ``out``."""
    nodes = out.parent / f"{out.stem}.nodes"
    nodes.mkdir()
    run_nodes(SCRIPT, nodes, "--devices", 1, "--accelerator", "gpu", "--backend", "gloo", "--start-method", "popen",
              *args, timeout=300)
    shutil.copyfile(nodes / "node0.pt", out)


def _assert_matches_reference(got, steps=4, rtol=1e-4, atol=1e-5, ref=None):
    ref = ref if ref is not None else reference(steps=steps, batch_size=16)
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref.losses), rtol=rtol, atol=atol)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got["state_dict"][name], value, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


@two_gpus
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_nccl_client_server_equals_one_process(tmp_path, schedule):
    _assert_matches_reference(_train(tmp_path, "--devices", 2, "--schedule", schedule, "--chunks", 4))


@two_gpus
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_nccl_sortquant_8_learns_like_one_process(tmp_path, schedule):
    got = _train(tmp_path, "--devices", 2, "--schedule", schedule, "--compressor", "sortquant", "--bits", 8, steps=6)
    ref = reference(steps=6, batch_size=16)
    assert got["losses"][-1] == pytest.approx(ref.losses[-1], rel=0.05)


@two_gpus
def test_gloo_between_gpus_stages_through_host_memory(tmp_path):
    _assert_matches_reference(_train(tmp_path, "--devices", 2, "--backend", "gloo", "--placement", "chain"))


@two_gpus
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])  # 16-mixed: a GradScaler on every rank
@pytest.mark.parametrize("codec", ["fp16", "sortquant", "quantize", "topk", "powersgd", "lloydmax"])
def test_every_codec_trains_under_autocast(tmp_path, precision, codec):
    got = _train(tmp_path, "--devices", 2, "--compressor", codec, "--precision", precision)
    assert all(torch.isfinite(torch.tensor(got["losses"])))


@two_gpus
def test_checkpoint_resume_is_exact_on_gpus(tmp_path):
    """Resumed from a checkpoint (gathered through host memory), the run continues exactly."""
    from tests.strategy.resume import run_and_resume

    run_and_resume(tmp_path, "--devices", 2, "--accelerator", "gpu", "--compressor", "powersgd")


@one_gpu
@pytest.mark.parametrize("placement", ["client-server", "chain"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_ranks_on_one_gpu_equal_one_process(tmp_path, placement, schedule):
    got = _train_sharing_one_gpu(tmp_path, "--placement", placement, "--schedule", schedule, "--chunks", 4)
    _assert_matches_reference(got)


@one_gpu
@pytest.mark.parametrize("codec", [["--compressor", "powersgd"], ["--delta", "--compressor", "quantize", "--bits", "2"]],
                         ids=["powersgd", "delta-quantize-2"])
def test_checkpoint_resume_is_exact_on_one_gpu(tmp_path, codec):
    """Two ranks sharing the GPU, resumed from a checkpoint (delta caches and PowerSGD's state
    back on the GPU): the run continues exactly."""
    from tests.strategy.resume import run_and_resume

    full, _ = run_and_resume(tmp_path, *codec, train=_share_one_gpu)
    assert full["device"] == "cuda:0"


@one_gpu
def test_auto_decides_every_link_from_gpu_traffic(tmp_path):
    """compressor="auto" on host-staged frames between GPU ranks: every link of both cuts is
    decided from the training's own messages, and training goes on."""
    kwargs = {"retune_every": 3, "min_bytes": 1024, "min_frames": 1, "window_bytes": 1 << 16}
    got = _train_sharing_one_gpu(tmp_path, "--compressor", "auto", "--compressor-kwargs", json.dumps(kwargs), steps=5)
    assert sorted(got["auto"]) == sorted(f"{d}/cut{c}" for d in ("activation", "gradient") for c in range(2))
    assert all(0 < d["bandwidth"] < float("inf") for d in got["auto_history"])
    assert len(got["losses"]) == 5 and all(torch.isfinite(torch.tensor(got["losses"])))


@one_gpu
def test_balance_by_time_on_one_gpu_equals_one_process(tmp_path):
    """balance="time" times each layer on the GPU (one layer there at a time) and trains as one
    process does on the split it chose."""
    _assert_matches_reference(_train_sharing_one_gpu(tmp_path, "--balance", "time"))


@one_gpu
@pytest.mark.parametrize("placement", ["client-server", "chain"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_fp16_mixed_on_one_gpu_skips_and_scales_like_one_process(tmp_path, placement, schedule):
    """CUDA float16 autocast and GradScalers whose first scales overflow: the two ranks skip the
    same steps and back off to the same scales as one CPU process under float16 autocast, and
    end with its weights within float16's rounding."""
    from tests.strategy.test_grad_scaling import INIT_SCALE, SCALES

    got = _train_sharing_one_gpu(tmp_path, "--placement", placement, "--schedule", schedule,
                                 "--fp16-scale", INIT_SCALE, steps=len(SCALES))
    ref = reference(steps=len(SCALES), batch_size=16, fp16_scale=INIT_SCALE)
    assert ref.scales == SCALES and got["scales"] == SCALES
    _assert_matches_reference(got, steps=len(SCALES), rtol=1e-3, atol=1e-4, ref=ref)


@one_gpu
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
@pytest.mark.parametrize("codec", ["sortquant", "lloydmax", "hadamard", "powersgd"])
def test_codecs_train_on_one_gpu_under_autocast(tmp_path, codec, precision):
    got = _train_sharing_one_gpu(tmp_path, "--compressor", codec, "--precision", precision, steps=6)
    assert got["losses"][-1] == pytest.approx(reference(steps=6, batch_size=16).losses[-1], rel=0.05)


@one_gpu
@pytest.mark.parametrize("case", CODECS, ids=codec_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(7,), (2, 3, 5), (32, 1024)], ids=str)
def test_codec_on_cuda_round_trips_like_on_the_host(case, dtype, shape):
    """A packet encoded on the GPU decodes on the GPU, and the same bytes decode to the same
    values on the host; its error is the host encoding's, within what a different kernel's
    rounding (or random draw) moves."""
    x = sample(shape, dtype)
    wire = make(case).encode(x.cuda()).to_bytes()
    y = make(case).decode(Packet.from_bytes(wire))
    assert y.device.type == "cuda" and y.dtype == dtype and y.shape == x.shape
    on_host = make(case).decode(Packet.from_bytes(wire.cpu()))
    torch.testing.assert_close(y.cpu(), on_host, rtol=0, atol=ulp_slack(x))
    host = make(case).decode(make(case).encode(x))
    error, host_error = (y.cpu().double() - x.double()).norm(), (host.double() - x.double()).norm()
    assert error <= 1.25 * host_error + ulp_slack(x) * x.numel() ** 0.5


@one_gpu
@pytest.mark.parametrize("n", [37, 5000, 70_000])
def test_topk_on_the_gpu_keeps_the_hosts_positions_ties_and_nan_included(n):
    """One selection rule on every device: the same payload, raw values, bit for bit."""
    g = torch.Generator().manual_seed(n)
    x = torch.where(torch.rand(n, generator=g) < 0.5, -2.0, torch.randn(n, generator=g))  # ties at magnitude 2
    x[n // 3] = float("nan")
    for fraction in (0.01, 0.3):
        codec = TopK(fraction=fraction, check_finite=False)
        assert torch.equal(codec.encode(x.cuda()).payload.cpu(), codec.encode(x).payload)


@one_gpu
@pytest.mark.parametrize("n", [37, 4096, 32768])
def test_lloydmax_of_a_small_gpu_tensor_is_the_cpus_packet(n):
    """Up to ``DEVICE_SORTED_FIT_MAX`` elements lloydmax fits a GPU tensor on the host."""
    x = sample((n,), torch.float32)
    case = ("lloydmax", {"bits": 4})
    assert torch.equal(make(case).encode(x.cuda()).to_bytes().cpu(), make(case).encode(x).to_bytes())


@one_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("n", [37, 4096, 70_000])
def test_hadamard_on_the_gpu_writes_and_reads_the_hosts_bits(n, dtype):
    """Butterflies, block scales and signs are correctly rounded float32 operations on every
    device: the GPU's payload is the host's, and both decode it to the same values."""
    x = sample((n,), torch.float32).to(dtype)
    case = ("hadamard", {"bits": 4})
    on_gpu = make(case).encode(x.cuda())
    assert torch.equal(on_gpu.payload.cpu(), make(case).encode(x).payload)
    assert torch.equal(make(case).decode(on_gpu).cpu(), make(case).decode(Packet.from_bytes(on_gpu.to_bytes().cpu())))
