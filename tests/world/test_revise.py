"""Rank 0's report read with the world in view: no blame on backward, verdicts per rank."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.doctor.grouping import presented
from lightning_speedpack.world.figures import world_figures
from lightning_speedpack.world.revise import judged_rank, revise_figures, revise_findings
from tests.world.synthetic import payloads


def _item(
    component: str, finding_id: str, message: str, severity: str = "warning"
) -> dict[str, Any]:
    return {
        "component": component,
        "id": finding_id,
        "severity": severity,
        "message": message,
        "fix": f"fix {finding_id}",
        "location": None,
    }


def _phases() -> Finding:
    shares = {"backward": 0.86, "other": 0.07, "training_step": 0.04, "data_wait": 0.03}
    return Finding(
        "timeline",
        "step-phases",
        "Where a training batch's host time goes: backward 86%, other 7%, training_step 4%",
        figures=shares,
        severity="info",
    )


MODEL_BOUND = Finding(
    "data", "model-bound", "model-bound: the model consumes 148 samples/s", severity="info"
)


def _slow_data_world() -> dict[str, Any]:
    findings = {
        0: [_item("data", "model-bound", "model-bound: the model consumes 148 samples/s", "info")],
        1: [_item("data", "data-bound", "data-bound: the loader delivers 200 samples/s", "error")],
    }
    return world_figures(payloads({0: (2.5, 3.0), 1: (37.0, 3.0)}, findings=findings))


def test_the_straggler_comes_first_and_rank_0s_backward_is_waiting_for_rank_1() -> None:
    world = _slow_data_world()
    revised = revise_findings([MODEL_BOUND, _phases()], world)
    shown = presented(revised)
    assert next(f.id for f in shown if f.severity != "info") == "straggler"
    phases = next(f for f in revised if f.id == "step-phases")
    assert phases.message.startswith(
        "Where a training batch's host time goes on rank 0: waiting for rank 1 "
    )
    assert "(in backward's gradient all-reduce)" in phases.message
    assert "backward 86%" not in phases.message
    assert phases.figures["waiting_for_rank_1"] > 0.8


def test_rank_0s_phases_add_where_the_stragglers_own_batch_went() -> None:
    theirs = (
        "Where a training batch's host time goes: training_step 88%, backward 5%, other 4% "
        "(timed on 1 step in 8, from step 64 1 in 64: 22 batches)"
    )
    findings = {1: [_item("timeline", "step-phases", theirs, "info")]}
    world = world_figures(payloads({0: (0.6, 5.0), 1: (0.6, 36.0)}, findings=findings))
    (phases,) = (f for f in revise_findings([_phases()], world) if f.id == "step-phases")
    assert phases.message.startswith(
        "Where a training batch's host time goes on rank 0: waiting for rank 1 "
    )
    assert phases.message.endswith(
        "; on rank 1, the straggler: training_step 88%, backward 5%, other 4%"
    )
    # a straggler that published no phases: rank 0's alone
    world = world_figures(payloads({0: (0.6, 5.0), 1: (0.6, 36.0)}))
    (alone,) = (f for f in revise_findings([_phases()], world) if f.id == "step-phases")
    assert "the straggler" not in alone.message


def test_the_worlds_verdict_is_the_slowest_ranks() -> None:
    world = _slow_data_world()
    assert judged_rank(world) == 1
    revised = revise_findings([MODEL_BOUND], world)
    verdict = next(f for f in revised if f.component == "data")
    assert verdict.id == "data-bound"
    assert verdict.message.startswith(
        "on rank 1, the slowest rank: data-bound: the loader delivers 200 samples/s (rank 0 "
        "alone would say model-bound: it counts its wait for rank 1 as the model's time)"
    )
    assert verdict.severity == "warning"  # below the straggler's error: it says why
    assert verdict.fix == "fix data-bound"


def _pipeline(fetch_ms: float) -> str:
    return f"where a training sample's loading time goes:\nfetch (sample)  {fetch_ms:.3f}"


@pytest.mark.parametrize(("slow", "shown"), [(37.0, 4.252), (2.6, 0.017)], ids=["slow", "alike"])
def test_the_pipeline_shown_is_the_stragglers_where_there_is_one(slow: float, shown: float) -> None:
    # Rank 0 fetches a sample in 0.017 ms and waits for rank 1, which takes 4.252 ms.
    findings = {
        0: [_item("data", "data-pipeline", _pipeline(0.017), "info")],
        1: [_item("data", "data-pipeline", _pipeline(4.252), "info")],
    }
    world = world_figures(payloads({0: (2.5, 3.0), 1: (slow, 3.0)}, findings=findings))
    mine = Finding(
        "data", "data-pipeline", _pipeline(0.017), figures={"fetch_ms": 0.017}, severity="info"
    )
    (pipeline,) = (f for f in revise_findings([mine], world) if f.id == "data-pipeline")
    assert pipeline.message.endswith(f"fetch (sample)  {shown:.3f}")
    straggling = world["straggler"] is not None
    assert straggling == (slow > 30)
    assert pipeline.message.startswith("on rank 1, the slowest rank: ") == straggling
    # rank 0's measured figures are not given as rank 1's
    mine_then = {"rank": 1, "rank_0": {"fetch_ms": 0.017}}
    assert pipeline.figures == (mine_then if straggling else {"fetch_ms": 0.017})


def test_a_straggler_that_sent_no_pipeline_leaves_rank_0s_said_to_be_rank_0s() -> None:
    findings = {0: [_item("data", "data-pipeline", _pipeline(0.017), "info")]}
    world = world_figures(payloads({0: (2.5, 3.0), 1: (37.0, 3.0)}, findings=findings))
    mine = Finding("data", "data-pipeline", _pipeline(0.017), severity="info")
    (pipeline,) = (f for f in revise_findings([mine], world) if f.id == "data-pipeline")
    assert pipeline.message == f"on rank 0 (rank 1 did not say): {_pipeline(0.017)}"


def test_figures_take_the_slowest_ranks_verdict_and_split_the_ledgers_step() -> None:
    sent = payloads({0: (2.5, 3.0), 1: (37.0, 3.0)})
    sent[0]["figures"] = {"verdict": "model-bound: ...", "bound": "model"}
    sent[1]["figures"] = {"verdict": "data-bound: ...", "bound": "data"}
    world = world_figures(sent)
    figures: dict[str, Any] = {
        "verdict": "model-bound: ...",
        "bound": "model",
        "wall_time": {
            "total_s": 10.0,
            "parts": {"training_step": 4.0, "setup": 6.0},
            "fractions": {"training_step": 0.4, "setup": 0.6},
        },
    }
    revise_figures(figures, world)
    assert (figures["verdict"], figures["bound"]) == ("data-bound: ...", "data")
    parts = figures["wall_time"]["parts"]
    assert parts["waiting for rank 1"] == 3.45  # 34.5 ms x 100 batches
    assert parts["training_step"] == 0.55
    assert figures["wall_time"]["fractions"]["waiting for rank 1"] == 0.345


def test_alike_ranks_leave_rank_0s_findings_alone() -> None:
    findings = {r: [_item("data", "model-bound", f"model-bound on {r}", "info")] for r in (0, 1)}
    world = world_figures(payloads({0: (1.0, 10.0), 1: (1.1, 10.2)}, findings=findings))
    given = [MODEL_BOUND, _phases()]
    assert revise_findings(given, world) == given
    assert revise_findings(given, None) == given


def test_cpu_threads_is_judged_on_every_rank() -> None:
    message = "torch runs 8 CPU threads x 2 process(es) on 2 cores"
    threads = _item("wall_time", "cpu-threads", message)
    own = {0: (1.0, 10.0), 1: (1.0, 10.0)}
    only_1 = world_figures(payloads(own, findings={1: [threads]}))
    (added,) = revise_findings([], only_1)
    assert added.id == "cpu-threads"
    assert added.message.startswith("on rank 1: torch runs 8 CPU threads")
    both = world_figures(payloads(own, findings={0: [threads], 1: [threads]}))
    rank0 = Finding("wall_time", "cpu-threads", message)
    (kept,) = revise_findings([rank0], both)
    assert kept.message.endswith("(on ranks 0, 1)")


def test_a_needless_unused_search_stands_only_when_no_rank_found_unused_parameters() -> None:
    # DDP needs find_unused_parameters=True when any rank leaves a parameter without a gradient:
    # rank 0's "none unused" must not tell the user to turn it off.
    from lightning_speedpack.core.findings import Finding
    from lightning_speedpack.world.revise import revise_findings

    needless = Finding("comm", "find-unused-parameters", "none unused", severity="warning")
    rank1 = {
        "component": "comm",
        "id": "find-unused-parameters",
        "severity": "info",
        "message": "1.0 MiB of parameters got no gradient",
        "location": "unused",
    }
    world = {"ranks": [{"rank": 0}, {"rank": 1}], "findings_by_rank": [[0, []], [1, [rank1]]]}
    [revised] = revise_findings([needless], world)
    assert revised.severity == "info"
    assert revised.message.startswith("on rank 1: 1.0 MiB")
    quiet = {"ranks": [{"rank": 0}, {"rank": 1}], "findings_by_rank": [[0, []], [1, []]]}
    assert revise_findings([needless], quiet) == [needless]
