"""What :class:`~lightning_speedpack.StepTimeline` accepts: its arguments, checked all at once.

:func:`check_options` raises on the first wrong argument, with ``TypeError`` for a wrong type and
``ValueError`` for a value out of range, before anything is stored: a bad argument never
surfaces mid-training. :func:`doctor_trace` reads the trace window the doctor asks for
(``speedpack doctor --trace``) from the environment.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from lightning_speedpack.core.sampling import SAMPLED_FROM_STEP, check_sample_every
from lightning_speedpack.timeline.nvtx import NvtxApi
from lightning_speedpack.timeline.trace import check_trace_steps, parse_trace_steps

__all__ = [
    "SAMPLED_FROM_STEP",
    "TRACE_DIR_ENV",
    "TRACE_ENV",
    "check_options",
    "check_sample_every",
    "doctor_trace",
]

#: ``START:COUNT``: the trace window of the doctor's StepTimeline (``speedpack doctor --trace``).
TRACE_ENV = "LIGHTNING_SPEEDPACK_TRACE"
#: Where the doctor's StepTimeline writes its trace (default: the Trainer's log dir).
TRACE_DIR_ENV = "LIGHTNING_SPEEDPACK_TRACE_DIR"

# The torch.profiler options, which only mean something inside a trace window.
_PROFILER_OPTIONS = ("record_shapes", "profile_memory", "with_stack")


def check_options(
    ranges: Any,
    nvtx: Any,
    trace_steps: Any,
    trace_dir: Any,
    log_every_n_steps: Any,
    record_shapes: Any,
    profile_memory: Any,
    with_stack: Any,
) -> tuple[int, int] | None:
    """Validate StepTimeline's arguments; return ``trace_steps`` as ``(start, count)`` or None.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a value is out of range, ``nvtx=True`` without CUDA, or a profiler option
            without ``trace_steps``.

    Example:
        >>> check_options(True, "auto", [2, 3], None, None, False, False, False)
        (2, 3)
        >>> check_options(True, "auto", None, None, 0, False, False, False)
        Traceback (most recent call last):
        ...
        ValueError: `log_every_n_steps` must be a positive int, got 0
    """
    flags = {
        "ranges": ranges,
        "record_shapes": record_shapes,
        "profile_memory": profile_memory,
        "with_stack": with_stack,
    }
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"`{name}` must be a bool, got {value!r}")
    _check_nvtx(nvtx)
    steps = check_trace_steps(trace_steps)
    if trace_dir is not None and not isinstance(trace_dir, (str, os.PathLike)):
        raise TypeError(f"`trace_dir` must be a path or None, got {trace_dir!r}")
    _check_log_every(log_every_n_steps)
    options = [name for name in _PROFILER_OPTIONS if flags[name]]
    if steps is None and options:
        raise ValueError(
            f"{', '.join(f'`{o}`' for o in options)} only apply to a trace window: "
            "pass `trace_steps=(start, count)` too"
        )
    return steps


def _check_nvtx(nvtx: Any) -> None:
    if not (isinstance(nvtx, (bool, NvtxApi)) or nvtx == "auto"):
        # a misspelt mode is a wrong value; anything else that is not a str a wrong type
        raise (ValueError if isinstance(nvtx, str) else TypeError)(
            f"`nvtx` must be 'auto', True, False or an NvtxApi, got {nvtx!r}"
        )
    if nvtx is True and not torch.cuda.is_available():
        raise ValueError("`nvtx=True` needs CUDA (torch.cuda.is_available() is False); use 'auto'")


def _check_log_every(log_every_n_steps: Any) -> None:
    if log_every_n_steps is None:
        return
    # bool is an int subclass, but `True` steps is a mistake, not 1
    if isinstance(log_every_n_steps, bool) or not isinstance(log_every_n_steps, int):
        raise TypeError(f"`log_every_n_steps` must be an int or None, got {log_every_n_steps!r}")
    if log_every_n_steps < 1:
        raise ValueError(f"`log_every_n_steps` must be a positive int, got {log_every_n_steps}")


def doctor_trace() -> tuple[tuple[int, int] | None, str | None]:
    """``(trace_steps, trace_dir)`` from :data:`TRACE_ENV` and :data:`TRACE_DIR_ENV` (unset: None).

    Raises:
        ValueError: :data:`TRACE_ENV` is set but not ``START:COUNT``.
    """
    text = os.environ.get(TRACE_ENV, "").strip()
    steps = parse_trace_steps(text) if text else None
    return steps, os.environ.get(TRACE_DIR_ENV) or None
