import pytest
from torch import nn

from lightning_epipe.strategy.planning.layer_costs import balance_by_parameters, balance_by_time
from lightning_epipe.strategy.planning.solver import solve_balance
from lightning_epipe.strategy.planning.partition import find_pipeline, num_stages_for, plan_pipeline


def test_client_server_plan_puts_head_and_tail_on_rank_zero():
    plan = plan_pipeline(num_layers=6, num_ranks=3, balance=[1, 2, 2, 1])
    assert plan.stage_ranks == (0, 1, 2, 0)
    assert plan.bounds == ((0, 1), (1, 3), (3, 5), (5, 6))
    assert plan.layers_of(0) == (0, 5)
    assert plan.layers_of(2) == (3, 4)
    assert plan.cut_ranks(2) == (2, 0)


def test_chain_plan_puts_the_last_stage_on_rank_zero():
    plan = plan_pipeline(num_layers=6, num_ranks=3, balance=[2, 2, 2], placement="chain")
    assert plan.stage_ranks == (1, 2, 0)
    assert plan.input_rank == 1
    assert plan.stages_of(0) == (2,)


def test_balance_wrong_length():
    with pytest.raises(ValueError, match=r"balance has 3 stages but 3 processes .* form 4 stages"):
        plan_pipeline(6, 3, [2, 2, 2])


def test_balance_wrong_sum():
    with pytest.raises(ValueError, match=r"Sequential: 6, sum of balance: 7"):
        plan_pipeline(6, 3, [1, 2, 3, 1])


def test_balance_empty_stage():
    with pytest.raises(ValueError, match="at least one layer"):
        plan_pipeline(6, 3, [0, 3, 2, 1])


def test_one_process_is_not_a_pipeline():
    with pytest.raises(ValueError, match="at least 2 processes"):
        plan_pipeline(6, 1, [6])


def test_unknown_placement():
    with pytest.raises(ValueError, match="placement must be one of"):
        num_stages_for("ring", 3)


def test_more_stages_than_layers():
    with pytest.raises(ValueError, match="cannot split 3 layers into 4 stages"):
        solve_balance([1, 1, 1], 3)


@pytest.mark.parametrize(
    ("costs", "ranks", "placement", "expected"),
    [
        ([1] * 6, 3, "client-server", [1, 2, 2, 1]),
        ([5, 1, 1, 1, 1, 1, 1, 1, 5], 3, "client-server", [1, 3, 4, 1]),  # ties: the lexicographically smallest
        ([1, 1, 1, 1, 10, 1], 3, "chain", [4, 1, 1]),
        ([3, 3, 3, 3], 4, "chain", [1, 1, 1, 1]),
    ],
)
def test_solve_balance(costs, ranks, placement, expected):
    assert solve_balance(costs, ranks, placement) == expected


def test_solve_balance_minimizes_the_busiest_rank():
    costs = [4, 1, 1, 1, 1, 1, 1, 6]
    balance = solve_balance(costs, 3)
    plan = plan_pipeline(len(costs), 3, balance)
    load = {r: 0 for r in range(3)}
    for s, (a, b) in enumerate(plan.bounds):
        load[plan.stage_ranks[s]] += sum(costs[a:b])
    assert max(load.values()) == 10  # head 4 + tail 6 is the floor


def test_balance_by_parameters_and_time():
    seq = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
    assert balance_by_parameters(seq, 3) == [1, 2, 2, 1]
    import torch

    balance = balance_by_time(seq, torch.randn(4, 8), 3)
    assert sum(balance) == 6 and len(balance) == 4


class _NoSequential(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)


class _TwoSequentials(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(2, 2))
        self.b = nn.Sequential(nn.Linear(2, 2))


def test_find_pipeline_errors_name_the_fix():
    with pytest.raises(ValueError, match="no nn.Sequential child"):
        find_pipeline(_NoSequential())
    with pytest.raises(ValueError, match=r"several nn.Sequential children \['a', 'b'\].*pipeline='a'"):
        find_pipeline(_TwoSequentials())
    with pytest.raises(ValueError, match=r"_NoSequential.fc is Linear, not an nn.Sequential"):
        find_pipeline(_NoSequential(), "fc")
    assert find_pipeline(_TwoSequentials(), "b")[0] == "b"
