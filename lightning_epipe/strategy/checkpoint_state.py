"""What a checkpoint holds of a pipeline, and how each rank gets its part back.

Every rank owns some layers (the others are meta tensors there) and the optimizer state of
their parameters, plus state of its own: codec streams (error feedback, delta caches), its
RNG, the bottlenecks' halves. Saving gathers all of it on rank 0 through the control
stream (:func:`~lightning_epipe.strategy.comm.collectives.gather_tensors`, no pickle); the
model's state dict is the plain module's (it loads without the strategy), and the rest goes
under ``checkpoint["epipe"]``::

    {"balance": [...], "placement": "...", "ranks": {"<global rank>": {"codecs": ..., "rng": ...}},
     "bottlenecks": {...}, "auto": {...}}

Loading: every rank reads the file; each keeps the optimizer state of the parameters it owns,
its own codec and RNG state, provided the split is the one it was saved with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

import torch
from lightning.fabric.utilities.optimizer import _optimizer_to_device
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from torch.optim import Optimizer

from lightning_epipe.strategy.compression.bottleneck_layers import ATTRIBUTE as BOTTLENECKS
from lightning_epipe.strategy.compression.bottleneck_layers import split_bottleneck_state
from lightning_epipe.strategy.comm.collectives import gather_tensors
from lightning_epipe.strategy.comm.transport import Transport

__all__ = ["PipelineCheckpoint", "CheckpointRank", "flatten_state", "unflatten_state", "owned_state", "gather_model_state", "gather_optimizer_state",
           "load_owned_optimizer_state", "local_extra_state", "extra_state", "rank_resume_state", "restore_rng"]


def flatten_state(state: Any, prefix: str = "") -> dict[str, Tensor]:
    """``{"a": {"b": t}}`` -> ``{"a/b": t}``; Python numbers become 0-d tensors tagged by dtype."""
    out: dict[str, Tensor] = {}
    if isinstance(state, dict):
        for key, value in state.items():
            out.update(flatten_state(value, f"{prefix}{key}/"))
    elif isinstance(state, Tensor):
        out[prefix[:-1]] = state
    elif isinstance(state, bool):
        out[prefix[:-1] + "#bool"] = torch.tensor(state)
    elif isinstance(state, int):
        out[prefix[:-1] + "#int"] = torch.tensor(state, dtype=torch.int64)
    elif isinstance(state, float):
        out[prefix[:-1] + "#float"] = torch.tensor(state, dtype=torch.float64)
    elif state is not None:
        raise TypeError(f"cannot move state entry {prefix[:-1]!r} of type {type(state).__name__} between ranks")
    return out


def unflatten_state(flat: dict[str, Tensor], int_keys: bool = False) -> dict[str, Any]:
    """Inverse of :func:`flatten_state` (``int_keys`` turns digit keys back into ints)."""
    out: dict[Any, Any] = {}
    for name, value in flat.items():
        if "#" in name:
            name, tag = name.rsplit("#", 1)
            value = {"bool": bool, "int": int, "float": float}[tag](value.item())
        parts = name.split("/")
        node = out
        for part in parts[:-1]:
            key = int(part) if int_keys and part.isdigit() else part
            node = node.setdefault(key, {})
        last = parts[-1]
        node[int(last) if int_keys and last.isdigit() else last] = value
    return out


def owned_state(module: nn.Module, pipeline_attr: Optional[str], owned_layers: Optional[Iterable[int]]) -> dict[str, Tensor]:
    """The real (non-meta) entries of ``module``'s state dict that this rank owns: all of them on
    the client (``owned_layers=None``), else the layers ``owned_layers`` of the Sequential at
    ``pipeline_attr`` and the bottlenecks' halves."""
    state = module.state_dict()
    if owned_layers is None:
        return {k: v for k, v in state.items() if not v.is_meta}
    prefix = f"{pipeline_attr}."
    owned = {str(i) for i in owned_layers}
    return {
        k: v for k, v in state.items()
        if not v.is_meta and (k.startswith(BOTTLENECKS + ".") or k.startswith(prefix) and k[len(prefix):].split(".", 1)[0] in owned)
    }


def gather_model_state(transport: Transport, world_size: int, module: nn.Module,
                       owned: dict[str, Tensor]) -> Optional[tuple[dict[str, Tensor], dict[str, Tensor]]]:
    """Every rank's ``owned`` weights merged on rank 0 as ``(model state, bottleneck state)``, in
    the module's key order (``None`` elsewhere; a collective)."""
    full = module.state_dict()
    merged = gather_tensors(transport, world_size, owned)
    if merged is None:
        return None
    missing = [k for k in full if k not in merged]
    if missing:
        raise RuntimeError(f"EPipeStrategy could not collect {len(missing)} weights for the checkpoint, e.g. {missing[:3]}")
    return split_bottleneck_state({k: merged[k] for k in full})


def extra_state(balance: list[int], placement: str, merged: dict[str, Tensor], bottlenecks: dict[str, Tensor],
                auto: Optional[dict[str, Any]]) -> dict[str, Any]:
    """``checkpoint["epipe"]`` from every rank's gathered :func:`local_extra_state`."""
    extra: dict[str, Any] = {"balance": balance, "placement": placement, "ranks": unflatten_state(merged)}
    if bottlenecks:
        extra["bottlenecks"] = bottlenecks
    if auto is not None:
        extra["auto"] = auto
    return extra


def gather_optimizer_state(transport: Transport, world_size: int, optimizer: Optimizer) -> Optional[dict[str, Any]]:
    """Every rank's part of ``optimizer``'s state merged on rank 0 (``None`` elsewhere; a collective)."""
    state = optimizer.state_dict()
    merged = gather_tensors(transport, world_size, flatten_state(state["state"]))
    if merged is None:
        return None
    return {"state": dict(sorted(unflatten_state(merged, int_keys=True).items())), "param_groups": state["param_groups"]}


def load_owned_optimizer_state(optimizers: list[Optimizer], states: list[Mapping[str, Any]], device: torch.device) -> None:
    """Each optimizer keeps the state of the parameters this rank owns (the others are meta here)."""
    for optimizer, opt_state in zip(optimizers, states):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        own = {i for i, p in enumerate(params) if not p.is_meta}
        opt_state = {**opt_state, "state": {i: s for i, s in opt_state["state"].items() if i in own}}
        optimizer.load_state_dict(opt_state)
        _optimizer_to_device(optimizer, device)


def local_extra_state(global_rank: int, codec_state: dict[str, Any], device: torch.device) -> dict[str, Tensor]:
    """This rank's codec and RNG state, flat and keyed ``"<global rank>/..."`` for the gather."""
    local = flatten_state({"codecs": codec_state, "rng": {"cpu": torch.get_rng_state()}})
    if device.type == "cuda":
        local["rng/cuda"] = torch.cuda.get_rng_state(device)
    return {f"{global_rank}/{k}": v for k, v in local.items()}


def rank_resume_state(state: Mapping[str, Any], balance: Optional[list[int]], global_rank: int) -> Optional[dict[str, Any]]:
    """This rank's part of ``checkpoint["epipe"]``; ``None`` (with a warning) if the split changed."""
    if balance is not None and list(state.get("balance", [])) != list(balance):
        rank_zero_warn(
            f"the checkpoint was written with balance={state.get('balance')} but this run uses"
            f" {list(balance)}: codec and RNG state are not restored"
        )
        return None
    return state.get("ranks", {}).get(str(global_rank))


def restore_rng(mine: Optional[Mapping[str, Any]], device: torch.device) -> None:
    """Put this rank's saved RNG state back (CPU, and CUDA where it runs on CUDA)."""
    if mine and "rng" in mine:
        torch.set_rng_state(mine["rng"]["cpu"])
        if "cuda" in mine["rng"] and device.type == "cuda":
            torch.cuda.set_rng_state(mine["rng"]["cuda"], device)


@dataclass(frozen=True)
class CheckpointRank:
    """Where a rank stands when it saves: bound at setup (:meth:`PipelineCheckpoint.attach`)."""

    transport: Transport  # global ranks, over the control group
    world_size: int
    global_rank: int
    device: torch.device
    module: nn.Module
    pipeline_attr: str  # the module's attribute holding the Sequential
    owned_layers: Optional[tuple[int, ...]]  # None on the client: it holds every real weight
    codecs: Any  # this rank's CodecBook
    balance: list[int]
    placement: str
    tuner: Any  # compressor="auto": its AutoTuner, else None


class PipelineCheckpoint:
    """One rank's side of checkpointing: what it contributes to a save, and what it takes back
    from a loaded checkpoint (``checkpoint["epipe"]``) once the pipeline is set up."""

    def __init__(self) -> None:
        self.resume: Optional[dict[str, Any]] = None  # checkpoint["epipe"] of the loaded checkpoint
        self.bottleneck_state: dict[str, Tensor] = {}  # split off the last gathered model state
        self.rank: Optional[CheckpointRank] = None  # after setup: saves are collectives over every rank

    def attach(self, rank: CheckpointRank) -> None:
        """Bind this rank's part after setup, then put a loaded checkpoint's codec state in force."""
        self.rank = rank
        self.restore_codecs(rank.codecs, rank.tuner, rank.balance, rank.global_rank)

    def owned_state(self) -> dict[str, Tensor]:
        """The real weights this rank owns (see :func:`owned_state`)."""
        rank = self._attached()
        return owned_state(rank.module, rank.pipeline_attr, rank.owned_layers)

    def model_state(self) -> dict[str, Any]:
        """The plain module's full state dict on rank 0 (``{}`` elsewhere; a collective); the
        bottlenecks are kept for ``checkpoint["epipe"]``, so the model loads without the strategy."""
        rank = self._attached()
        gathered = gather_model_state(rank.transport, rank.world_size, rank.module, self.owned_state())
        if gathered is None:
            return {}
        model_state, self.bottleneck_state = gathered
        return model_state

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """``optimizer``'s whole state on rank 0 (``{}`` elsewhere; a collective)."""
        rank = self._attached()
        return gather_optimizer_state(rank.transport, rank.world_size, optimizer) or {}

    def extra_state(self) -> Optional[dict[str, Any]]:
        """``checkpoint["epipe"]`` on rank 0: every rank's codec and RNG state (``None`` elsewhere; a collective)."""
        rank = self._attached()
        local = local_extra_state(rank.global_rank, rank.codecs.state_dict(), rank.device)
        merged = gather_tensors(rank.transport, rank.world_size, local)
        auto = None if rank.tuner is None else rank.tuner.state_dict()
        return None if merged is None else extra_state(rank.balance, rank.placement, merged, self.bottleneck_state, auto)

    def _attached(self) -> CheckpointRank:
        if self.rank is None:
            raise RuntimeError("EPipeStrategy gathers checkpoint state only after the Trainer has set it up")
        return self.rank

    def restore_codecs(self, codecs: Any, tuner: Any, balance: list[int], global_rank: int) -> None:
        """After setup, from a loaded checkpoint: ``compressor="auto"``'s choices (``tuner``, or
        ``None``) put in force first, then this rank's codec streams' state (a ``CodecBook``)."""
        if self.resume is None:
            return
        if tuner is not None and "auto" in self.resume:
            tuner.load_state_dict(self.resume["auto"], codecs)
        mine = self.mine(balance, global_rank)
        if mine and mine.get("codecs"):
            codecs.load_state_dict(mine["codecs"])

    def mine(self, balance: Optional[list[int]], global_rank: int) -> Optional[dict[str, Any]]:
        """This rank's part of the loaded checkpoint (``None``: nothing loaded, or another split)."""
        return None if self.resume is None else rank_resume_state(self.resume, balance, global_rank)

    def restore_rng(self, global_rank: int, device: torch.device) -> None:
        """Put this rank's saved RNG state back (at the start of training, after every other
        restore); the loaded checkpoint is then done with."""
        if self.resume is not None:
            restore_rng(self.mine(None if self.rank is None else self.rank.balance, global_rank), device)
            self.resume = None
