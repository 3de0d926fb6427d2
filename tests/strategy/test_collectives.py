"""The collectives Lightning's hooks reach (broadcast, boolean agreement) in two real gloo processes,
and what a server iterates instead of the client's data."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_epipe.strategy.comm.collectives import agree, broadcast_plain
from lightning_epipe.strategy.server_data import ServerBatches, server_dataloader
from tests.helpers import free_port


def _rank(rank: int, port: int, results: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))
    device = torch.device("cpu")
    try:
        got = {
            "path": broadcast_plain(Path("/ckpt/epoch=1.ckpt") if rank == 0 else None, device),
            "value": broadcast_plain({"best": 0.25, "keys": [1, 2]} if rank == 1 else None, device, src=1),
            "all_yes": agree(True, device),
            "all_mixed": agree(rank == 0, device),
            "any_mixed": agree(rank == 0, device, every=False),
            "any_no": agree(False, device, every=False),
        }
        try:
            broadcast_plain(object() if rank == 0 else None, device)
            got["pickled"] = "no error"
        except TypeError as error:
            got["pickled"] = str(error)
        results[rank] = got
    finally:
        dist.destroy_process_group()


def test_broadcast_and_agreement_across_two_processes() -> None:
    results = mp.Manager().dict()
    context = mp.start_processes(_rank, args=(free_port(), results), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail("the two gloo processes did not finish within 120 s")
    for rank in (0, 1):
        got = results[rank]
        assert got["path"] == Path("/ckpt/epoch=1.ckpt") and isinstance(got["path"], Path)
        assert got["value"] == {"best": 0.25, "keys": [1, 2]}
        assert (got["all_yes"], got["all_mixed"], got["any_mixed"], got["any_no"]) == (True, False, True, False)
        assert "never pickles" in got["pickled"]
    assert "object" in results[0]["pickled"] and "rank 0 says which" in results[1]["pickled"]


def test_a_server_iterates_one_placeholder_per_client_batch() -> None:
    batches = server_dataloader([("x", "y")] * 5)
    assert isinstance(batches, ServerBatches) and len(batches) == 5 and list(batches) == [()] * 5
    stream = iter(range(3))  # no length: the server reads the data itself to keep the step count
    assert server_dataloader(stream) is stream
