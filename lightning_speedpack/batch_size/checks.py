"""What :class:`~lightning_speedpack.BatchSizeTuner` accepts: its arguments, and the runs it tunes.

:func:`check_arguments` validates the constructor's arguments all at once (``TypeError`` /
``ValueError``); :func:`check_supported` checks, when the fit starts, that the run is one the
trials can drive (a batch-size attribute, automatic optimization, one optimizer, a single-device
or DDP strategy) and raises :class:`BatchSizeTuningError` with what to change otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.nn.parallel import DistributedDataParallel

from lightning_speedpack.core.lightning import lightning_hasattr

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "MODES",
    "BatchSizeTuningError",
    "check_arguments",
    "check_batch_size_holder",
    "check_supported",
]


#: The tuner's modes, as ``BatchSizeTuner(mode=...)`` accepts them.
MODES = ("max", "throughput", "nearest")


class BatchSizeTuningError(RuntimeError):
    """The tuner cannot run on this model or found no batch size that fits."""


def check_arguments(
    *,
    mode: Any,
    multiple_of: Any,
    init_val: Any,
    max_val: Any,
    steps_per_trial: Any,
    margin: Any,
    attr_name: Any,
    flags: dict[str, Any],
) -> None:
    """Validate the arguments of ``BatchSizeTuner(...)`` (``collective_timeout`` aside).

    ``flags`` maps the name of each bool argument to its value.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: an argument is out of range, or ``max_val``/``steps_per_trial`` do not fit
            ``multiple_of``/``init_val``/``mode``.
    """

    def positive_int(name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"`{name}` must be an int, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"`{name}` must be a positive int, got {value}")

    if mode not in MODES:
        raise ValueError(f"`mode` must be 'max', 'throughput' or 'nearest', got {mode!r}")
    for name, value in (
        ("multiple_of", multiple_of),
        ("init_val", init_val),
        ("max_val", max_val),
        ("steps_per_trial", steps_per_trial),
    ):
        positive_int(name, value)
    if max_val < multiple_of:
        raise ValueError(f"`max_val` ({max_val}) must be >= `multiple_of` ({multiple_of})")
    if init_val > max_val:
        raise ValueError(
            f"`init_val` ({init_val}) must be <= `max_val` ({max_val}): the search starts at "
            f"`init_val` and never tries a size above `max_val`; lower `init_val` or raise "
            "`max_val`"
        )
    if mode in ("throughput", "nearest") and steps_per_trial < 2:
        raise ValueError(
            f"`steps_per_trial` must be >= 2 in {mode!r} mode (one warm-up step), "
            f"got {steps_per_trial}"
        )
    if isinstance(margin, bool) or not isinstance(margin, (int, float)):
        raise TypeError(f"`margin` must be a float, got {type(margin).__name__} {margin!r}")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"`margin` must be in [0, 1), got {margin}")
    if not isinstance(attr_name, str) or not attr_name:
        raise TypeError(f"`attr_name` must be a non-empty str, got {attr_name!r}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"`{name}` must be a bool, got {type(value).__name__} {value!r}")


def check_batch_size_holder(
    pl_module: pl.LightningModule, attr: str, *, owner: str = "BatchSizeTuner"
) -> None:
    """Raise :class:`BatchSizeTuningError` when Lightning finds no batch-size attribute ``attr``."""
    if not lightning_hasattr(pl_module, attr):
        raise BatchSizeTuningError(
            f"{owner}: no batch-size attribute `{attr}` found; looked at `model.{attr}`, "
            f"`model.hparams[{attr!r}]`, `datamodule.{attr}` and `datamodule.hparams[{attr!r}]`. "
            "Build the dataloaders from such an attribute or pass `attr_name=`"
        )


def check_supported(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    attr: str,
    *,
    owner: str = "BatchSizeTuner",
) -> None:
    """Raise :class:`BatchSizeTuningError` when the trials cannot run on this fit.

    They need the batch-size attribute ``attr``, automatic optimization, exactly one optimizer
    and a single-device or DDP strategy. ``owner`` names the caller in the messages.
    """
    check_batch_size_holder(pl_module, attr, owner=owner)
    if not pl_module.automatic_optimization:
        raise BatchSizeTuningError(
            f"{owner} supports automatic optimization only (the trials run the optimizer "
            "step themselves)"
        )
    model = trainer.strategy.model
    if model is not pl_module and not isinstance(model, DistributedDataParallel):
        raise BatchSizeTuningError(
            f"{owner} supports single-device and DDP strategies, not "
            f"{type(trainer.strategy).__name__}"
        )
    if len(trainer.optimizers) != 1:
        raise BatchSizeTuningError(
            f"{owner} needs exactly one optimizer, found {len(trainer.optimizers)}"
        )
