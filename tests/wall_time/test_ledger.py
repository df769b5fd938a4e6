"""The ledger's bookkeeping: every instant charged once, to the innermost bracket."""

from __future__ import annotations

import random

import pytest

from lightning_speedpack.wall_time.ledger import PARTS, Ledger, part_of


def test_time_goes_to_the_innermost_bracket_then_back_to_the_ambient_part() -> None:
    ledger = Ledger()
    ledger.open(10.0, "setup")
    ledger.enter(11.0, "training_step", token="step")
    ledger.enter(12.0, "callback:Slow", token="hook", detail="on_before_backward")
    ledger.leave(14.0, "hook")
    ledger.leave(15.0, "step")
    ledger.switch(15.0, "unaccounted")
    ledger.close(17.0)
    assert dict(ledger.seconds) == {
        "setup": 1.0,
        "training_step": 2.0,
        "callback:Slow": 2.0,
        "unaccounted": 2.0,
    }
    assert ledger.details[("callback:Slow", "on_before_backward")] == 2.0
    assert ledger.total_s == 7.0 == ledger.ended - ledger.started


def test_a_checkpoint_absorbs_the_hooks_that_run_inside_it() -> None:
    ledger = Ledger()
    ledger.open(0.0, "unaccounted")
    ledger.enter(1.0, "checkpoint", token="save_checkpoint")
    ledger.enter(2.0, "callback:Mine", token="[Callback]Mine.on_save_checkpoint")
    ledger.leave(5.0, "[Callback]Mine.on_save_checkpoint")
    ledger.leave(6.0, "save_checkpoint")
    ledger.close(6.0)
    assert ledger.seconds["checkpoint"] == 5.0
    assert "callback:Mine" not in ledger.seconds


def test_an_unbalanced_stop_is_ignored_and_close_charges_what_is_open() -> None:
    ledger = Ledger()
    ledger.open(0.0)
    ledger.enter(1.0, "validation", token="val")
    ledger.leave(2.0, "something else")  # not the innermost: ignored
    ledger.close(4.0)
    assert dict(ledger.seconds) == {"setup": 1.0, "validation": 3.0}
    ledger.enter(5.0, "checkpoint", token="late")  # after close: nothing is charged
    assert ledger.total_s == 4.0


def test_nothing_is_charged_before_open() -> None:
    ledger = Ledger()
    ledger.enter(1.0, "checkpoint", token="save")
    ledger.switch(2.0, "unaccounted")
    assert ledger.total_s == 0.0
    assert not ledger.is_open


@pytest.mark.parametrize("seed", range(5))
def test_the_parts_sum_to_the_span_whatever_the_nesting(seed: int) -> None:
    rng = random.Random(seed)
    ledger = Ledger()
    now = 0.0
    ledger.open(now)
    tokens: list[str] = []
    for i in range(500):
        now += rng.random()
        action = rng.choice(("enter", "leave", "switch"))
        if action == "enter":
            tokens.append(f"t{i}")
            ledger.enter(now, rng.choice(PARTS[:-1]), token=tokens[-1])
        elif action == "leave" and tokens:
            ledger.leave(now, tokens.pop())
        else:
            ledger.switch(now, rng.choice(("unaccounted", "epoch_start", "end_of_fit")))
    ledger.close(now + 1.0)
    assert ledger.total_s == pytest.approx(now + 1.0)


def test_callback_keys_belong_to_the_callbacks_part() -> None:
    assert part_of("callback:ModelSummary") == "callbacks"
    assert part_of("validation") == "validation"


def test_extend_after_close_charges_the_tail_to_one_part() -> None:
    ledger = Ledger()
    ledger.open(0.0)
    ledger.close(2.0)
    ledger.extend(1.0, "end_of_fit")  # earlier than the close: nothing
    ledger.extend(3.5, "end_of_fit")
    assert dict(ledger.seconds) == {"setup": 2.0, "end_of_fit": 1.5}
    assert ledger.ended == 3.5
