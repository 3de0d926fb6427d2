"""Pure planning: which layers form which stage, and which process runs which stage.

Nothing here starts a process or touches a device: the strategy calls these functions with
the module and the world size, and tests call them directly.

Placements (``R`` processes, ``K`` stages):

- ``"client-server"`` (the report's rule, default): ``K = R + 1``. Rank 0, the client, runs
  the first stage (the head) and the last stage (the tail) and computes the loss; ranks
  ``1..R-1``, the servers, run the middle. Raw inputs and labels never leave the client.
- ``"chain"``: ``K = R``. Ranks ``1..R-1`` run stages ``0..R-2`` and rank 0 runs the last
  stage and the loss; the inputs travel raw from rank 0 to rank 1. This is the textbook
  chain up to a relabelling of ranks, chosen so that Lightning's rank-0 logging and
  checkpointing sit where the loss is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from torch import nn

__all__ = ["Placement", "PipelinePlan", "find_pipeline", "plan_pipeline", "PLACEMENTS"]

Placement = Literal["client-server", "chain"]
PLACEMENTS: tuple[str, ...] = ("client-server", "chain")


@dataclass(frozen=True)
class PipelinePlan:
    """Layers of every stage and the rank that runs it.

    Example:
        >>> plan = plan_pipeline(num_layers=6, num_ranks=3, balance=[1, 2, 2, 1])
        >>> plan.stage_ranks, plan.bounds
        ((0, 1, 2, 0), ((0, 1), (1, 3), (3, 5), (5, 6)))
    """

    placement: str
    num_ranks: int
    balance: tuple[int, ...]
    stage_ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.balance) != len(self.stage_ranks):
            raise ValueError(f"balance has {len(self.balance)} stages but stage_ranks {len(self.stage_ranks)}")

    @property
    def num_stages(self) -> int:
        return len(self.balance)

    @property
    def num_layers(self) -> int:
        return sum(self.balance)

    @property
    def bounds(self) -> tuple[tuple[int, int], ...]:
        """``(start, stop)`` layer indices of every stage."""
        out, start = [], 0
        for n in self.balance:
            out.append((start, start + n))
            start += n
        return tuple(out)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages rank ``rank`` runs, in pipeline order."""
        return tuple(s for s, r in enumerate(self.stage_ranks) if r == rank)

    def layers_of(self, rank: int) -> tuple[int, ...]:
        """Indices of the Sequential's children that rank ``rank`` owns."""
        return tuple(i for s in self.stages_of(rank) for i in range(*self.bounds[s]))

    @property
    def input_rank(self) -> int:
        """Rank that runs stage 0 (it needs the micro-batch inputs)."""
        return self.stage_ranks[0]

    @property
    def num_cuts(self) -> int:
        return self.num_stages - 1

    def cut_ranks(self, cut: int, direction: str = "activation") -> tuple[int, int]:
        """``(sender, receiver)`` of the activations crossing cut ``cut`` (between stage cut and cut+1),
        or of its gradients (``direction="gradient"``: the other way)."""
        sender, receiver = self.stage_ranks[cut], self.stage_ranks[cut + 1]
        return (receiver, sender) if direction == "gradient" else (sender, receiver)


def stage_ranks_for(placement: str, num_ranks: int) -> tuple[int, ...]:
    if placement == "client-server":
        return (0, *range(1, num_ranks), 0)
    if placement == "chain":
        return (*range(1, num_ranks), 0)
    raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")


def num_stages_for(placement: str, num_ranks: int) -> int:
    """How many stages ``num_ranks`` processes form under ``placement``."""
    return len(stage_ranks_for(placement, num_ranks))


def plan_pipeline(
    num_layers: int, num_ranks: int, balance: Sequence[int], placement: str = "client-server"
) -> PipelinePlan:
    """Validate ``balance`` against the Sequential and the world size, and place the stages."""
    if num_ranks < 2:
        raise ValueError(
            f"a pipeline needs at least 2 processes, got {num_ranks}: set `devices=2` or more"
            " (or `num_nodes`), or train without EPipeStrategy"
        )
    ranks = stage_ranks_for(placement, num_ranks)
    balance = tuple(int(b) for b in balance)
    if len(balance) != len(ranks):
        raise ValueError(
            f"balance has {len(balance)} stages but {num_ranks} processes with placement={placement!r}"
            f" form {len(ranks)} stages: give {len(ranks)} numbers (balance={list(balance)})"
        )
    if any(b < 1 for b in balance):
        raise ValueError(f"every stage needs at least one layer, got balance={list(balance)}")
    if sum(balance) != num_layers:
        raise ValueError(
            f"the Sequential and sum of balance have different length"
            f" (Sequential: {num_layers}, sum of balance: {sum(balance)}, balance={list(balance)})"
        )
    return PipelinePlan(placement=placement, num_ranks=num_ranks, balance=balance, stage_ranks=ranks)


def find_pipeline(module: nn.Module, name: str | None = None) -> tuple[str, nn.Sequential]:
    """The ``nn.Sequential`` to pipeline: the attribute ``name``, or the only Sequential child."""
    if name is not None:
        target = module.get_submodule(name) if "." in name else getattr(module, name, None)
        if not isinstance(target, nn.Sequential):
            found = type(target).__name__ if target is not None else "nothing"
            raise ValueError(
                f"EPipeStrategy(pipeline={name!r}): {type(module).__name__}.{name} is {found}, not an"
                " nn.Sequential. Point `pipeline` at the Sequential attribute that holds the layers to split."
            )
        return name, target
    candidates = [(n, m) for n, m in module.named_children() if isinstance(m, nn.Sequential)]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ValueError(
            f"{type(module).__name__} has no nn.Sequential child to split into pipeline stages. Put the layers"
            " to pipeline in one `self.layers = nn.Sequential(...)` and call it from your steps."
        )
    names = [n for n, _ in candidates]
    raise ValueError(
        f"{type(module).__name__} has several nn.Sequential children {names}: choose one with"
        f" EPipeStrategy(pipeline={names[0]!r})"
    )
