import itertools
import math
import random
import time

import pytest

from lightning_epipe.strategy.planning.solver import rank_loads, solve_balance
from lightning_epipe.strategy.planning.partition import num_stages_for, plan_pipeline

GiB = 2**30


def _compositions(n, k):
    """Every split of n layers into k non-empty stages."""
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        yield [b - a for a, b in zip(bounds, bounds[1:])]


def _memory_of(balance, mem, num_ranks, placement):
    plan = plan_pipeline(sum(balance), num_ranks, balance, placement)
    return [sum(mem[i] for i in plan.layers_of(r)) for r in range(num_ranks)]


def _brute(costs, num_ranks, placement, cuts=None, mem=None, caps=None):
    """The solver's documented order: max load, sum of loads, sum of squares, balance."""
    best = None
    for balance in _compositions(_num_layers(costs), num_stages_for(placement, num_ranks)):
        if mem is not None and any(m > c for m, c in zip(_memory_of(balance, mem, num_ranks, placement), caps)):
            continue
        loads = rank_loads(balance, costs, num_ranks, placement, cuts)
        key = (max(loads), sum(loads), sum(x * x for x in loads), balance)
        if best is None or key < best:
            best = key
    return best


def _num_layers(costs):
    return len(costs[0]) if isinstance(costs[0], list) else len(costs)


def test_client_server_optimum_when_head_plus_tail_is_no_contiguous_sum():
    # The client's best load 9 + 2 = 11 is no sum of consecutive costs (a binary search over
    # such sums, this module's predecessor, returned a split with 12); brute force says 11.
    costs = [9, 4, 4, 9, 1, 2]
    balance = solve_balance(costs, 3)
    assert balance == [1, 2, 2, 1]
    assert rank_loads(balance, costs, 3) == [11.0, 8.0, 10.0]
    assert _brute(costs, 3, "client-server")[0] == 11.0


def test_flat_costs_equal_the_same_costs_per_rank():
    costs = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    cuts = [1, 0, 2, 0, 1, 1, 0, 3, 1]
    assert solve_balance(costs, 3, cut_costs=cuts) == solve_balance([costs] * 3, 3, cut_costs=cuts)


def _random_case(rng, integer):
    placement = rng.choice(["client-server", "chain"])
    num_ranks = rng.randint(2, 3 if placement == "client-server" else 4)
    k = num_stages_for(placement, num_ranks)
    n = rng.randint(k, 9)

    def draw(lo, hi):
        return float(rng.randint(lo, hi)) if integer else rng.uniform(lo, hi)

    scale = [rng.choice([1, 1, 3, 10]) for _ in range(num_ranks)]  # heterogeneous processes
    costs = [[draw(0, 9) * scale[r] for _ in range(n)] for r in range(num_ranks)]
    cuts = [draw(0, 6) for _ in range(n - 1)] if rng.random() < 0.7 else None
    mem = caps = None
    if rng.random() < 0.6:
        mem = [draw(1, 5) for _ in range(n)]
        caps = [draw(3, 3 + 4 * n // k) for _ in range(num_ranks)]
    return costs, num_ranks, placement, cuts, mem, caps


@pytest.mark.parametrize("integer", [True, False])
def test_brute_force_confirms_optimality(integer):
    rng = random.Random(2024 + integer)
    infeasible = feasible = 0
    for _ in range(250):
        costs, num_ranks, placement, cuts, mem, caps = _random_case(rng, integer)
        best = _brute(costs, num_ranks, placement, cuts, mem, caps)
        if best is None:
            infeasible += 1
            with pytest.raises(ValueError, match="no balance fits the memory"):
                solve_balance(costs, num_ranks, placement, cuts, mem, caps)
            continue
        feasible += 1
        balance = solve_balance(costs, num_ranks, placement, cuts, mem, caps)
        assert len(balance) == num_stages_for(placement, num_ranks)
        assert min(balance) >= 1 and sum(balance) == len(costs[0])
        if mem is not None:
            assert all(m <= c for m, c in zip(_memory_of(balance, mem, num_ranks, placement), caps))
        loads = rank_loads(balance, costs, num_ranks, placement, cuts)
        assert max(loads) == pytest.approx(best[0], rel=1e-9, abs=1e-12)
        if integer:  # exact arithmetic: the documented tie-break is reproduced exactly
            assert balance == best[3], (costs, num_ranks, placement, cuts, mem, caps)
    assert feasible > 100 and infeasible > 3  # both branches were exercised


def test_tie_break_is_documented_order():
    # Homogeneous, no cuts: the sum of loads is constant, the sum of squares prefers even loads
    # ([1, 2, 3, 2] and [1, 3, 3, 1] tie on both), then the lexicographically smallest wins.
    assert solve_balance([1] * 8, 3, "client-server") == [1, 2, 3, 2]  # loads 3, 2, 3
    assert solve_balance([1] * 100, 4) == [1, 25, 25, 25, 24]
    # All zero: everything is optimal, the lexicographically smallest balance is returned.
    assert solve_balance([0] * 7, 3, "chain") == [1, 1, 5]


@pytest.mark.parametrize("placement", ["client-server", "chain"])
def test_slow_client_gets_fewer_layers(placement):
    n, num_ranks = 12, 3
    fast = solve_balance([1.0] * n, num_ranks, placement)
    slow = solve_balance([[10.0] * n, [1.0] * n, [1.0] * n], num_ranks, placement)
    plan_fast = plan_pipeline(n, num_ranks, fast, placement)
    plan_slow = plan_pipeline(n, num_ranks, slow, placement)
    assert len(plan_slow.layers_of(0)) < len(plan_fast.layers_of(0))
    assert len(plan_slow.layers_of(0)) == len(plan_slow.stages_of(0))  # one layer per client stage


def test_expensive_cut_is_avoided():
    costs = [1.0] * 8
    assert solve_balance(costs, 2, "chain") == [4, 4]
    cuts = [0.0] * 7
    cuts[3] = 10.0  # a cut after layer 3 (the even split) is expensive
    assert solve_balance(costs, 2, "chain", cut_costs=cuts) == [3, 5]
    assert max(rank_loads([3, 5], costs, 2, "chain", cuts)) == 5.0
    # client-server, 3 processes: the even [2, 2, 2, 2] would cut after layer 5 too
    cuts = [0.0, 0.0, 0.0, 0.0, 0.0, 10.0, 0.0]
    balance = solve_balance(costs, 3, cut_costs=cuts)
    assert 6 not in itertools.accumulate(balance)  # no stage boundary after layer 5
    assert max(rank_loads(balance, costs, 3, "client-server", cuts)) == 3.0


def test_cut_costs_count_on_both_ranks_and_both_client_stages():
    costs = [1, 2, 3, 4, 5, 6]
    loads = rank_loads([1, 2, 2, 1], costs, 3, "client-server", cut_costs=[1, 0, 0, 0, 1])
    assert loads == [1 + 1 + 6 + 1, 2 + 3 + 1, 4 + 5 + 1]
    assert rank_loads([2, 4], [[1] * 6, [2] * 6], 2, "chain", [0, 7, 0, 0, 0]) == [4 + 7, 4 + 7]


def test_memory_forces_a_layer_off_a_small_rank():
    costs, mem = [1.0] * 6, [1.0] * 6
    assert solve_balance(costs, 2, "chain") == [3, 3]
    # chain: stage 0 runs on rank 1, which holds only 2 layers
    assert solve_balance(costs, 2, "chain", layer_memory=mem, rank_memory=[10, 2]) == [2, 4]
    # client-server: a small client keeps one layer at each end
    balance = solve_balance([1.0] * 9, 2, layer_memory=[1.0] * 9, rank_memory=[2, 100])
    assert balance == [1, 7, 1]
    balance = solve_balance([1.0] * 9, 2)
    assert len(plan_pipeline(9, 2, balance).layers_of(0)) > 2


def test_infeasible_memory_raises_with_the_best_split():
    with pytest.raises(ValueError) as err:
        solve_balance([1.0] * 4, 2, "chain", layer_memory=[1 * GiB] * 4, rank_memory=[1 * GiB, 1 * GiB])
    msg = str(err.value)
    assert "no balance fits the memory: the best split [2, 2] needs 2.0 GiB on rank" in msg
    assert "which has 1.0 GiB" in msg
    # Unequal capacities: the best split puts 3 layers on the larger rank, and rank 1 is short.
    with pytest.raises(ValueError, match=r"best split \[1, 3\] needs 1\.0 GiB on rank 1 which has 0\.5 GiB"):
        solve_balance([1.0] * 4, 2, "chain", layer_memory=[1 * GiB] * 4, rank_memory=[2 * GiB, 0.5 * GiB])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(layer_costs=[1, 1, 1], num_ranks=3), r"cannot split 3 layers into 4 stages"),
        (dict(layer_costs=[1] * 6, num_ranks=1), r"at least 2 processes, got num_ranks=1"),
        (dict(layer_costs=[1] * 6, num_ranks=3, placement="ring"), r"placement must be one of"),
        (dict(layer_costs=[1, -1, 1, 1, 1], num_ranks=2), r"layer_costs\[1\] = -1\.0"),
        (dict(layer_costs=[1, 1, math.nan, 1], num_ranks=2), r"finite and non-negative"),
        (dict(layer_costs=[[1] * 5] * 3, num_ranks=2), r"3 rows but there are 2 processes"),
        (dict(layer_costs=[[1] * 5, [1] * 4], num_ranks=2), r"layer_costs\[1\] has 4 entries but needs 5"),
        (dict(layer_costs=[1] * 5, num_ranks=2, cut_costs=[1] * 5), r"cut_costs has 5 entries but needs 4"),
        (dict(layer_costs=[1] * 5, num_ranks=2, cut_costs=[1, math.inf, 1, 1]), r"cut_costs\[1\] = inf"),
        (dict(layer_costs=[1] * 5, num_ranks=2, layer_memory=[1] * 5), r"without rank_memory"),
        (dict(layer_costs=[1] * 5, num_ranks=2, rank_memory=[1, 1]), r"without layer_memory"),
        (
            dict(layer_costs=[1] * 5, num_ranks=2, layer_memory=[1] * 4, rank_memory=[9, 9]),
            r"layer_memory has 4 entries but needs 5",
        ),
        (
            dict(layer_costs=[1] * 5, num_ranks=2, layer_memory=[1] * 5, rank_memory=[9, 0]),
            r"rank_memory must be positive",
        ),
        (dict(layer_costs=[1] * 5, num_ranks=2, layer_memory=[1] * 5, rank_memory=[9]), r"needs 2"),
    ],
)
def test_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        solve_balance(**kwargs)


def test_rank_loads_validates_the_balance():
    with pytest.raises(ValueError, match="Sequential: 6, sum of balance: 7"):
        rank_loads([1, 2, 3, 1], [1] * 6, 3)


def test_speed_100_layers_four_ranks():
    rng = random.Random(3)
    n = 100
    costs = [[rng.uniform(1, 10) * (8 if r == 0 else 1) for _ in range(n)] for r in range(4)]
    cuts = [rng.uniform(0, 5) for _ in range(n - 1)]
    mem = [rng.uniform(1, 3) for _ in range(n)]
    for kwargs in ({}, dict(cut_costs=cuts), dict(cut_costs=cuts, layer_memory=mem, rank_memory=[60, 90, 90, 90])):
        start = time.perf_counter()
        balance = solve_balance(costs, 4, "client-server", **kwargs)
        assert time.perf_counter() - start < 2.0
        assert len(balance) == 5 and sum(balance) == n
    start = time.perf_counter()
    solve_balance([0.0] * n, 4)  # nothing to prune: the O(n^3 K) worst case
    assert time.perf_counter() - start < 2.0
