"""Lightning's per-step SIGTERM broadcast, posted by the client without waiting for it.

Lightning (2.5 and later) starts every training batch with a ``torch.distributed.broadcast``
of rank 0's SIGTERM flag (``_TrainingEpochLoop._broadcast_sigterm_tensor``) so that every
rank stops at the same step. On rank 0 of a pipeline that broadcast is a barrier at every
step boundary: the client waits there until the slowest stage has finished its step, so
its work between steps (the next batch, Lightning's hooks, the first sends) cannot overlap
the servers' last backward and optimizer step.

:class:`AsyncSigtermBroadcast` replaces the method on rank 0's loop: it posts the same
broadcast (``async_op=True``) and waits for the one of the step before, which the other
ranks received before they served that step. The other ranks keep Lightning's method and
wait in it as before, where they would wait for the client's first message anyway. Every
rank still runs one broadcast per step and one ``barrier`` before ``SIGTERMException``, so
the broadcasts Lightning's SIGTERM handler adds pair up as they do without the pipeline.

Lightning's SIGTERM handler broadcasts too, from inside the signal handler, on whichever
rank receives the signal. A pipeline rank spends its time in blocking waits for its peers,
where Python runs no signal handler, so that broadcast waits for a peer that waits for it
(until the timeout, with or without this class). :func:`quiet_sigterm_handler` makes the
handler only record the signal and pass it on to the launcher's other ranks, as Lightning's
does; the per-step broadcast carries rank 0's flag, and each rank also stops after the step
in which it received the signal (Lightning's own check at the end of every batch).

Lightning offers no hook for either: the methods are replaced on the instances (before
Lightning registers its handlers, which happens after ``Strategy.setup``) and the loop's is
given back by :meth:`AsyncSigtermBroadcast.uninstall`.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist
from lightning.pytorch.utilities.exceptions import SIGTERMException

__all__ = ["AsyncSigtermBroadcast", "quiet_sigterm_handler"]

_METHOD = "_broadcast_sigterm_tensor"
log = logging.getLogger(__name__)


def quiet_sigterm_handler(trainer: Any) -> None:
    """Make ``trainer``'s SIGTERM handler record the signal and pass it to the other local
    ranks without a collective (Lightning's broadcasts from inside the handler)."""
    connector = trainer._signal_connector

    def notify(signum: int, frame: Any) -> None:
        log.info("rank %d: received SIGTERM (%d); stopping at the end of this training batch", trainer.global_rank, signum)
        if not connector.received_sigterm and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)
        connector.received_sigterm = True

    if callable(getattr(connector, "_sigterm_notifier_fn", None)):
        connector._sigterm_notifier_fn = notify


class AsyncSigtermBroadcast:
    """Rank 0's per-step SIGTERM broadcast, posted without waiting for the other ranks."""

    def __init__(self, trainer: Any, device: torch.device, timeout: timedelta) -> None:
        self.trainer, self.device, self.timeout = trainer, device, timeout
        self._pending: Optional[tuple[Any, torch.Tensor]] = None  # the last broadcast and its tensor

    def install(self) -> bool:
        """Take over the epoch loop's broadcast; False where Lightning has none (older versions)."""
        loop = self.trainer.fit_loop.epoch_loop
        if not callable(getattr(type(loop), _METHOD, None)):
            return False
        setattr(loop, _METHOD, self)
        return True

    def uninstall(self, wait: bool = True) -> None:
        """Give the loop Lightning's method back; ``wait``: after the last broadcast arrived."""
        if wait:
            self.finish()
        self._pending = None
        vars(self.trainer.fit_loop.epoch_loop).pop(_METHOD, None)

    def finish(self) -> None:
        """Wait until the other ranks have received the last broadcast (bounded by the timeout)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[0].wait(self.timeout)

    def __call__(self) -> None:
        received = bool(getattr(self.trainer, "received_sigterm", False))
        flag = torch.tensor([int(received)], device=self.device)
        self.finish()  # the step before's: done since the other ranks began that step
        self._pending = (dist.broadcast(flag, src=0, async_op=True), flag)
        if received:  # as Lightning does on every rank: agree, then stop
            self.finish()
            with contextlib.suppress(Exception):
                dist.barrier()
            raise SIGTERMException()
