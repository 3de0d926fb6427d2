from lightning_epipe.strategy.schedule import Task, clock_cycles, ideal_efficiency, rank_tasks, recomputes


def test_clock_cycles_staircase():
    assert list(clock_cycles(3, 3)) == [
        [(0, 0)],
        [(1, 0), (0, 1)],
        [(2, 0), (1, 1), (0, 2)],
        [(2, 1), (1, 2)],
        [(2, 2)],
    ]


def test_clock_cycles_more_stages_than_microbatches():
    assert list(clock_cycles(1, 3)) == [[(0, 0)], [(0, 1)], [(0, 2)]]


def test_every_task_appears_once():
    cells = [c for tick in clock_cycles(5, 4) for c in tick]
    assert sorted(cells) == [(i, s) for i in range(5) for s in range(4)]


def test_rank_tasks_fill_then_drain():
    # the client-server client runs the first (0) and last (3) stage
    forward = rank_tasks((0, 3), 2, "forward")
    assert forward == [Task("forward", 0, 0), Task("forward", 0, 1), Task("forward", 3, 0), Task("forward", 3, 1)]
    backward = rank_tasks((0, 3), 2, "backward")
    assert backward == [Task("backward", 3, 1), Task("backward", 3, 0), Task("backward", 0, 1), Task("backward", 0, 0)]


def test_rank_tasks_rejects_unknown_phase():
    import pytest

    with pytest.raises(ValueError, match="phase"):
        rank_tasks((0,), 1, "sideways")


def test_ideal_efficiency():
    assert ideal_efficiency(4, 4) == 4 / 7
    assert ideal_efficiency(1, 1) == 1.0


def test_recomputation_policies():
    assert [recomputes("always", i, 3) for i in range(3)] == [True, True, True]
    assert [recomputes("except_last", i, 3) for i in range(3)] == [True, True, False]
    assert [recomputes("never", i, 3) for i in range(3)] == [False, False, False]
