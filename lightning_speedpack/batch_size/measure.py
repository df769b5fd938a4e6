"""Measure given batch sizes with real training steps, every piece of state put back.

:func:`measure_sizes` is the whole job for a caller outside the tuner (e.g. a what-if tool that
compares today's batch size with its nearest multiples of 8): snapshot, trials, restore.
:func:`run_sizes` is the loop inside it, for a caller that already holds a
:class:`~lightning_speedpack.core.trials.TrialRunner` and a
:class:`~lightning_speedpack.core.trials.StateSnapshot` (``BatchSizeTuner(mode="nearest")``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from lightning_speedpack.batch_size.checks import BatchSizeTuningError, check_supported
from lightning_speedpack.batch_size.search import Trial, free_memory
from lightning_speedpack.core.lightning import lightning_getattr, lightning_setattr
from lightning_speedpack.core.trials import (
    StateSnapshot,
    TrialRunner,
    dataloader_source,
    logging_disabled,
)

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["measure_sizes", "run_sizes"]


def run_sizes(
    run: TrialRunner, sizes: Iterable[int], attr_name: str, snapshot: StateSnapshot
) -> list[Trial]:
    """Try each of ``sizes`` in order with ``run``; return one :class:`Trial` per size.

    Each size is set with Lightning's ``lightning_setattr`` (so the trial's loader is built with
    it) before its trial; the gradients are put back from ``snapshot`` after it. The attribute
    is left at the last size and the rest of ``snapshot`` is not restored: that is the caller's
    job.
    """
    trials: list[Trial] = []
    for size in sizes:
        lightning_setattr(run.module, attr_name, size)
        fits, speed = run(size)
        trials.append(Trial(size, fits, speed if fits else None))
        snapshot.restore_grads()
    return trials


def measure_sizes(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    sizes: Iterable[int],
    *,
    attr_name: str = "batch_size",
    steps: int = 3,
    owner: str = "BatchSizeTuner",
    collective_timeout: float | None = None,
) -> list[Trial]:
    """Measure samples/s at each of ``sizes``, in order; leave the run exactly as found.

    For each size: set ``attr_name`` (on the module, its ``hparams`` or the datamodule,
    wherever Lightning's ``lightning_setattr`` finds it), build the train dataloader, run
    ``steps`` real training steps (forward, backward, optimizer step; batches drawn in this
    process) plus one validation step when there is a val dataloader, and time them. The result
    is ``Trial(size, fits, samples_per_sec)``: ``fits`` is ``False`` after an out-of-memory
    error (on any rank), and ``samples_per_sec`` is the median over the steps after the first
    (a warm-up; ``None`` with ``steps=1`` or when the size did not fit; the mean over ranks
    under DDP). Afterwards parameters and buffers (bit-identical), gradients, optimizer and
    scheduler states, modes, RNG states and the batch-size attribute are put back; ``self.log``
    is a no-op meanwhile.

    Call it once the Trainer has set up its strategy and optimizers (``on_fit_start`` or later),
    on every rank with the same ``sizes``: each trial ends with one small, time-bounded
    all-reduce (``collective_timeout`` seconds, ``None``: the pack's default).

    Args:
        trainer: the running Trainer.
        pl_module: its LightningModule.
        sizes: the batch sizes to measure, in order (a size given twice is measured twice).
        attr_name: the batch-size attribute the dataloaders are built from.
        steps: training steps per size (at least 2 for a speed: the first is a warm-up).
        owner: the caller's name, for error messages.
        collective_timeout: seconds each rank agreement may take under DDP.

    Returns:
        One :class:`~lightning_speedpack.batch_size.search.Trial` per size, in order.

    Raises:
        TypeError: ``steps`` or a size is not an int.
        ValueError: ``steps`` or a size is below 1.
        BatchSizeTuningError: the run is one trials cannot drive (no ``attr_name`` attribute,
            manual optimization, several optimizers, a strategy other than single-device or
            DDP, dataloaders passed to ``fit``). Any error other than out-of-memory in the
            user's steps propagates unchanged.
    """
    sizes = list(sizes)
    for name, value in [("steps", steps), *(("size", s) for s in sizes)]:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"`{name}` must be an int, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"`{name}` must be a positive int, got {value}")
    check_supported(trainer, pl_module, attr_name, owner=owner)
    original = lightning_getattr(pl_module, attr_name)
    source = dataloader_source(trainer, pl_module, owner, BatchSizeTuningError)
    snapshot = StateSnapshot.take(trainer, pl_module)  # before any dataloader draws numbers
    try:
        with logging_disabled(pl_module):
            run = TrialRunner(
                trainer,
                pl_module,
                source,
                steps,
                owner=owner,
                error_type=BatchSizeTuningError,
                collective_timeout=collective_timeout,
            )
            return run_sizes(run, sizes, attr_name, snapshot)
    finally:
        snapshot.restore()
        lightning_setattr(pl_module, attr_name, original)
        free_memory()
