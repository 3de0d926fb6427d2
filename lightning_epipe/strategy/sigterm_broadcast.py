"""Lightning's per-step SIGTERM broadcast without a barrier, and SIGTERM that stops a pipeline.

Lightning (2.5 and later) starts every training batch with a ``torch.distributed.broadcast``
of rank 0's SIGTERM flag (``_TrainingEpochLoop._broadcast_sigterm_tensor``) so that every
rank stops at the same step. On rank 0 of a pipeline that broadcast is a barrier at every
step boundary: the client waits there until the slowest stage has finished its step, so
its work between steps (the next batch, Lightning's hooks, the first sends) cannot overlap
the servers' last backward and optimizer step.

:class:`AsyncSigtermBroadcast` replaces the method on rank 0's loop: it posts the same
broadcast (``async_op=True``) and waits for the one of the step before, which the other
ranks received before they served that step. The other ranks keep Lightning's method and
wait in it as before, where they would wait for the client's first message anyway.

SIGTERM (a cluster preempting the job): Lightning's handler broadcasts from inside the
signal handler, on whichever rank receives the signal, and a pipeline rank blocked in a wait
for its peer runs no Python handler until the wait ends, so that broadcast hung until the
timeout. Lightning also stops each rank on its own after the batch in which the signal came,
and without a barrier between steps the client may be a batch ahead of the servers.
:func:`quiet_sigterm_handler` makes the handler pass the signal on to the launcher's other
ranks (as Lightning's does) and record it only where the per-step broadcast reads it (rank 0):
rank 0 broadcasts 1 at the start of its next training batch, and every rank stops there, on
the same step.

Lightning offers no hook for either: the methods are replaced on the instances (before
Lightning registers its signal handlers, which it does after ``Strategy.setup``), and the
loop's is given back by :meth:`AsyncSigtermBroadcast.uninstall`.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from lightning.pytorch.utilities.exceptions import SIGTERMException

__all__ = ["AsyncSigtermBroadcast", "quiet_sigterm_handler", "has_step_broadcast", "install_sigterm_handling"]

_METHOD = "_broadcast_sigterm_tensor"
log = logging.getLogger(__name__)


def has_step_broadcast(trainer: Any) -> bool:
    """Whether this Lightning starts every training batch with rank 0's SIGTERM broadcast."""
    return callable(getattr(type(trainer.fit_loop.epoch_loop), _METHOD, None))


def quiet_sigterm_handler(trainer: Any, record: Optional[Callable[[], None]]) -> None:
    """Make ``trainer``'s SIGTERM handler pass the signal to the launcher's other ranks and call
    ``record`` (``None``: nothing to record, rank 0 decides), without a collective."""
    connector = trainer._signal_connector
    forwarded = False

    def notify(signum: int, frame: Any) -> None:
        nonlocal forwarded
        log.info("rank %d: received SIGTERM (%d); every rank stops before rank 0's next training batch",
                 trainer.global_rank, signum)
        if not forwarded and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)
        forwarded = True
        if record is not None:
            record()

    if callable(getattr(connector, "_sigterm_notifier_fn", None)):
        connector._sigterm_notifier_fn = notify


class AsyncSigtermBroadcast:
    """Rank 0's per-step SIGTERM broadcast, posted without waiting for the other ranks."""

    def __init__(self, trainer: Any, device: torch.device, timeout: timedelta) -> None:
        self.trainer, self.device, self.timeout = trainer, device, timeout
        self.received = False  # SIGTERM came (:meth:`record`): the next training batch stops every rank
        self._pending: Optional[tuple[Any, torch.Tensor]] = None  # the last broadcast and its tensor

    def record(self) -> None:
        self.received = True

    def install(self) -> bool:
        """Take over the epoch loop's broadcast; False where Lightning has none (older versions)."""
        if not has_step_broadcast(self.trainer):
            return False
        setattr(self.trainer.fit_loop.epoch_loop, _METHOD, self)
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
        flag = torch.tensor([int(self.received)], device=self.device)
        self.finish()  # the step before's: done since the other ranks began that step
        self._pending = (dist.broadcast(flag, src=0, async_op=True), flag)
        if self.received:  # as Lightning does on every rank: agree, then stop
            self.finish()
            with contextlib.suppress(Exception):
                dist.barrier()
            raise SIGTERMException()


def install_sigterm_handling(trainer: Any, device: torch.device, timeout: timedelta, fitting: bool) -> Optional[AsyncSigtermBroadcast]:
    """No barrier at every step boundary, and SIGTERM that stops every rank on the same step.

    Returns rank 0's :class:`AsyncSigtermBroadcast` while fitting (``None`` elsewhere, or where
    this Lightning has no per-step broadcast); give it back with ``uninstall`` at teardown.
    """
    broadcast = None
    if fitting and trainer.global_rank == 0:
        candidate = AsyncSigtermBroadcast(trainer, device, timeout)
        broadcast = candidate if candidate.install() else None
    connector = trainer._signal_connector
    if broadcast is not None:
        record: Optional[Callable[[], None]] = broadcast.record
    elif trainer.global_rank != 0 and has_step_broadcast(trainer):
        record = None  # rank 0's broadcast decides
    else:
        record = lambda: setattr(connector, "received_sigterm", True)  # noqa: E731 - Lightning's own flag
    quiet_sigterm_handler(trainer, record)
    return broadcast
