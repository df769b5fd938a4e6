"""``benchmarks/doctor_lines.py``: the doctor's per-step work, counted in lines, by module.

Run as the script it is, in a child: the count fits with ``strategy="ddp"`` in its own process
(a process group, torch's thread count and warning filters are the process's to keep).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "doctor_lines.py"


def _run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "6", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_doctors_extra_lines_are_charged_to_its_modules() -> None:
    rows = {
        cells[0]: cells[1:]
        for line in _run("--top", "60").splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    # the ledger brackets every batch, the hub dispatches the doctor's per-batch hooks: lines
    # the plain loop never runs
    for module in ("wall_time/ledger", "core/hook_hub"):
        plain, doctor, _, calls = rows[module]
        assert float(plain) == 0.0
        assert float(doctor) > 0.0
        assert float(calls) > 0.0  # its functions were called: calls charged to the callee
    assert float(rows["**all**"][2].strip("*+")) > 0


def test_the_figure_alone_is_one_number_near_the_tables_total() -> None:
    # two fits in two processes: the same count but for what depends on the clock (a budget,
    # a timed window). On a loaded machine one such path, run once in a fit of 6 steps, moved
    # the figure by 13.5 lines a step (of ~2,180): 2% is allowed, the same figure, not another.
    figure = float(_run("--figure").strip().splitlines()[-1])
    total = next(line for line in _run().splitlines() if line.startswith("| **all**"))
    table = int(total.split("|")[4].strip().strip("*+"))
    assert abs(figure - table) <= max(3.0, 0.02 * table)
