from lightning_epipe.strategy.engine.schedule import Task, clock_cycles, ideal_efficiency, rank_tasks, recomputes


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


def _names(tasks):
    return [f"{t.phase[0].upper()}{t.stage}.{t.microbatch}" for t in tasks]


def test_stage_1f1b_warms_up_alternates_and_drains():
    from lightning_epipe.strategy.engine.schedule import stage_1f1b

    assert _names(stage_1f1b(0, 3, 4)) == ["F0.0", "F0.1", "F0.2", "B0.0", "F0.3", "B0.1", "B0.2", "B0.3"]
    assert _names(stage_1f1b(2, 3, 4)) == ["F2.0", "B2.0", "F2.1", "B2.1", "F2.2", "B2.2", "F2.3", "B2.3"]
    assert _names(stage_1f1b(0, 4, 2)) == ["F0.0", "F0.1", "B0.0", "B0.1"]   # fewer micro-batches than stages


def test_client_interleaves_its_head_and_tail():
    from lightning_epipe.strategy.engine.schedule import rank_tasks_1f1b

    order = rank_tasks_1f1b((0, 1, 0), 3)
    # by the simulated clock: the head's third forward runs while the server works on the first
    assert _names(order[0]) == ["F0.0", "F0.1", "F0.2", "F2.0", "B2.0", "F2.1", "B0.0", "B2.1", "F2.2", "B0.1",
                                "B2.2", "B0.2"]
    assert _names(order[1]) == ["F1.0", "F1.1", "B1.0", "F1.2", "B1.1", "B1.2"]


def _run(order, stage_ranks):
    """Execute every rank's list with blocking receives and asynchronous sends; the finishing order
    of the tasks, or AssertionError on a deadlock."""
    last = len(stage_ranks) - 1
    sent, done, position = set(), [], dict.fromkeys(order, 0)

    def needs(t):
        if t.phase == "forward":
            return None if t.stage == 0 else ("act", t.stage - 1, t.microbatch)
        return None if t.stage == last else ("grad", t.stage + 1, t.microbatch)

    while any(position[r] < len(order[r]) for r in order):
        progressed = False
        for r in order:
            while position[r] < len(order[r]):
                t = order[r][position[r]]
                need = needs(t)
                if t.phase == "backward" and t.stage == last and Task("forward", last, t.microbatch) not in done:
                    break
                if need is not None and need not in sent:
                    break
                sent.add(("act" if t.phase == "forward" else "grad", t.stage, t.microbatch))
                done.append(t)
                position[r] += 1
                progressed = True
        assert progressed, f"deadlock at {position}"
    return done


import pytest  # noqa: E402


@pytest.mark.parametrize("stage_ranks", [(0, 1, 0), (0, 1, 2, 0), (0, 1, 2, 3, 0), (1, 0), (1, 2, 0), (1, 2, 3, 0)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
def test_1f1b_never_deadlocks_and_bounds_the_micro_batches_in_flight(stage_ranks, m):
    from lightning_epipe.strategy.engine.schedule import rank_tasks_1f1b

    order = rank_tasks_1f1b(stage_ranks, m)
    k = len(stage_ranks)
    done = _run(order, stage_ranks)
    assert sorted(done, key=lambda t: (t.phase, t.stage, t.microbatch)) == sorted(
        [Task(p, s, i) for p in ("forward", "backward") for s in range(k) for i in range(m)],
        key=lambda t: (t.phase, t.stage, t.microbatch))
    for r, tasks in order.items():
        for s in {t.stage for t in tasks}:
            alive, peak = 0, 0
            for t in (t for t in tasks if t.stage == s):
                alive += 1 if t.phase == "forward" else -1
                peak = max(peak, alive)
            assert peak <= min(k - s, m)   # GPipe would hold all m
