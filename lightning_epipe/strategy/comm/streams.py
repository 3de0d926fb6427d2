"""Which streams a pipeline's ranks talk on: one per direction of a link and kind of message.

A *stream* carries one kind of message from one rank to another: the activations of one
cut, the gradients of one cut going back, or the raw inputs the client sends to the first
stage (chain placement). Every stream gets a process group of its own, so

- each stream is a FIFO whose order both ends derive from the schedule alone (a stage
  sends and receives one cut's micro-batches in ascending order forward, and in its
  schedule's backward order back), whatever the order in which a rank interleaves its
  streams (1F1B, two stages on one rank);
- NCCL, which runs all point-to-point operations of one communicator on one stream in
  posting order, never sees two ranks each waiting on a send to the other: a stream's
  communicator only ever holds sends one way and the matching receives the other.

Control messages (commands, sample ids, checkpoint state) take one more group, on gloo
(host memory) whatever the data backend, so reading them never syncs an accelerator.

    >>> [str(s) for s in pipeline_streams("client-server", 2)]
    ['activation 0->1', 'activation 1->0', 'gradient 0->1', 'gradient 1->0']
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_epipe.strategy.planning.partition import stage_ranks_for
from lightning_epipe.strategy.comm.wire import Kind

__all__ = ["Stream", "pipeline_streams", "stream_name", "CONTROL"]

CONTROL = "control"
_NAMES = {Kind.ACTIVATION: "activation", Kind.GRADIENT: "gradient", Kind.INPUT: "input"}


@dataclass(frozen=True, order=True)
class Stream:
    """Messages of kind ``name`` from pipeline rank ``src`` to pipeline rank ``dst``."""

    name: str  # "activation" | "gradient" | "input"
    src: int
    dst: int

    def __str__(self) -> str:
        return f"{self.name} {self.src}->{self.dst}"


def stream_name(kind: int) -> str:
    """The stream a message of ``kind`` travels on (``CONTROL`` for commands, sample ids, state)."""
    return _NAMES.get(kind, CONTROL)


def pipeline_streams(placement: str, num_ranks: int) -> list[Stream]:
    """Every data stream of one pipeline of ``num_ranks`` processes, in a fixed order (every
    rank creates the process groups in this order)."""
    ranks = stage_ranks_for(placement, num_ranks)
    streams = set()
    for cut in range(len(ranks) - 1):
        a, b = ranks[cut], ranks[cut + 1]
        streams |= {Stream("activation", a, b), Stream("gradient", b, a)}
    if ranks[0] != 0:
        streams.add(Stream("input", 0, ranks[0]))
    return sorted(streams)
