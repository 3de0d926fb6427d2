"""The CUDA path, where there is a GPU: skipped (with the reason in pytest's summary) elsewhere.

    python -m pytest tests/gpu -rs        # on a machine with 2 GPUs (one GPU runs the last test only)

Each test starts real processes (``tests/strategy/scenario.py`` with ``--accelerator gpu``) and
compares with the same training in one CPU process (float tolerance across devices).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import ROOT, run_ranks
from tests.strategy.scenario import reference

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs, this machine has {GPUS}")


def _train(tmp_path, *args, steps=4):
    out = tmp_path / "result.pt"
    run_ranks(SCRIPT, "--out", out, "--steps", steps, "--batch-size", 16, "--accelerator", "gpu", *args, timeout=300)
    return torch.load(out, weights_only=False, map_location="cpu")


def _assert_matches_reference(got, steps=4, rtol=1e-4, atol=1e-5):
    ref = reference(steps=steps, batch_size=16)
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
@pytest.mark.parametrize("precision", ["bf16-mixed"])
@pytest.mark.parametrize("codec", ["fp16", "sortquant", "quantize", "topk", "powersgd", "lloydmax"])
def test_every_codec_trains_under_bf16_autocast(tmp_path, precision, codec):
    got = _train(tmp_path, "--devices", 2, "--compressor", codec, "--precision", precision)
    assert all(torch.isfinite(torch.tensor(got["losses"])))


@two_gpus
def test_checkpoint_resume_is_exact_on_gpus(tmp_path):
    """Resumed from a checkpoint (gathered through host memory), the run continues exactly."""
    from tests.strategy.resume import run_and_resume

    run_and_resume(tmp_path, "--devices", 2, "--accelerator", "gpu", "--compressor", "powersgd")
