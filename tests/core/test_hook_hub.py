"""A HookHub dispatches its members' per-batch hooks from one callback, in their order."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from pytorch_lightning import Trainer
from pytorch_lightning.demos.boring_classes import BoringModel

from lightning_speedpack import WallTimeLedger
from lightning_speedpack.core.hook_hub import HookHub, callbacks_of, hub_of
from lightning_speedpack.core.lightning import Callback
from tests.helpers.models import ProfiledNames

STEPS = 3


class Recording(Callback):
    """Appends ``(name, hook)`` to a shared list at three per-batch hooks."""

    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        self.name, self.calls = name, calls

    def on_train_batch_start(self, *args: Any) -> None:
        self.calls.append((self.name, "start"))

    def on_before_backward(self, *args: Any) -> None:
        self.calls.append((self.name, "backward"))

    def on_train_batch_end(self, *args: Any) -> None:
        self.calls.append((self.name, "end"))


def _fit(callbacks: list[Any], model: Any = None, max_steps: int = STEPS, **kwargs: Any) -> Trainer:
    trainer = Trainer(
        max_steps=max_steps,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        limit_val_batches=0,
        **kwargs,
    )
    trainer.fit(BoringModel() if model is None else model)
    return trainer


def test_each_members_hooks_run_once_a_batch_in_the_members_order() -> None:
    calls: list[tuple[str, str]] = []
    members = [Recording("a", calls), Recording("b", calls)]
    _fit([*members, HookHub(members)])
    per_batch = [
        ("a", "start"),
        ("b", "start"),
        ("a", "backward"),
        ("b", "backward"),
        ("a", "end"),
        ("b", "end"),
    ]
    assert calls == per_batch * STEPS  # not twice: Lightning no longer calls the members


def test_lightning_dispatches_one_hook_a_batch_for_all_the_members() -> None:
    calls: list[tuple[str, str]] = []
    members = [Recording("a", calls), Recording("b", calls)]
    profiler = ProfiledNames()
    _fit([*members, HookHub(members)], profiler=profiler)
    ends = [a for a in profiler.names if a.endswith(".on_train_batch_end") and "Callback" in a]
    assert ends == ["[Callback]HookHub.on_train_batch_end"] * STEPS


def test_a_hook_a_member_sets_after_the_hub_took_over_is_called_by_lightning() -> None:
    class Late(Callback):
        def __init__(self) -> None:
            self.backwards = 0

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            self.on_before_backward = self._count  # type: ignore[method-assign,assignment]

        def _count(self, *args: Any) -> None:
            self.backwards += 1

    late = Late()
    _fit([late, HookHub([late])])
    assert late.backwards == STEPS


def test_seconds_are_each_members_and_start_again_with_a_new_fit() -> None:
    class Slow(Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            time.sleep(0.002)

    slow, quick = Slow(), Recording("q", [])
    hub = HookHub([slow, quick])
    trainer = _fit([slow, quick, hub])
    seconds = hub.seconds()
    assert seconds[(slow, "on_train_batch_end")] >= STEPS * 0.002  # sleep sleeps at least that
    assert set(seconds) == {
        (slow, "on_train_batch_end"),
        (quick, "on_train_batch_start"),
        (quick, "on_before_backward"),
        (quick, "on_train_batch_end"),
    }
    hub.setup(trainer, trainer.lightning_module, "fit")
    assert set(hub.seconds().values()) == {0.0}


def test_the_ledger_charges_each_member_not_the_hub() -> None:
    class Slow(Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            time.sleep(0.002)

    slow, quick = Slow(), Recording("q", [])
    ledger = WallTimeLedger()
    _fit([ledger, slow, quick, HookHub([slow, quick])])
    by_callback = ledger.callback_seconds()
    assert "HookHub" not in by_callback
    assert by_callback["Slow"] >= STEPS * 0.002
    assert by_callback["Recording"] > 0.0
    assert ledger.details()[("callback:Slow", "on_train_batch_end")] == pytest.approx(
        by_callback["Slow"]
    )
    assert sum(ledger.seconds().values()) == pytest.approx(ledger.total_s)  # nothing lost


def test_a_members_in_step_hook_is_its_own_time_not_the_training_steps() -> None:
    # The ledger does not bracket the hub's hooks inside the training batch: the hub's clock
    # carves them out of `training_step`.
    sleep_s = 0.05  # far above a loaded machine's BoringModel step, so no timing race

    class SlowBackward(Callback):
        def on_before_backward(self, *args: Any) -> None:
            time.sleep(sleep_s)

    slow = SlowBackward()
    plain = WallTimeLedger()
    _fit([plain])
    ledger = WallTimeLedger()
    _fit([ledger, slow, HookHub([slow])])
    charged = ledger.details()[("callback:SlowBackward", "on_before_backward")]
    assert charged >= STEPS * sleep_s
    assert ledger.callback_seconds()["SlowBackward"] == pytest.approx(charged)
    # Were the sleeps left in the step, it would hold all of them; BoringModel's own step is a
    # millisecond or two even on a loaded machine (CI once read 4 ms a step with 4 ms sleeps).
    assert ledger.seconds()["training_step"] < STEPS * sleep_s
    assert plain.seconds()["training_step"] > 0.0
    assert sum(ledger.seconds().values()) == pytest.approx(ledger.total_s)  # nothing lost


@pytest.mark.parametrize(
    ("members", "error", "match"),
    [
        ("callbacks", TypeError, "sequence of callbacks"),
        (None, TypeError, "sequence of callbacks"),
    ],
)
def test_members_must_be_a_sequence(members: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        HookHub(members)


def test_a_member_listed_twice_is_refused() -> None:
    member = Recording("a", [])
    with pytest.raises(ValueError, match="twice"):
        HookHub([member, member])


def test_a_pickled_ledger_keeps_each_members_share() -> None:
    import pickle

    slow, quick = Recording("s", []), Recording("q", [])
    ledger = WallTimeLedger()
    _fit([ledger, slow, quick, HookHub([slow, quick])])
    copy = pickle.loads(pickle.dumps(ledger))
    assert "HookHub" not in copy.callback_seconds()
    assert copy.callback_seconds() == pytest.approx(ledger.callback_seconds())
    assert copy.total_s == pytest.approx(ledger.total_s)


def test_a_member_lightning_replaced_with_the_models_own_callback_is_not_called() -> None:
    class Mine(Callback):
        def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
            self.name, self.calls = name, calls

        def on_train_batch_end(self, *args: Any) -> None:
            self.calls.append((self.name, "end"))

    calls: list[tuple[str, str]] = []
    replaced, kept = Mine("replaced", calls), Recording("kept", calls)

    class Model(BoringModel):
        def configure_callbacks(self) -> list[Any]:
            return [Mine("model's", calls)]  # Lightning drops the Trainer's Mine for this one

    _fit([replaced, kept, HookHub([replaced, kept])], Model())
    assert {name for name, _ in calls} == {"kept", "model's"}


class _EveryHook(Recording):
    """Records its once-a-fit hooks too, and keeps a state Lightning would checkpoint."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.calls.append((self.name, "setup:fit" if stage == "fit" else "setup:other"))

    def on_train_end(self, *args: Any) -> None:
        self.calls.append((self.name, "train_end"))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.calls.append((self.name, f"exception:{exception}"))

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.calls.append((self.name, "teardown:fit" if stage == "fit" else "teardown:other"))

    def state_dict(self) -> dict[str, Any]:
        return {"calls": len(self.calls)}


def test_an_owning_hub_stands_in_for_its_members_and_calls_all_their_hooks(
    tmp_path: Any,
) -> None:
    calls: list[tuple[str, str]] = []
    members = [_EveryHook("a", calls), _EveryHook("b", calls)]
    hub = HookHub(members, owns=True)
    profiler = ProfiledNames()
    trainer = _fit([hub], profiler=profiler, default_root_dir=tmp_path)
    assert [c for c in trainer.callbacks if isinstance(c, _EveryHook)] == []
    assert callbacks_of(trainer)[-3:] == [hub, *members]
    once = [c for c in calls if c[1] not in ("start", "backward", "end")]
    assert once == [
        ("a", "setup:fit"),
        ("b", "setup:fit"),
        ("a", "train_end"),
        ("b", "train_end"),
        ("a", "teardown:fit"),
        ("b", "teardown:fit"),
    ]
    assert len(calls) - len(once) == 6 * STEPS  # each member's per-batch hooks, once a batch
    # Each member's once-a-fit hook runs inside Lightning's profiled action for the hub's own,
    # timed by the hub's clock (the wall-time ledger shares that action out by it).
    assert "[Callback]HookHub.on_train_end" in profiler.names
    assert "[Callback]_EveryHook.on_train_end" not in profiler.names
    for member in members:
        timed = {hook for (m, hook), s in hub.seconds().items() if m is member and s > 0}
        assert {"setup", "on_train_end", "teardown"} <= timed
    # The doctor's callbacks write nothing into the user's checkpoints.
    trainer.save_checkpoint(tmp_path / "saved.ckpt")
    saved = torch.load(tmp_path / "saved.ckpt", weights_only=False)
    assert not any("_EveryHook" in key for key in saved.get("callbacks", {}))


def test_an_owning_hub_leaves_out_the_hooks_a_member_keeps_at_lightnings_default(
    tmp_path: Any,
) -> None:
    # Lightning enters the profiler for a callback's empty default hook too; the hub does not,
    # and a hook set on a member's instance is still called.
    calls: list[tuple[str, str]] = []
    member = _EveryHook("a", calls)
    member.on_train_epoch_start = lambda *args: calls.append(("a", "epoch_start"))  # type: ignore[method-assign]
    hub = HookHub([member], owns=True)
    _fit([hub], default_root_dir=tmp_path)
    assert ("a", "epoch_start") in calls
    timed = {hook for (m, hook) in hub.seconds() if m is member}
    assert {"on_train_epoch_start", "on_train_end"} <= timed  # set on the instance; overridden
    assert not timed & {"on_train_epoch_end", "on_fit_start"}  # Lightning's defaults: not called
    assert hub.forwards("on_train_epoch_start")
    assert hub.forwards("on_train_end")
    assert not hub.forwards("on_train_epoch_end")
    assert not hub.forwards("on_fit_start")


def test_an_owning_hub_passes_an_exception_to_its_members() -> None:
    calls: list[tuple[str, str]] = []
    member = _EveryHook("a", calls)

    class Fails(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        _fit([HookHub([member], owns=True)], Fails())
    assert ("a", "exception:boom") in calls


def test_an_owned_member_whose_class_the_model_brings_is_left_out() -> None:
    calls: list[tuple[str, str]] = []
    replaced, kept = _EveryHook("replaced", calls), Recording("kept", calls)

    class Model(BoringModel):
        def configure_callbacks(self) -> list[Any]:
            return [_EveryHook("model's", calls)]

    _fit([HookHub([replaced, kept], owns=True)], Model())
    assert {name for name, _ in calls} == {"kept", "model's"}


def test_owns_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="`owns` must be a bool"):
        HookHub([], owns="yes")  # type: ignore[arg-type]


class _QuietsAfterTheFirstBatch(Recording):
    """Tells its hub, at its first batch's end, to stop calling its backward hook; then back."""

    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        super().__init__(name, calls)
        self.seen: list[Any] = []

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        super().on_train_batch_end(trainer, *args)
        hub = hub_of(self)
        assert hub is not None
        hub.quiet(self, ("on_before_backward",) if trainer.global_step == 1 else ())
        self.seen.append(hub.on_before_backward)


def test_a_quiet_members_hooks_are_not_called_and_a_hook_left_to_no_one_is_none() -> None:
    calls: list[tuple[str, str]] = []
    quiet = _QuietsAfterTheFirstBatch("q", calls)
    hub = HookHub([quiet])
    _fit([quiet, hub])
    # batch 0: all of it; batch 1: no backward hook (quiet since batch 0's end); batch 2: back
    assert calls == [
        ("q", "start"),
        ("q", "backward"),
        ("q", "end"),
        ("q", "start"),
        ("q", "end"),
        ("q", "start"),
        ("q", "backward"),
        ("q", "end"),
    ]
    # alone on the hook, the hub's hook was None for batch 1: Lightning skipped it altogether
    assert [fn is None for fn in quiet.seen] == [True, False, False]
    # what each call took stayed the member's own
    assert {h for (_, h), s in hub.seconds().items() if s > 0} >= {"on_before_backward"}


def test_another_members_hooks_go_on_while_one_is_quiet() -> None:
    calls: list[tuple[str, str]] = []
    other = Recording("o", calls)
    quiet = _QuietsAfterTheFirstBatch("q", calls)
    hub = HookHub([quiet, other])  # the quiet one first: each member is known to the hub
    _fit([quiet, other, hub])
    assert [c for c in calls if c[0] == "o"] == [("o", h) for h in ("start", "backward", "end")] * 3
    assert calls.count(("q", "backward")) == 2
    assert hub_of(other) is hub
    assert all(fn is not None for fn in quiet.seen)  # the other member still needs the hook


def test_a_member_without_a_hub_has_none() -> None:
    assert hub_of(Recording("x", [])) is None
    assert hub_of(object()) is None  # not weak-referenceable


class _SleepsAtStep1(Recording):
    """Records the global step of each call; at step 1 sleeps (all three hooks) until step 4,
    its backward hook already quiet for good."""

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        self.calls.append((self.name, f"start {trainer.global_step}"))
        hub = hub_of(self)
        assert hub is not None
        if trainer.global_step == 0:
            hub.quiet(self, ("on_before_backward",))
        if trainer.global_step == 1:
            hub.sleep(self, ("on_train_batch_start", "on_train_batch_end"), until_step=4)


def test_a_sleeping_member_is_not_called_until_its_step_and_then_as_before() -> None:
    calls: list[tuple[str, str]] = []
    sleeper, other = _SleepsAtStep1("s", calls), Recording("o", calls)
    hub = HookHub([sleeper, other])
    _fit([sleeper, other, hub], max_steps=6)
    mine = [h for n, h in calls if n == "s"]
    # steps 2 and 3 not called at all; from step 4 on every batch, and its backward hook, quiet
    # before it slept, stays quiet after it woke
    assert mine == ["start 0", "end", "start 1", "start 4", "end", "start 5", "end"]
    assert [h for n, h in calls if n == "o"] == ["start", "backward", "end"] * 6
    assert hub._alarms == {}  # woken: the batch start dispatches without the alarm check
    assert hub.on_train_batch_start is hub._start


def test_a_new_fit_wakes_every_sleeper() -> None:
    calls: list[tuple[str, str]] = []
    sleeper = _SleepsAtStep1("s", calls)
    hub = HookHub([sleeper])
    _fit([sleeper, hub], max_steps=3)  # ends asleep (until step 4)
    assert hub._alarms
    calls.clear()
    _fit([sleeper, hub], max_steps=1)
    assert calls == [("s", "start 0"), ("s", "end")]


@pytest.mark.parametrize("until", [4.0, None, True])
def test_sleep_wants_an_int_step(until: Any) -> None:
    member = Recording("x", [])
    with pytest.raises(TypeError, match="`until_step` must be an int"):
        HookHub([member]).sleep(member, ("on_train_batch_start",), until)


def test_quiet_wakes_a_sleeper_with_the_hooks_it_names() -> None:
    calls: list[tuple[str, str]] = []
    member = Recording("m", calls)
    hub = HookHub([member])
    at_step_0 = (SimpleNamespace(global_step=0), None, None, 0)  # trainer, module, batch, index
    hub.sleep(member, ("on_train_batch_start", "on_train_batch_end"), until_step=100)
    hub.on_train_batch_start(*at_step_0)
    assert hub.on_train_batch_end is None  # alone on it: Lightning skips the hook
    hub.quiet(member, ("on_before_backward",))  # e.g. from a once-a-fit hook: awake now
    hub.on_train_batch_start(*at_step_0)
    assert calls == [("m", "start")]
    assert hub.on_before_backward is None
    assert hub.on_train_batch_end is not None


def test_a_hook_called_with_keywords_passes_them_to_each_member() -> None:
    # Lightning passes the per-batch hooks' arguments by position (the hub's fast path);
    # a caller that names them must still reach every member, each call timed.
    seen: list[tuple[str, Any]] = []

    class Named(Callback):
        def __init__(self, name: str) -> None:
            self.name = name

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            seen.append((self.name, (outputs, batch, batch_idx)))

    members = [Named("a"), Named("b")]
    hub = HookHub(members)
    hub.on_train_batch_end(None, None, outputs={"loss": 1}, batch=[2], batch_idx=3)
    hub.on_train_batch_end(None, None, {"loss": 4}, [5], 6)
    assert seen == [
        ("a", ({"loss": 1}, [2], 3)),
        ("b", ({"loss": 1}, [2], 3)),
        ("a", ({"loss": 4}, [5], 6)),
        ("b", ({"loss": 4}, [5], 6)),
    ]
    assert sorted(h for _, h in hub.seconds()) == ["on_train_batch_end"] * 2
