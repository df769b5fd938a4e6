"""``make demo`` prints the what-if figure of a doctor report, and what the fast run applied.

The full demo takes minutes; here its printing runs on a report of the shape
``WhatIf.doctor_figures`` writes (the columns and rows of ``what_if.report``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from rich.console import Console

from lightning_speedpack.what_if.measure import NOT_TRIED, Measurement
from lightning_speedpack.what_if.report import COLUMNS, rows

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


@pytest.fixture
def demo(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("speedpack_demo", DEMO)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "console", Console(record=True, width=200))
    return module


def _report(applied: dict[str, Any]) -> dict[str, Any]:
    found = [
        Measurement("num_workers", "loader", "0", "2", 2, [100.0, 100.0], [190.0, 210.0]),
        Measurement(
            "persistent_workers", "loader", "False", "True", True, [100.0, 100.0], [101.0, 120.0]
        ),
        Measurement.skipped("cache", "loader", "JpegDataset", NOT_TRIED, "the budget ran out"),
    ]
    figure = {
        "columns": list(COLUMNS),
        "rows": rows(found, 1.05, 1e-3),
        "applied": applied,
        "trial_seconds": 12.5,
    }
    return {"runs": [{"figures": {"what_if": figure}}], "findings": []}


def test_the_what_if_table_has_a_row_per_knob(demo: ModuleType) -> None:
    demo.print_what_if(_report({}), "slow_training.py")
    text = demo.console.export_text()
    assert "slow_training.py" in text
    assert "trials: 12.5 s before the first step" in text
    lines = text.splitlines()
    workers = next(line for line in lines if "num_workers" in line)
    assert "100 -> 200" in workers  # the medians of the rounds, before -> after
    assert "2.00x (1.90-2.10)" in workers  # the median gain of the rounds, their spread
    assert "apply" in workers
    assert "uncertain" in next(line for line in lines if "persistent_workers" in line)
    assert "not tried" in next(line for line in lines if "cache" in line)
    assert "the budget ran out" in text


def test_the_applied_settings_and_the_ones_left(demo: ModuleType) -> None:
    demo.print_applied(_report({"num_workers": 2}), "fast_training.py")
    lines = demo.console.export_text().splitlines()
    assert lines[0] == "fast_training.py: WhatIf applied num_workers=2 for the fit (measured)"
    assert lines[1] == "fast_training.py: persistent_workers left at False (uncertain)"
    assert lines[2] == "fast_training.py: cache left at JpegDataset (not tried: the budget ran out)"


def test_a_report_without_trials_says_so(demo: ModuleType) -> None:
    demo.print_what_if({"runs": [{"figures": {}}], "findings": []}, "slow_training.py")
    assert "No what-if table" in demo.console.export_text()


def test_the_findings_are_folded_and_gpu_advice_comes_last(demo: ModuleType) -> None:
    layer = {
        "component": "advisor",
        "id": "layer-dims-multiple",
        "severity": "info",
        "fix": "pad to head_dim=104",
        "figures": {"layer": "MultiheadAttention"},
        "pays_on": "GPU",
    }
    findings = [
        {**layer, "message": f"dims of enc.{i}.attn", "location": f"enc.{i}.attn"} for i in range(6)
    ]
    findings.append(
        {
            "component": "data",
            "id": "model-bound",
            "severity": "info",
            "message": "the model consumes 94 samples/s",
            "location": None,
            "figures": {},
            "fix": None,
        }
    )
    demo.print_findings({"findings": findings, "runs": []})
    text = demo.console.export_text()
    assert text.count("advisor/layer-dims-multiple") == 1
    assert "dims of 6 MultiheadAttention layers" in text
    assert "info, on GPU" in text
    assert text.index("data/model-bound") < text.index("advisor/layer-dims-multiple")


def test_the_screenshot_says_how_to_get_chromium_when_there_is_none(
    demo: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_speedpack.doctor.html.chromium as chromium

    monkeypatch.delenv("SPEEDPACK_CHROMIUM", raising=False)
    monkeypatch.setattr(chromium, "CANDIDATES", ())  # not Debian's
    monkeypatch.setenv("PATH", str(tmp_path))  # nor one on PATH
    page = tmp_path / "page.html"
    page.write_text("<html><body>report</body></html>")
    assert demo.screenshot(page, tmp_path / "page.png") is None
    assert "apt-get install chromium-headless-shell" in demo.console.export_text()
    assert not (tmp_path / "page.png").exists()
