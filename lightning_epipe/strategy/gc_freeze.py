"""``freeze_gc=True``: Python's full garbage collections leave out what existed at set-up.

A full (generation 2) collection traverses every container object of the process, hundreds
of thousands with torch and Lightning imported, and the rank computes and sends nothing
meanwhile: in a pipeline every other stage waits for it. CPython runs one every few hundred
steps of a training loop (when enough objects have outlived the younger collections), on each
rank at its own moment, so the pipeline stops as often as all its ranks together collect
(benchmarks/README.md, section 0, "Full garbage collections stop the pipeline"). At the end
of set-up every rank collects once and freezes what survives (``gc.freeze``): the imports,
the model, the optimizers and Lightning's loop go to a generation the collector never
traverses, and later collections scan only what the training created since. Cyclic garbage the training creates is
collected as before; a frozen object is still freed by reference counting when its last
reference goes, and one in a reference cycle once teardown unfreezes (``gc.unfreeze``). A
process that froze objects itself is left as it is.
"""

from __future__ import annotations

import gc

__all__ = ["FrozenGC", "check_freeze_gc"]


def check_freeze_gc(freeze_gc: object) -> None:
    """Raise ValueError for a ``freeze_gc`` that is not a bool."""
    if not isinstance(freeze_gc, bool):
        raise ValueError(f"freeze_gc must be True or False, got {freeze_gc!r}")


class FrozenGC:
    """One process's freeze: :meth:`freeze` at the end of set-up, :meth:`unfreeze` at teardown."""

    def __init__(self) -> None:
        self.frozen = False  # whether this freeze is in place (and so this object's to undo)

    def freeze(self) -> None:
        """Collect once, then freeze every object that survives; nothing where this process had
        frozen objects already (its own ``gc.freeze``, or this freeze still in place)."""
        if self.frozen or gc.get_freeze_count():
            return
        gc.collect()
        gc.freeze()
        self.frozen = True

    def unfreeze(self) -> None:
        """Give the frozen objects back to the collector (they join the oldest generation)."""
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
