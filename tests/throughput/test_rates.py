from __future__ import annotations

import pytest

from lightning_speedpack.throughput.rates import (
    RATE_FIELDS,
    StepClock,
    StepRecord,
    WindowRates,
    combine_ranks,
    mfu,
    rates,
    window_rates,
)


def test_window_rates_exact() -> None:
    records = [
        StepRecord(seconds=0.25, samples=8, items=80, data_wait=0.05, flops=100.0),
        StepRecord(seconds=0.75, samples=24, items=240, data_wait=0.45, flops=300.0),
    ]
    r = window_rates(records)
    assert r == WindowRates(
        samples_per_sec=32.0,
        batches_per_sec=2.0,
        items_per_sec=320.0,
        flops_per_sec=400.0,
        step_time_ms=500.0,
        data_wait_ms=250.0,
        data_wait_fraction=0.5,
    )


def test_window_rates_empty_or_zero_time() -> None:
    assert window_rates([]) is None
    assert window_rates([StepRecord(0.0, 4)]) is None
    assert rates(batches=0, seconds=1.0, samples=0) is None


def test_data_wait_fraction_is_clamped() -> None:
    r = rates(batches=1, seconds=1.0, samples=1, wait=2.0)
    assert r is not None
    assert r.data_wait_fraction == 1.0


def test_combine_ranks_sums_rates_and_averages_times() -> None:
    a = WindowRates(100.0, 10.0, 1.0, 5.0, 100.0, 10.0, 0.1)
    b = WindowRates(300.0, 10.0, 3.0, 15.0, 100.0, 30.0, 0.3)
    summed = [x + y for x, y in zip(a.vector(), b.vector(), strict=True)]
    w = combine_ranks(summed, ranks=2)
    assert w.samples_per_sec == 400.0  # the sum of what each rank did, not 2 x rank 0
    assert w.batches_per_sec == 20.0
    assert w.items_per_sec == 4.0
    assert w.flops_per_sec == 20.0
    assert w.step_time_ms == 100.0
    assert w.data_wait_ms == 20.0
    assert w.data_wait_fraction == pytest.approx(0.2)


def test_combine_ranks_validates() -> None:
    with pytest.raises(ValueError, match="expected 7 summed values, got 2"):
        combine_ranks([1.0, 2.0], ranks=1)
    with pytest.raises(ValueError, match="`ranks` must be >= 1, got 0"):
        combine_ranks([0.0] * len(RATE_FIELDS), ranks=0)


def test_mfu() -> None:
    assert mfu(50.0, 100.0, devices=1) == 0.5
    assert mfu(50.0, 100.0, devices=2) == 0.25
    assert mfu(50.0, None, devices=1) is None
    assert mfu(50.0, 0.0, devices=1) is None


def test_step_clock_measures_wait_and_step() -> None:
    clock = StepClock(window=10)
    clock.epoch_start(10.0)
    clock.add_wait(0.5)
    clock.batch_start()
    first = clock.batch_end(11.0, samples=4, items=40, flops=7.0)
    assert first == StepRecord(seconds=1.0, samples=4, items=40, data_wait=0.5, flops=7.0)
    clock.add_wait(0.125)  # two fetches for one step (a prefetch, a dataloader_iter step)
    clock.add_wait(0.125)
    clock.batch_start()
    second = clock.batch_end(13.0, samples=4)
    assert second == StepRecord(seconds=2.0, samples=4, data_wait=0.25)
    assert list(clock.window) == [first, second]


def test_step_clock_excludes_paused_time() -> None:
    clock = StepClock(window=10)
    clock.epoch_start(0.0)
    clock.batch_start()
    clock.batch_end(1.0, samples=1)
    clock.pause(1.0)
    clock.pause(2.0)  # idempotent: the first pause counts
    clock.resume(101.0)  # 100 s of validation
    clock.resume(200.0)  # a resume without a pause does nothing
    clock.add_wait(0.5)
    clock.batch_start()
    record = clock.batch_end(2.0 + 100.0, samples=1)
    assert record == StepRecord(seconds=1.0, samples=1, data_wait=0.5)


def test_step_clock_window_evicts_oldest_and_reset_forgets() -> None:
    clock = StepClock(window=2)
    clock.epoch_start(0.0)
    for i in range(3):
        clock.batch_start()
        clock.batch_end(float(i + 1), samples=i + 1)
    assert [r.samples for r in clock.window] == [2, 3]
    clock.reset()
    assert len(clock.window) == 0
    clock.batch_start()
    assert clock.batch_end(6.0, samples=1) is None  # no epoch start after reset: no interval


def test_step_clock_epoch_start_restarts_the_interval() -> None:
    clock = StepClock(window=4)
    clock.epoch_start(0.0)
    clock.batch_start()
    clock.batch_end(1.0, samples=1)
    clock.epoch_start(50.0)  # epoch-end work and validation before it do not count
    clock.add_wait(0.5)
    clock.batch_start()
    assert clock.batch_end(51.0, samples=1) == StepRecord(seconds=1.0, samples=1, data_wait=0.5)


def test_step_clock_wait_is_only_what_was_reported() -> None:
    # Time between two batches that no fetch reported (other callbacks' hooks, a checkpoint
    # save) is step time, not data wait.
    clock = StepClock(window=4)
    clock.epoch_start(0.0)
    clock.add_wait(0.25)
    clock.batch_start()
    clock.batch_end(1.0, samples=1)
    clock.batch_start()
    assert clock.batch_end(3.0, samples=1) == StepRecord(seconds=2.0, samples=1, data_wait=0.0)
    assert clock.wait_seconds == 0.25
    assert clock.train_seconds == 3.0


def test_step_clock_drops_a_wait_no_step_can_own() -> None:
    clock = StepClock(window=4)
    clock.epoch_start(0.0)
    clock.add_wait(7.0)  # a batch that never reached the model (on_train_batch_start: -1)
    assert clock.batch_end(1.0, samples=1) is None
    clock.batch_start()
    assert clock.batch_end(2.0, samples=1) == StepRecord(seconds=1.0, samples=1, data_wait=0.0)
    clock.add_wait(5.0)  # before the next epoch's start: not the next epoch's first step
    clock.epoch_start(10.0)
    clock.batch_start()
    assert clock.batch_end(11.0, samples=1) == StepRecord(seconds=1.0, samples=1, data_wait=0.0)
    clock.add_wait(3.0)
    clock.reset()
    clock.epoch_start(20.0)
    clock.batch_start()
    assert clock.batch_end(21.0, samples=1) == StepRecord(seconds=1.0, samples=1, data_wait=0.0)
