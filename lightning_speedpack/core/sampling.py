"""Which training steps a sampled tool watches: every step at first, then one step in N.

The doctor's per-step work is most of its cost on a millisecond step (issue 37: the clean
2-rank DDP job). Its tools that report shares and means (the step timeline's phases, the sync
points' counts per step) watch every step of the first :data:`SAMPLED_FROM_STEP`, so a short fit
keeps a series of its first steps, and then one step in ``every``. They use the same rule with
the same ``every``, so the steps one of them watches are the steps the others watch: the
timeline places the syncs that the sync detector reports in the phases it times.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DOCTOR_SAMPLE_EVERY", "SAMPLED_FROM_STEP", "check_sample_every", "sampled"]

#: A sampled tool watches every step before this one (16 steps, then one in N, give the medians;
#: 64 cost a 2-epoch job of 32 batches a step's phases on every step).
SAMPLED_FROM_STEP = 16


#: The doctor's sampled tools watch one step in this many (``--deep``: every step).
DOCTOR_SAMPLE_EVERY = 8


def sampled(step: int, every: int) -> bool:
    """Whether a tool that samples one step in ``every`` watches ``step`` (the global step).

    Example:
        >>> [s for s in range(40) if sampled(s, 8)][14:]
        [14, 15, 16, 24, 32]
    """
    return every == 1 or step < SAMPLED_FROM_STEP or step % every == 0


def check_sample_every(value: Any) -> int:
    """``sample_every_n_steps``: an int of at least 1 (TypeError, ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`sample_every_n_steps` must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"`sample_every_n_steps` must be >= 1 (1: every step), got {value}")
    return value
