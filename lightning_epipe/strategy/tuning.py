"""``compressor="auto"`` across processes: probe the links, profile the codecs, agree, switch.

Runs between two training steps, on every rank at the same step (the strategy calls
:meth:`AutoTuner.maybe_retune` from ``on_train_batch_start``):

1. Every auto link (a cut and a direction) has a sender, which kept the last tensor it sent
   there (the runtime's ``samples``). For each such link, in cut order, sender and receiver
   time a ping-pong of a message of that size (``probe_bandwidth``): the link's bandwidth
   as the pipeline sees it (loopback, a ``tc``-limited namespace or a real network).
2. Where the bandwidth moved by more than ``tolerance`` since the last decision (always the
   first time), the sender profiles every candidate codec on its sample
   (:func:`~lightning_epipe.compressors.profile.profile_codecs`) and picks the fastest
   within the error budget (:func:`~lightning_epipe.strategy.autotune.choose_codec`).
3. Every rank broadcasts its choices (JSON, never pickles) and every rank applies all of
   them, so the two ends of a link switch codecs at the same step.

Until the first decision (after the first training step) auto links send uncompressed.
"""

from __future__ import annotations

import time
from typing import Optional

import torch
import torch.distributed as dist
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import Tensor

from lightning_epipe.compressors.profile import DEFAULT_CANDIDATES, profile_codecs
from lightning_epipe.strategy.autotune import (
    LinkChoice,
    choices_from_json,
    choices_to_json,
    choose_codec,
    default_error_budget,
    format_choices,
    needs_retune,
)
from lightning_epipe.strategy.codecs import CodecBook
from lightning_epipe.strategy.collectives import broadcast_json
from lightning_epipe.strategy.partition import PipelinePlan
from lightning_epipe.strategy.timing import synchronize

__all__ = ["AutoTuner", "probe_bandwidth"]

_PROBE_ROUNDS = 3


def probe_bandwidth(src: int, dst: int, nbytes: int, rank: int, device: torch.device, rounds: int = _PROBE_ROUNDS) -> Optional[float]:
    """Bytes/s from ``src`` to ``dst`` for ``nbytes`` messages (best of ``rounds`` ping-pongs);
    ``None`` on ranks other than ``src``. Both ``src`` and ``dst`` must call it, others must not."""
    size = torch.tensor([nbytes], dtype=torch.int64, device=device)
    ack = torch.zeros(1, dtype=torch.uint8, device=device)
    if rank == src:
        dist.send(size, dst)
        payload = torch.zeros(max(1, nbytes), dtype=torch.uint8, device=device)
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            dist.send(payload, dst)
            dist.recv(ack, dst)
            synchronize(device)  # NCCL returns once the operations are queued
            best = min(best, time.perf_counter() - start)
        return max(1, nbytes) / max(best, 1e-9)
    dist.recv(size, src)
    payload = torch.empty(max(1, int(size.item())), dtype=torch.uint8, device=device)
    for _ in range(rounds):
        dist.recv(payload, src)
        dist.send(ack, src)
    return None


class AutoTuner:
    """Chooses the codec of every auto link at the first training step, and again every
    ``retune_every`` steps where a link's bandwidth drifted by more than ``tolerance``."""

    def __init__(self, error_budget: Optional[float] = None, retune_every: int = 100, tolerance: float = 0.5,
                 candidates=DEFAULT_CANDIDATES) -> None:
        if error_budget is not None and (isinstance(error_budget, bool) or not isinstance(error_budget, (int, float))
                                         or error_budget < 0):
            raise ValueError(f"auto: error_budget must be a number >= 0 (relative L2 error), got {error_budget!r}")
        if isinstance(retune_every, bool) or not isinstance(retune_every, int) or retune_every < 1:
            raise ValueError(f"auto: retune_every must be a positive number of steps, got {retune_every!r}")
        self.error_budget = error_budget
        self.retune_every = retune_every
        self.tolerance = tolerance
        self.candidates = candidates
        self.choices: dict[tuple[int, str], LinkChoice] = {}   # every rank: the choice of every auto link
        self._bandwidth: dict[tuple[int, str], float] = {}     # senders: bandwidth at the last decision
        self._last_step: Optional[int] = None

    def due(self, step: int) -> bool:
        """Whether to tune before training step ``step`` (global steps taken so far)."""
        if step < 1:
            return False
        return self._last_step is None or step - self._last_step >= self.retune_every

    def maybe_retune(self, step: int, plan: PipelinePlan, rank: int, codecs: CodecBook, samples: dict[tuple[str, int], Tensor],
                     device: torch.device, offset: int = 0) -> list[LinkChoice]:
        """Collective over every rank: probe, decide and apply; the choices made now (may be empty).

        ``rank`` is the rank within the pipeline, ``offset`` the global rank of its client: with
        several replicas each probes its own links and every replica applies replica 0's choices.
        """
        if not self.due(step):
            return []
        self._last_step = step
        mine = []
        for direction, cut in codecs.auto_links():
            sender, receiver = plan.cut_ranks(cut)
            if direction == "gradient":
                sender, receiver = receiver, sender
            if rank not in (sender, receiver):
                continue
            sample = samples.get((direction, cut))
            nbytes = 0 if sample is None else sample.numel() * sample.element_size()
            bandwidth = probe_bandwidth(offset + sender, offset + receiver, nbytes, offset + rank, device)
            if rank != sender or sample is None:
                continue
            key = (cut, direction)
            if key in self._bandwidth and not needs_retune(self._bandwidth[key], bandwidth, self.tolerance):
                continue
            budget = self.error_budget if self.error_budget is not None else default_error_budget(direction)
            profiles = profile_codecs(sample.detach(), self.candidates)
            mine.append(choose_codec(profiles, nbytes, bandwidth, budget, cut, direction))
            self._bandwidth[key] = bandwidth
        made: list[LinkChoice] = []
        for src in range(plan.num_ranks):  # replica 0's ranks: global rank == pipeline rank
            made += choices_from_json(broadcast_json(choices_to_json(mine) if src == offset + rank else None, device, src))
        for choice in made:
            self.choices[(choice.cut, choice.direction)] = choice
            codecs.choose(choice.direction, choice.cut, choice.name, choice.kwargs)
        if made and offset + rank == 0:
            rank_zero_info(f"EPipeStrategy compressor='auto' at step {step}:\n{format_choices(made)}")
        return made

    def state_dict(self) -> dict:
        """JSON-able: the choices in force and the step they were made at (for checkpoints)."""
        return {"choices": choices_to_json(self.choices.values()), "last_step": self._last_step}

    def load_state_dict(self, state: dict, codecs: CodecBook) -> None:
        """Put a checkpoint's choices back in force on this rank (every rank reads the checkpoint)."""
        self._last_step = state.get("last_step")
        for choice in choices_from_json(state.get("choices", [])):
            self.choices[(choice.cut, choice.direction)] = choice
            codecs.choose(choice.direction, choice.cut, choice.name, choice.kwargs)

    def describe(self) -> dict[str, str]:
        """``{"activation/cut0": "sortquant(bits=8)", ...}`` for the links decided so far."""
        return {f"{d}/cut{c}": choice.label for (c, d), choice in sorted(self.choices.items())}
