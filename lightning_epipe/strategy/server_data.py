"""What a server iterates instead of the data: placeholders, one per client batch."""

from __future__ import annotations

from typing import Iterator

__all__ = ["ServerBatches", "server_dataloader"]


def server_dataloader(dataloader: object) -> object:
    """What a server iterates for the client's ``dataloader``: as many placeholders as it has
    batches, or the data itself when it has no length (read to keep the step count equal)."""
    try:
        return ServerBatches(len(dataloader))  # type: ignore[arg-type]
    except TypeError:
        return dataloader


class ServerBatches:
    """``length`` placeholder batches (empty tuples); servers never see inputs or labels.

    Lightning skips a step whose batch is ``None``, hence an empty tuple.

    Example:
        >>> list(ServerBatches(3))
        [(), (), ()]
    """

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[tuple]:
        return iter([()] * self.length)
