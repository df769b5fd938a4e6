"""A rank that stalls now and then: told from a straggler and from a busy host's noise.

The ranks' clocks here are the real :class:`StepClock` fed in lock step, as DDP runs them: each
batch ends on every rank when the slowest rank is done, the faster ones waiting in backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.world.figures import world_figures
from lightning_speedpack.world.findings import stalls_finding, world_findings
from lightning_speedpack.world.payload import StepClock
from lightning_speedpack.world.revise import revise_findings
from lightning_speedpack.world.stalls import BatchTally, find_stalls

BACKWARD_S = 0.001  # backward's own compute on every rank
AFTER_S = 0.0002  # the optimizer and the batch-end hooks

# (rank, epoch, batch) -> (data s, compute s) of that rank's batch
Own = Callable[[int, int, int], tuple[float, float]]


def _usual(rank: int, epoch: int, batch: int) -> tuple[float, float]:
    return 0.0005, 0.0025


def _world(own: Own, *, ranks: int = 2, epochs: int = 2, batches: int = 32, **cpu: Any) -> dict:
    """The payloads of ``ranks`` lock-step clocks (``cpu``: ``cpu_wait_s`` per rank)."""
    clocks = [StepClock(cpu_wait=lambda: None) for _ in range(ranks)]
    t = 0.0
    for epoch in range(epochs):
        for clock in clocks:
            clock.epoch_start(epoch)
        for batch in range(batches):
            times = [own(r, epoch, batch) for r in range(ranks)]
            ready = max(d + c for d, c in times)  # the all-reduce waits for the slowest
            for clock, (data, compute) in zip(clocks, times, strict=True):
                start = t + (data if batch else 0.0)
                clock.batch_start(start)
                clock.backward_start(start + compute)
                clock.backward_end(t + ready + BACKWARD_S)
                clock.batch_end(t + ready + BACKWARD_S + AFTER_S, 8)
            t += ready + BACKWARD_S + AFTER_S
        for clock in clocks:
            clock.epoch_end()
    waits = cpu.get("cpu_wait_s", {})
    return {
        rank: {
            "rank": rank,
            "node": 0,
            "host": "h",
            "wall_s": t,
            "samples": 8 * epochs * batches,
            "clock": clock.figures(),
            "cpu_wait_s": waits.get(rank),
            "figures": {},
            "findings": [],
        }
        for rank, clock in enumerate(clocks)
    }


def _stalls_at(
    rank: int, batches: tuple[int, ...], seconds: float, *, in_data: bool = False
) -> Own:
    """Rank ``rank`` takes ``seconds`` longer in ``batches`` of each epoch (its step or data)."""

    def own(r: int, epoch: int, batch: int) -> tuple[float, float]:
        data, compute = _usual(r, epoch, batch)
        if r == rank and batch in batches:
            return (data + seconds, compute) if in_data else (data, compute + seconds)
        return data, compute

    return own


def test_a_rank_that_stalls_in_a_few_batches_is_named_with_its_batches_and_the_wait() -> None:
    world = world_figures(_world(_stalls_at(1, (8, 24), 0.15)))
    assert world["straggler"] is None  # the others did not wait in most steps
    stalls = world["stalls"]
    assert (stalls["rank"], stalls["stalls"], stalls["part"]) == (1, 4, "training step")
    assert sorted((e, b) for _, e, b, _ in stalls["longest"]) == [(0, 8), (0, 24), (1, 8), (1, 24)]
    assert 0.55 < stalls["waited_s"] < 0.62  # 4 x 150 ms, waited by rank 0
    finding = world_findings(world)[0]
    assert (finding.id, finding.severity) == ("stalls", "error")  # over half rank 0's loop
    assert "rank 1" in finding.message
    assert "epoch 1, batch 24" in finding.message
    assert "global_rank" in (finding.fix or "")
    # rank 0's row says whom it waited for, not its model
    row0 = world["ranks"][0]
    assert row0["bound"] == "rank 1"
    assert row0["verdict"].startswith("waiting for rank 1 (its stalls)")


def test_stalls_in_the_loader_are_the_data_wait() -> None:
    world = world_figures(_world(_stalls_at(1, (5, 20, 30), 0.12, in_data=True)))
    assert world["stalls"]["part"] == "data wait"
    assert "loader" in (world_findings(world)[0].fix or "")


def test_a_rank_slow_in_every_batch_is_a_straggler_not_stalls() -> None:
    def slow(r: int, epoch: int, batch: int) -> tuple[float, float]:
        return (0.0005, 0.03) if r == 1 else _usual(r, epoch, batch)

    world = world_figures(_world(slow))
    assert world["straggler"]["rank"] == 1
    assert world["stalls"] is None


def test_ranks_that_hiccup_alike_are_noise_not_one_ranks_stalls() -> None:
    def both(r: int, epoch: int, batch: int) -> tuple[float, float]:
        data, compute = _usual(r, epoch, batch)
        hiccups = (4, 20) if r == 0 else (12, 28)
        return (data, compute + 0.1) if batch in hiccups else (data, compute)

    assert world_figures(_world(both))["stalls"] is None


def test_short_or_few_stalls_are_not_named() -> None:
    assert world_figures(_world(_stalls_at(1, (8,), 0.05)))["stalls"] is None  # 0.1 s in all
    assert world_figures(_world(_stalls_at(1, (8, 24), 0.012)))["stalls"] is None  # < 20 ms


def test_the_first_batches_of_a_fit_are_left_out() -> None:
    def first(r: int, epoch: int, batch: int) -> tuple[float, float]:
        data, compute = _usual(r, epoch, batch)
        return (data, compute + 1.0) if (r, epoch, batch) == (1, 0, 1) else (data, compute)

    assert world_figures(_world(first))["stalls"] is None


def test_stalls_explained_by_the_ranks_wait_for_a_cpu_are_the_hosts_info() -> None:
    payloads = _world(_stalls_at(1, (8, 24), 0.15), cpu_wait_s={0: 0.01, 1: 0.6})
    world = world_figures(payloads)
    assert world["stalls"]["part"] == "wait for a CPU"
    finding = world_findings(world)[0]
    assert finding.severity == "info"
    assert "every core busy" in finding.message


def test_rank_zeros_phases_say_it_waited_for_the_stalling_rank() -> None:
    world = world_figures(_world(_stalls_at(1, (8, 24), 0.15)))
    phases = Finding(
        "timeline",
        "step-phases",
        "Where a training batch's host time goes: backward 86%, other 7%, training_step 4%",
        figures={"backward": 0.86, "other": 0.07, "training_step": 0.04},
        severity="info",
    )
    revised = revise_findings([phases], world)
    assert [f.id for f in revised] == ["stalls", "step-phases"]
    assert "waiting for rank 1" in revised[1].message
    assert "straggler" not in revised[1].message  # rank 1 kept pace between its stalls


def test_four_ranks_one_stalling_the_others_wait_each() -> None:
    world = world_figures(_world(_stalls_at(2, (3, 9, 15, 27), 0.1), ranks=4))
    assert (world["stalls"]["rank"], world["stalls"]["others"]) == (2, 3)
    assert "the other 3 ranks waited" in stalls_finding(world["stalls"]).message
    assert [r["bound"] for r in world["ranks"] if r["rank"] != 2] == ["rank 2"] * 3


def test_the_tally_keeps_its_longest_batches_and_leaves_out_the_warmup() -> None:
    tally = BatchTally(warmup=2, keep=3)
    for i, own in enumerate([9.0, 8.0, 0.1, 0.5, 0.2, 0.7, 0.3, 0.6]):
        tally.add(own, 0.01, 0.0, epoch=0, batch=i)
    figures = tally.figures()
    assert [x[0] for x in figures["longest"]] == [700.0, 600.0, 500.0]
    assert sum(n for _, n, _ in figures["own"]) == 6  # the first two left out


def test_a_world_without_tallies_names_no_stalls() -> None:
    rows = [{"rank": r, "batches": 64, "cycle_ms": 5.0} for r in (0, 1)]
    assert find_stalls({0: {}, 1: {}}, rows) is None  # ranks of an older pack


def test_without_ddps_sampled_waits_each_ranks_typical_backward_decides() -> None:
    payloads = _world(_stalls_at(1, (8, 24), 0.15))
    world = world_figures(payloads)
    assert world["straggler"] is None  # rank 0's typical backward is not rank 1's excess
    assert [round(r["backward_typical_ms"]) for r in world["ranks"]] == [1, 1]
    # DDP's sampled waits are read first where every rank has them (here: waits in most steps)
    for rank, wait in ((0, 12.0), (1, 0.2)):
        payloads[rank]["figures"] = {"comm_wait_median_ms": wait}
    assert world_figures(payloads)["straggler"]["rank"] == 1
