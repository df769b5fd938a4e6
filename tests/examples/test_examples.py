"""The examples run, and the doctor finds in slow_training.py what it was written to show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SMALL = ["--images", "96", "--epochs", "2"]


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)}
    return subprocess.run(
        [sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.parametrize("script", ["slow_training.py", "fast_training.py"])
def test_example_runs(script: str, tmp_path: Path) -> None:
    proc = _run([str(EXAMPLES / script), *SMALL, "--out", str(tmp_path / "out")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_doctor_on_the_slow_example_writes_the_report(tmp_path: Path) -> None:
    report_path = tmp_path / "out.json"
    proc = _run(
        [
            "-m",
            "lightning_speedpack",
            "doctor",
            str(EXAMPLES / "slow_training.py"),
            "--json",
            str(report_path),
            *SMALL,
            "--out",
            str(tmp_path / "out"),
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    (run,) = report["runs"]
    assert run["samples"] == 96 * 2
