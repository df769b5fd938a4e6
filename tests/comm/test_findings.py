"""The comm findings from synthetic measurements: exact ids, figures, severities."""

from __future__ import annotations

from pathlib import Path

from lightning_speedpack.comm.ddp_stats import DDPSample
from lightning_speedpack.comm.findings import (
    UnusedParameters,
    find_unused_findings,
    sync_dist_findings,
)
from lightning_speedpack.comm.sync_dist import SyncSite

HERE = str(Path(__file__))


def _site(calls: int, steps: int, seconds: float, line: int = 3) -> SyncSite:
    return SyncSite(HERE, line, calls=calls, steps=steps, seconds=seconds)


def test_a_line_that_syncs_every_step_is_a_warning_with_its_cost() -> None:
    [finding] = sync_dist_findings(
        [_site(calls=600, steps=100, seconds=1.45)], steps=100, step_ms=15.6, world_size=2
    )
    assert finding.id == "sync-dist-every-step"
    assert finding.component == "comm"
    assert finding.severity == "warning"
    assert finding.location == "tests/comm/test_findings.py:3"
    assert finding.figures == {
        "values_per_step": 6.0,
        "steps_with_sync": 100,
        "training_steps": 100,
        "sync_ms_per_step": 14.5,
        "sync_share_of_step": 0.9295,
    }
    assert "reduces 6 values across the 2 ranks in 100 of 100 training steps" in finding.message
    assert "14.50 ms per step (93% of the step)" in finding.message
    # the line itself, read from the file: line 3 of this module
    assert '"""The comm findings' not in finding.message
    assert finding.fix is not None
    assert "on_step=False, on_epoch=True" in finding.fix
    assert "torchmetrics" in finding.fix


def test_one_finding_per_line_costliest_first_and_rare_lines_left_out() -> None:
    cheap = _site(calls=100, steps=100, seconds=0.0001, line=5)
    costly = _site(calls=100, steps=100, seconds=0.5, line=7)
    rare = _site(calls=10, steps=10, seconds=2.0, line=9)  # 10 of 100 steps: not every step
    findings = sync_dist_findings([cheap, costly, rare], steps=100, step_ms=10.0, world_size=4)
    assert [(f.location, f.severity) for f in findings] == [
        ("tests/comm/test_findings.py:7", "warning"),
        ("tests/comm/test_findings.py:5", "info"),  # 0.001 ms of a 10 ms step
    ]


def test_no_sync_dist_finding_on_one_process_or_without_steps() -> None:
    site = _site(calls=100, steps=100, seconds=1.0)
    assert sync_dist_findings([site], steps=100, step_ms=10.0, world_size=1) == []
    assert sync_dist_findings([site], steps=0, step_ms=None, world_size=2) == []


def test_without_a_step_time_the_cost_is_still_said() -> None:
    [finding] = sync_dist_findings([_site(4, 4, 0.004)], steps=4, step_ms=None, world_size=2)
    assert finding.figures["sync_share_of_step"] is None
    assert "measured: 1.00 ms per step, the wall time" in finding.message
    assert "reduces a value" in finding.message


def _samples(unused: int | None, n: int = 5) -> list[DDPSample]:
    return [DDPSample(i, 1, 2_000_000, 3_000_000, 1, unused) for i in range(1, n + 1)]


def test_find_unused_parameters_that_finds_nothing_is_a_warning() -> None:
    state = UnusedParameters(
        True, False, _samples(0), batches=64, backward_compute_ms=2.0, comm_ms_per_step=3.0
    )
    [finding] = find_unused_findings(state)
    assert (finding.id, finding.severity) == ("find-unused-parameters", "warning")
    assert finding.location == "Trainer(strategy)"
    assert finding.figures == {
        "find_unused_parameters": True,
        "sampled_steps": 4,  # iteration 1 left out
        "training_batches": 64,
        "unused_parameter_bytes": 0,
    }
    assert (
        "no parameter went without a gradient in any of the 4 steps DDP sampled (of 64 training"
        in (finding.message)
    )
    assert "Cost not measured in this run" in finding.message
    assert "backward compute (2.00 ms per step)" in finding.message
    assert "communication (3.00 ms per step)" in finding.message
    assert finding.fix is not None
    assert 'strategy="ddp"' in finding.fix
    assert "DDPStrategy(find_unused_parameters=False)" in finding.fix


def test_unused_layers_are_an_info_naming_them() -> None:
    state = UnusedParameters(
        True,
        False,
        _samples(1_050_624),
        batches=64,
        names_without_grad=["unused.weight", "unused.bias"],
    )
    [finding] = find_unused_findings(state)
    assert (finding.id, finding.severity) == ("find-unused-parameters", "info")
    assert finding.location == "unused"
    assert finding.figures["unused_parameter_bytes"] == 1_050_624
    assert finding.figures["unused_parameter_tensors"] == 2
    assert finding.message.startswith(
        "1.0 MiB (1,050,624 bytes) of parameters got no gradient in 4 of the 4 steps DDP "
        "sampled (2 tensors without a gradient after the last step: unused.weight, unused.bias)"
    )
    assert finding.fix is not None
    assert "static_graph=True" in finding.fix


def test_a_step_optimized_by_hand_is_told_the_search_is_needed_not_to_remove_layers() -> None:
    state = UnusedParameters(
        True,
        False,
        _samples(9_488),
        batches=64,
        names_without_grad=["net.0.weight", "critic.weight"],  # the last backward's other part
        manual_optimization=True,
    )
    [finding] = find_unused_findings(state)
    assert (finding.id, finding.severity, finding.location) == (
        "find-unused-parameters",
        "info",
        "training_step",
    )
    assert finding.message.startswith(
        "9488 bytes of parameters got no gradient in 4 of the 4 iterations DDP sampled"
    )
    assert "net.0.weight" not in finding.message
    assert finding.fix is not None
    assert "remove the layers" not in finding.fix
    assert "keep `find_unused_parameters=True`" in finding.fix


def test_no_unused_finding_without_the_search_or_without_samples() -> None:
    assert find_unused_findings(UnusedParameters(False, False, _samples(None), 64)) == []
    # static_graph: DDP finds the unused parameters once, no search per step
    assert find_unused_findings(UnusedParameters(True, True, _samples(0), 64)) == []
    assert find_unused_findings(UnusedParameters(True, False, _samples(0, n=1), 1)) == []
    assert find_unused_findings(UnusedParameters(True, False, [], 0)) == []
