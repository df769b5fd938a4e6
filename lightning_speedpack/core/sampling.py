"""Which training steps a sampled tool watches: every step at first, then one in N, then fewer.

The doctor's per-step work is most of its cost on a millisecond step (issue 37: the clean
2-rank DDP job). Its tools that report shares and means (the step timeline's phases, the sync
points' counts per step) watch every step of the first :data:`SAMPLED_FROM_STEP`, so a short fit
keeps a series of its first steps, then one step in ``every``, and from
:data:`SPARSE_FROM_STEP` on one in ``every * SPARSER``: by then a tool has watched 22 steps
(with the doctor's 8), enough for the medians and counts it reports, and a long fit pays for a
few more samples rather than for one step in ``every`` to its end. They use the same rule with
the same ``every``, so the steps one of them watches are the steps the others watch: the
timeline places the syncs that the sync detector reports in the phases it times.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DOCTOR_SAMPLE_EVERY",
    "SAMPLED_FROM_STEP",
    "SPARSER",
    "SPARSE_FROM_STEP",
    "cadence",
    "check_sample_every",
    "end_due",
    "log_interval",
    "next_sampled",
    "sampled",
]

#: A sampled tool watches every step before this one (16 steps, then one in N, give the medians;
#: 64 cost a 2-epoch job of 32 batches a step's phases on every step).
SAMPLED_FROM_STEP = 16


#: The doctor's sampled tools watch one step in this many (``--deep``: every step).
DOCTOR_SAMPLE_EVERY = 8

#: From this step on a sampled tool watches one step in ``every * SPARSER`` (with the doctor's 8:
#: 16 steps, then 6 in 48, then one in 64). A watched step costs the doctor about a quarter of a
#: millisecond step (its tools wake, arm and sleep again): from step 128 and one in 32, as it
#: was, a 512-step fit watched 42 steps; now 29 (``benchmarks/doctor_instructions.py``).
SPARSE_FROM_STEP = 64
SPARSER = 8


def sampled(step: int, every: int) -> bool:
    """Whether a tool that samples one step in ``every`` watches ``step`` (the global step).

    Example:
        >>> [s for s in range(40) if sampled(s, 8)][14:]
        [14, 15, 16, 24, 32]
        >>> [s for s in range(48, 200) if sampled(s, 8)]
        [48, 56, 64, 128, 192]
    """
    if every == 1 or step < SAMPLED_FROM_STEP:
        return True
    return step % (every if step < SPARSE_FROM_STEP else every * SPARSER) == 0


def next_sampled(step: int, every: int) -> int:
    """The first step after ``step`` that :func:`sampled` watches (when a sleeper wakes).

    Example:
        >>> [next_sampled(s, 8) for s in (3, 15, 16, 17, 23, 24, 56, 63, 64)]
        [4, 16, 24, 24, 24, 32, 64, 64, 128]
        >>> all(
        ...     sampled(n := next_sampled(s, e), e)
        ...     and not any(sampled(m, e) for m in range(s + 1, n))
        ...     for e in (2, 5, 8) for s in range(300)
        ... )
        True
    """
    if every == 1 or step + 1 < SAMPLED_FROM_STEP:
        return step + 1
    following = (step // every + 1) * every
    if following < SPARSE_FROM_STEP:
        return following
    sparse = every * SPARSER  # a multiple of `every`: its next multiple is `following` or later
    return (step // sparse + 1) * sparse


def cadence(every: int, timed: int | None = None) -> str:
    """How a tool that samples with ``every`` picks its steps, in words (for its report).

    ``timed``: the steps it timed in the fit; no more than it times before
    :data:`SPARSE_FROM_STEP`, and the back-off, which the fit never reached, goes unsaid.

    Example:
        >>> cadence(8)
        '1 step in 8, from step 64 1 in 64'
        >>> cadence(8, timed=22), cadence(8, timed=23)
        ('1 step in 8', '1 step in 8, from step 64 1 in 64')
        >>> cadence(1)
        'every step'
    """
    if every == 1:
        return "every step"
    dense = f"1 step in {every}"
    if timed is not None and timed <= sum(sampled(s, every) for s in range(SPARSE_FROM_STEP)):
        return dense
    return f"{dense}, from step {SPARSE_FROM_STEP} 1 in {every * SPARSER}"


def check_sample_every(value: Any) -> int:
    """``sample_every_n_steps``: an int of at least 1 (TypeError, ValueError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`sample_every_n_steps` must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"`sample_every_n_steps` must be >= 1 (1: every step), got {value}")
    return value


def log_interval(own: int | None, trainer: Any) -> int:
    """A tool's logging cadence in steps: its own ``log_every_n_steps``, else the Trainer's.

    0 logs no step, as Lightning logs none (``Trainer(log_every_n_steps=0)``, what
    ``barebones=True`` sets): a tool checks it before dividing by it.

    Example:
        >>> from types import SimpleNamespace
        >>> log_interval(None, SimpleNamespace(log_every_n_steps=20)), log_interval(5, None)
        (20, 5)
        >>> log_interval(None, SimpleNamespace(log_every_n_steps=0)), log_interval(None, None)
        (0, 50)
    """
    return own or int(getattr(trainer, "log_every_n_steps", 50))


def end_due(step: int, every: int, log_every: int) -> int:
    """The step of the next batch whose end opens a sampled step or logs (a sleeper's wake).

    A batch that starts at step ``S - 1`` ends at step ``S``: its end is where a timeline opens
    step ``S`` (before its fetch) or logs the window of steps it timed.

    ``log_every`` 0 logs no step (``Trainer(log_every_n_steps=0)``, ``barebones=True``).

    Example:
        >>> end_due(17, 8, 50), end_due(17, 8, 20), end_due(3, 8, 50), end_due(17, 8, 0)
        (23, 19, 3, 23)
    """
    if log_every <= 0:
        return next_sampled(step, every) - 1
    return min(next_sampled(step, every), (step // log_every + 1) * log_every) - 1
