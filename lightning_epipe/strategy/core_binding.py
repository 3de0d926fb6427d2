"""``bind_cores=True``: each pipeline process of a machine on its own share of the CPU cores.

Unbound, a pipeline process's threads (its compute thread and gloo's I/O thread, which reads
and writes the process's messages) run on whichever core the OS picks. When two processes
share the cores, a thread that holds gloo's connection lock or has a message to read can
sit behind another process's compute for milliseconds, and with it every stage that waits
for that message. Bound, process ``i`` of the machine's ``N`` (Lightning's local rank) runs
on the ``i``-th of ``N`` contiguous, near-equal shares of the cores it was started on, with
every thread it has and every thread or process it starts afterwards (gloo's, torch's, a
DataLoader's workers, which then share its cores): the binding happens before the process
group starts.
Where the processes outnumber the cores nothing is bound (single cores shared by several
processes stall them more than the OS's placement does). The process gets its cores back
at teardown.

Cores are split in order, not by NUMA node or by GPU affinity.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterable, Optional, Sequence

__all__ = ["core_shares", "CoreBinding", "check_bind_cores"]


def core_shares(cores: Sequence[int], processes: int) -> list[tuple[int, ...]]:
    """Split ``cores`` (CPU ids) into ``processes`` contiguous shares of sorted ids, as equal as
    they come (the first ``len(cores) % processes`` one core larger). With fewer cores than
    processes, process ``i`` gets core ``i % len(cores)`` (shared with others)."""
    if processes < 1 or not cores:
        raise ValueError(f"cannot split {len(cores)} cores among {processes} processes")
    cores = sorted(cores)
    if len(cores) < processes:
        return [(cores[i % len(cores)],) for i in range(processes)]
    size, extra = divmod(len(cores), processes)
    shares, start = [], 0
    for i in range(processes):
        end = start + size + (1 if i < extra else 0)
        shares.append(tuple(cores[start:end]))
        start = end
    return shares


def check_bind_cores(bind_cores: object) -> None:
    """Raise ValueError, with the fix, for a ``bind_cores`` this platform cannot apply."""
    if not isinstance(bind_cores, bool):
        raise ValueError(f"bind_cores must be True or False, got {bind_cores!r}")
    if bind_cores and not hasattr(os, "sched_setaffinity"):
        raise ValueError("bind_cores=True needs os.sched_setaffinity (Linux); pass bind_cores=False on this platform")


class CoreBinding:
    """One process's binding: :meth:`bind` before the process group starts, :meth:`restore` at teardown."""

    def __init__(self) -> None:
        self._before: Optional[set[int]] = None  # the cores this process had before bind

    @property
    def bound(self) -> bool:
        return self._before is not None

    def bind(self, local_rank: int, local_processes: int) -> Optional[tuple[int, ...]]:
        """Run this process (local process ``local_rank`` of ``local_processes``) on its share of
        the cores it had before; returns the share, or None (nothing bound) where the processes
        outnumber the cores: sharing single cores would stall them more than floating does."""
        before = self._before if self._before is not None else set(os.sched_getaffinity(0))
        if local_processes > len(before):
            return None
        self._before = before
        share = core_shares(sorted(before), local_processes)[local_rank]
        _set_every_thread(share)
        return share

    def restore(self) -> None:
        """Give the process, every thread it runs, the cores it had before :meth:`bind`."""
        if self._before is not None:
            _set_every_thread(self._before)
            self._before = None


def _set_every_thread(cores: Iterable[int]) -> None:
    """Affinity ``cores`` for every thread of this process (this one last: new threads copy it)."""
    cores = set(cores)
    me = threading.get_native_id()
    for tid in (int(t) for t in os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else ():
        if tid != me:
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(tid, cores)
    os.sched_setaffinity(0, cores)
