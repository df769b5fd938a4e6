"""``comm/comm-bound`` on given figures: when it fires, its fixes, how the world judges it.

No timing here: the figures are given (the DDP zoo's ``comm-bound`` case measures them).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lightning_speedpack.comm.comm_bound import (
    INFO_SHARE,
    WARNING_SHARE,
    CommBound,
    comm_bound_finding,
)
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.world.findings import comm_bound_in_world
from lightning_speedpack.world.revise import revise_findings

# The zoo's comm-bound job as measured on rank 0 (2 gloo ranks, a 128 MiB embedding table).
BOUND = CommBound(
    comm_wait_fraction=0.40,
    comm_wait_ms=199.8,
    comm_ms_per_step=206.1,
    overlap_fraction=0.03,
    step_ms=493.9,
    world_size=2,
    iterations=24,
    fit_s=12.1,
    gradient_bytes=134_479_914,
    largest_gradient_bytes=134_217_728,
    bucket_cap_mb=25.0,
)


def _finding(state: CommBound = BOUND) -> Finding:
    found = comm_bound_finding(state)
    assert found is not None
    return found


def test_a_large_wait_on_the_all_reduce_is_a_warning_with_its_share_of_the_wall_time() -> None:
    f = _finding()
    assert (f.component, f.id, f.severity) == ("comm", "comm-bound", "warning")
    assert f.message.startswith(
        "communication-bound: on rank 0 the backward waits for the gradient all-reduce of 128 "
        "MiB of gradients across 2 ranks after its last gradient at least 199.8 ms a step (the "
        "least, where no other rank was waited for), 40% of the 493.9 ms step (40% of the wall "
        "time); the all-reduce takes 206.1 ms, 3% of it hidden"
    )
    typical = _finding(replace(BOUND, samples=9, typical_wait_ms=210.0, mean_wait_ms=230.0))
    assert (
        "at least 199.8 ms a step (the least of 9 sampled steps, where no other rank was "
        "waited for; 210.0 ms typical)" in typical.message
    )
    # the wall time lost is the mean wait's
    assert typical.figures["wall_fraction"] == pytest.approx(230.0 * 24 / 1000 / 12.1, abs=1e-4)
    assert f.figures["wall_fraction"] == pytest.approx(199.8 * 24 / 1000 / 12.1, abs=1e-4)
    assert f.figures["comm_wait_fraction"] == 0.4


@pytest.mark.parametrize(
    ("share", "severity"),
    [(WARNING_SHARE, "warning"), (INFO_SHARE, "info"), (INFO_SHARE - 0.01, None), (0.05, None)],
)
def test_severity_follows_the_share_of_the_step(share: float, severity: str | None) -> None:
    found = comm_bound_finding(replace(BOUND, comm_wait_fraction=share))
    assert (found.severity if found else None) == severity


def test_nothing_on_one_process() -> None:
    assert comm_bound_finding(replace(BOUND, world_size=1)) is None


def test_the_fixes_come_best_first_and_only_those_that_apply() -> None:
    fix = _finding().fix or ""
    order = [
        "accumulate_grad_batches=k",
        "a larger batch per rank",
        "gradient_as_bucket_view=True",
        "bucket_cap_mb",
        "fp16_compress_hook",
        "static_graph=True",
    ]
    positions = [fix.find(text) for text in order]
    assert all(p >= 0 for p in positions), fix
    assert positions == sorted(positions)
    # the measured job's gradient is mostly one 128 MiB tensor: no cap splits it
    assert "but the largest gradient (128 MiB) is over any cap: its bucket waits for it" in fix
    assert "Lightning applies `DDPStrategy(ddp_comm_hook=...)` on CUDA only" in fix  # a CPU job


def test_settings_already_in_place_are_said_and_not_advised_again() -> None:
    state = replace(
        BOUND,
        accumulate_grad_batches=4,
        gradient_as_bucket_view=True,
        comm_hook="fp16_compress_hook",
        static_graph=True,
        overlap_fraction=0.8,  # the buckets overlap well: no bucket_cap_mb advice
        cuda=True,
    )
    fix = _finding(state).fix or ""
    assert fix.startswith("(1) raise `Trainer(accumulate_grad_batches=4)`")
    assert "bucket_cap_mb" not in fix
    assert "compress_hook)`" not in fix.split("(already set")[0]
    assert fix.endswith(
        "(already set: gradient_as_bucket_view=True, a communication hook (fp16_compress_hook), "
        "static_graph=True)"
    )


def test_on_cuda_the_compression_is_bf16_through_lightnings_strategy() -> None:
    fix = _finding(replace(BOUND, cuda=True)).fix or ""
    assert "`DDPStrategy(ddp_comm_hook=default.bf16_compress_hook)`" in fix


def _world(shares: dict[int, float], straggler: dict[str, Any] | None = None) -> dict[str, Any]:
    ranks = [{"rank": r, "comm_wait_fraction": s, "cycle_ms": 10.0} for r, s in shares.items()]
    return {"ranks": ranks, "straggler": straggler}


def test_the_world_judges_it_on_the_rank_that_waited_least() -> None:
    f = _finding()
    judged = comm_bound_in_world(f, _world({0: 0.40, 1: 0.43}))
    assert judged is not None
    assert judged.severity == "warning"
    assert judged.message.startswith(
        "on every rank (rank 0: 40%, rank 1: 43% of the step waiting for the gradient "
        "all-reduce; rank 0, which waited least, waited for nobody): communication-bound"
    )
    moderate = comm_bound_in_world(f, _world({0: 0.40, 1: 0.2}))
    assert moderate is not None
    assert moderate.severity == "info"
    assert moderate.figures["comm_wait_fraction"] == 0.2
    assert moderate.figures["wall_fraction"] < f.figures["wall_fraction"]


def test_a_wait_for_a_slower_rank_is_not_communication_bound() -> None:
    # rank 0 waits 78% of its step in the all-reduce, rank 1 (slow) 1%: the zoo's slow-step
    f = _finding(replace(BOUND, comm_wait_fraction=0.78))
    assert comm_bound_in_world(f, _world({0: 0.78, 1: 0.01})) is None
    straggler = {"rank": 1, "waited_step_fraction": 0.78}
    assert comm_bound_in_world(f, _world({0: 0.78, 1: 0.2}, straggler)) is None
    # a straggler and an all-reduce that is slow on its own: kept, below the straggler
    both = comm_bound_in_world(f, _world({0: 0.78, 1: 0.35}, straggler))
    assert both is not None
    assert both.severity == "info"
    assert "besides rank 1, the straggler" in both.message


def test_rank_zeros_view_stands_where_a_rank_did_not_measure() -> None:
    f = _finding()
    assert (
        comm_bound_in_world(f, {"ranks": [{"rank": 0, "comm_wait_fraction": 0.4}, {"rank": 1}]})
        is f
    )


def test_the_report_drops_it_where_rank_0_waited_for_a_straggler() -> None:
    f = _finding(replace(BOUND, comm_wait_fraction=0.78))
    straggler = {
        "rank": 1, "node": 0, "host": "h", "own_ms": 40.0, "others_ms": 6.0, "excess_ms": 34.0,
        "part": "training step", "part_ms": 37.0, "part_others_ms": 5.0, "callback": None,
        "waited_ms": 31.0, "waited_s": 2.0, "waited_step_fraction": 0.78,
        "wall_fraction": 0.75, "others": 1, "moving": None,
    }  # fmt: skip
    world = _world({0: 0.78, 1: 0.01}, straggler)
    assert [g.id for g in revise_findings([f], world)] == ["straggler"]
    assert [g.id for g in revise_findings([f], _world({0: 0.4, 1: 0.43}))] == ["comm-bound"]


def test_the_world_reads_the_least_iterations_share_where_every_rank_has_it() -> None:
    # the mean says 40% on both ranks (each waited for the other in turn), the least 1%
    rows = [
        {"rank": r, "comm_wait_fraction": 0.4, "comm_wait_least_fraction": 0.01} for r in (0, 1)
    ]
    assert comm_bound_in_world(_finding(), {"ranks": rows}) is None
