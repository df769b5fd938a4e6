"""The host-side phase clock: every moment between batch ends is charged to one phase."""

from __future__ import annotations

import pytest

from lightning_speedpack.timeline.phases import PHASES, PhaseClock, PhaseTotals, shares


def test_switches_charge_the_running_phase_and_sum_to_the_batch() -> None:
    clock = PhaseClock()
    clock.switch("data_wait", 10.0)
    clock.switch("batch_transfer", 10.25)
    clock.switch("training_step", 10.5)
    clock.switch("zero_grad", 11.0)
    clock.switch("backward", 11.25)
    clock.switch("other", 12.0)
    clock.switch("optimizer_step", 12.25)
    clock.switch("other", 12.75)
    clock.end_batch(13.0)
    assert clock.run.batches == 1
    assert clock.run.seconds == {
        "data_wait": 0.25,
        "batch_transfer": 0.25,
        "training_step": 0.5,
        "zero_grad": 0.25,
        "backward": 0.75,
        "optimizer_step": 0.5,
        "other": 0.5,
    }
    assert clock.run.total_seconds() == pytest.approx(3.0)


def test_window_means_per_batch_and_restarts() -> None:
    clock = PhaseClock()
    for start in (0.0, 1.0):
        clock.switch("data_wait", start)
        clock.switch("training_step", start + 0.1)
        clock.end_batch(start + 0.4)
    means = clock.take_window()
    assert means["data_wait"] == pytest.approx(100.0)
    assert means["training_step"] == pytest.approx(300.0)
    assert set(means) == set(PHASES)
    assert clock.take_window() == dict.fromkeys(PHASES, 0.0)  # a new, empty window
    assert clock.run.batches == 2  # the run keeps counting


def test_pause_charges_nothing_and_discard_drops_an_unfinished_batch() -> None:
    clock = PhaseClock()
    clock.switch("data_wait", 0.0)
    clock.switch(None, 1.0)  # validation starts
    clock.switch("data_wait", 5.0)  # ... and ends
    clock.switch("training_step", 6.0)
    clock.end_batch(7.0)
    assert clock.run.seconds["data_wait"] == pytest.approx(2.0)
    clock.switch("data_wait", 8.0)
    clock.discard_batch()
    clock.switch("training_step", 9.0)
    clock.end_batch(9.5)
    assert clock.run.seconds["data_wait"] == pytest.approx(2.0)
    assert clock.run.batches == 2


def test_unknown_phase_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown phase 'forward'"):
        PhaseClock().switch("forward", 0.0)


def test_shares_and_empty_totals() -> None:
    assert shares({"a": 1.0, "b": 3.0}) == {"a": 0.25, "b": 0.75}
    assert shares({"a": 0.0}) == {"a": 0.0}
    assert PhaseTotals().mean_ms() == dict.fromkeys(PHASES, 0.0)
