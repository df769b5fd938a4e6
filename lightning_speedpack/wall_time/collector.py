"""Python's garbage collector, timed: each pause charged to ``garbage_collection``, not to its host.

A collection runs whenever the process's allocations cross the collector's thresholds, inside
whatever code allocated last: a user's training step, Lightning's loop, or a callback's hook. A
full (generation 2) collection scans every tracked object; after ``import torch`` and Lightning
that is ~400,000 objects, 0.3-1.3 s on this project's 2-core machine. Left in the ledger, such a
pause is charged to the hook that happened to run: a six-step run once reported "the hooks of
callback SyncPointWarnings took 43% of the wall time" for a 1.2 s collection inside the
callback's end-of-fit table. :class:`CollectorClock` hears each collection through
``gc.callbacks`` and remembers which ledger bracket it fell in; :func:`carve_collections` then
moves those seconds from that bracket to the ``garbage_collection`` part.

Only the collector's own collections move: a ``gc.collect()`` that code calls (a callback that
collects every batch, Lightning's OOM handling) stays with the bracket that called it, its true
cause. The clock tells them apart by wrapping ``gc.collect`` while it runs (put back by
:meth:`CollectorClock.stop`); code that bound ``collect`` before the fit is not seen, and its
calls count as the collector's own.

Only collections on the fit's own thread in the fit's own process are counted. A collection on
another thread (a pin-memory or prefetch thread) holds the GIL, yet the fit's thread may then be
in C code that released it (a backward, a queue wait) and lose nothing. Forked DataLoader workers
inherit the callback; it ignores them by their process id.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import threading
from collections.abc import Callable
from time import perf_counter
from types import FrameType
from typing import Any

from lightning_speedpack.wall_time.ledger import Ledger

__all__ = ["COLLECTION", "CollectorClock", "carve_collections"]

#: The ledger part that Python's garbage collections are charged to.
COLLECTION = "garbage_collection"


class CollectorClock:
    """Seconds of Python's garbage collections per ledger bracket, while the ledger is open.

    Example:
        >>> import gc
        >>> ledger = Ledger()
        >>> ledger.open(perf_counter(), "setup")
        >>> clock = CollectorClock(ledger)
        >>> clock.start()
        >>> garbage = [[] for _ in range(100_000)]  # allocations: the collector runs by itself
        >>> _ = gc.collect()  # a call: counted apart, left with its caller
        >>> clock.stop()
        >>> sum(clock.collections) > 0, clock.explicit, set(clock.seconds) == {("setup", "")}
        (True, 1, True)
    """

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        #: seconds per (ledger key, detail) that was charged while each collection ran
        self.seconds: dict[tuple[str, str], float] = {}
        #: collections per generation (0, 1, 2) on the fit's thread
        self.collections = [0, 0, 0]
        #: the longest pause
        self.longest_s = 0.0
        #: ``gc.collect()`` calls made by code during the fit (left with their callers), and
        #: per calling line (file, line): how many and their seconds
        self.explicit = 0
        self.calls: dict[tuple[str, int], tuple[int, float]] = {}
        #: objects the job had frozen (``gc.freeze()``) when the fit began
        self.frozen = 0
        self._began = 0.0
        self._thread = 0
        self._pid = 0
        self._calling = 0  # > 0 inside a wrapped `gc.collect()` on the fit's thread
        self._wrapper: Callable[..., int] | None = None

    def start(self) -> None:
        """Hear every collection from now on (on this thread, in this process)."""
        self._thread, self._pid = threading.get_ident(), os.getpid()
        self.frozen = gc.get_freeze_count()
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        if self._wrapper is None:
            self._wrapper = self._wrap(gc.collect)
            gc.collect = self._wrapper

    def stop(self) -> None:
        """Stop hearing collections; ``gc.callbacks`` and ``gc.collect`` are left as found."""
        while self in gc.callbacks:
            gc.callbacks.remove(self)
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is not None and gc.collect is wrapper:  # not if someone wrapped it since
            gc.collect = wrapper.__wrapped__  # type: ignore[attr-defined]

    def _wrap(self, original: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(original)
        def collect(generation: int = 2) -> int:
            if threading.get_ident() != self._thread:
                return original(generation)
            self._calling += 1
            started = perf_counter()
            try:
                return original(generation)
            finally:
                self._calling -= 1
                self._called(sys._getframe(1), perf_counter() - started)

        return collect

    def _called(self, frame: FrameType, spent: float) -> None:
        self.explicit += 1
        site = (frame.f_code.co_filename, frame.f_lineno)
        count, seconds = self.calls.get(site, (0, 0.0))
        self.calls[site] = (count + 1, seconds + spent)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        """Hear one ``gc.callbacks`` event (``"start"`` or ``"stop"`` of a collection)."""
        # Called twice per collection, a few times a second at most: cheap enough as it is.
        if self._calling or threading.get_ident() != self._thread or os.getpid() != self._pid:
            return
        if phase == "start":
            self._began = perf_counter()
            return
        ledger = self.ledger
        if not ledger.is_open or not self._began:
            return
        spent, self._began = perf_counter() - self._began, 0.0
        # Read-only: the ledger may be mid-update on this thread (a collection runs inside an
        # allocation), so it is never written here.
        where = ledger.bracket
        self.seconds[where] = self.seconds.get(where, 0.0) + spent
        self.collections[int(info.get("generation", 0))] += 1
        self.longest_s = max(self.longest_s, spent)

    def settled(self, ledger: Ledger) -> CollectorClock:
        """A copy over ``ledger``, whose seconds were already carved: the counts, no seconds."""
        copy = CollectorClock(ledger)
        copy.collections, copy.explicit = list(self.collections), self.explicit
        copy.calls = dict(self.calls)
        copy.frozen = self.frozen
        copy.longest_s = self.longest_s
        return copy

    def __getstate__(self) -> dict[str, Any]:
        # A pickled ledger (the doctor's report, a checkpoint) keeps the figures, not the hook.
        return {**self.__dict__, "_thread": 0, "_pid": 0, "_calling": 0, "_wrapper": None}


def carve_collections(
    by_bracket: dict[tuple[str, str], float],
    seconds: dict[str, float],
    details: dict[tuple[str, str], float],
) -> None:
    """Move each bracket's collection seconds to :data:`COLLECTION` (in place).

    Never more than the bracket was charged, so the ledger's total does not move (a collection
    that began as a bracket opened may have been charged to the next one).

    Example:
        >>> seconds = {"callback:Slow": 1.3, "training_step": 2.0}
        >>> details = {("callback:Slow", "on_train_end"): 1.3}
        >>> carve_collections({("callback:Slow", "on_train_end"): 1.2}, seconds, details)
        >>> {k: round(v, 3) for k, v in seconds.items()}
        {'callback:Slow': 0.1, 'training_step': 2.0, 'garbage_collection': 1.2}
    """
    for (key, detail), spent in by_bracket.items():
        moved = min(spent, seconds.get(key, 0.0))
        if moved <= 0.0:
            continue
        seconds[key] -= moved
        seconds[COLLECTION] = seconds.get(COLLECTION, 0.0) + moved
        if detail and (key, detail) in details:
            details[(key, detail)] = max(0.0, details[(key, detail)] - moved)
