"""The collectives Lightning's hooks reach (broadcast, boolean agreement) and the link probe of
balance="time" in two real gloo processes, and what a server iterates instead of the client's data."""

from __future__ import annotations

from pathlib import Path

import torch

from lightning_epipe.strategy.comm.collectives import agree, broadcast_plain, probe_bandwidth
from lightning_epipe.strategy.server_data import ServerBatches, server_dataloader
from tests.helpers import run_two_gloo_ranks


def _rank(rank: int) -> dict:
    device = torch.device("cpu")
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
    return got


def test_broadcast_and_agreement_across_two_processes() -> None:
    results = run_two_gloo_ranks(_rank)
    for rank in (0, 1):
        got = results[rank]
        assert got["path"] == Path("/ckpt/epoch=1.ckpt") and isinstance(got["path"], Path)
        assert got["value"] == {"best": 0.25, "keys": [1, 2]}
        assert (got["all_yes"], got["all_mixed"], got["any_mixed"], got["any_no"]) == (True, False, True, False)
        assert "never pickles" in got["pickled"]
    assert "object" in results[0]["pickled"] and "rank 0 says which" in results[1]["pickled"]


def _probe_from_a_device_gloo_cannot_send(rank: int) -> float | None:
    # "meta" stands in for a GPU: gloo carries host memory only, so the probe's messages must be there
    return probe_bandwidth(0, 1, 1 << 16, rank, torch.device("meta"))


def test_the_link_probe_sends_host_memory_on_gloo_whatever_the_device() -> None:
    results = run_two_gloo_ranks(_probe_from_a_device_gloo_cannot_send)
    assert results[0] > 0 and results[1] is None


def test_a_server_iterates_one_placeholder_per_client_batch() -> None:
    batches = server_dataloader([("x", "y")] * 5)
    assert isinstance(batches, ServerBatches) and len(batches) == 5 and list(batches) == [()] * 5
    stream = iter(range(3))  # no length: the server reads the data itself to keep the step count
    assert server_dataloader(stream) is stream
