"""``scenario.py`` with the clock read around a killed peer (not collected by pytest).

    python tests/strategy/killed_peer.py --out r.pt --fault kill --fault-rank 2 --fault-step 2

The killed rank prints ``killed at <time.time()>`` just before its SIGKILL; every other rank
prints ``<exception> at <time.time()>: <its message's first line>`` when the failure reaches
it, then re-raises. All print to the output Lightning's launcher shares between the ranks of
this machine.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.strategy import scenario  # noqa: E402


class TimedFault(scenario.InjectFault):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.kind == "kill" and trainer.global_rank == self.rank and trainer.global_step == self.step:
            print(f"killed at {time.time():.6f}", flush=True)
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)


if __name__ == "__main__":
    scenario.InjectFault = TimedFault
    try:
        scenario.main()
    except Exception as err:
        print(f"{type(err).__name__} at {time.time():.6f}: {(str(err).splitlines() or [''])[0]}", flush=True)
        raise  # its traceback may be cut short when the launcher kills the ranks, the line above is not
