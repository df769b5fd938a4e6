"""`speedpack doctor --trace START:COUNT` profiles exactly those steps of an unmodified script."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lightning_speedpack.doctor.cli import main
from lightning_speedpack.timeline.callback import TRACE_DIR_ENV, TRACE_ENV

SCRIPT = """
import pytorch_lightning as pl
from pytorch_lightning.demos.boring_classes import BoringModel

trainer = pl.Trainer(max_steps=8, accelerator="cpu", logger=False, enable_progress_bar=False,
                     enable_checkpointing=False, enable_model_summary=False)
trainer.fit(BoringModel())
"""


def test_doctor_trace_writes_one_trace_of_the_asked_steps(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    traces = tmp_path / "traces"
    code = main(["doctor", "--quiet", "--trace", "3:2", "--trace-dir", str(traces), str(script)])
    assert code == 0
    (trace,) = traces.iterdir()
    assert trace.name == "speedpack-steps3-4-rank0.pt.trace.json"
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {"speedpack/step_3", "speedpack/step_4", "speedpack/backward"} <= names
    assert "speedpack/step_5" not in names
    # the variables were the script's only: nothing is left in this process
    assert TRACE_ENV not in os.environ
    assert TRACE_DIR_ENV not in os.environ


@pytest.mark.parametrize("bad", ["3", "a:b", "-1:2", "2:0"])
def test_a_bad_trace_window_is_one_line_and_exit_2(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    assert main(["doctor", f"--trace={bad}", str(script)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("speedpack doctor: --trace:")
