"""What one remedy measured, and the verdict: plain data and arithmetic, no Lightning.

A trial alternates the baseline (today's setting) and the candidate ``rounds`` times and keeps
each round's pair of rates; the gain of a round is the candidate's rate over the baseline's of
the same round, so a machine that slowed down between rounds slows both. The verdict:

- ``"apply"``: every round gained at least ``min_gain`` and the numerics stayed within the
  tolerance (a noisy machine can fake one round's gain, not all of them);
- ``"changes the numerics"``: faster, but the loss moved beyond the tolerance;
- ``"uncertain"``: the median gained ``min_gain`` but not every round did;
- ``"no gain here"``: the median did not gain ``min_gain``;
- ``"not applicable"`` / ``"not tried"`` with the reason, when nothing was measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "APPLY",
    "NOT_APPLICABLE",
    "NOT_TRIED",
    "Measurement",
    "best_of",
    "relative_difference",
]

APPLY = "apply"
NOT_APPLICABLE = "not applicable"
NOT_TRIED = "not tried"
NO_GAIN = "no gain here"
UNCERTAIN = "uncertain"
NUMERICS = "changes the numerics"


@dataclass
class Measurement:
    """One knob: today's setting, one candidate, the rates of each round, the numerics.

    Attributes:
        knob: the knob's name.
        side: ``"loader"`` or ``"model"``.
        today: today's setting, as text.
        candidate: the setting tried, as text (None: nothing was tried).
        value: the candidate as the code applies it (an int, a bool, a string).
        before: the baseline's rate (samples/s) in each round.
        after: the candidate's rate in each round.
        numerics: the largest relative loss difference against the baseline over the trial
            steps (None: not a model-side knob, or no loss to compare).
        reason: why it was not measured, or a note on the measurement.
        extra: knob-specific figures (compile seconds, epoch start-up seconds, ...).
        fit_before: the fit's projected samples/s in each round with today's setting, from
            ``before`` and the other side's measured rate
            (:func:`~lightning_speedpack.what_if.fit_gain.project_fit`); empty: not projected.
        fit_after: the same with the candidate.

    The gain is the fit's (``fit_after`` over ``fit_before``) when it was projected: a loader
    twice as fast does not make a fit twice as fast when the model's step takes most of it.
    The trial's own ratio (the loader or the model alone) stays in :attr:`ceiling_gain`.

    Example:
        >>> m = Measurement("num_workers", "loader", "0", "2", 2, [100.0, 90.0, 110.0],
        ...                 [190.0, 180.0, 200.0])
        >>> m.gain, m.spread, m.verdict(1.05, 1e-3)
        (1.9, (1.8181818181818181, 2.0), 'apply')
    """

    knob: str
    side: str
    today: str
    candidate: str | None = None
    value: Any = None
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    numerics: float | None = None
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    status: str | None = None  # NOT_APPLICABLE or NOT_TRIED when nothing was measured
    fit_before: list[float] = field(default_factory=list)
    fit_after: list[float] = field(default_factory=list)

    @classmethod
    def skipped(cls, knob: str, side: str, today: str, status: str, reason: str) -> Measurement:
        """A knob that was not measured, with the reason."""
        return cls(knob, side, today, status=status, reason=reason)

    @property
    def projected(self) -> bool:
        """Whether the gain is the fit's, projected from both sides (see the class docstring)."""
        return bool(self.fit_before and self.fit_after)

    @property
    def gains(self) -> list[float]:
        """The gain of each round: the fit's when projected, else the trial's own."""
        if self.projected:
            return _ratios(self.fit_before, self.fit_after)
        return self.ceiling_gains

    @property
    def ceiling_gains(self) -> list[float]:
        """The candidate's rate over the baseline's in the trial itself, per round."""
        return _ratios(self.before, self.after)

    @property
    def ceiling_gain(self) -> float | None:
        """The median of :attr:`ceiling_gains` (the loader's or the model's own gain)."""
        gains = self.ceiling_gains
        return statistics.median(gains) if gains else None

    @property
    def rate_before(self) -> float | None:
        """The samples/s the gain is a ratio of, today (the fit's when projected)."""
        values = self.fit_before if self.projected else self.before
        return statistics.median(values) if values else None

    @property
    def rate_after(self) -> float | None:
        """The same with the candidate."""
        values = self.fit_after if self.projected else self.after
        return statistics.median(values) if values else None

    @property
    def gain(self) -> float | None:
        """The median gain over the rounds (None: not measured)."""
        gains = self.gains
        return statistics.median(gains) if gains else None

    @property
    def spread(self) -> tuple[float, float] | None:
        """The lowest and highest gain of a round."""
        gains = self.gains
        return (min(gains), max(gains)) if gains else None

    @property
    def ceiling_before(self) -> float | None:
        """The baseline's median rate."""
        return statistics.median(self.before) if self.before else None

    @property
    def ceiling_after(self) -> float | None:
        """The candidate's median rate."""
        return statistics.median(self.after) if self.after else None

    def verdict(self, min_gain: float, tolerance: float) -> str:
        """``apply``, ``changes the numerics``, ``uncertain``, ``no gain here`` or the status."""
        if self.status is not None:
            return self.status
        gain, gains = self.gain, self.gains
        if gain is None:
            return NOT_TRIED
        if gain < min_gain:
            return NO_GAIN
        if self.numerics is not None and self.numerics > tolerance:
            return NUMERICS
        if min(gains) < min_gain:
            return UNCERTAIN
        return APPLY


def _ratios(before: list[float], after: list[float]) -> list[float]:
    return [a / b for a, b in zip(after, before, strict=False) if b > 0]


def best_of(measurements: list[Measurement]) -> Measurement | None:
    """The candidate with the highest median gain (None when none was measured).

    Example:
        >>> a = Measurement("num_workers", "loader", "0", "1", 1, [10.0], [15.0])
        >>> b = Measurement("num_workers", "loader", "0", "2", 2, [10.0], [19.0])
        >>> best_of([a, b]).candidate
        '2'
    """
    measured = [m for m in measurements if m.gain is not None]
    return max(measured, key=lambda m: m.gain or 0.0) if measured else None


def relative_difference(baseline: list[float], candidate: list[float]) -> float | None:
    """The largest ``|candidate - baseline| / |baseline|`` over paired losses (None: no pair).

    Example:
        >>> relative_difference([2.0, 1.0], [2.0, 1.01])
        0.01...
    """
    pairs = list(zip(baseline, candidate, strict=False))
    if not pairs:
        return None
    return max(abs(c - b) / max(abs(b), 1e-12) for b, c in pairs)
