"""What the timeline reports, from given phase totals: the doctor's figures and findings."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_speedpack.core.events import BatchTransfer
from lightning_speedpack.timeline.phases import PHASES, PhaseTotals
from lightning_speedpack.timeline.report import doctor_figures, doctor_findings
from lightning_speedpack.timeline.trace import TopOp, TraceWindow


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


def test_the_top_operators_read_whole_in_a_log_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """stderr into a file (SLURM, CI): every operator name whole, no `…`, the trace's path."""
    from lightning_speedpack.timeline.report import print_top_ops

    monkeypatch.delenv("COLUMNS", raising=False)
    window = TraceWindow(3, 2, tmp_path, rank=0)
    long_name = "aten::_scaled_dot_product_flash_attention_for_cpu_backward_" + "x" * 40
    window.top_ops = [TopOp(long_name, 12.5, 40), TopOp("aten::addmm", 3.25, 120)]
    window.first_step, window.last_step = 3, 4
    window.path = tmp_path / ("a-long-folder-name-" * 6) / "speedpack-steps3-4-rank0.pt.trace.json"
    print_top_ops(window)
    err = capsys.readouterr().err
    assert "…" not in err
    assert long_name in err  # never folded nor cut
    assert "Top operators by self time, steps 3-4" in err
    assert f"trace: {window.path} (open in https://ui.perfetto.dev)" in err
