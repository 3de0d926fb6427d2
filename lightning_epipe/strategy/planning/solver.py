"""Exact balance for heterogeneous processes, with cut costs and memory limits.

Pure planning like :mod:`~lightning_epipe.strategy.planning.partition`: plain Python numbers in,
layers per stage out; nothing here starts a process or touches a device.

Model (``n`` layers, ``R`` processes, ``K`` stages placed as in ``partition``: client-server
``(0, 1, ..., R-1, 0)``, chain ``(1, ..., R-1, 0)``):

- ``layer_costs[r][i]``: time of layer ``i`` when rank ``r`` runs it (one flat list means the
  same numbers on every rank).
- ``cut_costs[i]``: time a cut after layer ``i`` adds to *both* ranks it joins (the compressed
  activation forward and its gradient backward). The pipeline's ends (before layer 0, after
  layer ``n-1``) are no cuts.
- The *load* of a rank is the sum over its stages of the stage's layer costs on that rank plus
  the cut costs at the stage's two boundaries. Under client-server rank 0 runs the head and the
  tail, so both stages (and their boundaries) count towards its load.
- ``layer_memory[i]`` bytes per layer and ``rank_memory[r]`` capacities: a split where some rank
  holds more than its capacity is not allowed.

:func:`solve_balance` returns the split that minimizes the busiest rank's load (the pipeline's
clock period). Among optimal splits it breaks ties deterministically, in this order:

1. the smallest sum of all ranks' loads (less total work and traffic),
2. the smallest sum of squared rank loads (the non-bottleneck ranks as even as possible),
3. the lexicographically smallest balance.

Loads are compared with a relative tolerance of ``1e-9`` so that float rounding does not decide.

Algorithm: dynamic programming over (stage, end layer). Under client-server the client's load
couples head and tail, so the tail size ``t`` is enumerated; for a fixed ``t`` the rest is a chain
whose first stage carries the tail's load and memory as an offset. Phase 1 finds the optimal
bottleneck ``M*`` (min-max DP, pruned by the best value so far and by prefix sums: a stage's
compute only grows with its length); phase 2 minimizes ``(sum, sum of squares)`` over splits whose
every rank stays within ``M*`` (an additive DP, backward, so that phase 3 can read off the
lexicographically smallest split going forward). Worst case ``O(n^3 K)``; with the pruning a
100-layer, 5-stage problem takes a few tens of milliseconds.

Example:
    >>> solve_balance([1, 1, 1, 1, 1, 1], num_ranks=3)
    [1, 2, 2, 1]
    >>> slow_client = [[10] * 8, [1] * 8, [1] * 8]  # the client is 10x slower than the servers
    >>> balance = solve_balance(slow_client, num_ranks=3)
    >>> balance, rank_loads(balance, slow_client, 3)
    ([1, 3, 3, 1], [20.0, 3.0, 3.0])
    >>> solve_balance([1] * 6, 2, "chain", cut_costs=[0, 0, 5, 0, 5])  # avoid the expensive cuts
    [2, 4]
"""

from __future__ import annotations

import math
from typing import Sequence, Union

from lightning_epipe.strategy.planning.partition import PLACEMENTS, stage_ranks_for, plan_pipeline

__all__ = ["solve_balance", "rank_loads"]

Costs = Union[Sequence[float], Sequence[Sequence[float]]]

_INF = math.inf
_RTOL = 1e-9


def solve_balance(
    layer_costs: Costs,
    num_ranks: int,
    placement: str = "client-server",
    cut_costs: Sequence[float] | None = None,
    layer_memory: Sequence[float] | None = None,
    rank_memory: Sequence[float] | None = None,
) -> list[int]:
    """Layers per stage minimizing the busiest rank's load; see the module docstring for the model.

    Args:
        layer_costs: ``n`` non-negative times (same on every rank), or ``num_ranks`` lists of
            ``n`` times (``layer_costs[r][i]``: layer ``i`` on rank ``r``).
        num_ranks: processes (``>= 2``).
        placement: ``"client-server"`` (``num_ranks + 1`` stages) or ``"chain"`` (``num_ranks``).
        cut_costs: ``n - 1`` non-negative times, ``cut_costs[i]`` for a cut after layer ``i``,
            added to both ranks the cut joins.
        layer_memory: ``n`` non-negative byte counts; give ``rank_memory`` with it.
        rank_memory: ``num_ranks`` positive capacities in bytes (``math.inf``: no limit).

    Raises:
        ValueError: on malformed inputs, or when no split fits the memory (the message names
            the least overloaded split found and its worst rank).
    """
    stage_ranks, costs, cuts, n = _validate(layer_costs, num_ranks, placement, cut_costs)
    if (layer_memory is None) != (rank_memory is None):
        given, missing = ("layer_memory", "rank_memory") if rank_memory is None else ("rank_memory", "layer_memory")
        raise ValueError(f"{given} was given without {missing}: give both to limit memory, or neither")
    if layer_memory is not None:
        mem = _floats(layer_memory, "layer_memory", n, "one per layer")
        caps = _floats(rank_memory, "rank_memory", num_ranks, "one per process")  # type: ignore[arg-type]
        if not all(c > 0 for c in caps):
            raise ValueError(
                f"rank_memory must be positive capacities in bytes (math.inf for no limit), got {list(caps)}"
            )
    else:
        mem, caps = [0.0] * n, [_INF] * num_ranks

    prefix = [_prefix(c) for c in costs]
    mprefix = _prefix(mem)
    cut_at = [0.0, *cuts, 0.0]  # cut_at[b]: cost of a boundary before layer b (none at 0 and n)
    problem = _Problem(prefix, cut_at, mprefix, caps, stage_ranks, n, placement == "client-server")
    best = problem.bottleneck()
    if best == _INF:
        raise ValueError(_memory_message(mem, caps, stage_ranks, n, placement))
    return problem.tie_break(best)


def rank_loads(
    balance: Sequence[int],
    layer_costs: Costs,
    num_ranks: int,
    placement: str = "client-server",
    cut_costs: Sequence[float] | None = None,
) -> list[float]:
    """The load of every rank (index = rank) when the layers are split by ``balance``.

    Example:
        >>> rank_loads([1, 2, 2, 1], [1, 2, 3, 4, 5, 6], 3, cut_costs=[1, 0, 0, 0, 1])
        [9.0, 6.0, 10.0]
    """
    _, costs, cuts, n = _validate(layer_costs, num_ranks, placement, cut_costs)
    plan = plan_pipeline(n, num_ranks, balance, placement)
    cut_at = [0.0, *cuts, 0.0]
    loads = [0.0] * num_ranks
    for rank, (a, b) in zip(plan.stage_ranks, plan.bounds):
        loads[rank] += math.fsum(costs[rank][a:b]) + cut_at[a] + cut_at[b]
    return loads


class _Problem:
    """Prefix sums and placement of one solve; ``bottleneck`` then ``tie_break``."""

    def __init__(self, prefix, cut_at, mprefix, caps, stage_ranks, n, client_server):
        self.P, self.c, self.Q, self.caps = prefix, cut_at, mprefix, caps
        self.n, self.client_server = n, client_server
        # For client-server the chain part is (head, servers...), the tail is enumerated.
        self.ranks = stage_ranks[:-1] if client_server else stage_ranks

    def tails(self, limit: float):
        """``(t, tail load, tail memory)`` for every tail size whose tail alone fits ``limit``."""
        if not self.client_server:
            yield 0, 0.0, 0.0
            return
        n, P0, Q, c = self.n, self.P[0], self.Q, self.c
        for t in range(1, n - len(self.ranks) + 1):
            compute, tmem = P0[n] - P0[n - t], Q[n] - Q[n - t]
            if compute > limit or tmem > self.caps[0]:
                break  # both only grow with t
            load = compute + c[n - t]
            if load <= limit:
                yield t, load, tmem

    def bottleneck(self) -> float:
        """Phase 1: the smallest possible busiest-rank load (``inf``: nothing fits the memory)."""
        ub = _INF
        for t, load, tmem in self.tails(_INF):
            if load > ub:
                continue
            ub = min(ub, self._minmax(self.n - t, load, tmem, ub))
        return ub

    def _minmax(self, hi: int, off: float, offmem: float, ub: float) -> float:
        """Min over splits of layers ``[0, hi)`` into ``len(ranks)`` stages of the max stage load
        (stage 0 carrying ``off``/``offmem``); values above ``ub`` count as infeasible."""
        P, c, Q, caps, ranks = self.P, self.c, self.Q, self.caps, self.ranks
        S = len(ranks)
        P0, cap0 = P[ranks[0]], caps[ranks[0]] - offmem
        f = [_INF] * (hi + 1)
        for j in range(1, hi - S + 2) if S > 1 else (hi,):
            if Q[j] > cap0 or off + P0[j] > ub:
                break
            v = off + P0[j] + c[j]
            if v <= ub:
                f[j] = v
        for s in range(1, S):
            Pr, cap = P[ranks[s]], caps[ranks[s]]
            g = [_INF] * (hi + 1)
            for j in range(s + 1, hi - S + s + 2) if s < S - 1 else (hi,):
                Pj, cj, Qj, best = Pr[j], c[j], Q[j], _INF
                for a in range(j - 1, s - 1, -1):
                    comp = Pj - Pr[a]
                    if comp >= best or comp > ub or Qj - Q[a] > cap:
                        break  # a smaller a only adds compute and memory
                    fa = f[a]
                    if fa >= best:
                        continue
                    v = comp + c[a] + cj
                    if v < fa:
                        v = fa
                    if v < best and v <= ub:
                        best = v
                g[j] = best
            f = g
        return f[hi]

    def tie_break(self, best: float) -> list[int]:
        """Phases 2 and 3: among splits whose every rank load is <= ``best`` (up to rounding),
        the smallest (sum, sum of squares) of loads, then the lexicographically smallest."""
        limit = best + _RTOL * abs(best) + 1e-12
        K = len(self.ranks) + (1 if self.client_server else 0)
        tol_s = _RTOL * K * abs(best) + 1e-12
        tol_q = _RTOL * K * best * best + 1e-12
        tables = []
        for t, load, tmem in self.tails(limit):
            table = self._min_sum(self.n - t, load, tmem, limit, tol_s, tol_q)
            if table[0][0] is not None:
                tables.append((t, load, tmem, table))
        assert tables, "phase 1 found a split, phase 2 must too"
        opt_s = min(tb[0][0][0] for *_, tb in tables)
        near = [x for x in tables if x[3][0][0][0] <= opt_s + tol_s]
        opt_q = min(tb[0][0][1] for *_, tb in near)
        out = []
        for t, load, tmem, table in near:
            s0, q0 = table[0][0]
            if q0 <= opt_q + tol_q:
                head_mid = self._lex_first(self.n - t, load, tmem, limit, table, s0 + tol_s, q0 + tol_q, tol_s, tol_q)
                out.append(head_mid + ([t] if self.client_server else []))
        return min(out)

    def _stage(self, s, a, b, off, offmem, limit):
        """``(load, load**2)`` of stage ``s`` on layers ``[a, b)``, ``None`` if over a limit,
        ``False`` if over a limit that only grows with ``b``."""
        r = self.ranks[s]
        Pr = self.P[r]
        comp = Pr[b] - Pr[a]
        if s == 0:
            comp += off
        if comp > limit or self.Q[b] - self.Q[a] + (offmem if s == 0 else 0.0) > self.caps[r]:
            return False
        v = comp + self.c[a] + self.c[b]
        return None if v > limit else v

    def _min_sum(self, hi, off, offmem, limit, tol_s, tol_q):
        """``table[s][a]``: smallest ``(sum, sum of squares)`` of loads of stages ``s..S-1``
        on layers ``[a, hi)`` (stage 0 only from ``a = 0``), ``None`` if infeasible."""
        S = len(self.ranks)
        table: list[list] = [[None] * (hi + 1) for _ in range(S)]
        last = table[S - 1]
        for a in range(hi - 1, S - 2, -1) if S > 1 else (0,):
            v = self._stage(S - 1, a, hi, off, offmem, limit)
            if v is False:
                break
            if v is not None:
                last[a] = (v, v * v)
        for s in range(S - 2, -1, -1):
            nxt, row = table[s + 1], table[s]
            for a in range(s, hi - S + s + 1) if s > 0 else (0,):
                best = None
                for b in range(a + 1, hi - S + s + 2):
                    v = self._stage(s, a, b, off, offmem, limit)
                    if v is False:
                        break
                    rest = nxt[b]
                    if v is None or rest is None:
                        continue
                    cand = (v + rest[0], v * v + rest[1])
                    if best is None or _better(cand, best, tol_s, tol_q):
                        best = cand
                row[a] = best
        return table

    def _lex_first(self, hi, off, offmem, limit, table, budget_s, budget_q, tol_s, tol_q):
        """The lexicographically smallest split of ``[0, hi)`` within the sum budgets."""
        S = len(self.ranks)
        sizes, a = [], 0
        for s in range(S - 1):
            for b in range(a + 1, hi - S + s + 2):
                v = self._stage(s, a, b, off, offmem, limit)
                if v is False:
                    break
                rest = table[s + 1][b]
                if v is None or rest is None:
                    continue
                if v + rest[0] <= budget_s + tol_s and v * v + rest[1] <= budget_q + tol_q:
                    sizes.append(b - a)
                    budget_s, budget_q, a = budget_s - v, budget_q - v * v, b
                    break
            else:  # pragma: no cover - the table guarantees a completion
                raise AssertionError("no completion within the budget")
        sizes.append(hi - a)
        return sizes


def _better(x, y, tol_s, tol_q) -> bool:
    if x[0] < y[0] - tol_s:
        return True
    return x[0] <= y[0] + tol_s and x[1] < y[1] - tol_q


def _prefix(values: Sequence[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


def _floats(values, name: str, length: int, what: str) -> list[float]:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a sequence of numbers, got {values!r}") from err
    if len(out) != length:
        raise ValueError(f"{name} has {len(out)} entries but needs {length} ({what}), got {list(values)}")
    if name == "rank_memory":
        if any(math.isnan(v) for v in out):
            raise ValueError(f"{name} must not contain NaN, got {out}")
        return out
    bad = [(i, v) for i, v in enumerate(out) if not math.isfinite(v) or v < 0]
    if bad:
        i, v = bad[0]
        raise ValueError(
            f"{name} must be finite and non-negative, got {name}[{i}] = {v} ({len(bad)} bad entries):"
            " measure again or clamp it"
        )
    return out


def _validate(layer_costs, num_ranks, placement, cut_costs):
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 2:
        raise ValueError(
            f"a pipeline needs at least 2 processes, got num_ranks={num_ranks!r}: set `devices=2` or more"
            " (or `num_nodes`), or train without EPipeStrategy"
        )
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    stage_ranks = stage_ranks_for(placement, num_ranks)
    rows = list(layer_costs)
    per_rank = bool(rows) and all(hasattr(r, "__len__") for r in rows)
    if per_rank:
        if len(rows) != num_ranks:
            raise ValueError(
                f"layer_costs has {len(rows)} rows but there are {num_ranks} processes: give one list of"
                " layer costs per rank, or one flat list used on every rank"
            )
        n = len(rows[0])
        costs = [
            _floats(row, f"layer_costs[{r}]", n, "one per layer, like layer_costs[0]") for r, row in enumerate(rows)
        ]
    else:
        n = len(rows)
        costs = [_floats(rows, "layer_costs", n, "one per layer")] * num_ranks
    k = len(stage_ranks)
    if n < k:
        raise ValueError(
            f"cannot split {n} layers into {k} stages ({num_ranks} processes, placement={placement!r}):"
            f" use fewer processes or a Sequential with at least {k} children"
        )
    if cut_costs is None:
        cuts = [0.0] * (n - 1)
    else:
        cuts = _floats(cut_costs, "cut_costs", n - 1, "one per gap between layers")
    return stage_ranks, costs, cuts, n


def _gib(x: float) -> str:
    return "unlimited" if x == _INF else f"{x / 2**30:.1f} GiB"


def _memory_message(mem, caps, stage_ranks, n, placement) -> str:
    """Find the split with the smallest worst ratio of memory to capacity and describe it."""
    ratio = [_prefix([m / cap for m in mem]) for cap in caps]
    zeros = [0.0] * (n + 1)
    problem = _Problem(ratio, zeros, zeros, [_INF] * len(caps), stage_ranks, n, placement == "client-server")
    balance = problem.tie_break(problem.bottleneck())
    plan = plan_pipeline(n, len(caps), balance, placement)
    need = [math.fsum(mem[i] for i in plan.layers_of(r)) for r in range(len(caps))]
    worst = max(range(len(caps)), key=lambda r: need[r] / caps[r])
    return (
        f"no balance fits the memory: the best split {balance} needs {_gib(need[worst])} on rank {worst}"
        f" which has {_gib(caps[worst])}; per rank it needs {[_gib(x) for x in need]} of"
        f" {[_gib(x) for x in caps]}. Use more processes, smaller micro-batches or a smaller model,"
        " or give the ranks more memory"
    )
