"""`speedpack doctor --what-if`: WhatIf attached only when asked, its table in every output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lightning_speedpack import WhatIf
from lightning_speedpack.core.hook_hub import callbacks_of
from lightning_speedpack.doctor.cli import main
from lightning_speedpack.doctor.runner import FLAGS_ENV, DoctorSession
from lightning_speedpack.what_if.callback import BUDGET_ENV
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace

SCRIPT = """
import pytorch_lightning as pl
from pytorch_lightning.demos.boring_classes import BoringModel

trainer = pl.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
                     enable_checkpointing=False, enable_model_summary=False)
trainer.fit(BoringModel())
"""


@each_namespace
def test_the_doctor_attaches_what_if_only_with_the_flag(ns: Namespace, tmp_path: Path) -> None:
    def attached(session: DoctorSession) -> list[object]:
        with session.installed():
            trainer = ns.Trainer(**quiet_trainer_kwargs(tmp_path))
        return [c for c in callbacks_of(trainer) if isinstance(c, WhatIf)]

    assert attached(DoctorSession()) == []
    assert attached(DoctorSession(deep=True)) == []
    (what_if,) = attached(DoctorSession(flags=["--what-if"]))
    assert what_if.apply is False  # the doctor reports; it never changes the user's run
    assert len(attached(DoctorSession(only=["what_if"]))) == 1


def test_doctor_what_if_reports_the_table_in_the_json_and_the_print(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "240")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "report.json"
    assert main(["doctor", "--what-if-budget", "30", "--json", str(out), str(script)]) == 0
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    table = run["figures"]["what_if"]
    rows = {row[0]: dict(zip(table["columns"], row, strict=True)) for row in table["rows"]}
    assert {"num_workers", "cache", "fused_optimizer", "precision", "compile"} <= set(rows)
    assert rows["compile"]["verdict"] == "not tried"  # named only on a CPU
    assert rows["num_workers"]["gain"] is not None  # 30 s, not 5% of this 4-step fit
    assert rows["channels_last"]["verdict"] == "not applicable"  # BoringModel has no conv
    assert table["applied"] == {}
    assert FLAGS_ENV not in os.environ
    assert BUDGET_ENV not in os.environ
    printed = capsys.readouterr().err
    assert "Run 0: what if" in printed
    assert "fused_optimizer" in printed


def test_the_doctors_flag_gets_the_whole_budget_and_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--what-if` on a fit of a few seconds tried nothing under the 5% rule (issue 38).
    from lightning_speedpack.what_if import callback as what_if_callback

    monkeypatch.delenv(what_if_callback.BUDGET_ENV, raising=False)
    with caplog.at_level("INFO"):
        made = what_if_callback._doctor_factory(None)
    assert made.budget_s == what_if_callback.DEFAULT_BUDGET_S
    assert "for up to 60 s (`--what-if-budget SECONDS` to change it)" in caplog.text
    monkeypatch.setenv(what_if_callback.BUDGET_ENV, "12.5")
    assert what_if_callback._doctor_factory(None).budget_s == 12.5
