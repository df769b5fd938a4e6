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

# (rank, epoch, batch) -> (data s, compute s) of that rank's batch, or with the seconds of its
# batch-end hooks after the all-reduce: (data s, compute s, after s)
Own = Callable[[int, int, int], tuple[float, ...]]


def _usual(rank: int, epoch: int, batch: int) -> tuple[float, float]:
    return 0.0005, 0.0025


def _world(own: Own, *, ranks: int = 2, epochs: int = 2, batches: int = 32, **extra: Any) -> dict:
    """The payloads of ``ranks`` lock-step clocks (``extra``: ``cpu_wait_s``, ``figures``).

    As Lightning runs DDP: each batch begins with a broadcast from rank 0 (the others leave it
    when rank 0 arrives), then the fetch and the forward, then backward's all-reduce (every rank
    leaves it when the slowest arrives), then each rank's batch-end hooks.
    """
    clocks = [StepClock(cpu_wait=lambda: None) for _ in range(ranks)]
    ends = [0.0] * ranks
    for epoch in range(epochs):
        for clock in clocks:
            clock.epoch_start(epoch)
        for batch in range(batches):
            times = [(*own(r, epoch, batch), 0.0)[:3] for r in range(ranks)]
            sent = ends[0]  # rank 0 broadcasts when it gets there
            left = [max(end, sent) for end in ends]
            starts = [go + (d if batch else 0.0) for go, (d, _, _) in zip(left, times, strict=True)]
            ready = max(st + c for st, (_, c, _) in zip(starts, times, strict=True))
            for r, clock in enumerate(clocks):
                _, compute, after = times[r]
                clock.broadcast_wait(left[r] - ends[r])  # timed around the broadcast
                clock.batch_start(starts[r])
                clock.backward_start(starts[r] + compute)
                clock.backward_end(ready + BACKWARD_S)
                ends[r] = ready + BACKWARD_S + AFTER_S + after
                clock.batch_end(ends[r], 8)
        for clock in clocks:
            clock.epoch_end()
    t = max(ends)
    waits = extra.get("cpu_wait_s", {})
    published = extra.get("figures", {})
    return {
        rank: {
            "rank": rank,
            "node": 0,
            "host": "h",
            "wall_s": t,
            "samples": 8 * epochs * batches,
            "clock": clock.figures(),
            "cpu_wait_s": waits.get(rank),
            "figures": dict(published.get(rank, {})),
            "findings": [],
        }
        for rank, clock in enumerate(clocks)
    }


def _stalls_at(rank: int, batches: tuple[int, ...], seconds: float, *, where: str = "step") -> Own:
    """Rank ``rank`` takes ``seconds`` longer in ``batches`` of each epoch: in its data, its
    step (before the all-reduce) or its batch-end hooks (after it)."""

    def own(r: int, epoch: int, batch: int) -> tuple[float, ...]:
        data, compute = _usual(r, epoch, batch)
        if r != rank or batch not in batches:
            return data, compute
        return {
            "data": (data + seconds, compute),
            "step": (data, compute + seconds),
            "after": (data, compute, seconds),
        }[where]

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
    world = world_figures(_world(_stalls_at(1, (5, 20, 30), 0.12, where="data")))
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


def test_the_others_typical_wait_from_their_clocks_or_ddps_medians_confirms_a_straggler() -> None:
    payloads = _world(_stalls_at(1, (8, 24), 0.15))
    world = world_figures(payloads)
    assert world["straggler"] is None  # rank 0's typical wait is not rank 1's excess
    assert [round(r["wait_typical_ms"]) for r in world["ranks"]] == [1, 1]
    # DDP's sampled medians (the all-reduce's alone) say rank 0 waited in most steps: either
    # typical wait may confirm (a starved rank is slow in its own backward too, which only
    # DDP's figure leaves out)
    for rank, wait in ((0, 12.0), (1, 0.2)):
        payloads[rank]["figures"] = {"comm_wait_median_ms": wait}
    assert world_figures(payloads)["straggler"]["rank"] == 1
    # neither: the stalls stay stalls
    for rank, wait in ((0, 1.0), (1, 0.9)):
        payloads[rank]["figures"] = {"comm_wait_median_ms": wait}
    assert world_figures(payloads)["straggler"] is None


def test_stalls_in_one_ranks_callback_name_the_callback() -> None:
    # A rank_zero_only callback that plots every 16 batches, after the all-reduce: rank 1 waits
    # for it in the next batch's broadcast from rank 0, before its fetch, not in its backward.
    plots = {"wall_time/parts/callbacks": 0.62, "wall_time/callbacks/Plots": 0.6}
    figures = {0: plots, 1: {"wall_time/parts/callbacks": 0.02, "wall_time/callbacks/Plots": 0.0}}
    world = world_figures(_world(_stalls_at(0, (8, 24), 0.15, where="after"), figures=figures))
    stalls = world["stalls"]
    assert (stalls["rank"], stalls["part"], stalls["callback"]) == (0, "callbacks", "Plots")
    finding = stalls_finding(stalls)
    assert "in the hooks of Plots" in finding.message
    assert "rank_zero_only" in (finding.fix or "")
    assert world["ranks"][1]["bound"] == "rank 0"  # rank 1 waited for rank 0's plots


def test_a_rank_0_slow_after_the_all_reduce_is_a_straggler_waited_for_before_the_fetch() -> None:
    # rank 0's batch-end hooks take 30 ms every batch: rank 1 waits in the broadcast at the
    # start of its next batch; counted as its data wait, both ranks looked alike
    slow = _stalls_at(0, tuple(range(32)), 0.03, where="after")
    figures = {0: {"wall_time/parts/callbacks": 1.9, "wall_time/callbacks/Plots": 1.9}}
    world = world_figures(_world(slow, figures=figures))
    straggler = world["straggler"]
    assert (straggler["rank"], straggler["part"]) == (0, "callbacks")
    assert straggler["callback"] == "Plots"
    rank1 = world["ranks"][1]
    assert rank1["start_wait_ms"] > 25  # its wait before the fetch
    assert rank1["data_wait_ms"] < 1  # not its data
    assert world["stalls"] is None


def test_the_clock_keeps_the_broadcasts_wait_apart_from_the_data() -> None:
    clock = StepClock(cpu_wait=lambda: None)
    clock.epoch_start(0)
    clock.batch_start(0.0)
    clock.batch_end(0.01, 8)
    clock.broadcast_wait(0.03)  # 30 ms in the broadcast, then a 5 ms fetch
    clock.batch_start(0.045)
    clock.batch_end(0.055, 8)
    figures = clock.figures()
    assert round(figures["start_ms"], 3) == 30.0
    assert round(figures["gap_ms"], 3) == 35.0


def test_each_epoch_counts_the_wait_before_the_fetch_as_a_wait() -> None:
    # Epoch 0: rank 1's step is slow; epoch 1: rank 0's batch-end hooks are (rank 1 waits for
    # them before its fetch): the slowest rank moves, epoch by epoch.
    def moving(r: int, epoch: int, batch: int) -> tuple[float, ...]:
        data, compute = _usual(r, epoch, batch)
        if (r, epoch) == (1, 0):
            return data, compute + 0.03
        if (r, epoch) == (0, 1):
            return data, compute, 0.03
        return data, compute

    world = world_figures(_world(moving))
    assert world["slowest_by_epoch"] == [[0, 1], [1, 0]]
    assert world["straggler"]["moving"] == [[0, 1], [1, 0]]
