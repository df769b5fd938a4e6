"""The world's rates under DDP: each rank's window summed over ranks in one bounded all-reduce.

Called on logging steps and at fit end only, on every rank at the same step. The world's
samples/s is the sum of what each rank processed (not rank 0 times the world size); the
maths is :func:`~lightning_speedpack.throughput.rates.combine_ranks`. The all-reduce is the
pack's bounded one: a rank that died or is stuck makes the others raise
``CollectiveTimeoutError`` naming the step, instead of hanging.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lightning_speedpack.core.collectives import bounded_all_reduce, collective_timeout
from lightning_speedpack.throughput.rates import RATE_FIELDS, WindowRates, combine_ranks

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["combine_over_ranks"]


def combine_over_ranks(
    trainer: pl.Trainer,
    device: torch.device,
    local: WindowRates | None,
    extra: list[float],
    timeout_s: float | None = None,
) -> tuple[WindowRates | None, list[float]]:
    """Sum ``local`` rates (and ``extra`` values) over ranks with one small all-reduce.

    Returns the world's rates (None when no rank has any) and the summed ``extra``. With one
    rank, ``local`` and ``extra`` as they are. ``timeout_s``: the collective's bound (None:
    :func:`~lightning_speedpack.core.collectives.collective_timeout`'s default).
    """
    if trainer.world_size <= 1:  # the world is this rank: nothing to sum
        return local, extra
    vector = [
        *(local.vector() if local else [0.0] * len(RATE_FIELDS)),
        float(local is not None),
        *extra,
    ]
    local_sums = torch.tensor(vector, dtype=torch.float64, device=device)
    if torch.distributed.is_initialized():
        # bounded: a rank that died or is stuck fails this one with a clear message
        summed = bounded_all_reduce(
            local_sums,
            timeout_s=collective_timeout(timeout_s),
            what=f"ThroughputLogger: world samples/s combine at step {trainer.global_step}",
        )
    else:  # a strategy without torch.distributed: its own reduce
        summed = trainer.strategy.reduce(local_sums, reduce_op="sum")
    vector = summed.tolist()
    n = len(RATE_FIELDS)
    ranks = round(vector[n])
    world = combine_ranks(vector[:n], ranks) if ranks > 0 else None
    return world, vector[n + 1 :]
