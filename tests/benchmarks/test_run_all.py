"""``benchmarks/run_all.py --quick`` passes ``--quick`` to every script it runs: each must take it.

Read from each script's source (its ``argparse`` calls), not by running 20 scripts: a script
without the option would end ``make bench``'s quick form with argparse's "unrecognized
arguments" (doctor_floor.py, doctor_lines.py and collector.py did).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
#: What run_all.py leaves out of its run (its own rule, by name).
NOT_RUN = ("_", "run_all", "gpu_check", "bench_check")


def _options(script: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            found |= {a.value for a in node.args if isinstance(a, ast.Constant)}
    return found


SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith(NOT_RUN))


def test_run_all_still_runs_the_scripts_this_test_reads() -> None:
    source = (BENCH / "run_all.py").read_text()
    assert '(["--quick"] if quick else [])' in source
    assert 'startswith(("_", "run_all", "gpu_check", "bench_check"))' in source
    assert len(SCRIPTS) >= 20


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_script_takes_quick(script: Path) -> None:
    assert "--quick" in _options(script), f"{script.name} has no --quick option"
