"""Two "nodes" on loopback, started the way a cluster launcher starts them (one command per
node with MASTER_ADDR/MASTER_PORT/NODE_RANK), train exactly like one process."""

from __future__ import annotations

import torch

from tests.helpers import ROOT, run_nodes
from tests.strategy.scenario import reference

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"


def test_two_nodes_on_loopback(tmp_path):
    outputs = run_nodes(SCRIPT, tmp_path, "--devices", 1, "--steps", 4, "--start-method", "popen")
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1]
    got = torch.load(tmp_path / "node0.pt", weights_only=False)
    ref = reference(steps=4, batch_size=16)
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref.losses), rtol=1e-5, atol=1e-6)
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got["state_dict"][name], value, rtol=1e-5, atol=1e-6)
