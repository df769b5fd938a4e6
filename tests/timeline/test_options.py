"""StepTimeline's arguments as plain functions: the checks, and the doctor's environment."""

from __future__ import annotations

import pytest

from lightning_speedpack.timeline.options import (
    TRACE_DIR_ENV,
    TRACE_ENV,
    check_options,
    doctor_trace,
)


def test_check_options_returns_the_trace_window_as_a_tuple() -> None:
    assert check_options(True, "auto", [3, 2], "out", 5, True, False, True) == (3, 2)
    assert check_options(False, False, None, None, None, False, False, False) is None


def test_check_options_names_every_profiler_option_without_a_window() -> None:
    with pytest.raises(ValueError, match="`record_shapes`, `profile_memory` only apply"):
        check_options(True, "auto", None, None, None, True, True, False)


def test_check_options_rejects_a_bool_step_count() -> None:
    with pytest.raises(TypeError, match="`log_every_n_steps` must be an int or None, got True"):
        check_options(True, "auto", None, None, True, False, False, False)


def test_doctor_trace_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACE_ENV, raising=False)
    monkeypatch.delenv(TRACE_DIR_ENV, raising=False)
    assert doctor_trace() == (None, None)
    monkeypatch.setenv(TRACE_ENV, " 4:2 ")
    monkeypatch.setenv(TRACE_DIR_ENV, "")
    assert doctor_trace() == ((4, 2), None)
    monkeypatch.setenv(TRACE_DIR_ENV, "/tmp/traces")
    assert doctor_trace() == ((4, 2), "/tmp/traces")
