"""The world's rates under DDP: each rank's window summed over ranks in one bounded all-reduce.

Called on logging steps and at fit end only, on every rank at the same step; with
``ThroughputLogger(world_combine="end")`` once, at the end of training, for every logging step
at once (and every :data:`KEEP_AT_MOST` logging steps on a long run). The world's samples/s is
the sum of what each rank processed (not rank 0 times the world size); the
maths is :func:`~lightning_speedpack.throughput.rates.combine_ranks`. The all-reduce is the
pack's bounded one: a rank that died or is stuck makes the others raise
``CollectiveTimeoutError`` naming the step, instead of hanging.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from lightning_speedpack.core.collectives import bounded_all_reduce, collective_timeout
from lightning_speedpack.throughput.rates import RATE_FIELDS, WindowRates, combine_ranks

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["KEEP_AT_MOST", "DeferredWindows", "combine_over_ranks", "combine_rows_over_ranks"]

#: ``world_combine="end"`` keeps at most this many logging steps (~0.5 kB each) before it sums
#: them over ranks: on a long run, one all-reduce per this many logging steps (every 10,000
#: steps at the doctor's 10-step cadence), at the same step on every rank.
KEEP_AT_MOST = 1000


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
    if trainer.world_size <= 1:  # the world is this rank (and the step is not read)
        return local, extra
    what = f"ThroughputLogger: world samples/s combine at step {trainer.global_step}"
    return combine_rows_over_ranks(trainer, device, [(local, extra)], timeout_s, what)[0]


def combine_rows_over_ranks(
    trainer: pl.Trainer,
    device: torch.device,
    rows: Sequence[tuple[WindowRates | None, Sequence[float]]],
    timeout_s: float | None = None,
    what: str = "ThroughputLogger: world samples/s combine",
) -> list[tuple[WindowRates | None, list[float]]]:
    """:func:`combine_over_ranks` for several rows at once: still one all-reduce.

    Every rank must pass as many rows, each with as many ``extra`` values as the same row on
    the others (the rows of logging steps that every rank reaches at the same global step).

    Example:
        >>> class OneRank: world_size = 1
        >>> combine_rows_over_ranks(OneRank(), torch.device("cpu"), [(None, [2.0]), (None, [])])
        [(None, [2.0]), (None, [])]
    """
    if trainer.world_size <= 1:  # the world is this rank: nothing to sum
        return [(local, list(extra)) for local, extra in rows]
    n = len(RATE_FIELDS)
    width = n + 1 + max((len(extra) for _, extra in rows), default=0)
    vector: list[float] = []
    for local, extra in rows:
        row = [*(local.vector() if local else [0.0] * n), float(local is not None), *extra]
        vector += row + [0.0] * (width - len(row))
    local_sums = torch.tensor(vector, dtype=torch.float64, device=device)
    if torch.distributed.is_initialized():
        # bounded: a rank that died or is stuck fails this one with a clear message
        summed = bounded_all_reduce(local_sums, timeout_s=collective_timeout(timeout_s), what=what)
    else:  # a strategy without torch.distributed: its own reduce
        summed = trainer.strategy.reduce(local_sums, reduce_op="sum")
    values = summed.tolist()
    out: list[tuple[WindowRates | None, list[float]]] = []
    for i, (_, extra) in enumerate(rows):
        row = values[i * width : (i + 1) * width]
        ranks = round(row[n])
        out.append(
            (combine_ranks(row[:n], ranks) if ranks > 0 else None, row[n + 1 : n + 1 + len(extra)])
        )
    return out


class DeferredWindows:
    """Logging steps kept on each rank until training ends, then summed over ranks at once.

    ``ThroughputLogger(world_combine="end")``: no rank waits for another in the training loop.
    Every rank keeps the same logging steps (they are global steps), so every rank passes as
    many rows to the one all-reduce; :attr:`full` at the same step on every rank.

    Example:
        >>> class OneRank: world_size = 1
        >>> kept = DeferredWindows()
        >>> kept.keep(10, None, (80.0, 10.0), {})
        >>> kept.combine(OneRank(), torch.device("cpu"), None, None)
        [(10, None, 80.0, 10.0, {})]
    """

    def __init__(self) -> None:
        # (step, this rank's window rates, (samples, batches) so far, rank 0's system metrics)
        self.kept: list[tuple[int, WindowRates | None, tuple[float, float], dict[str, float]]]
        self.kept = []
        self.world_total: WindowRates | None = None  # the run's, after :meth:`combine`

    def keep(
        self,
        step: int,
        local: WindowRates | None,
        totals: Sequence[float],
        system: dict[str, float],
    ) -> None:
        """Keep one logging step's local figures (``totals``: samples and batches so far)."""
        self.kept.append((step, local, (float(totals[0]), float(totals[1])), system))

    @property
    def full(self) -> bool:
        """:data:`KEEP_AT_MOST` steps kept: sum them now (a long run's memory stays bounded)."""
        return len(self.kept) >= KEEP_AT_MOST

    def combine(
        self,
        trainer: pl.Trainer,
        device: torch.device,
        total: WindowRates | None,
        timeout_s: float | None,
    ) -> list[tuple[int, WindowRates | None, float, float, dict[str, float]]]:
        """Sum every kept step and the run's ``total`` rates in one all-reduce, and forget them.

        Returns ``(step, world rates, world samples, world batches, system metrics)`` per kept
        step; the world's total rates go to :attr:`world_total`.
        """
        rows: list[tuple[WindowRates | None, Sequence[float]]] = [
            (local, totals) for _, local, totals, _ in self.kept
        ]
        rows.append((total, ()))
        what = f"ThroughputLogger: world samples/s of {len(self.kept)} logging steps at train end"
        combined = combine_rows_over_ranks(trainer, device, rows, timeout_s, what)
        self.world_total = combined[-1][0]
        kept, self.kept = self.kept, []
        return [
            (step, world, summed[0], summed[1], system)
            for (step, _, _, system), (world, summed) in zip(kept, combined[:-1], strict=True)
        ]
