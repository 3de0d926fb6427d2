"""bind_cores=True: each process of a machine runs on its own share of the CPU cores."""

from __future__ import annotations

import json
import os
import re

import pytest

from lightning_epipe import EPipeStrategy
from lightning_epipe.strategy.core_binding import CoreBinding, core_shares
from tests.helpers import ROOT, run_ranks

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"
needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")


@pytest.mark.parametrize(("cores", "processes", "shares"), [
    ([0, 1], 2, [(0,), (1,)]),
    ([0, 1, 2, 3, 4, 5, 6, 7], 3, [(0, 1, 2), (3, 4, 5), (6, 7)]),
    ([6, 2, 4], 1, [(2, 4, 6)]),
    ([3, 5], 3, [(3,), (5,), (3,)]),  # fewer cores than processes: one core each, shared
])
def test_core_shares_are_contiguous_and_near_equal(cores, processes, shares):
    assert core_shares(cores, processes) == shares


def test_core_shares_refuse_nothing_to_split():
    with pytest.raises(ValueError, match="cannot split 0 cores among 2 processes"):
        core_shares([], 2)


def test_bind_cores_must_be_a_bool():
    with pytest.raises(ValueError, match="bind_cores must be True or False, got 'yes'"):
        EPipeStrategy(bind_cores="yes")


@needs_affinity
def test_binding_takes_a_share_and_restore_gives_the_cores_back():
    before = os.sched_getaffinity(0)
    binding = CoreBinding()
    try:
        share = binding.bind(len(before) - 1, len(before))  # the last local process: one core
        assert share == (max(before),) and os.sched_getaffinity(0) == {max(before)}
        assert binding.bind(0, 1) == tuple(sorted(before))  # shares come from the cores it had before
    finally:
        binding.restore()
    assert os.sched_getaffinity(0) == before and not binding.bound


@needs_affinity
def test_more_processes_than_cores_are_left_unbound():
    before = os.sched_getaffinity(0)
    binding = CoreBinding()
    assert binding.bind(0, len(before) + 1) is None
    assert os.sched_getaffinity(0) == before and not binding.bound


@needs_affinity
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_two_processes_run_on_disjoint_cores_gloo_threads_included(tmp_path):
    _, out = run_ranks(SCRIPT, "--out", tmp_path / "r.pt", "--devices", "2", "--steps", "2", "--bind-cores",
                       "--start-method", "popen", timeout=180)
    seen = {}
    # a thread map holds no braces inside; the other rank's output may follow it on the same line
    for rank, cores, threads in re.findall(r"rank (\d) cores (\[[\d, ]*\]) threads (\{[^{}]*\})", out):
        seen[int(rank)] = set(json.loads(cores))
        assert all(set(c) <= seen[int(rank)] for c in json.loads(threads).values()), "every thread stays on the share"
    shares = core_shares(sorted(os.sched_getaffinity(0)), 2)
    assert seen == {0: set(shares[0]), 1: set(shares[1])}


@needs_affinity
@pytest.mark.skipif(len(os.sched_getaffinity(0)) > 3, reason="starts one process more than the cores")
def test_more_processes_than_cores_train_unbound_and_say_so_once(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    _, out = run_ranks(SCRIPT, "--out", tmp_path / "r.pt", "--devices", str(len(cores) + 1), "--steps", "2",
                       "--bind-cores", "--start-method", "popen", timeout=240, env={"PYTHONWARNINGS": "default"})
    assert out.count("outnumber its cores; left unbound") == 1  # fit and the predict after it both set up
    reported = re.findall(r"rank \d cores (\[[\d, ]*\])", out)
    assert len(reported) == len(cores) + 1 and all(json.loads(c) == cores for c in reported)
