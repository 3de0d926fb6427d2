"""Lightning's per-step SIGTERM broadcast, carried by the pipeline's commands.

Lightning (2.5 and later) starts every training batch with a ``torch.distributed.broadcast``
of rank 0's SIGTERM flag (``_TrainingEpochLoop._broadcast_sigterm_tensor``) so that every
rank stops at the same step. In a pipeline that collective costs at every step boundary: on
rank 0 it is a barrier (the client waits there until the slowest stage has finished its step,
so its work between steps cannot overlap the servers' last backward and optimizer step), and
on the rank of the first stage, whose step boundary is the critical path of a pipeline with
few micro-batches, it takes longer than a message (traced with the broadcast in place:
0.36-0.48 ms a step on the first stage's rank, up to 1.41 ms on the third of three ranks;
benchmarks/README.md, section 0).

:class:`StepStartSignal` replaces the method on every rank of a pipeline while fitting. The
client sends each server ``BATCH_START`` on its command connection (or ``STOP`` once SIGTERM
came), a send that waits for nothing; a server reads it where Lightning would broadcast, and
stops there on ``STOP``. Every rank thus stops before the same batch, before any hook of it
(``on_train_batch_start`` may hold a collective: ``compressor="auto"``'s), and no rank waits
in a collective between steps. With ``replicas > 1`` the clients of the replicas still agree
on rank 0's flag by a broadcast among themselves (rank 0 posts it without waiting, and waits
for it one step later).

SIGTERM (a cluster preempting the job): Lightning's handler broadcasts from inside the signal
handler, on whichever rank receives the signal, and a pipeline rank blocked in a wait
for its peer runs no Python handler until the wait ends, so that broadcast hung until the
timeout. Lightning also stops each rank on its own after the batch in which the signal came,
and without a barrier between steps the client may be a batch ahead of the servers.
:func:`quiet_sigterm_handler` makes the handler pass the signal on to the launcher's other
ranks (as Lightning's does) and record it only where the per-step signal reads it (rank 0):
rank 0's next training batch stops every rank, on the same step.

Lightning offers no hook for either: the methods are replaced on the instances (before
Lightning registers its signal handlers, which it does after ``Strategy.setup``), and the
loop's is given back by :meth:`StepStartSignal.uninstall`.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_epipe.strategy.comm.wire import Command, WireError
from lightning_epipe.strategy.engine.runtime import PipelineRuntime

__all__ = ["StepStartSignal", "quiet_sigterm_handler", "has_step_broadcast", "install_sigterm_handling"]

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


class _ClientFlags:
    """``replicas > 1``: rank 0's SIGTERM flag broadcast to the clients of every replica
    (``group``); rank 0 posts it without waiting and waits for it one step later."""

    def __init__(self, group: Any, device: torch.device, timeout: timedelta, is_source: bool) -> None:
        self.group, self.device, self.timeout, self.is_source = group, device, timeout, is_source
        self._pending: Optional[tuple[Any, torch.Tensor]] = None  # rank 0: the last broadcast and its tensor

    def agree(self, received: bool) -> bool:
        """Rank 0's ``received``, on every client."""
        flag = torch.tensor([int(received)], device=self.device)
        if not self.is_source:
            dist.broadcast(flag, src=0, group=self.group)
            return bool(flag.item())
        self.finish()  # the step before's: done since the other clients began that step
        self._pending = (dist.broadcast(flag, src=0, group=self.group, async_op=True), flag)
        return received

    def finish(self) -> None:
        """Rank 0: wait until the other clients have received the last broadcast (bounded by the timeout)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[0].wait(self.timeout)


class StepStartSignal:
    """The start of a training batch on one rank of a pipeline: the client tells its servers to
    go on (``BATCH_START``) or to stop (``STOP``); a server reads which."""

    def __init__(self, trainer: Any, runtime: PipelineRuntime, clients: Optional[_ClientFlags] = None) -> None:
        self.trainer, self.runtime, self.clients = trainer, runtime, clients
        self.received = False  # rank 0: SIGTERM came (:meth:`record`); the next training batch stops every rank

    @property
    def is_client(self) -> bool:
        return self.runtime.rank == 0

    def record(self) -> None:
        self.received = True

    def install(self) -> bool:
        """Take over the epoch loop's broadcast; False where Lightning has none (older versions)."""
        if not has_step_broadcast(self.trainer):
            return False
        setattr(self.trainer.fit_loop.epoch_loop, _METHOD, self)
        return True

    def uninstall(self, wait: bool = True) -> None:
        """Give the loop Lightning's method back; ``wait``: after rank 0's last broadcast to the
        other clients arrived (``replicas > 1``)."""
        if wait and self.clients is not None:
            self.clients.finish()
        vars(self.trainer.fit_loop.epoch_loop).pop(_METHOD, None)

    def __call__(self) -> None:
        if not self.is_client:
            if self.runtime.started_ahead:  # read with the step's FORWARD (server_loop.start_next_step)
                return
            command = self.runtime.next_command().command
            if command == Command.STOP:
                raise SIGTERMException()
            if command != Command.BATCH_START:
                raise WireError(f"pipeline rank {self.runtime.rank}: {command.name} where a training batch starts"
                                " (BATCH_START or STOP): the client and this rank run different steps")
            return
        stop = self.clients.agree(self.received) if self.clients is not None else self.received
        self.runtime.command(Command.STOP if stop else Command.BATCH_START)
        if stop:  # as Lightning does on every rank once the flag is agreed: stop before this batch
            self.runtime.transport.flush()
            if self.clients is not None:
                self.clients.finish()
            raise SIGTERMException()


def install_sigterm_handling(trainer: Any, runtime: PipelineRuntime, device: torch.device, timeout: timedelta,
                             fitting: bool, clients_group: Any = None) -> Optional[StepStartSignal]:
    """No collective at every step boundary, and SIGTERM that stops every rank on the same step.

    Returns this rank's :class:`StepStartSignal` while fitting (``None`` elsewhere, or where this
    Lightning has no per-step broadcast); give it back with ``uninstall`` at teardown.
    ``clients_group``: on a client with ``replicas > 1``, the clients of every replica (else ``None``).
    """
    signal = None
    if fitting:
        clients = None
        if clients_group is not None:
            clients = _ClientFlags(clients_group, device, timeout, is_source=trainer.global_rank == 0)
        candidate = StepStartSignal(trainer, runtime, clients)
        signal = candidate if candidate.install() else None
    connector = trainer._signal_connector
    if signal is not None and trainer.global_rank == 0:
        record: Optional[Callable[[], None]] = signal.record
    elif trainer.global_rank != 0 and has_step_broadcast(trainer):
        record = None  # rank 0 decides (outside fit: the client's STOP after its batch)
    else:
        record = lambda: setattr(connector, "received_sigterm", True)  # noqa: E731 - Lightning's own flag
    quiet_sigterm_handler(trainer, record)
    return signal
