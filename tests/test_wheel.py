"""The wheel, installed as a user installs it (issue 40): away from the checkout, with ``[all]``.

Builds the wheel from this checkout, installs it into a fresh venv under ``tmp_path`` (the CPU
torch first, as the README says, then ``lightning-speedpack[all]`` from the wheel file), and from
a folder outside the repository runs what a newcomer runs first: ``speedpack doctor --json
--html`` on a short training script, then ``speedpack compare`` of two reports. It proves the
package data (the doctor's bootstrap, the HTML page's styles), the console script and the extras
work from the installed wheel, not from the source tree.

Needs the package registry (or pip's cache) for the dependencies; marked slow (a few minutes).
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers.procs import run_in_session

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TORCH_SPEC = os.environ.get("SPEEDPACK_TORCH_SPEC", "torch==2.13.0")

SCRIPT = """\
import sys
import torch
from pytorch_lightning import Trainer
from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

class Model(BoringModel):
    def train_dataloader(self):
        return DataLoader(RandomDataset(32, int(sys.argv[1]) * 8), batch_size=8)

Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        accelerator="cpu", devices=1).fit(Model())
"""


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = run_in_session(cmd, timeout=timeout, cwd=cwd, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return f"{proc.stdout}\n{proc.stderr}"  # the report goes to stderr, the job's output to stdout


def _build_wheel(out: Path) -> Path:
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)], out)
    (wheel,) = out.glob("lightning_speedpack-*.whl")
    return wheel


def test_the_installed_wheel_runs_the_doctor_and_compare_outside_the_checkout(
    tmp_path: Path,
) -> None:
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert "lightning_speedpack/py.typed" in names
    assert any(n.startswith("lightning_speedpack/doctor/_bootstrap/") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)

    venv = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "-q", TORCH_SPEC], tmp_path)
    _run([str(py), "-m", "pip", "install", "-q", f"{wheel}[all]"], tmp_path)

    work = tmp_path / "job"  # outside the checkout: the source tree cannot be imported here
    work.mkdir()
    where = _run([str(py), "-c", "import lightning_speedpack as m; print(m.__file__)"], work)
    assert str(venv) in where
    assert str(REPO) not in where

    (work / "train.py").write_text(SCRIPT)
    speedpack = str(venv / "bin" / "speedpack")
    for name, batches in (("a", 6), ("b", 12)):
        out = _run(
            [
                speedpack,
                "doctor",
                "--json",
                f"{name}.json",
                "--html",
                f"{name}.html",
                "--layout",
                "log",
                "train.py",
                str(batches),
            ],
            work,
        )
        assert "speedpack doctor" in out
        assert f"HTML report written to {name}.html" in out
        report = json.loads((work / f"{name}.json").read_text())
        assert report["runs"], report
        page = (work / f"{name}.html").read_text()
        assert page.startswith("<!DOCTYPE html>")
        assert "<svg" in page

    compared = _run([speedpack, "compare", "a.json", "b.json", "--html", "ab.html"], work)
    assert "samples/s" in compared
    assert (work / "ab.html").read_text().startswith("<!DOCTYPE html>")
