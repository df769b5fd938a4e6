"""The wall-time ledger: every second between two instants charged to exactly one part.

A :class:`Ledger` keeps a stack of open brackets (a checkpoint save, a callback's hook, a
validation loop) over an *ambient* part (what the run is doing between brackets: setting up,
starting an epoch, Lightning's loop). At every event the time since the previous event goes to
the innermost open bracket, or to the ambient part when none is open, so the parts are exclusive
and their sum is the span from the first event to the last: nothing is counted twice and nothing
falls through. Some parts absorb what opens inside them (a checkpoint's ``on_save_checkpoint``
hooks are checkpointing; everything in the sanity check is the sanity check).

The ledger knows nothing of Lightning; :mod:`~lightning_speedpack.wall_time.callback` feeds it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

__all__ = ["ABSORBING", "PARTS", "Ledger", "carve", "part_of", "share_out"]

#: The ledger's parts, in the order a fit meets them (``callback:<Class>`` parts come per class).
PARTS = (
    "setup",
    "sanity_check",
    "epoch_start",
    "data_wait",
    "batch_transfer",
    "training_step",
    "validation",
    "checkpoint",
    "logging",
    "callbacks",
    "garbage_collection",
    "end_of_fit",
    "unaccounted",
)

#: Parts whose nested brackets are charged to them (a save's hooks are the save).
ABSORBING = frozenset({"checkpoint", "sanity_check"})

CALLBACK_PREFIX = "callback:"


def part_of(key: str) -> str:
    """The part a ledger key belongs to: ``callback:<Class>`` keys are ``callbacks``."""
    return "callbacks" if key.startswith(CALLBACK_PREFIX) else key


#: A bracket: (the key charged while it is innermost, a finer label such as a hook name, the
#: token that closes it). Tuples, not objects: ~50 are opened a batch under the doctor.
_Frame = tuple[str, str, str]


@dataclass
class Ledger:
    """Exclusive wall time per key, from :meth:`open` to :meth:`close`.

    Example:
        >>> ledger = Ledger()
        >>> ledger.open(0.0, "setup")
        >>> ledger.enter(1.0, "checkpoint", token="save")
        >>> ledger.enter(1.5, "callback:Mine", token="hook")  # absorbed by the checkpoint
        >>> ledger.leave(2.0, "hook"); ledger.leave(3.0, "save")
        >>> ledger.switch(3.0, "unaccounted"); ledger.close(4.0)
        >>> dict(ledger.seconds), ledger.total_s
        ({'setup': 1.0, 'checkpoint': 2.0, 'unaccounted': 1.0}, 4.0)
    """

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    #: seconds per (key, detail), e.g. ("callback:Mine", "on_train_batch_end")
    details: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    started: float | None = None
    ended: float | None = None
    _ambient: str = "setup"
    _stack: list[_Frame] = field(default_factory=list)
    _last: float = 0.0

    @property
    def is_open(self) -> bool:
        """Whether the ledger is counting (opened and not yet closed)."""
        return self.started is not None and self.ended is None

    @property
    def top(self) -> str:
        """The key charged right now: the innermost bracket's, else the ambient part."""
        return self._stack[-1][0] if self._stack else self._ambient

    @property
    def bracket(self) -> tuple[str, str]:
        """The ``(key, detail)`` charged right now (the ambient part's detail is empty)."""
        return (self._stack[-1][0], self._stack[-1][1]) if self._stack else (self._ambient, "")

    @property
    def total_s(self) -> float:
        """The seconds charged so far (``close`` to have the whole span)."""
        return sum(self.seconds.values())

    def open(self, now: float, ambient: str = "setup") -> None:
        """Start counting at ``now`` with ``ambient`` as the part between brackets."""
        self.started, self.ended, self._last, self._ambient = now, None, now, ambient
        self._stack.clear()

    def enter(self, now: float, key: str, *, token: str, detail: str = "") -> None:
        """Open a bracket charged to ``key`` (or to the enclosing absorbing part)."""
        # Called at the start of every bracketed action, ~10 times a batch: `_charge` inlined.
        if self.started is None or self.ended is not None:
            return
        stack = self._stack
        elapsed = now - self._last
        self._last = now
        if stack:
            top = stack[-1]
            self.seconds[top[0]] += elapsed
            if top[1]:
                self.details[(top[0], top[1])] += elapsed
            if top[0] in ABSORBING:
                key, detail = top[0], top[1]
        else:
            self.seconds[self._ambient] += elapsed
        stack.append((key, detail, token))

    def leave(self, now: float, token: str) -> None:
        """Close the innermost bracket if ``token`` opened it (unbalanced closes are ignored)."""
        stack = self._stack
        if self.ended is not None or not stack or stack[-1][2] != token:
            return
        key, detail, _ = stack.pop()
        elapsed = now - self._last
        self._last = now
        self.seconds[key] += elapsed
        if detail:
            self.details[(key, detail)] += elapsed

    def switch(self, now: float, ambient: str) -> None:
        """From ``now`` on, time outside any bracket is charged to ``ambient``."""
        if not self.is_open:
            return
        self._charge(now)
        self._ambient = ambient

    def close(self, now: float) -> None:
        """Stop counting at ``now``; brackets still open are charged up to ``now``."""
        if not self.is_open:
            return
        self._charge(now)
        self._stack.clear()
        self.ended = now

    def extend(self, now: float, key: str) -> None:
        """After :meth:`close`, charge the time from the close to ``now`` to ``key``."""
        if self.ended is None or now <= self.ended:
            return
        self.seconds[key] += now - self.ended
        self.ended = now

    def _charge(self, now: float) -> None:
        elapsed = now - self._last
        self._last = now
        if self._stack:
            key, detail, _ = self._stack[-1]
            self.seconds[key] += elapsed
            if detail:
                self.details[(key, detail)] += elapsed
        else:
            self.seconds[self._ambient] += elapsed


def carve(
    source: str,
    key: str,
    measured: dict[str, float],
    seconds: dict[str, float],
    details: dict[tuple[str, str], float],
) -> None:
    """Move ``measured`` seconds per detail, timed by another clock, from ``source`` to ``key``.

    For work the ledger did not bracket (it ran inside ``source``'s bracket, which was charged
    for it) but someone timed: each detail's seconds go to ``(key, detail)``, never more than
    ``source`` has left, so the total does not move.

    Example:
        >>> seconds, details = {"training_step": 5.0}, {}
        >>> carve("training_step", "callback:Hub", {"on_after_backward": 1.5}, seconds, details)
        >>> seconds, details
        ({'training_step': 3.5, 'callback:Hub': 1.5}, {('callback:Hub', 'on_after_backward'): 1.5})
    """
    for detail, value in measured.items():
        moved = min(value, seconds.get(source, 0.0))
        if moved <= 0.0:
            continue
        seconds[source] -= moved
        seconds[key] = seconds.get(key, 0.0) + moved
        details[(key, detail)] = details.get((key, detail), 0.0) + moved


def share_out(
    key: str,
    shares: dict[tuple[str, str], float],
    seconds: dict[str, float],
    details: dict[tuple[str, str], float],
) -> None:
    """Hand ``key``'s seconds, detail by detail, to the keys in ``shares`` (in place).

    ``key`` is a bracket that ran other keys' work (a hub calling several callbacks' hooks);
    ``shares`` says how long each ``(other key, detail)`` took inside it by its own clock. Each
    detail's ledger seconds are split in proportion to those shares, so the ledger's total does
    not move; a detail with no share stays ``key``'s.

    Example:
        >>> seconds = {"callback:Hub": 3.0, "training_step": 5.0}
        >>> details = {("callback:Hub", "on_train_batch_end"): 3.0}
        >>> share_out("callback:Hub", {("callback:A", "on_train_batch_end"): 1.0,
        ...                            ("callback:B", "on_train_batch_end"): 0.5},
        ...           seconds, details)
        >>> seconds, details[("callback:A", "on_train_batch_end")]
        ({'training_step': 5.0, 'callback:A': 2.0, 'callback:B': 1.0}, 2.0)
    """
    by_detail: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for (other, detail), measured in shares.items():
        by_detail[detail].append((other, measured))
    for detail, parts in by_detail.items():
        ledger_s = details.get((key, detail), 0.0)
        measured_s = sum(m for _, m in parts)
        if ledger_s <= 0.0 or measured_s <= 0.0:
            continue
        del details[(key, detail)]
        seconds[key] = seconds.get(key, 0.0) - ledger_s
        for other, measured in parts:
            moved = ledger_s * measured / measured_s
            seconds[other] = seconds.get(other, 0.0) + moved
            details[(other, detail)] = details.get((other, detail), 0.0) + moved
    if key in seconds and abs(seconds[key]) < 1e-12:
        del seconds[key]
