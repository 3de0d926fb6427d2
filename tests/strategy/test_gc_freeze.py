"""freeze_gc=True: every rank freezes what set-up left, so full collections skip it; teardown undoes it."""

from __future__ import annotations

import gc
import re

import pytest

from lightning_epipe import EPipeStrategy
from lightning_epipe.strategy.gc_freeze import FrozenGC
from tests.helpers import ROOT, run_ranks

SCRIPT = ROOT / "tests" / "strategy" / "scenario.py"


@pytest.fixture
def unfrozen():
    """A process with nothing frozen, before and after the test."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_freeze_moves_the_survivors_out_of_the_collectors_way_and_unfreeze_gives_them_back(unfrozen):
    frozen = FrozenGC()
    kept = [[] for _ in range(10)]  # containers alive at set-up
    frozen.freeze()
    assert frozen.frozen and gc.get_freeze_count() > len(kept)
    assert not any(o is kept[0] for o in gc.get_objects())  # in no generation: no collection traverses it
    count = gc.get_freeze_count()
    later = [[]]
    frozen.freeze()  # in place already: nothing more is frozen (frozen objects may still be freed)
    assert gc.get_freeze_count() <= count and any(o is later for o in gc.get_objects())
    frozen.unfreeze()
    assert not frozen.frozen and gc.get_freeze_count() == 0
    assert any(o is kept[0] for o in gc.get_objects(generation=2))


def test_a_process_that_froze_objects_itself_is_left_alone(unfrozen):
    gc.freeze()
    mine = gc.get_freeze_count()
    frozen = FrozenGC()
    frozen.freeze()
    frozen.unfreeze()  # not its freeze to undo: still in place (frozen objects may be freed meanwhile)
    assert not frozen.frozen and 0 < gc.get_freeze_count() <= mine


def test_cyclic_garbage_made_after_the_freeze_is_still_collected(unfrozen):
    frozen = FrozenGC()
    frozen.freeze()
    try:
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    finally:
        frozen.unfreeze()


def test_freeze_gc_must_be_a_bool():
    with pytest.raises(ValueError, match="freeze_gc must be True or False, got 'yes'"):
        EPipeStrategy(freeze_gc="yes")


@pytest.mark.parametrize(("flag", "frozen"), [((), True), (("--no-freeze-gc",), False)])
def test_every_rank_trains_frozen_and_teardown_unfreezes(tmp_path, flag, frozen):
    _, out = run_ranks(SCRIPT, "--out", tmp_path / "r.pt", "--devices", "2", "--steps", "2", "--print-gc",
                       "--start-method", "popen", *flag, timeout=180)
    training = {int(r): int(n) for r, n in re.findall(r"rank (\d) training frozen (\d+)", out)}
    after = {int(r): int(n) for r, n in re.findall(r"rank (\d) after fit frozen (\d+)", out)}
    assert set(training) == set(after) == {0, 1}, out[-3000:]
    assert all((n > 10_000) == frozen for n in training.values()), training  # the imports' objects and more
    assert after == {0: 0, 1: 0}
