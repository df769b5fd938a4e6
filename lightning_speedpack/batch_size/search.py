"""Pure helpers behind :class:`~lightning_speedpack.BatchSizeTuner`.

Which batch size to try next (:class:`SizeSearch`; in ``mode="nearest"``,
:func:`nearest_candidates` around today's size, from :func:`nearest_multiples`), which measured
size to keep (:func:`pick_fastest`, :func:`pick_nearest`), whether an exception is an
out-of-memory error (:func:`is_oom_error`) and how to give the memory back afterwards
(:func:`free_memory`). Nothing here knows about Lightning.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from lightning_speedpack.core.memory import OOM_MESSAGES, free_memory, is_oom_error

__all__ = [
    "OOM_MESSAGES",
    "THROUGHPUT_TIE_TOLERANCE",
    "SizeSearch",
    "Trial",
    "format_trials",
    "free_memory",
    "is_oom_error",
    "nearest_candidates",
    "nearest_multiples",
    "next_throughput_size",
    "pick_fastest",
    "pick_nearest",
    "round_down",
    "round_up",
]


#: Sizes whose samples/s are within this fraction of the fastest count as tied: a timing
#: difference this small is noise on a shared machine. :func:`pick_fastest` gives a tie to the
#: larger size, :func:`pick_nearest` to the size closest to today's.
THROUGHPUT_TIE_TOLERANCE = 0.02


class Trial(NamedTuple):
    """One tried batch size: whether it fit (on every rank) and its measured samples/s."""

    batch_size: int
    fits: bool
    samples_per_sec: float | None = None


def round_down(value: float, multiple: int) -> int:
    """Return the largest multiple of ``multiple`` that is ``<= value`` (0 when none is).

    Example:
        >>> round_down(665, 8), round_down(7.9, 8)
        (664, 0)
    """
    return int(value // multiple) * multiple


def round_up(value: int, multiple: int) -> int:
    """Return the smallest multiple of ``multiple`` that is ``>= value``.

    Example:
        >>> round_up(50, 8), round_up(64, 8), round_up(0, 8)
        (56, 64, 0)
    """
    return -(-value // multiple) * multiple


def nearest_multiples(size: int, multiple_of: int, cap: int | None = None) -> list[int]:
    """Return the multiples of ``multiple_of`` nearest to ``size``, ascending, none above ``cap``.

    The multiple just below ``size`` and the one just above it; ``[size]`` alone when ``size``
    already is a multiple. ``size`` itself is not in the list otherwise (see
    :func:`nearest_candidates` for the list a measurement compares). A multiple above ``cap``
    (``max_val``, the dataset's length per rank) is left out; when ``cap`` is below ``size``
    the multiple below is the largest one ``<= cap`` instead (a loader over ``cap`` samples
    never yields a batch larger than ``cap``). Zero is not a batch size: for ``size <
    multiple_of`` only ``multiple_of`` is returned, and the list is empty when ``cap <
    multiple_of``.

    Args:
        size: today's batch size.
        multiple_of: the multiple wanted (8 for tensor cores).
        cap: no size above this; ``None``: no cap.

    Raises:
        TypeError: ``size``, ``multiple_of`` or ``cap`` is not an int.
        ValueError: one of them is below 1.

    Example:
        >>> nearest_multiples(50, 8), nearest_multiples(64, 8), nearest_multiples(5, 8)
        ([48, 56], [64], [8])
        >>> nearest_multiples(50, 8, cap=52), nearest_multiples(50, 8, cap=40)
        ([48], [40])
        >>> nearest_multiples(50, 8, cap=7)
        []
    """
    for name, value in (("size", size), ("multiple_of", multiple_of), ("cap", cap)):
        if value is None and name == "cap":
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"`{name}` must be an int, got {type(value).__name__} {value!r}")
        if value < 1:
            raise ValueError(f"`{name}` must be a positive int, got {value}")
    upper = size if cap is None else min(size, cap)
    below, above = round_down(upper, multiple_of), round_up(size, multiple_of)
    return sorted({m for m in (below, above) if m >= multiple_of and (cap is None or m <= cap)})


def nearest_candidates(size: int, multiple_of: int, cap: int | None = None) -> list[int]:
    """Return the sizes ``mode="nearest"`` measures: ``size`` and :func:`nearest_multiples`.

    Ascending. Today's ``size`` is always in the list, whatever ``cap``: it is what the run
    does without the tuner, the baseline the multiples must beat. ``[size]`` alone means
    there is nothing to measure: ``size`` already is a multiple of ``multiple_of`` (within
    ``cap``), or no multiple is ``<= cap``.

    Example:
        >>> nearest_candidates(50, 8), nearest_candidates(64, 8), nearest_candidates(50, 8, cap=52)
        ([48, 50, 56], [64], [48, 50])
    """
    return sorted({size, *nearest_multiples(size, multiple_of, cap)})


class SizeSearch:
    """The sequence of batch sizes to try: grow x2, bisect, then verify the size minus the margin.

    Every size it proposes is a multiple of ``multiple_of`` between ``multiple_of`` and ``cap``.
    Call :meth:`next_size`, try that size, :meth:`record` whether it fit, and repeat until
    :meth:`next_size` returns ``None``; :attr:`largest_fit` is then the largest size that fit and
    :attr:`result` the chosen one (``largest_fit`` minus ``margin``, rounded down, verified by a
    trial at that exact size), or ``None`` when not even ``multiple_of`` fit.

    Args:
        init_val: first size to try (rounded up to a multiple).
        max_val: no size above this (rounded down to a multiple) is tried.
        multiple_of: every size is a multiple of this.
        margin: fraction taken off the largest fitting size before rounding down (only when a
            size ran out of memory; a search stopped by ``max_val`` or ``cap`` keeps the cap).
        cap: another upper bound, e.g. the dataset's length (rounded down to a multiple).

    Raises:
        ValueError: the bounds leave no multiple of ``multiple_of`` to try.

    Example:
        >>> search, limit = SizeSearch(init_val=8, max_val=8192, multiple_of=8, margin=0.05), 700
        >>> while (size := search.next_size()) is not None:
        ...     search.record(size, size <= limit)
        >>> search.largest_fit, search.result, [t.batch_size for t in search.trials]
        (696, 656, [8, 16, 32, 64, 128, 256, 512, 1024, 768, 640, 704, 672, 688, 696, 656])
    """

    def __init__(
        self, init_val: int, max_val: int, multiple_of: int, margin: float, cap: int | None = None
    ) -> None:
        self.multiple_of = multiple_of
        self.margin = margin
        upper = max_val if cap is None else min(max_val, cap)
        self.cap = round_down(upper, multiple_of)
        if self.cap < multiple_of:
            raise ValueError(
                f"no multiple of {multiple_of} is <= {upper} (max_val={max_val}, cap={cap}); "
                f"lower `multiple_of` or raise `max_val`/the dataset size"
            )
        start = -(-max(init_val, 1) // multiple_of) * multiple_of  # round up
        self.trials: list[Trial] = []
        self._fits: dict[int, bool] = {}
        self._low = 0  # largest size known to fit (0: none yet)
        self._high: int | None = None  # smallest size known not to fit
        self._phase = "grow"
        self._next: int | None = min(start, self.cap)
        self.result: int | None = None

    @property
    def largest_fit(self) -> int | None:
        """The largest size that fit so far, or ``None``."""
        return self._low or None

    @property
    def done(self) -> bool:
        """Whether the search has finished."""
        return self._phase == "done"

    def next_size(self) -> int | None:
        """Return the next size to try, or ``None`` when the search is over."""
        while self._next is not None and self._next in self._fits:  # known: never tried twice
            self._advance(self._next, self._fits[self._next])
        return self._next

    def record(self, size: int, fits: bool, samples_per_sec: float | None = None) -> None:
        """Record the outcome of trying ``size`` (the size :meth:`next_size` returned)."""
        if size != self._next:
            raise ValueError(f"expected a result for batch size {self._next}, got one for {size}")
        self.trials.append(Trial(size, fits, samples_per_sec if fits else None))
        self._fits[size] = fits
        self._advance(size, fits)

    def _advance(self, size: int, fits: bool) -> None:
        m = self.multiple_of
        if fits:
            self._low = max(self._low, size)
        else:
            self._high = size if self._high is None else min(self._high, size)
        if self._phase == "verify":
            if fits:
                self._finish(size)
                return
            # Did not fit although a larger size did (fragmentation, noise): search below it.
            self._low, self._phase = 0, "bisect"
        elif self._phase == "grow" and fits and size < self.cap:
            self._next = min(size * 2, self.cap)
            return
        if self._high is not None and self._high - self._low > m:
            self._phase = "bisect"
            self._next = round_down((self._low + self._high) // 2, m)
            if self._next <= self._low:  # pragma: no cover - guarded by the loop condition
                self._next = self._low + m
            return
        self._verify()

    def _verify(self) -> None:
        m = self.multiple_of
        if self._low == 0:
            self._phase, self._next = "done", None
            return
        if self._high is None:
            # Nothing ran out of memory: the cap (max_val or the dataset) stopped the search,
            # and the margin, a memory safety fraction, has nothing to protect against.
            self._finish(self._low)
            return
        target = max(m, round_down(self._low * (1.0 - self.margin), m))
        if self._fits.get(target):
            self._finish(target)
            return
        self._phase, self._next = "verify", target

    def _finish(self, size: int) -> None:
        self.result = size
        self._phase, self._next = "done", None


def pick_fastest(
    trials: Iterable[Trial], limit: int, tie_tolerance: float = THROUGHPUT_TIE_TOLERANCE
) -> int | None:
    """Return the fitting size ``<= limit`` with the most samples/s; near-ties go to the larger.

    Example:
        >>> pick_fastest([Trial(8, True, 100.0), Trial(16, True, 150.0), Trial(32, True, 149.0),
        ...               Trial(64, False)], limit=64)
        32
    """
    measured = [
        t for t in trials if t.fits and t.batch_size <= limit and t.samples_per_sec is not None
    ]
    if not measured:
        return None
    best = max(t.samples_per_sec or 0.0 for t in measured)
    tied = [
        t.batch_size for t in measured if (t.samples_per_sec or 0.0) >= best * (1 - tie_tolerance)
    ]
    return max(tied)


def pick_nearest(
    trials: Iterable[Trial], size: int, tie_tolerance: float = THROUGHPUT_TIE_TOLERANCE
) -> int | None:
    """Return the fitting size with the most samples/s; near-ties go to the one closest to ``size``.

    ``size`` is today's batch size: among the sizes within ``tie_tolerance`` of the fastest, the
    one that changes the optimisation least wins (then the faster, then the larger). ``None``
    when no trial fit with a measured speed.

    Example:
        >>> trials = [Trial(48, True, 1000.0), Trial(50, True, 990.0), Trial(56, True, 1010.0)]
        >>> pick_nearest(trials, size=50)  # all three within 2% of the fastest: 50 stays
        50
        >>> pick_nearest(trials, size=50, tie_tolerance=0.0)
        56
        >>> pick_nearest([Trial(48, True, 1000.0), Trial(50, False), Trial(56, True, 900.0)], 50)
        48
    """
    measured = [t for t in trials if t.fits and t.samples_per_sec is not None]
    if not measured:
        return None
    best = max(t.samples_per_sec or 0.0 for t in measured)
    tied = [t for t in measured if (t.samples_per_sec or 0.0) >= best * (1 - tie_tolerance)]
    return min(
        tied, key=lambda t: (abs(t.batch_size - size), -(t.samples_per_sec or 0.0), -t.batch_size)
    ).batch_size


def format_trials(trials: Sequence[Trial], chosen: int | None) -> str:
    """Render the trials as a plain-text table (for logs and the doctor report).

    Example:
        >>> print(format_trials([Trial(8, True, 1000.0), Trial(16, False)], chosen=8))
        batch size  fits  samples/s
                 8   yes     1000.0  <- chosen
                16    no          -
    """
    lines = ["batch size  fits  samples/s"]
    for t in trials:
        speed = "-" if t.samples_per_sec is None else f"{t.samples_per_sec:.1f}"
        mark = "  <- chosen" if t.batch_size == chosen and t.fits else ""
        lines.append(f"{t.batch_size:>10}  {'yes' if t.fits else 'no':>4}  {speed:>9}{mark}")
    return "\n".join(lines)


def next_throughput_size(
    trials: Sequence[Trial],
    limit: int,
    multiple_of: int,
    tie_tolerance: float = THROUGHPUT_TIE_TOLERANCE,
) -> int | None:
    """Return the next size to measure around the fastest one so far, or ``None`` when done.

    The growth-and-bisection search measures sizes a factor of two apart below the memory limit;
    samples/s can peak between them. This refines like a bisection on both sides of the fastest
    measured size: it proposes the midpoint (a multiple of ``multiple_of``) between the fastest
    size and its measured neighbour below, then above, until both gaps are one multiple wide.

    Example:
        >>> speeds = {8: 100.0, 16: 180.0, 32: 300.0, 64: 280.0, 128: 200.0}
        >>> trials = [Trial(s, True, v) for s, v in speeds.items()]
        >>> next_throughput_size(trials, limit=128, multiple_of=8)
        24
    """
    measured = sorted(
        {t.batch_size for t in trials if t.fits and t.samples_per_sec is not None}
        & set(range(multiple_of, limit + 1, multiple_of))
    )
    best = pick_fastest(trials, limit, tie_tolerance)
    if best is None:
        return None
    tried = {t.batch_size for t in trials}
    i = measured.index(best)
    below = measured[i - 1] if i > 0 else 0
    above = measured[i + 1] if i + 1 < len(measured) else None
    for low, high in ((below, best), (best, above)):
        if high is None:
            continue
        mid = round_down((low + high) // 2, multiple_of)
        if low < mid < high and mid not in tried:
            return mid
    return None
