"""The gain WhatIf reports is the gain the fit will see, not one side's alone (issue 38).

The arithmetic on known numbers (:mod:`lightning_speedpack.what_if.fit_gain`), and a planted
fit whose model step (a 100 ms sleep) dwarfs its loading (16 x 2 ms sleeps): whatever the loader
alone gains, the fit cannot gain more than (loading + step) / step = 1.32x, and the reported
gain must say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_speedpack import WhatIf
from lightning_speedpack.what_if import loader_trials as lt
from lightning_speedpack.what_if.fit_gain import Machine, fit_rate, project_fit
from lightning_speedpack.what_if.measure import APPLY, Measurement
from lightning_speedpack.what_if.report import format_table, project
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import NAMESPACES
from tests.what_if.planted import conv_model

#: A machine with cores to spare: the workers take nothing from the step.
SPARE = Machine(cores=16)


def _m(
    knob: str, side: str, value: object, before: float, after: float, **extra: object
) -> Measurement:
    m = Measurement(knob, side, "today", str(value), value, [before] * 3, [after] * 3)
    m.extra.update(extra)
    return m


def test_without_workers_loading_and_the_step_add_up_with_them_the_slower_one_sets_the_pace() -> (
    None
):
    # 10 ms + 2.5 ms per sample one after the other; overlapped, the slower of the two.
    assert fit_rate(100.0, 400.0, overlapped=False) == pytest.approx(80.0)
    assert fit_rate(100.0, 400.0, overlapped=True) == pytest.approx(100.0)
    assert fit_rate(1000.0, 100.0, overlapped=True) == pytest.approx(100.0)
    # A start-up no overlap hides: 1 ms per sample on top of the slower side's 10 ms.
    assert fit_rate(100.0, 400.0, overlapped=True, serial_s=0.001) == pytest.approx(1 / 0.011)
    with pytest.raises(ValueError, match="rates must be positive"):
        fit_rate(0.0, 100.0, overlapped=True)


def test_a_loader_3x_faster_gains_a_fit_whose_step_takes_most_of_it_almost_nothing() -> None:
    # The loader alone 3,000 -> 9,000 samples/s with 2 workers; the step 100 samples/s.
    m = _m("num_workers", "loader", 2, 3000.0, 9000.0)
    project_fit([m], loader=3000.0, model=100.0, workers=0, machine=SPARE)
    assert m.ceiling_gain == pytest.approx(3.0)
    # Today 1/(1/3000 + 1/100) = 96.8 samples/s; with workers min(9000, 100) = 100.
    assert m.gain == pytest.approx(100.0 / (1 / (1 / 3000 + 1 / 100)))
    assert m.gain < 1.04
    assert m.verdict(1.05, 1e-3) == "no gain here"  # min_gain judges the fit's gain
    assert "the loader alone 3,000 -> 9,000 samples/s (3.00x)" in format_table([m], 1.05, 1e-3)


def test_moving_the_loading_into_workers_also_hides_the_step() -> None:
    # Loading 10 ms, the step 2.5 ms per sample: 12.5 ms today; 2 workers load in 3.3 ms.
    m = _m("num_workers", "loader", 2, 100.0, 300.0)
    project_fit([m], loader=100.0, model=400.0, workers=0, machine=SPARE)
    assert m.fit_before == pytest.approx([80.0] * 3)
    assert m.fit_after == pytest.approx([300.0] * 3)
    assert m.gain == pytest.approx(3.75)
    assert m.extra["other_side"] == 400.0
    # Back to 0 workers from 2: the overlap is lost, the step's time comes back.
    back = _m("num_workers", "loader", 0, 300.0, 100.0)
    project_fit([back], loader=300.0, model=400.0, workers=2, machine=SPARE)
    assert back.gain == pytest.approx(80.0 / 300.0)


def test_on_an_accelerator_loading_overlaps_the_step_even_without_workers() -> None:
    m = _m("num_workers", "loader", 2, 100.0, 300.0)
    project_fit([m], loader=100.0, model=200.0, workers=0, machine=Machine(accelerator=True))
    assert m.gain == pytest.approx(2.0)  # min(100, 200) -> min(300, 200): the lower projection


def test_a_cache_on_top_of_workers_gains_up_to_the_model_step() -> None:
    m = _m("cache", "loader", "CachedDataset", 100.0, 10_000.0)
    project_fit([m], loader=100.0, model=250.0, workers=2, machine=SPARE)
    assert m.ceiling_gain == pytest.approx(100.0)
    assert m.gain == pytest.approx(2.5)


def test_persistent_workers_start_up_is_not_hidden_by_the_step() -> None:
    # Steady ceiling 1,000 samples/s; an epoch of 1,000 samples; start-up 0.5 s -> 0.1 s.
    m = _m("persistent_workers", "loader", True, 1000 / 1.5, 1000 / 1.1, ceiling=1000.0, workers=2)
    project_fit([m], loader=1000.0, model=500.0, workers=0, machine=SPARE)
    # The step (2 ms a sample) sets the pace; the start-up comes on top: 2.5 ms -> 2.1 ms.
    assert m.gain == pytest.approx(2.5 / 2.1)


def test_workers_that_compute_on_cores_the_step_needs_hide_nothing() -> None:
    # An in-memory loader (1.0 CPU share) read 0.33x as fast by 2 workers, a step of 8,500
    # samples/s, 2 cores: the workers' 77 us a sample come out of the step (a fit measured
    # 0.73x), where an overlap would have promised 1.1x.
    m = _m("num_workers", "loader", 2, 80_000.0, 26_000.0)
    crowded = Machine(cpu_share=1.0, cores=2, step_threads=1)
    project_fit([m], loader=80_000.0, model=8_500.0, workers=0, machine=crowded)
    assert m.gain < 1.0
    assert m.verdict(1.05, 1e-3) == "no gain here"
    project_fit([m], loader=80_000.0, model=8_500.0, workers=0, machine=SPARE)
    assert m.gain > 1.05  # with cores to spare the overlap stands
    # One worker, one step thread and the fit's process: 3 on 2 cores, charged too.
    one = _m("num_workers", "loader", 1, 57_000.0, 15_400.0)
    project_fit([one], loader=57_000.0, model=6_100.0, workers=0, machine=crowded)
    assert one.verdict(1.05, 1e-3) == "no gain here"  # a fit measured 0.6x, not 1.1x
    # A loader that sleeps (3% CPU) hides behind the step on the same 2 cores.
    sleepy = _m("num_workers", "loader", 2, 314.0, 626.0)
    machine = Machine(cpu_share=0.03, cores=2, step_threads=1)
    project_fit([sleepy], loader=314.0, model=7_663.0, workers=0, machine=machine)
    assert sleepy.gain == pytest.approx(626.0 / fit_rate(314.0, 7_663.0, overlapped=False))


def test_a_model_knob_gains_a_loader_bound_fit_nothing() -> None:
    m = _m("channels_last", "model", True, 400.0, 600.0)
    project_fit([m], loader=100.0, model=400.0, workers=2, machine=SPARE)
    assert m.ceiling_gain == pytest.approx(1.5)
    assert m.gain == pytest.approx(1.0)
    assert m.verdict(1.05, 1e-3) == "no gain here"


def test_without_the_other_sides_pace_the_gain_stays_the_trials_own() -> None:
    m = _m("num_workers", "loader", 2, 100.0, 300.0)
    skipped = Measurement.skipped("cache", "loader", "x", "not applicable", "a stream")
    project_fit([m, skipped], loader=100.0, model=None, workers=0, machine=SPARE)
    assert not m.projected
    assert m.gain == pytest.approx(3.0)
    assert not skipped.projected
    assert skipped.gain is None


def test_the_projection_adds_the_two_times_without_workers_and_takes_the_slower_with_them() -> None:
    w = _m("num_workers", "loader", 2, 100.0, 190.0)
    c = _m("channels_last", "model", True, 400.0, 440.0)
    p = project([w, c], 1.05, 1e-3, workers=0)
    assert p.today == pytest.approx(80.0)  # 10 ms + 2.5 ms per sample
    assert p.after == pytest.approx(190.0)  # min(100 x 1.9, 400 x 1.1)
    assert "one after the other = 80 samples/s" in p.message()
    assert "with the winners: 190 samples/s" in p.message()


def test_a_whole_round_of_workers_is_timed() -> None:
    # Batches come in bursts of `workers`: 3 timed batches of 2 workers read 1.5x too fast.
    assert [lt.whole_cycles(3, w) for w in (0, 1, 2, 3, 4)] == [3, 3, 4, 3, 4]
    assert lt.whole_cycles(10, 4) == 12


@pytest.mark.slow
def test_the_reported_gain_never_exceeds_what_a_step_bound_fit_can_gain(tmp_path: Path) -> None:
    # Loading 16 x 2 ms = 32 ms a batch at 0 workers; the step 100 ms. Whatever loading
    # becomes, a batch takes at least the step: the fit gains at most 132 / 100 = 1.32x.
    nap, batch, step = 0.002, 16, 0.1
    most = (batch * nap + step) / step
    ns = NAMESPACES[0]
    what_if = WhatIf(knobs=["num_workers", "cache"], steps=2, rounds=1, budget_s=60, verbose=False)
    trainer = ns.Trainer(
        callbacks=[what_if], **quiet_trainer_kwargs(tmp_path, max_steps=2, limit_val_batches=0)
    )
    trainer.fit(conv_model(ns.name)(batch_size=batch, n=320, nap=nap, step_nap=step))
    found = {m.knob: m for m in what_if.measurements}
    cache = found["cache"]
    assert cache.gain is not None
    assert cache.ceiling_gain is not None
    # The loader alone gains far more from the warm cache (no naps) than the fit can.
    assert cache.ceiling_gain > 3 * most
    for m in found.values():
        if m.gain is None:
            continue
        assert m.projected, m.knob
        assert m.gain <= most * 1.25, (m.knob, m.gain, m.ceiling_gain)
    # Nor does the verdict promise what the fit cannot give: no 1.05x is missing here.
    assert found["cache"].verdict(1.4, 1e-3) != APPLY
