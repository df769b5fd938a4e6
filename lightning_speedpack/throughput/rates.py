"""Pure throughput maths: a step clock, windowed rates, cross-rank sums and MFU.

Nothing here reads a clock or a device: callers pass times (``time.perf_counter()`` values)
and counts, so every figure can be tested with exact numbers. The rate over a window is
``sum(samples) / sum(step seconds)`` over the window's steps; with asynchronous kernels each
single step interval is noisy but the sum over a window is exact in steady state.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

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
    """Turns batch ends and loader fetch times into steps, excluding paused (validation) time.

    A step's interval runs from the previous batch's end (or the epoch's start) to this
    batch's end. Its data wait is what :meth:`add_wait` reported since the previous batch's end
    (or the epoch's start): the seconds spent inside the DataLoader's fetch, not a gap between
    two hooks, so what other code does between batches counts as step time and never as
    waiting for data. Time between ``pause`` and ``resume`` is removed from the clock, so
    validation never counts as training time.

    Built for a per-step cost of a few stores: the last ``window`` steps live in preallocated
    ring buffers, and the run's totals (``samples``, ``batches``, ``items``, ``train_seconds``,
    ``wait_seconds``, ``flops``) take in the ring's steps once per lap of it; a read adds the
    lap so far. Both add in step order, so they equal a running sum (to the bit before
    Python 3.12, whose ``sum`` of floats rounds better).
    :meth:`tick` allocates nothing but the floats it computes; :meth:`batch_end` is
    :meth:`tick` returning the step as a :class:`StepRecord`; :attr:`window` builds the
    records on demand.

    Example:
        >>> clock = StepClock(window=2)
        >>> clock.epoch_start(0.0)
        >>> clock.add_wait(0.25)  # the DataLoader's fetch took 0.25 s
        >>> clock.batch_start()
        >>> clock.batch_end(1.0, samples=8).data_wait
        0.25
        >>> clock.pause(1.0); clock.resume(5.0)  # validation: excluded
        >>> clock.batch_start()
        >>> clock.batch_end(6.0, samples=8).seconds
        1.0
        >>> clock.window_rates().samples_per_sec, clock.samples
        (8.0, 16.0)
    """

    __slots__ = (
        "_done",
        "_flops",
        "_items",
        "_last_end",
        "_next",
        "_offset",
        "_paused_at",
        "_pending",
        "_samples",
        "_seconds",
        "_size",
        "_started",
        "_stored",
        "_wait",
        "_waits",
    )

    def __init__(self, window: int) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"`window` must be a positive int, got {window!r}")
        self._size = window
        self._seconds = [0.0] * window
        self._waits = [0.0] * window
        self._samples = [0] * window
        self._items = [0] * window
        self._flops = [0.0] * window
        self._next = 0  # the ring slot the next step goes to
        self._stored = 0  # steps put in the ring since the reset (the window: the last ones)
        self._pending = 0  # ring slots [_pending, _next) are not in the totals yet
        self._done = [0.0] * len(_TOTAL_NAMES)  # totals of the steps taken in
        self._offset = 0.0  # paused seconds so far
        self._paused_at: float | None = None
        self._last_end: float | None = None
        self._started = False  # the open step's batch reached `batch_start`
        self._wait = 0.0  # loader seconds reported for the open step

    # ---- per step ----------------------------------------------------------------------------

    def epoch_start(self, now: float) -> None:
        """Mark the start of an epoch: the first batch's interval is measured from here."""
        self._last_end = now - self._offset
        self._started = False
        self._wait = 0.0

    def batch_start(self) -> None:
        """Mark that the open step's batch reached the model (a step that never did is dropped)."""
        self._started = True

    def add_wait(self, seconds: float) -> None:
        """Charge ``seconds`` spent waiting for the DataLoader to the open step."""
        self._wait += seconds

    def tick(self, now: float, samples: int, items: int = 0, flops: float = 0.0) -> bool:
        """Close the step and put it in the window; False if it never started."""
        end = now - self._offset
        previous = self._last_end
        started = self._started
        wait = self._wait
        self._last_end = end
        self._started = False
        self._wait = 0.0
        if previous is None or not started:
            return False
        seconds = end - previous
        i = self._next
        self._seconds[i] = seconds if seconds > 0.0 else 0.0
        self._waits[i] = wait if wait > 0.0 else 0.0
        self._samples[i] = samples
        self._items[i] = items
        self._flops[i] = flops
        self._stored += 1
        self._next = i = i + 1
        if i == self._size:  # a lap is done: its steps go into the totals
            self._take_in()
            self._next = self._pending = 0
        return True

    def batch_end(
        self, now: float, samples: int, items: int = 0, flops: float = 0.0
    ) -> StepRecord | None:
        """:meth:`tick`, returning the step as a record (None if it never started)."""
        if not self.tick(now, samples, items, flops):
            return None
        i = (self._next - 1) % self._size
        return StepRecord(self._seconds[i], samples, items, self._waits[i], flops)

    # ---- around steps ------------------------------------------------------------------------

    def pause(self, now: float) -> None:
        """Stop the clock (validation starts); idempotent."""
        if self._paused_at is None:
            self._paused_at = now

    def resume(self, now: float) -> None:
        """Restart the clock, excluding the time since :meth:`pause`."""
        if self._paused_at is not None:
            self._offset += max(0.0, now - self._paused_at)
            self._paused_at = None

    def drop_last(self) -> None:
        """Take the newest step out of the window (it stays in the totals)."""
        if self._stored:
            self._take_in()
            self._stored = min(self._stored, self._size) - 1
            self._next = self._pending = (self._next - 1) % self._size

    def reset(self) -> None:
        """Forget the window and the open step (new fit, or a resume from a checkpoint)."""
        self._take_in()
        self._next = self._pending = self._stored = 0
        self._offset = 0.0
        self._paused_at = self._last_end = None
        self._started = False
        self._wait = 0.0

    def set_totals(
        self,
        samples: float = 0.0,
        batches: float = 0.0,
        items: float = 0.0,
        train_seconds: float = 0.0,
        wait_seconds: float = 0.0,
        flops: float = 0.0,
    ) -> None:
        """Set the run's totals (zero: a new fit; a checkpoint's: a resume)."""
        values = (samples, batches, items, train_seconds, wait_seconds, flops)
        self._done = [float(v) for v in values]
        self._pending = self._next  # the window's steps are not part of these totals

    # ---- reading -----------------------------------------------------------------------------

    def _take_in(self) -> None:
        """Add the ring's pending steps to the totals, one at a time, in step order."""
        self._done = self.totals()
        self._pending = self._next

    def totals(self) -> list[float]:
        """The run's totals, in :data:`_TOTAL_NAMES` order (``samples``, ``batches``, ...)."""
        a, b = self._pending, self._next
        done = self._done
        return [
            sum(self._samples[a:b], done[0]),
            done[1] + (b - a),
            sum(self._items[a:b], done[2]),
            sum(self._seconds[a:b], done[3]),
            sum(self._waits[a:b], done[4]),
            sum(self._flops[a:b], done[5]),
        ]

    @property
    def samples(self) -> float:
        """Samples of every step since the totals were set."""
        return self.totals()[0]

    @property
    def batches(self) -> float:
        """Steps since the totals were set."""
        return self._done[1] + (self._next - self._pending)

    @property
    def items(self) -> float:
        """Items of every step since the totals were set."""
        return self.totals()[2]

    @property
    def train_seconds(self) -> float:
        """Training seconds (data wait included, pauses excluded) since the totals were set."""
        return self.totals()[3]

    @property
    def wait_seconds(self) -> float:
        """Seconds spent waiting for data since the totals were set."""
        return self.totals()[4]

    @property
    def flops(self) -> float:
        """FLOPs of every step since the totals were set."""
        return self.totals()[5]

    def _window_sum(self, values: list[Any]) -> Any:
        # Oldest first, in one pass: the same figure as summing the window's records.
        n = min(self._stored, self._size)
        first = (self._next - n) % self._size
        end = first + n
        if end <= self._size:
            return sum(values[first:end])
        return sum(itertools.chain(values[first:], values[: end - self._size]))

    @property
    def window(self) -> list[StepRecord]:
        """The window's steps as records, oldest first (built on each read)."""
        n = min(self._stored, self._size)
        first = self._next - n
        return [
            StepRecord(
                self._seconds[i], self._samples[i], self._items[i], self._waits[i], self._flops[i]
            )
            for i in ((first + k) % self._size for k in range(n))
        ]

    def window_rates(self) -> WindowRates | None:
        """The rates over the window: :func:`window_rates` of :attr:`window`, without records."""
        return rates(
            min(self._stored, self._size),
            self._window_sum(self._seconds),
            self._window_sum(self._samples),
            self._window_sum(self._items),
            self._window_sum(self._waits),
            self._window_sum(self._flops),
        )

    def total_rates(self) -> WindowRates | None:
        """The rates over every step since the totals were set (None before the first)."""
        samples, batches, items, seconds, wait, flops = self.totals()
        return rates(int(batches), seconds, int(samples), int(items), wait, flops)


#: Names of :meth:`StepClock.totals`, in order.
_TOTAL_NAMES = ("samples", "batches", "items", "train_seconds", "wait_seconds", "flops")
