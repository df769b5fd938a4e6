from __future__ import annotations

import json
from pathlib import Path

import pytest
from pytorch_lightning import Callback

from lightning_speedpack.doctor import (
    DoctorContext,
    Finding,
    Report,
    RunSummary,
    register_diagnostic,
    registered_diagnostics,
    unregister_diagnostic,
)


class A(Callback):
    pass


class B(Callback):
    pass


def test_register_orders_and_is_idempotent() -> None:
    try:
        register_diagnostic("zz-b", B, order=-2)
        register_diagnostic("zz-a", A, order=-1)
        register_diagnostic("zz-a", A, order=-1)  # same class again: fine
        names = [d.name for d in registered_diagnostics()]
        assert names.index("zz-b") < names.index("zz-a")
        assert names.count("zz-a") == 1
        built = next(d for d in registered_diagnostics() if d.name == "zz-a").factory(
            DoctorContext()
        )
        assert isinstance(built, A)
    finally:
        unregister_diagnostic("zz-a")
        unregister_diagnostic("zz-b")
    assert "zz-a" not in [d.name for d in registered_diagnostics()]


def test_register_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="Callback subclass"):
        register_diagnostic("x", object)  # type: ignore[arg-type]
    register_diagnostic("zz-c", A)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_diagnostic("zz-c", B)
    finally:
        unregister_diagnostic("zz-c")


def test_context_reads_the_accelerator() -> None:
    assert DoctorContext({"accelerator": "gpu"}).accelerator == "gpu"
    assert DoctorContext().accelerator == "auto"


def test_report_json_has_stable_keys(tmp_path: Path) -> None:
    report = Report(
        findings=[Finding("c", "id-1", "msg", "x.py:3", {"v": 1.5}, "error", "do this")],
        runs=[RunSummary(wall_s=2.0, samples=10, samples_per_sec=5.0, figures={"f": 1})],
    )
    report.write_json(tmp_path / "sub" / "r.json")
    data = json.loads((tmp_path / "sub" / "r.json").read_text())
    assert data["findings"] == [
        {
            "component": "c",
            "id": "id-1",
            "message": "msg",
            "location": "x.py:3",
            "figures": {"v": 1.5},
            "severity": "error",
            "fix": "do this",
            "pays_on": None,
        }
    ]
    assert data["runs"] == [
        {"wall_s": 2.0, "samples": 10, "samples_per_sec": 5.0, "figures": {"f": 1}}
    ]


def test_report_prints_findings_and_figures() -> None:
    from rich.console import Console

    console = Console(record=True, width=200)
    Report(
        findings=[
            Finding("sync", "item", ".item() in the step", "train.py:12", fix="use self.log")
        ],
        runs=[RunSummary(1.0, 8, 8.0, {"syncs_per_step": 1.0, "series": [[1, 2]]})],
    ).print(console)
    text = console.export_text()
    for expected in ("train.py:12", "use self.log", "syncs_per_step"):
        assert expected in text
    assert "series" not in text  # lists stay in the JSON
