"""Faults injected in real processes: every rank exits non-zero within the timeout with a
message naming the rank and the step; nothing hangs, nothing is decoded into garbage."""

from __future__ import annotations

import re

import lightning as L
import pytest
import torch

from tests.helpers import ROOT, run_ranks
from tests.strategy.scenario import TinyNet, loader, trainer_kwargs

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"
TIMEOUT = 8  # EPipeStrategy(timeout=...) in seconds


def _run_fault(kind: str, *extra: str, rank: int = 2, step: int = 2, tmp_path=None, script=SCRIPT):
    return run_ranks(
        script, "--out", tmp_path / "r.pt", "--steps", "5", "--timeout", TIMEOUT, "--start-method", "popen",
        "--fault", kind, "--fault-rank", rank, "--fault-step", step, *extra,
        timeout=150, expect_ok=False,
    )


def test_killed_server_fails_the_client_fast(tmp_path):
    code, out = _run_fault("kill", tmp_path=tmp_path, script=ROOT / "tests" / "strategy" / "killed_peer.py")
    assert code != 0
    assert "PeerError" in out and "rank 2 closed the connection" in out, out[-3000:]  # the dead socket, not the timeout
    killed = float(re.search(r"killed at ([0-9.]+)", out).group(1))
    detected = float(re.search(r"PeerError at ([0-9.]+)", out).group(1))
    assert 0 < detected - killed < TIMEOUT, (detected - killed, out[-3000:])


@pytest.mark.slow
def test_stalled_server_times_out(tmp_path):
    code, out = _run_fault("stall", tmp_path=tmp_path)
    assert code != 0
    assert "PeerError" in out and f"sent nothing for 0:00:0{TIMEOUT}" in out, out[-3000:]


@pytest.mark.slow
def test_server_raising_in_its_stage(tmp_path):
    code, out = _run_fault("raise", rank=1, tmp_path=tmp_path)
    assert code != 0
    assert "injected failure on rank 1" in out
    assert "PeerError" in out  # the others learn of it


def test_corrupted_payload_is_rejected_with_the_link(tmp_path):
    code, out = _run_fault("corrupt", rank=1, tmp_path=tmp_path)
    assert code != 0
    assert "WireError" in out and "link rank 1 -> rank 2" in out and "checksum mismatch" in out, out[-3000:]


@pytest.mark.slow
def test_out_of_order_message_is_rejected(tmp_path):
    code, out = _run_fault("misorder", rank=1, tmp_path=tmp_path)
    assert code != 0
    assert "WireError" in out and "microbatch=1 (expected 0)" in out, out[-3000:]


def test_nan_stops_the_run_naming_stage_and_step(tmp_path):
    code, out = _run_fault("nan", rank=1, tmp_path=tmp_path)
    assert code != 0
    assert "NonFiniteActivation" in out and "leaving stage 1 (rank 1) at step 3" in out, out[-3000:]


def test_nan_skip_skips_the_step_on_every_rank(tmp_path):
    code, out = _run_fault("nan", "--nonfinite", "skip", rank=1, tmp_path=tmp_path)
    assert code == 0, out[-3000:]
    result = torch.load(tmp_path / "r.pt", weights_only=False)
    losses = torch.tensor(result["losses"])
    assert len(losses) == 5 and torch.isnan(losses[2]) and torch.isfinite(losses[[0, 1, 3, 4]]).all()
    assert all(torch.isfinite(v).all() for v in result["state_dict"].values())


def test_fp16_overflow_at_a_cut_stops_the_run_naming_stage_and_step(tmp_path):
    """An activation past fp16's range would arrive as Inf: the cut's codec says so, as for NaN."""
    code, out = _run_fault("overflow", "--compressor", "fp16", rank=1, tmp_path=tmp_path)
    assert code != 0
    assert "NonFiniteActivation" in out and "exceed the torch.float16 range" in out, out[-3000:]
    assert "leaving stage 1 (rank 1) at step 3" in out, out[-3000:]


class _DropGradients(L.Callback):
    """One process's side of a skipped step: no parameter moves at training batch ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_step == self.step:
            for p in pl_module.parameters():
                p.grad = None


@pytest.mark.slow
def test_fp16_overflow_skip_skips_the_step_on_every_rank(tmp_path):
    code, out = _run_fault("overflow", "--compressor", "fp16", "--nonfinite", "skip", rank=1, tmp_path=tmp_path)
    assert code == 0, out[-3000:]
    got = torch.load(tmp_path / "r.pt", weights_only=False)["state_dict"]
    ref = TinyNet()  # the same five batches in one process, the third one skipped
    L.Trainer(devices=1, **trainer_kwargs(5, callbacks=[_DropGradients(2)])).fit(ref, loader(16))
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-3, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_sigterm_stops_every_rank_after_the_same_step(tmp_path):
    """A preempted job (SIGTERM to rank 0 as its second step ends, while the servers may still be
    finishing it; Lightning's launcher passes it on) stops on every rank before the third batch,
    well inside the timeout: no collective waits in a signal handler for a peer that waits in
    the pipeline, and no rank stops a step before the others."""
    code, out = _run_fault("sigterm", rank=0, step=2, tmp_path=tmp_path)
    stopped = re.findall(r"rank (\d) stopped by SIGTERM at global_step (\d+)", out)
    assert sorted(rank for rank, _ in stopped) == ["0", "1", "2"], out[-3000:]
    assert {step for _, step in stopped} == {"2"}, stopped
    assert code == 0 and "Timed out" not in out and "PeerError" not in out, out[-3000:]


@pytest.mark.slow
def test_sigterm_stops_every_replica_after_the_same_step(tmp_path):
    """Pipeline x data parallel (2 pipelines of 2 ranks): rank 0's SIGTERM reaches the other
    pipeline's client by a broadcast among the clients, and each client tells its own server;
    all 4 ranks stop before the same batch."""
    code, out = _run_fault("sigterm", "--devices", "4", "--replicas", "2", rank=0, step=2, tmp_path=tmp_path)
    stopped = re.findall(r"rank (\d) stopped by SIGTERM at global_step (\d+)", out)
    assert sorted(rank for rank, _ in stopped) == ["0", "1", "2", "3"], out[-3000:]
    assert {step for _, step in stopped} == {"2"}, stopped
    assert code == 0 and "Timed out" not in out and "PeerError" not in out, out[-3000:]


def test_sigterm_in_validate_stops_every_rank_after_the_same_batch(tmp_path):
    """SIGTERM in a standalone ``trainer.validate()`` (no per-step broadcast there): the client
    stops after its batch as Lightning does and tells the servers, which wait for its next
    command, to stop too; every rank exits as Lightning's SIGTERM exit, no PeerError."""
    code, out = _run_fault("sigterm-validate", "--steps", "8", rank=0, step=1, tmp_path=tmp_path)
    stopped = re.findall(r"rank (\d) stopped by SIGTERM after validation batch (\d+)", out)
    assert sorted(rank for rank, _ in stopped) == ["0", "1", "2"], out[-3000:]
    assert {batch for _, batch in stopped} == {"2"}, stopped
    assert code == 0 and "Timed out" not in out and "PeerError" not in out, out[-3000:]
