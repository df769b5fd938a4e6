"""Which profiled actions the ledger brackets (``wall_time/actions.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_speedpack.core.hook_hub import HookHub
from lightning_speedpack.core.hooks import TRAIN_STEP_HOOKS
from lightning_speedpack.wall_time.actions import FETCHED, HUB_CARVED, IGNORED, ActionKeys
from tests.helpers.namespaces import Namespace, each_namespace


def _member(ns: Namespace) -> Any:
    class Member(ns.Callback):  # type: ignore[misc, name-defined]
        def on_train_batch_end(self, *args: Any) -> None: ...

        def on_validation_batch_end(self, *args: Any) -> None: ...

        def on_train_epoch_end(self, *args: Any) -> None: ...

    return Member()


@each_namespace
def test_a_hubs_training_batch_hooks_are_carved_its_validation_hooks_bracketed(
    ns: Namespace,
) -> None:
    hub = HookHub([_member(ns)], owns=True)
    keys = ActionKeys({hub.state_key: hub}, ns.BoringModel())
    for hook in HUB_CARVED:
        assert keys[f"[Callback]{hub.state_key}.{hook}"] is IGNORED, hook
    assert keys[f"[Callback]{hub.state_key}.on_validation_batch_end"] == (
        "callback:HookHub",
        "on_validation_batch_end",
    )
    assert keys[f"[Callback]{hub.state_key}.on_train_start"] is IGNORED  # its own upkeep
    # a hook the hub forwards to a member's own: bracketed, then shared out by the hub's clock
    assert keys[f"[Callback]{hub.state_key}.on_train_epoch_end"] == (
        "callback:HookHub",
        "on_train_epoch_end",
    )


def test_the_carved_hooks_say_which_part_ran_them() -> None:
    assert {h: HUB_CARVED[h] for h in TRAIN_STEP_HOOKS} == dict.fromkeys(
        TRAIN_STEP_HOOKS, "training_step"
    )
    assert HUB_CARVED["on_train_batch_start"] == HUB_CARVED["on_train_batch_end"] == "unaccounted"


@each_namespace
@pytest.mark.parametrize("overridden", [False, True])
def test_the_modules_transfer_hook_is_bracketed_only_where_it_is_the_users(
    ns: Namespace, overridden: bool
) -> None:
    class Model(ns.BoringModel):  # type: ignore[misc, name-defined]
        if overridden:

            def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
                return batch

    keys = ActionKeys({}, Model())
    found = keys["[LightningModule]Model.on_before_batch_transfer"]
    assert found == (("batch_transfer", "on_before_batch_transfer") if overridden else IGNORED)
    # Lightning names the datamodule only where the datamodule overrides the hook.
    assert keys["[LightningDataModule]Data.on_before_batch_transfer"] == (
        "batch_transfer",
        "on_before_batch_transfer",
    )
    assert keys["[_TrainingEpochLoop].train_dataloader_next"] is FETCHED
    # No module known (a ledger fed by hand): bracketed, as a user's hook would be.
    assert ActionKeys({}, None)["[LightningModule]M.on_before_batch_transfer"] != IGNORED


def test_a_callback_added_after_setup_is_charged_by_its_class_name() -> None:
    keys = ActionKeys({}, None)
    assert keys["[Callback]pkg.mod.Late{'a': 1}.on_train_batch_end"] == (
        "callback:Late",
        "on_train_batch_end",
    )
