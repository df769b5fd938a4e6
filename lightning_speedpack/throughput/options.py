"""ThroughputLogger's arguments: checked all at once, and described for a run's config."""

from __future__ import annotations

from typing import Any

__all__ = ["check_args", "describe"]


def check_args(
    batch_size_fn: Any,
    items_fn: Any,
    window: Any,
    log_every_n_steps: Any,
    flops_per_batch: Any,
    gpu_stats: Any,
    prefix: Any,
) -> None:
    """Raise on the first argument out of its type or range, saying what is allowed.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``window``, ``log_every_n_steps`` or ``flops_per_batch`` is out of range.

    Example:
        >>> check_args(None, None, 0, None, None, True, "throughput/")
        Traceback (most recent call last):
        ...
        ValueError: `window` must be a positive int, got 0
    """
    for name, fn in (("batch_size_fn", batch_size_fn), ("items_fn", items_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(f"`{name}` must be a callable(batch) -> int or None, got {fn!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"`window` must be a positive int, got {window!r}")
    if log_every_n_steps is not None and (
        isinstance(log_every_n_steps, bool)
        or not isinstance(log_every_n_steps, int)
        or log_every_n_steps < 1
    ):
        raise ValueError(
            f"`log_every_n_steps` must be a positive int or None, got {log_every_n_steps!r}"
        )
    if isinstance(flops_per_batch, str):
        if flops_per_batch != "auto":
            raise ValueError(
                f"`flops_per_batch` as a string must be 'auto', got {flops_per_batch!r}"
            )
    elif isinstance(flops_per_batch, bool) or not (
        flops_per_batch is None
        or callable(flops_per_batch)
        or isinstance(flops_per_batch, (int, float))
    ):
        raise TypeError(
            "`flops_per_batch` must be an int, a callable(batch), 'auto' or None, "
            f"got {flops_per_batch!r}"
        )
    elif isinstance(flops_per_batch, (int, float)) and flops_per_batch <= 0:
        raise ValueError(f"`flops_per_batch` must be positive, got {flops_per_batch!r}")
    if not isinstance(gpu_stats, bool):
        raise TypeError(f"`gpu_stats` must be a bool, got {gpu_stats!r}")
    if not isinstance(prefix, str):
        raise TypeError(f"`prefix` must be a str, got {prefix!r}")


def describe(
    window: int,
    log_every_n_steps: int | None,
    flops_per_batch: Any,
    batch_size_fn: Any,
    items_fn: Any,
    gpu_stats: bool,
    peak_flops_per_device: float | None,
) -> dict[str, Any]:
    """The settings as plain values for a run's config (callables by their ``__name__``).

    Example:
        >>> describe(50, None, len, None, None, True, None)["flops_per_batch"]
        'len'
    """
    flops = flops_per_batch
    return {
        "window": window,
        "log_every_n_steps": log_every_n_steps,
        "flops_per_batch": flops
        if isinstance(flops, (int, float, str)) or flops is None
        else getattr(flops, "__name__", "callable"),
        "batch_size_fn": getattr(batch_size_fn, "__name__", None),
        "items_fn": getattr(items_fn, "__name__", None),
        "gpu_stats": gpu_stats,
        "peak_flops_per_device": peak_flops_per_device,
    }
