"""``core.sampling``: the one rule the doctor's sampled tools (timeline, sync points) share."""

from __future__ import annotations

import doctest

import pytest

from lightning_speedpack.core import sampling


def test_every_step_at_first_then_one_in_n() -> None:
    assert [s for s in range(48) if sampling.sampled(s, 8)] == [*range(16), 16, 24, 32, 40]
    assert all(sampling.sampled(s, 1) for s in range(100))
    assert sampling.DOCTOR_SAMPLE_EVERY == 8


def test_a_long_fit_is_sampled_more_sparsely_from_step_64() -> None:
    # 22 steps watched by step 64 (16 dense, 6 sampled), then one in 64: a 4,096-step fit
    # pays for 85 watched steps, not 526 (and a 512-step one for 29, where it paid for 42).
    watched = [s for s in range(4096) if sampling.sampled(s, 8)]
    assert watched[19:25] == [40, 48, 56, 64, 128, 192]
    assert len([s for s in watched if s < sampling.SPARSE_FROM_STEP]) == 22
    assert len(watched) == 22 + (4096 - 64) // 64
    assert sum(sampling.sampled(s, 8) for s in range(512)) == 29
    # a sleeper told to wake at the next watched step wakes at each of them, and only there
    woken, step = [], 0
    while step < 4096:
        woken.append(step)
        step = sampling.next_sampled(step, 8)
    assert woken == watched
    assert sampling.cadence(8) == "1 step in 8, from step 64 1 in 64"
    # a fit that timed no more steps than the dense stretch holds never backed off
    dense = sum(sampling.sampled(s, 8) for s in range(sampling.SPARSE_FROM_STEP))
    assert (dense, sampling.cadence(8, timed=dense)) == (22, "1 step in 8")
    assert sampling.cadence(8, timed=dense + 1) == "1 step in 8, from step 64 1 in 64"


def test_the_timeline_and_the_sync_points_sample_the_same_steps_under_the_doctor() -> None:
    from lightning_speedpack.core.registry import DoctorContext, registered_diagnostics
    from lightning_speedpack.doctor.runner import import_tools

    import_tools()
    built = {d.name: d.factory(DoctorContext()) for d in registered_diagnostics()}
    assert built["timeline"].sample_every_n_steps == sampling.DOCTOR_SAMPLE_EVERY
    assert built["sync_points"].sample_every_n_steps == sampling.DOCTOR_SAMPLE_EVERY


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0, ValueError, r"`sample_every_n_steps` must be >= 1 \(1: every step\), got 0"),
        (True, TypeError, "`sample_every_n_steps` must be an int, got True"),
        ("8", TypeError, "`sample_every_n_steps` must be an int, got '8'"),
    ],
)
def test_bad_values_are_refused(value: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        sampling.check_sample_every(value)


def test_docstring_examples() -> None:
    assert doctest.testmod(sampling).failed == 0
