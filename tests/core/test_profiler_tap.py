"""The profiler tap: listeners hear the actions they want; the profiler is left as it was."""

from __future__ import annotations

from typing import Any

from pytorch_lightning.profilers import PassThroughProfiler, SimpleProfiler

from lightning_speedpack.core.profiler_tap import FetchTimer, mute, tap, untap

FETCH = "[_TrainingEpochLoop].train_dataloader_next"


class _Trainer:
    def __init__(self, profiler: Any) -> None:
        self.profiler = profiler


class _Heard:
    def __init__(self, wanted: str | None = None) -> None:
        self.heard: list[tuple[str, bool]] = []
        if wanted is not None:
            self.wants = lambda name: name == wanted

    def on_action(self, name: str, started: bool, now: float) -> None:
        self.heard.append((name, started))


def test_each_listener_hears_what_it_wants_and_the_users_profiler_still_records() -> None:
    trainer = _Trainer(SimpleProfiler())
    everything, fetch_only, waits = _Heard(), _Heard(wanted=FETCH), []
    for listener in (everything, fetch_only, FetchTimer(waits.append)):
        tap(trainer, listener)
    for name in ("run_training_batch", FETCH):
        with trainer.profiler.profile(name):
            pass
    assert everything.heard == [
        ("run_training_batch", True),
        ("run_training_batch", False),
        (FETCH, True),
        (FETCH, False),
    ]
    assert fetch_only.heard == [(FETCH, True), (FETCH, False)]
    assert len(waits) == 1
    assert set(trainer.profiler.recorded_durations) == {"run_training_batch", FETCH}


def test_the_last_untap_gives_the_profiler_its_own_methods_back() -> None:
    profiler = PassThroughProfiler()
    trainer = _Trainer(profiler)
    first, second = _Heard(), _Heard()
    tap(trainer, first)
    tap(trainer, second)
    untap(trainer, first)
    assert "start" in vars(profiler)  # the second still listens
    with profiler.profile("x"):
        pass
    assert first.heard == []
    assert second.heard == [("x", True), ("x", False)]
    untap(trainer, second)
    assert "start" not in vars(profiler)
    assert "stop" not in vars(profiler)
    untap(trainer, second)  # twice: nothing happens


def test_a_listener_that_joins_later_is_routed_the_names_seen_before() -> None:
    trainer = _Trainer(PassThroughProfiler())
    first, late = _Heard(), _Heard()
    tap(trainer, first)
    with trainer.profiler.profile("x"):
        pass
    tap(trainer, late)
    with trainer.profiler.profile("x"):
        pass
    assert late.heard == [("x", True), ("x", False)]
    untap(trainer, first)
    untap(trainer, late)


class _CountingPassThrough(PassThroughProfiler):
    """A user's subclass of the default profiler that does something in start and stop."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def start(self, action_name: str) -> None:
        self.calls.append(("start", action_name))

    def stop(self, action_name: str) -> None:
        self.calls.append(("stop", action_name))


def test_a_subclass_of_the_default_profiler_keeps_its_own_start_and_stop() -> None:
    # The tap skips the default profiler's no-op methods, never a subclass's own ones.
    trainer = _Trainer(_CountingPassThrough())
    heard = _Heard()
    tap(trainer, heard)
    with trainer.profiler.profile("run_training_batch"):
        pass
    untap(trainer, heard)
    assert trainer.profiler.calls == [
        ("start", "run_training_batch"),
        ("stop", "run_training_batch"),
    ]
    assert heard.heard == [("run_training_batch", True), ("run_training_batch", False)]
    assert "start" not in vars(trainer.profiler)


def test_the_default_profilers_context_tells_the_listeners_and_yields_the_name() -> None:
    # With Lightning's default profiler the tap answers `profile(name)` itself (no
    # contextlib generator): the same starts and stops, the same value bound by `as`, the
    # exception passed on, and the class's `profile` back after the last untap.
    profiler = PassThroughProfiler()
    trainer = _Trainer(profiler)
    heard = _Heard()
    tap(trainer, heard)
    assert "profile" in vars(profiler)
    with profiler.profile("outer") as name, profiler.profile("inner"):
        assert name == "outer"
    try:
        with profiler.profile("raises"):
            raise KeyError("boom")
    except KeyError:
        pass
    else:  # pragma: no cover - the context must not swallow it
        raise AssertionError("the exception was swallowed")
    assert heard.heard == [
        ("outer", True),
        ("inner", True),
        ("inner", False),
        ("outer", False),
        ("raises", True),
        ("raises", False),
    ]
    untap(trainer, heard)
    assert "profile" not in vars(profiler)
    with profiler.profile("after"):
        pass
    assert heard.heard[-1] == ("raises", False)


def test_a_listener_that_leaves_inside_an_action_does_not_hear_it_stop() -> None:
    trainer = _Trainer(PassThroughProfiler())
    staying, leaving = _Heard(), _Heard()
    tap(trainer, staying)
    tap(trainer, leaving)
    with trainer.profiler.profile("x"):
        untap(trainer, leaving)
    assert leaving.heard == [("x", True)]
    assert staying.heard == [("x", True), ("x", False)]
    untap(trainer, staying)


def test_a_handler_is_chosen_once_per_name() -> None:
    asked: list[str] = []
    heard: list[tuple[str, str, bool]] = []

    class PerName:
        def handler(self, name: str) -> Any:
            asked.append(name)
            if name == "ignored":
                return None
            return lambda action, started, now: heard.append((name, action, started))

        def on_action(self, name: str, started: bool, now: float) -> None:  # pragma: no cover
            raise AssertionError("a listener with a handler is not called here")

    trainer = _Trainer(PassThroughProfiler())
    listener = PerName()
    tap(trainer, listener)
    for _ in range(3):
        for name in ("kept", "ignored"):
            with trainer.profiler.profile(name):
                pass
    assert asked == ["kept", "ignored"]
    assert heard == [("kept", "kept", True), ("kept", "kept", False)] * 3
    untap(trainer, listener)


def test_a_muted_listener_is_not_called_until_unmuted_and_the_others_still_hear() -> None:
    for profiler in (PassThroughProfiler(), SimpleProfiler()):
        trainer = _Trainer(profiler)
        muted, other = _Heard(), _Heard()
        tap(trainer, muted)
        tap(trainer, other)
        with profiler.profile("seen before"):
            pass
        mute(trainer, muted)
        mute(trainer, muted)  # twice: the same as once
        for name in ("seen before", "first seen while muted"):
            with profiler.profile(name):
                pass
        mute(trainer, muted, False)
        for name in ("seen before", "first seen while muted"):
            with profiler.profile(name):
                pass
        assert muted.heard == [
            ("seen before", True),
            ("seen before", False),
            ("seen before", True),
            ("seen before", False),
            ("first seen while muted", True),
            ("first seen while muted", False),
        ]
        assert len(other.heard) == 10  # every action, muted or not
        untap(trainer, muted)
        untap(trainer, other)
        assert "start" not in vars(profiler)


def test_muting_a_listener_that_is_not_tapped_changes_nothing() -> None:
    trainer = _Trainer(PassThroughProfiler())
    listening, stranger = _Heard(), _Heard()
    mute(trainer, stranger)  # no tap on this profiler yet: nothing to do
    tap(trainer, listening)
    mute(trainer, stranger)
    with trainer.profiler.profile("x"):
        pass
    tap(trainer, stranger)  # tapped after: it hears, the mute was never kept
    with trainer.profiler.profile("x"):
        pass
    assert stranger.heard == [("x", True), ("x", False)]
    assert len(listening.heard) == 4
    untap(trainer, listening)
    untap(trainer, stranger)


def test_a_fetch_timer_is_routed_the_training_fetch_alone() -> None:
    waits: list[float] = []
    timer = FetchTimer(waits.append)
    assert timer.handler("run_training_batch") is None
    assert timer.handler("[_EvaluationLoop].val_next") is None
    trainer = _Trainer(PassThroughProfiler())
    tap(trainer, timer)
    for name in ("run_training_batch", FETCH, "[_EvaluationLoop].val_next"):
        with trainer.profiler.profile(name):
            pass
    heard = [name for name, action in trainer.profiler.profile.__self__.items() if action.route]
    untap(trainer, timer)
    assert heard == [FETCH]
    assert len(waits) == 1
