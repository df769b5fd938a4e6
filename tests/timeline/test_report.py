"""What the timeline reports, from given phase totals: the doctor's figures and findings."""

from __future__ import annotations

from pathlib import Path

from lightning_speedpack.core.events import BatchTransfer
from lightning_speedpack.timeline.phases import PHASES, PhaseTotals
from lightning_speedpack.timeline.report import doctor_figures, doctor_findings
from lightning_speedpack.timeline.trace import TopOp


def _run() -> PhaseTotals:
    run = PhaseTotals()
    run.add({"data_wait": 0.002, "training_step": 0.006})
    run.add({"data_wait": 0.002, "training_step": 0.006})
    return run


def test_figures_without_batches_are_empty() -> None:
    assert doctor_figures(PhaseTotals(), None) == {}
    assert doctor_findings(PhaseTotals(), None, []) == []


def test_figures_per_phase_and_of_the_copy() -> None:
    copy = BatchTransfer(0.0, 8.0, 2, bytes_per_batch=128, pinned=True, gb_per_sec=1.23456)
    figures = doctor_figures(_run(), copy)
    assert figures["phase_share"] == {
        **dict.fromkeys(PHASES, 0.0),
        "data_wait": 0.25,
        "training_step": 0.75,
    }
    assert figures["phase_ms"]["training_step"] == 6.0
    assert (figures["h2d_bytes_per_batch"], figures["h2d_pinned"]) == (128, 1)
    assert figures["h2d_gb_per_sec"] == 1.235
    assert "phase_ms_over_steps" not in figures  # no window logged
    windows = [(2, {"data_wait": 1.0}), (4, {"data_wait": 3.0})]
    assert doctor_figures(_run(), None, windows)["phase_ms_over_steps"] == [
        [2, {"data_wait": 1.0}],
        [4, {"data_wait": 3.0}],
    ]
    unmeasured = doctor_figures(_run(), BatchTransfer(0.0, 8.0, 2))
    assert not {"h2d_bytes_per_batch", "h2d_pinned", "h2d_gb_per_sec"} & set(unmeasured)


def test_findings_rank_the_phases_and_point_at_the_trace(tmp_path: Path) -> None:
    ops = [TopOp(f"aten::op{i}", 4.0 - i, 1) for i in range(4)]
    phases, trace = doctor_findings(_run(), tmp_path / "t.json", ops)
    assert (
        phases.message
        == "Where a training batch's host time goes: training_step 75%, data_wait 25%"
    )
    assert (phases.id, phases.severity) == ("step-phases", "info")
    assert trace.message.endswith("aten::op0 4.0 ms, aten::op1 3.0 ms, aten::op2 2.0 ms")
    assert trace.location == str(tmp_path / "t.json")
    assert trace.figures == {"aten::op0": 4.0, "aten::op1": 3.0, "aten::op2": 2.0, "aten::op3": 1.0}
