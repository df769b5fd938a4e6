"""A pytest plugin for the ``tests`` check: each test's outcome written the moment it is known.

``check_tests.py`` runs pytest with ``-p benchmarks.gpu._pytest_lines`` and
``GPU_CHECK_PYTEST_LINES=PATH``: every setup, call and teardown report that is not a plain pass
is appended to ``PATH`` as one JSON line (node id, phase, outcome, duration, short traceback)
and flushed, and a last line marks the session's end. A pytest that dies before its summary and
its JUnit report (a crash, ``os._exit``, a kill) still leaves what each test did.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

__all__ = ["ENV", "pytest_runtest_logreport", "pytest_sessionfinish"]

ENV = "GPU_CHECK_PYTEST_LINES"


def _write(entry: dict[str, Any]) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One line per phase report (a passing setup or teardown is left out)."""
    if report.when != "call" and report.outcome == "passed":
        return
    outcome = report.outcome
    if report.when != "call" and outcome == "failed":
        outcome = "error"
    _write(
        {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": outcome,
            "duration_s": round(report.duration, 3),
            "longrepr": report.longreprtext[-4000:] if report.failed or report.skipped else "",
            "sections": [[name, text[-2000:]] for name, text in report.sections if report.failed],
        }
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The last line: the session reached its end (its exit status)."""
    _write({"sessionfinish": int(exitstatus)})
