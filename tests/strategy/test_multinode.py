"""Two "nodes" on loopback, started the way a cluster launcher starts them (one command per
node with MASTER_ADDR/MASTER_PORT/NODE_RANK), train exactly like one process."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from tests.helpers import ROOT, free_port, run_ranks
from tests.strategy.scenario import reference

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"


def test_two_nodes_on_loopback(tmp_path):
    port = str(free_port())
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(
                run_ranks, SCRIPT, "--out", tmp_path / f"node{node}.pt", "--devices", 1, "--num-nodes", 2, "--steps", 4,
                timeout=240, env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NODE_RANK": str(node)},
            )
            for node in (0, 1)
        ]
        outputs = [r.result()[1] for r in runs]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]
    got = torch.load(tmp_path / "node0.pt", weights_only=False)
    ref = reference(steps=4, batch_size=16)
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref.losses), rtol=1e-5, atol=1e-6)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got["state_dict"][name], value, rtol=1e-5, atol=1e-6)
