"""Host-side phase timing: which phase of the training step the host is in, and for how long.

A :class:`PhaseClock` is told when the host *switches* from one phase to the next (the
callback does it from Lightning's hooks) and charges the time since the last switch to the
phase that was running. Every moment between two batch ends is charged to exactly one phase,
so the phases of a batch add up to its wall time. Durations are kept per batch, summed over a
logging window and over the whole run. Only ``time.perf_counter`` values go in: nothing here
touches a device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PHASES", "PhaseClock", "PhaseTotals", "shares"]

#: The phases of a training step, in the order they usually run.
PHASES: tuple[str, ...] = (
    "data_wait",
    "batch_transfer",
    "training_step",
    "zero_grad",
    "backward",
    "optimizer_step",
    "other",
)


@dataclass
class PhaseTotals:
    """Seconds per phase summed over ``batches`` complete batches."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    batches: int = 0

    def add(self, batch: dict[str, float]) -> None:
        """Add one batch's seconds per phase."""
        for name, value in batch.items():
            self.seconds[name] += value
        self.batches += 1

    def mean_ms(self) -> dict[str, float]:
        """Mean milliseconds per batch of each phase (zeros when no batch was added)."""
        n = self.batches or 1
        return {name: 1000.0 * value / n for name, value in self.seconds.items()}

    def total_seconds(self) -> float:
        """Seconds of all phases together."""
        return sum(self.seconds.values())


def shares(seconds: dict[str, float]) -> dict[str, float]:
    """Each phase's fraction of the sum (all zeros when nothing was timed).

    Example:
        >>> shares({"data_wait": 1.0, "backward": 3.0})
        {'data_wait': 0.25, 'backward': 0.75}
    """
    total = sum(seconds.values())
    return {name: (value / total if total > 0 else 0.0) for name, value in seconds.items()}


class PhaseClock:
    """Charges the time between switches to the running phase; sums per batch, window and run.

    Example:
        >>> clock = PhaseClock()
        >>> clock.switch("data_wait", 0.0)
        >>> clock.switch("training_step", 0.010)
        >>> clock.switch("backward", 0.030)
        >>> clock.end_batch(0.060)
        >>> {k: round(v) for k, v in clock.take_window().items() if v}
        {'data_wait': 10, 'training_step': 20, 'backward': 30}
    """

    def __init__(self) -> None:
        self.current: str | None = None
        self._since = 0.0
        self._batch: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.window = PhaseTotals()
        self.run = PhaseTotals()

    def switch(self, phase: str | None, now: float) -> None:
        """From ``now`` on the host is in ``phase`` (None: paused, nothing is charged).

        Raises:
            KeyError: ``phase`` is not one of :data:`PHASES`.
        """
        if phase is not None and phase not in self._batch:
            raise KeyError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
        if self.current is not None:
            self._batch[self.current] += now - self._since
        self.current = phase
        self._since = now

    def end_batch(self, now: float) -> None:
        """Close the running phase and count the batch into the window and the run."""
        self.switch(None, now)
        self.window.add(self._batch)
        self.run.add(self._batch)
        self._batch = dict.fromkeys(PHASES, 0.0)

    def discard_batch(self) -> None:
        """Drop what the unfinished batch collected (the run ended before its end)."""
        self.current = None
        self._batch = dict.fromkeys(PHASES, 0.0)

    def take_window(self) -> dict[str, float]:
        """Mean milliseconds per batch of each phase over the window, then start a new window."""
        means = self.window.mean_ms()
        self.window = PhaseTotals()
        return means

    def reset(self) -> None:
        """Forget everything (a new fit)."""
        self.__init__()  # type: ignore[misc]
