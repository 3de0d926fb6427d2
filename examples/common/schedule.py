"""The learning-rate schedule of the report: linear warm-up, then cosine or linear decay."""

import math
from typing import Literal

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_decay(
    optimizer: Optimizer, warmup: int, total: int, decay: Literal["cosine", "linear"] = "cosine"
) -> LambdaLR:
    """Scale the lr up linearly over ``warmup`` steps, then down to 0 at step ``total``.

    A "step" is whatever the caller steps the scheduler on (an epoch or an optimizer step).
    The first step already trains at ``lr / (warmup + 1)``, not at 0.

    Example:
        >>> import torch
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> s = warmup_decay(opt, warmup=1, total=3, decay="linear")
        >>> [round(s.lr_lambdas[0](step), 2) for step in range(4)]
        [0.5, 1.0, 0.5, 0.0]
    """
    if not 0 <= warmup < total:
        raise ValueError(f"need 0 <= warmup < total (warmup: {warmup}, total: {total})")

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / (total - warmup))
        if decay == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0 - progress

    return LambdaLR(optimizer, factor)
