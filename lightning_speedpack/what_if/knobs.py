"""The knobs ``WhatIf`` can try, which side each is on, and which it may apply at run time.

- Loader side (the loader ceiling of a fresh iterator): ``num_workers``, ``persistent_workers``,
  ``prefetch_factor``, ``pin_memory`` (CUDA only) and ``cache`` (a warm
  :class:`~lightning_speedpack.CachedDataset`).
- Model side (training steps on a batch in memory): ``channels_last``, ``precision``,
  ``compile``, ``fused_optimizer``, ``cudnn_benchmark`` and ``tf32`` (CUDA only) and
  ``batch_size`` (the two multiples of 8 around today's size).

:data:`RUN_TIME` are the knobs ``apply=`` may change for the fit; the others are reported
with the exact line to write (a cache assumes a deterministic ``__getitem__``, precision and
compile change how the model computes, the batch size changes the optimisation).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "ALL_KNOBS",
    "CPU_AUTO",
    "GPU_ONLY",
    "LOADER_KNOBS",
    "MODEL_KNOBS",
    "RUN_TIME",
    "resolve_knobs",
]

LOADER_KNOBS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory", "cache")
MODEL_KNOBS = (
    "channels_last",
    "fused_optimizer",
    "cudnn_benchmark",
    "tf32",
    "precision",
    "batch_size",
    "compile",
)
ALL_KNOBS = LOADER_KNOBS + MODEL_KNOBS

#: What ``apply=`` may change for the fit.
RUN_TIME = frozenset(
    {
        "num_workers",
        "prefetch_factor",
        "persistent_workers",
        "pin_memory",
        "channels_last",
        "fused_optimizer",
        "cudnn_benchmark",
        "tf32",
    }
)

GPU_ONLY = "needs a CUDA device (this run is on CPU)"


#: Knobs ``"auto"`` tries on a CPU-only run: ``compile`` only when named, since on a CPU the
#: compilation alone takes tens of seconds (39.7 s for a two-layer model on this project's
#: machine), most of a default budget, before the first trial step.
CPU_AUTO = tuple(k for k in ALL_KNOBS if k != "compile")


def resolve_knobs(knobs: Any, name: str = "knobs") -> tuple[str, ...]:
    """``"auto"`` (every knob) or a list of knob names, checked; in the order they are tried.

    Raises:
        TypeError: ``knobs`` is neither ``"auto"`` nor a list of strings.
        ValueError: an unknown knob name.

    Example:
        >>> resolve_knobs(["precision", "num_workers"])
        ('num_workers', 'precision')
        >>> resolve_knobs(["workers"])
        Traceback (most recent call last):
        ...
        ValueError: `knobs` names unknown knob(s) ['workers']; known: num_workers, ...
    """
    if knobs == "auto":
        return ALL_KNOBS
    if isinstance(knobs, str) or not isinstance(knobs, Sequence):
        raise TypeError(f"`{name}` must be 'auto' or a list of knob names, got {knobs!r}")
    if any(not isinstance(k, str) for k in knobs):
        raise TypeError(f"`{name}` must be 'auto' or a list of knob names, got {knobs!r}")
    unknown = [k for k in knobs if k not in ALL_KNOBS]
    if unknown:
        raise ValueError(f"`{name}` names unknown knob(s) {unknown}; known: {', '.join(ALL_KNOBS)}")
    return tuple(k for k in ALL_KNOBS if k in knobs)
