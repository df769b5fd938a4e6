"""Listen to the actions Lightning times through ``trainer.profiler``, without replacing it.

Lightning wraps every hook it calls (``[Callback]<state_key>.<hook>``,
``[LightningModule]<class>.<hook>``, ``[Strategy]<class>.<hook>``), each training batch
(``run_training_batch``), each epoch (``run_training_epoch``), each checkpoint save
(``save_checkpoint``) and the DataLoader fetch itself
(``[_TrainingEpochLoop].train_dataloader_next``, started and stopped by the data fetcher around
its ``next``) in ``profiler.start(name)`` /
``profiler.stop(name)``, whatever profiler the Trainer has (``PassThroughProfiler`` by default).
That is the one place where every second of a fit is announced by name, so the pack's tools
listen there instead of guessing from the gaps between their own hooks.

A tap sets ``start`` and ``stop`` (over Lightning's default profiler, ``profile`` too: see
:class:`_Action`) as *instance* attributes of the Trainer's profiler object:
the profiler's class, its ``isinstance`` checks and its own timing are untouched (each listener
runs before the profiler's own ``start`` and after its own ``stop``), and :func:`untap` removes
the attributes when the last listener leaves. Several tools may listen to the same Trainer. A
listener with nothing to hear for a stretch (a sampled tool between its samples) can
:func:`mute` itself: only the actions it hears are rerouted, and it is not called until unmuted.
Lightning's default ``PassThroughProfiler`` does nothing in ``start``/``stop``, so with it the
tap calls only the listeners (a subclass that overrides either method keeps both called).
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any, Protocol

__all__ = ["TRAIN_FETCH", "ActionListener", "FetchTimer", "mute", "tap", "untap"]

#: How the name of the training fetch action ends. Matched as a suffix: the part before it is
#: the epoch loop's class name, which a subclassed or future loop may change.
TRAIN_FETCH = "].train_dataloader_next"


class ActionListener(Protocol):
    """Something told of profiled actions: their name, start or stop, and the clock.

    A listener may also define ``wants(name) -> bool``: asked once per distinct action name
    (and again for every name seen so far when a listener joins or leaves), it keeps the
    listener out of the ~25 actions a batch it has no use for. Without it, a listener hears
    every one. Or it may define ``handler(name)``, asked the same way, returning the callable
    (with ``on_action``'s signature) that hears that action, or None: a listener that does
    something different for each name picks it once instead of at every start and stop.
    """

    def on_action(self, name: str, started: bool, now: float) -> None:
        """Called when ``name`` starts (``started``) or stops, at ``perf_counter()`` ``now``."""
        ...


class _Action:
    """What ``profiler.profile(name)`` returns while Lightning's default profiler is tapped.

    The base ``Profiler.profile`` is a ``contextlib.contextmanager``: each call builds a generator
    and its context object and steps through both (about twenty Python lines, five calls), for
    ~25 actions a batch. With the default ``PassThroughProfiler`` its ``start`` and ``stop`` do
    nothing, so the tap answers ``profile(name)`` with one stateless object per action name that
    tells the listeners and does nothing else: Lightning's profiled calls cost less under the
    tap than without it, and the listeners hear the same starts and stops in the same order.
    An action no listener wants is a :class:`_Silent` one (most of them), one that a single
    listener hears a :class:`_HeardOnce` one (called without a loop), one that several hear a
    :class:`_Heard` one; :meth:`reroute` switches between them. ``full`` keeps every listener
    that would hear it (by ``id``) with its hearer, muted or not, so :meth:`hear` can leave the
    muted out again without asking the listeners.
    """

    __slots__ = ("back", "full", "name", "one", "route")
    one: Callable[[str, bool, float], None]  # the only listener (a ``_HeardOnce``'s)

    def __init__(self, name: str, full: _Hearers, muted: set[int]) -> None:
        self.name = name
        self.hear(full, muted)

    def hear(self, full: _Hearers, muted: set[int]) -> None:
        """Heard by the hearers in ``full`` whose listener is not in ``muted``."""
        self.full = full
        self.reroute(tuple(heard for key, heard in full if key not in muted))

    def reroute(self, route: tuple[Callable[[str, bool, float], None], ...]) -> None:
        """Who hears this action from now on (in order; a stop is heard in reverse order)."""
        self.route, self.back = route, route[::-1]
        if len(route) == 1:
            self.one = route[0]
        self.__class__ = _Silent if not route else _HeardOnce if len(route) == 1 else _Heard


class _Silent(_Action):
    __slots__ = ()

    def __enter__(self) -> str:
        return self.name  # what the base ``profile`` yields

    def __exit__(self, *exc_info: object) -> None:
        return None


class _Heard(_Action):
    __slots__ = ()

    def __enter__(self) -> str:
        now = perf_counter()
        for on_action in self.route:
            on_action(self.name, True, now)
        return self.name

    def __exit__(self, *exc_info: object) -> None:
        now = perf_counter()
        for on_action in self.back:
            on_action(self.name, False, now)


class _HeardOnce(_Action):
    __slots__ = ()

    def __enter__(self) -> str:
        self.one(self.name, True, perf_counter())
        return self.name

    def __exit__(self, *exc_info: object) -> None:
        self.one(self.name, False, perf_counter())


_Hearers = tuple[tuple[int, Callable[[str, bool, float], None]], ...]  # (id(listener), hearer)


class _Actions(dict[str, _Action]):
    """Action name -> its :class:`_Action`, built by ``new`` the first time the name is seen."""

    def __init__(self, new: Callable[[str], _Action]) -> None:
        super().__init__()
        self.new = new

    def __missing__(self, name: str) -> _Action:
        action = self[name] = self.new(name)
        return action


class _Tap:
    """The instance-level ``start``/``stop`` (and ``profile``) of one profiler and its listeners."""

    def __init__(self, profiler: Any) -> None:
        self.profiler = profiler
        self.listeners: list[ActionListener] = []
        self.muted: set[int] = set()  # id() of the listeners muted for now
        self.heard_by: dict[int, list[_Action]] = {}  # id(listener) -> the actions it hears
        self.actions = _Actions(self._new_action)  # action name -> who hears it, in order
        # What the instance had before (usually nothing: the class's methods).
        self._saved = {
            k: profiler.__dict__[k] for k in ("start", "stop", "profile") if k in profiler.__dict__
        }
        # Lightning's default profiler does nothing in start/stop: not calling it saves two
        # Python calls for each of the ~25 actions a batch, and its ``profile`` context can be
        # one object per name (see ``_Action``).
        noop = not self._saved and _is_pass_through(type(profiler))
        profiler.start, profiler.stop = self._hooks(
            None if noop else profiler.start, None if noop else profiler.stop
        )
        if noop:
            profiler.profile = self.actions.__getitem__

    def _hooks(
        self, own_start: Callable[[str], Any] | None, own_stop: Callable[[str], Any] | None
    ) -> tuple[Callable[[str], None], Callable[[str], None]]:
        # Closures over locals: the tap runs for every hook of every callback, every batch.
        actions = self.actions

        def announcer(started: bool) -> Callable[[str], None]:
            def announce(action_name: str) -> None:
                action = actions[action_name]
                if action.route:
                    now = perf_counter()
                    for on_action in action.route if started else action.back:
                        on_action(action_name, started, now)

            return announce

        start, stop = announcer(True), announcer(False)
        if own_start is None or own_stop is None:
            return start, stop

        def start_then_own(action_name: str) -> None:
            start(action_name)
            own_start(action_name)

        def own_then_stop(action_name: str) -> None:
            own_stop(action_name)
            stop(action_name)

        return start_then_own, own_then_stop

    def _route(self, name: str) -> _Hearers:
        hearer = _hearer(name)
        return tuple(
            (id(listener), heard)
            for listener in self.listeners
            if (heard := hearer(listener)) is not None
        )

    def _new_action(self, name: str) -> _Action:
        action = _Action(name, self._route(name), self.muted)
        self._index(action)
        return action

    def _index(self, action: _Action) -> None:
        for key, _ in action.full:
            self.heard_by.setdefault(key, []).append(action)

    def reroute(self) -> None:
        """Route the names seen so far again, after a listener joined or left.

        In place: an action entered before the change is heard stopping by who listens now.
        """
        self.heard_by.clear()
        for name, action in self.actions.items():
            action.hear(self._route(name), self.muted)
            self._index(action)

    def mute(self, listener: ActionListener, muted: bool) -> None:
        """Leave ``listener`` out of (or put it back in) the routes of the actions it hears."""
        key = id(listener)
        if muted == (key in self.muted) or listener not in self.listeners:
            return
        if muted:
            self.muted.add(key)
        else:
            self.muted.discard(key)
        for action in self.heard_by.get(key, ()):  # only these: a few names, not all
            action.hear(action.full, self.muted)

    def remove(self) -> None:
        for key in ("start", "stop", "profile"):
            if key in self._saved:
                setattr(self.profiler, key, self._saved[key])
            else:
                self.profiler.__dict__.pop(key, None)


def _hearer(name: str) -> Callable[[ActionListener], Callable[[str, bool, float], None] | None]:
    """What hears ``name`` for a listener: its ``handler(name)``, its ``on_action``, or None."""

    def heard_by(listener: ActionListener) -> Callable[[str, bool, float], None] | None:
        handler = getattr(listener, "handler", None)
        if handler is not None:
            return handler(name)  # type: ignore[no-any-return]
        wants = getattr(listener, "wants", None)
        return listener.on_action if wants is None or wants(name) else None

    return heard_by


def _is_pass_through(cls: type) -> bool:
    """Whether ``cls`` has the no-op ``start``/``stop`` of Lightning's ``PassThroughProfiler``.

    Found by name in the class's bases (either namespace, or a subclass that keeps both
    methods), so no Lightning namespace is imported for the check.
    """
    return any(
        base.__name__ == "PassThroughProfiler"
        and base.__module__.endswith(_PASS_THROUGH_MODULE)
        and cls.start is base.start  # type: ignore[attr-defined]
        and cls.stop is base.stop  # type: ignore[attr-defined]
        for base in cls.__mro__
    )


_PASS_THROUGH_MODULE = "profilers.base"  # pytorch_lightning.profilers.base, lightning.pytorch...


_TAPS: dict[int, _Tap] = {}  # id(profiler) -> its tap, while anyone listens


def tap(trainer: Any, listener: ActionListener) -> None:
    """Tell ``listener`` of every action ``trainer.profiler`` times, until :func:`untap`.

    Example:
        >>> class Count:
        ...     def __init__(self): self.n = 0
        ...     def on_action(self, name, started, now): self.n += started
        >>> from pytorch_lightning.profilers import PassThroughProfiler
        >>> class T: profiler = PassThroughProfiler()
        >>> trainer, count = T(), Count()
        >>> tap(trainer, count)
        >>> with trainer.profiler.profile("run_training_batch"): pass
        >>> untap(trainer, count); count.n, "start" in vars(trainer.profiler)
        (1, False)
    """
    profiler = trainer.profiler
    entry = _TAPS.get(id(profiler))
    if entry is None or entry.profiler is not profiler:
        entry = _TAPS[id(profiler)] = _Tap(profiler)
    if listener not in entry.listeners:
        entry.listeners.append(listener)
        entry.reroute()


def untap(trainer: Any, listener: ActionListener) -> None:
    """Stop telling ``listener``; the profiler gets its own methods back with the last one."""
    profiler = getattr(trainer, "profiler", None)
    entry = _TAPS.get(id(profiler))
    if entry is None or entry.profiler is not profiler:
        return
    if listener in entry.listeners:
        entry.listeners.remove(listener)
        entry.muted.discard(id(listener))
        entry.reroute()
    if not entry.listeners:
        entry.remove()
        del _TAPS[id(profiler)]


def mute(trainer: Any, listener: ActionListener, muted: bool = True) -> None:
    """Stop calling ``listener`` (``muted``) or call it again, while it stays tapped.

    For a listener with nothing to hear for a stretch (a sampled tool between its samples):
    only the actions it hears are rerouted, so muting costs a few lines where its calls cost
    a few a batch. An action it heard start while unmuted is not heard stopping once muted.
    A listener that is not tapped is left alone; :func:`untap` forgets the mute.

    Example:
        >>> from pytorch_lightning.profilers import PassThroughProfiler
        >>> class T: profiler = PassThroughProfiler()
        >>> trainer, waits, fetch = T(), [], "[_TrainingEpochLoop].train_dataloader_next"
        >>> timer = FetchTimer(waits.append)
        >>> tap(trainer, timer); mute(trainer, timer)
        >>> with trainer.profiler.profile(fetch): pass  # muted: not timed
        >>> mute(trainer, timer, False)
        >>> with trainer.profiler.profile(fetch): pass
        >>> untap(trainer, timer); len(waits)
        1
    """
    entry = _TAPS.get(id(getattr(trainer, "profiler", None)))
    if entry is not None and entry.profiler is trainer.profiler:
        entry.mute(listener, muted)


class FetchTimer:
    """An action listener that hands each training-batch fetch's seconds to ``charge``.

    Tapped, it is routed the training fetch alone (its :meth:`handler`, asked once per action
    name), so a fetch costs one subtraction and one call and no other action calls it; called
    directly, :meth:`on_action` checks the name. Validation fetches (``...val_next``) are not
    training fetches and are ignored; a stop whose start came before the tap is dropped.

    Example:
        >>> waits = []
        >>> timer = FetchTimer(waits.append)
        >>> timer.on_action("[_TrainingEpochLoop].train_dataloader_next", True, 1.0)
        >>> timer.on_action("[Callback]Slow.on_train_batch_end", True, 1.5)  # not a fetch
        >>> timer.on_action("[_TrainingEpochLoop].train_dataloader_next", False, 3.0)
        >>> waits
        [2.0]
    """

    __slots__ = ("_began", "_charge")

    def __init__(self, charge: Callable[[float], None]) -> None:
        self._charge = charge
        self._began: float | None = None  # when the fetch in progress started

    def handler(self, name: str) -> Callable[[str, bool, float], None] | None:
        """What the tap calls for ``name``: :meth:`heard` for the training fetch, else none."""
        return self.heard if name.endswith(TRAIN_FETCH) else None

    def on_action(self, name: str, started: bool, now: float) -> None:
        """Time ``name`` if it is a training fetch; its seconds go to ``charge``."""
        if name.endswith(TRAIN_FETCH):
            self.heard(name, started, now)

    def heard(self, name: str, started: bool, now: float) -> None:
        """The training fetch ``name`` starts or stops (the tap routes no other name here)."""
        if started:
            self._began = now
        elif self._began is not None:
            self._charge(now - self._began)
            self._began = None
