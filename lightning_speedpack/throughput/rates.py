"""Pure throughput maths: a step clock, windowed rates, cross-rank sums and MFU.

Nothing here reads a clock or a device: callers pass times (``time.perf_counter()`` values)
and counts, so every figure can be tested with exact numbers. The rate over a window is
``sum(samples) / sum(step seconds)`` over the window's steps; with asynchronous kernels each
single step interval is noisy but the sum over a window is exact in steady state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "RATE_FIELDS",
    "StepClock",
    "StepRecord",
    "WindowRates",
    "combine_ranks",
    "mfu",
    "rates",
    "window_rates",
]


class StepRecord(NamedTuple):
    """One training batch: its wall interval (data wait included), what it held, its wait.

    A ``NamedTuple`` rather than a dataclass: one is built per training step, and tuples are
    the cheapest record Python has.
    """

    seconds: float
    samples: int
    items: int = 0
    data_wait: float = 0.0
    flops: float = 0.0


@dataclass(frozen=True)
class WindowRates:
    """Rates of one rank (or, after :func:`combine_ranks`, of the world) over a window."""

    samples_per_sec: float
    batches_per_sec: float
    items_per_sec: float
    flops_per_sec: float
    step_time_ms: float
    data_wait_ms: float
    data_wait_fraction: float

    def vector(self) -> list[float]:
        """The fields in :data:`RATE_FIELDS` order, for one small cross-rank sum."""
        return [float(getattr(self, name)) for name in RATE_FIELDS]


RATE_FIELDS: tuple[str, ...] = (
    "samples_per_sec",
    "batches_per_sec",
    "items_per_sec",
    "flops_per_sec",
    "step_time_ms",
    "data_wait_ms",
    "data_wait_fraction",
)
# Summed over ranks (the world's rate); the other fields are averaged over ranks.
_SUMMED = frozenset({"samples_per_sec", "batches_per_sec", "items_per_sec", "flops_per_sec"})


def window_rates(records: Iterable[StepRecord]) -> WindowRates | None:
    """Return the rates over ``records``, or None when they span no time.

    Example:
        >>> steps = [StepRecord(0.5, 32, data_wait=0.1), StepRecord(0.5, 32, data_wait=0.3)]
        >>> r = window_rates(steps)
        >>> r.samples_per_sec, r.step_time_ms, r.data_wait_fraction
        (64.0, 500.0, 0.4)
    """
    batches = 0
    seconds = wait = flops = 0.0
    samples = items = 0
    for record in records:
        batches += 1
        seconds += record.seconds
        samples += record.samples
        items += record.items
        wait += record.data_wait
        flops += record.flops
    return rates(batches, seconds, samples, items, wait, flops)


def rates(
    batches: int,
    seconds: float,
    samples: int,
    items: int = 0,
    wait: float = 0.0,
    flops: float = 0.0,
) -> WindowRates | None:
    """Return the rates of ``batches`` that took ``seconds`` in all, or None when no time passed.

    Example:
        >>> rates(batches=10, seconds=2.0, samples=320).samples_per_sec
        160.0
    """
    if batches <= 0 or seconds <= 0.0:
        return None
    return WindowRates(
        samples_per_sec=samples / seconds,
        batches_per_sec=batches / seconds,
        items_per_sec=items / seconds,
        flops_per_sec=flops / seconds,
        step_time_ms=1000.0 * seconds / batches,
        data_wait_ms=1000.0 * wait / batches,
        data_wait_fraction=min(1.0, max(0.0, wait / seconds)),
    )


def combine_ranks(summed: Sequence[float], ranks: int) -> WindowRates:
    """Turn the element-wise sum of ``ranks`` :meth:`WindowRates.vector`s into the world's rates.

    Rates (samples, batches, items, FLOPs per second) are the sum over ranks of what each rank
    processed; times and the data-wait fraction are the mean over ranks.

    Raises:
        ValueError: ``summed`` does not have one value per field, or ``ranks`` < 1.

    Example:
        >>> a = WindowRates(100.0, 10.0, 0.0, 0.0, 100.0, 20.0, 0.2).vector()
        >>> b = WindowRates(300.0, 10.0, 0.0, 0.0, 100.0, 40.0, 0.4).vector()
        >>> w = combine_ranks([x + y for x, y in zip(a, b)], ranks=2)
        >>> w.samples_per_sec, w.data_wait_fraction
        (400.0, 0.30000000000000004)
    """
    if len(summed) != len(RATE_FIELDS):
        raise ValueError(f"expected {len(RATE_FIELDS)} summed values, got {len(summed)}")
    if ranks < 1:
        raise ValueError(f"`ranks` must be >= 1, got {ranks}")
    values = {
        name: float(value) if name in _SUMMED else float(value) / ranks
        for name, value in zip(RATE_FIELDS, summed, strict=True)
    }
    return WindowRates(**values)


def mfu(flops_per_sec: float, peak_flops_per_device: float | None, devices: int) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the peak of all ``devices``, or None.

    Example:
        >>> mfu(156e12, 312e12, devices=1)
        0.5
    """
    if not peak_flops_per_device or peak_flops_per_device <= 0 or devices < 1:
        return None
    return flops_per_sec / (peak_flops_per_device * devices)


class StepClock:
    """Turns hook times into :class:`StepRecord` intervals, excluding paused (validation) time.

    A step's interval runs from the previous batch's end (or the epoch's start) to this
    batch's end; its data wait is the part before ``batch_start``. Time between ``pause`` and
    ``resume`` is removed from the clock, so validation never counts as training time.

    Example:
        >>> clock = StepClock(window=2)
        >>> clock.epoch_start(0.0)
        >>> clock.batch_start(0.25)
        >>> clock.batch_end(1.0, samples=8).data_wait
        0.25
        >>> clock.pause(1.0); clock.resume(5.0)  # validation: excluded
        >>> clock.batch_start(5.0)
        >>> clock.batch_end(6.0, samples=8).seconds
        1.0
        >>> window_rates(clock.window).samples_per_sec
        8.0
    """

    def __init__(self, window: int) -> None:
        self.window: deque[StepRecord] = deque(maxlen=window)
        self._offset = 0.0  # paused seconds so far
        self._paused_at: float | None = None
        self._last_end: float | None = None
        self._start: float | None = None

    def _train_time(self, now: float) -> float:
        return now - self._offset

    def epoch_start(self, now: float) -> None:
        """Mark the start of an epoch: the first batch's data wait is measured from here."""
        self._last_end = self._train_time(now)
        self._start = None

    def batch_start(self, now: float) -> None:
        """Mark that the DataLoader delivered the next batch."""
        self._start = self._train_time(now)

    def batch_end(
        self, now: float, samples: int, items: int = 0, flops: float = 0.0
    ) -> StepRecord | None:
        """Close the step, append it to the window and return it (None if it never started)."""
        end = self._train_time(now)
        previous = self._last_end
        start = self._start
        self._last_end, self._start = end, None
        if previous is None or start is None:
            return None
        record = StepRecord(
            seconds=max(0.0, end - previous),
            samples=samples,
            items=items,
            data_wait=max(0.0, start - previous),
            flops=flops,
        )
        self.window.append(record)
        return record

    def pause(self, now: float) -> None:
        """Stop the clock (validation starts); idempotent."""
        if self._paused_at is None:
            self._paused_at = now

    def resume(self, now: float) -> None:
        """Restart the clock, excluding the time since :meth:`pause`."""
        if self._paused_at is not None:
            self._offset += max(0.0, now - self._paused_at)
            self._paused_at = None

    def reset(self) -> None:
        """Forget the window and the open step (new fit, or a resume from a checkpoint)."""
        self.window.clear()
        self._offset = 0.0
        self._paused_at = self._last_end = self._start = None
