"""The world engine on synthetic ranks: who the others wait for, uneven ranks, many ranks."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_speedpack.world.engine import CPU_WAIT, find_imbalance, find_straggler, world_rows
from lightning_speedpack.world.epochs import epoch_waits, slowest_by_epoch
from lightning_speedpack.world.figures import world_figures
from lightning_speedpack.world.findings import world_findings
from lightning_speedpack.world.table import display_table, display_title, logged_table
from tests.world.synthetic import payloads


def test_rows_carry_each_ranks_own_figures_and_its_wait() -> None:
    rows = world_rows(payloads({0: (2.5, 3.0), 1: (37.0, 3.0)}))
    assert [r["rank"] for r in rows] == [0, 1]
    slow, fast = rows[1], rows[0]
    assert slow["wait_ms"] == 0.0  # it arrived last in every all-reduce
    assert fast["wait_ms"] == pytest.approx(34.5, abs=0.01)  # 40.2 - 5.5 - (backward 1.0 both)
    assert fast["own_ms"] == pytest.approx(5.5 + 0.2, abs=0.01)
    assert slow["own_ms"] == pytest.approx(40.2, abs=0.01)
    assert slow["data_wait_ms"] == pytest.approx(37.0)


def test_a_rank_with_slow_data_is_the_straggler_with_its_data_wait_and_the_cost() -> None:
    world = world_figures(payloads({0: (2.5, 3.0), 1: (37.0, 3.0), 2: (2.4, 3.1), 3: (2.6, 2.9)}))
    straggler = world["straggler"]
    assert straggler["rank"] == 1
    assert straggler["part"] == "data wait"
    assert straggler["part_ms"] == pytest.approx(37.0)
    assert straggler["others"] == 3
    assert straggler["waited_s"] == pytest.approx(3.45, abs=0.02)  # 34.5 ms x 100 batches
    assert straggler["waited_step_fraction"] > 0.9
    (finding,) = [f for f in world_findings(world) if f.id == "straggler"]
    assert finding.message.startswith("rank 1 (node 0, host0) is the straggler")
    assert "mostly its data wait (37.0 ms a step against 2.5 ms)" in finding.message
    assert "the other 3 ranks waited 3.5 s each (mean) for it in the gradient all-reduce" in (
        finding.message
    )
    assert finding.severity == "error"  # they waited more than they computed
    assert finding.figures["wall_fraction"] == straggler["wall_fraction"] > 0
    assert "num_workers" in (finding.fix or "")
    assert finding.location == "rank 1, node 0, host0"


def test_a_rank_with_a_slow_step_is_named_with_its_step() -> None:
    world = world_figures(payloads({0: (1.0, 3.0), 1: (1.0, 33.0)}))
    assert world["straggler"]["rank"] == 1
    assert world["straggler"]["part"] == "training step"
    (finding,) = world_findings(world)
    assert "mostly its training step" in finding.message
    assert "the other rank waited" in finding.message


def _with_cpu_wait(world: dict[int, dict[str, Any]], ms: dict[int, float | None]) -> None:
    for rank, per_batch in ms.items():  # seconds over the fit, as the recorder sends them
        batches = world[rank]["clock"]["batches"]
        world[rank]["cpu_wait_s"] = None if per_batch is None else per_batch * batches / 1000


def test_a_rank_kept_off_the_cpu_is_named_for_its_host_not_its_step() -> None:
    """Its step took 30 ms longer, and it spent 28 ms of that ready to run with every core busy:
    the host is the cause, said as an info, and the table shows the CPU wait."""
    ranks = payloads({0: (1.0, 3.0), 1: (1.0, 33.0)})
    _with_cpu_wait(ranks, {0: 0.4, 1: 28.4})
    world = world_figures(ranks)
    straggler = world["straggler"]
    assert straggler["rank"] == 1
    assert straggler["part"] == CPU_WAIT
    assert (straggler["part_ms"], straggler["part_others_ms"]) == (28.4, 0.4)
    (finding,) = world_findings(world)
    assert finding.severity == "info"
    assert "mostly its wait for a CPU (28.4 ms a step against 0.4 ms, ready to run with" in (
        finding.message
    )
    assert "the host, not the job's code" in finding.message
    assert "torch.set_num_threads" in (finding.fix or "")
    assert "CPU wait ms" in display_table(world)[0]


@pytest.mark.parametrize("cpu_wait", [{0: 0.4, 1: 3.0}, {0: 0.4, 1: None}])
def test_a_slow_step_that_was_not_kept_off_the_cpu_stays_its_step(
    cpu_wait: dict[int, float | None],
) -> None:
    """Too little of its excess was CPU wait (or a rank could not measure it): its step."""
    ranks = payloads({0: (1.0, 3.0), 1: (1.0, 33.0)})
    _with_cpu_wait(ranks, cpu_wait)
    world = world_figures(ranks)
    assert world["straggler"]["part"] == "training step"
    (finding,) = world_findings(world)
    assert finding.severity == "error"


def test_a_slow_callback_on_one_rank_is_named_by_class() -> None:
    figures = {
        0: {"wall_time/parts/callbacks": 0.1, "wall_time/callbacks/Slow": 0.0},
        1: {"wall_time/parts/callbacks": 3.1, "wall_time/callbacks/Slow": 3.0},
    }
    # 30 ms a batch of rank 1's own time is in its hooks (3.0 s over 100 batches)
    world = world_figures(payloads({0: (1.0, 3.0), 1: (1.0, 34.0)}, figures=figures))
    straggler = world["straggler"]
    assert (straggler["rank"], straggler["part"], straggler["callback"]) == (1, "callbacks", "Slow")
    assert "the hooks of Slow" in world_findings(world)[0].message


@pytest.mark.parametrize(
    "own",
    [
        {0: (1.0, 10.0), 1: (1.2, 10.5)},  # about alike: noise
        {0: (1.0, 10.0), 1: (1.0, 14.0)},  # 1.3x: under the ratio
        {0: (0.2, 0.5), 1: (0.2, 2.0)},  # 3x but 1.5 ms: under the floor
    ],
)
def test_alike_ranks_have_no_straggler(own: dict[int, tuple[float, float]]) -> None:
    world = world_figures(payloads(own))
    assert world["straggler"] is None
    assert world_findings(world) == []


def test_without_the_others_waiting_there_is_no_straggler() -> None:
    rows = world_rows(payloads({0: (2.5, 3.0), 1: (37.0, 3.0)}))
    for row in rows:  # the backward clock says nobody waited: not the lock step of DDP
        row["wait_ms"], row["own_ms"] = 0.0, row["cycle_ms"] - (row["rank"] == 0) * 34.5
    assert find_straggler(rows) is None


def test_the_comm_diagnostics_time_in_collectives_is_the_wait_when_every_rank_has_it() -> None:
    figures = {
        0: {"comm_ms_per_step": 35.0, "comm_wait_fraction": 0.87, "step_ms": 40.7, "wait_ms": 9},
        1: {"comm_ms_per_step": 0.5, "step_ms": 40.7},
    }
    world = world_figures(payloads({0: (2.5, 3.0), 1: (37.0, 3.0)}, figures=figures))
    rank0 = world["ranks"][0]
    assert rank0["wait_ms"] == pytest.approx(34.5)
    assert rank0["comm_wait_fraction"] == 0.87  # published figures ride along, unchanged
    assert rank0["step_ms"] == 40.7
    assert rank0["published/wait_ms"] == 9  # named like an engine column: kept, renamed
    assert world["straggler"]["rank"] == 1
    headers, _ = display_table(world)
    assert {"comm wait", "comm ms"} <= set(headers)
    columns, rows = logged_table(world)
    assert "comm_ms_per_step" in columns
    assert len(rows) == 2


def test_a_slowest_rank_that_moves_between_epochs_is_the_data() -> None:
    epochs = [
        {0: (2.0, 3.0), 1: (30.0, 3.0)},
        {0: (30.0, 3.0), 1: (2.0, 3.0)},
        {0: (2.0, 3.0), 1: (30.0, 3.0)},
    ]
    sent = payloads(epochs=epochs)
    clocks = {r: p["clock"]["epochs"] for r, p in sent.items()}
    assert slowest_by_epoch(clocks) == [[0, 1], [1, 0], [2, 1]]
    waits = epoch_waits(clocks)
    assert waits[0] == pytest.approx(2 * 2.8, abs=0.01)  # two epochs of 28 ms x 100 batches
    assert waits[1] == pytest.approx(2.8, abs=0.01)
    world = world_figures(sent)
    assert world["straggler"]["moving"] == [[0, 1], [1, 0], [2, 1]]
    (finding,) = world_findings(world)
    assert finding.id == "straggler"
    assert finding.message.startswith(
        "the slowest rank changes from epoch to epoch (epoch 0: rank 1; epoch 1: rank 0; "
        "epoch 2: rank 1): it is the data, not one slow host"
    )
    assert "bucket samples by size" in (finding.fix or "")


_HOST_MOVES = [  # a neighbour's work on rank 1's core in even epochs, rank 0's in odd
    {0: (2.0, 3.0), 1: (2.0, 31.0)},
    {0: (2.0, 31.0), 1: (2.0, 3.0)},
    {0: (2.0, 3.0), 1: (2.0, 31.0)},
]
_DATA_MOVES = [  # the costly batches fall to rank 1, then rank 0, then rank 1
    {0: (2.0, 3.0), 1: (30.0, 3.0)},
    {0: (30.0, 3.0), 1: (2.0, 3.0)},
    {0: (2.0, 3.0), 1: (30.0, 3.0)},
]


@pytest.mark.parametrize(
    ("epochs", "cpu_wait_ms", "moving"),
    [
        (_HOST_MOVES, [{0: 0.3, 1: 26.0}, {0: 26.0, 1: 0.3}, {0: 0.3, 1: 26.0}], None),
        (
            _DATA_MOVES,
            [{0: 0.3, 1: 0.4}, {0: 0.4, 1: 0.3}, {0: 0.3, 1: 0.4}],
            [[0, 1], [1, 0], [2, 1]],
        ),
    ],
    ids=["host", "data"],
)
def test_a_slowest_rank_that_moves_is_the_data_unless_its_host_kept_it_off_the_cpu(
    epochs: list[dict[int, tuple[float, float]]],
    cpu_wait_ms: list[dict[int, float]],
    moving: list[list[int]] | None,
) -> None:
    """Each epoch's slowest rank spent its extra time ready to run with no CPU free (host), or
    had costlier batches (data): only the second says anything about the data."""
    sent = payloads(epochs=epochs)
    for rank, payload in sent.items():  # each epoch row's 7th column: its wait for a CPU
        for row, waited in zip(payload["clock"]["epochs"], cpu_wait_ms, strict=True):
            row.append(waited[rank] * row[1] / 1000)
    clocks = {r: p["clock"]["epochs"] for r, p in sent.items()}
    assert slowest_by_epoch(clocks) == (moving or [])
    world = world_figures(sent)
    assert (world["straggler"] or {}).get("moving") == moving
    said_data = any("it is the data" in f.message for f in world_findings(world))
    assert said_data is (moving is not None)


def test_a_host_whose_load_moves_between_the_ranks_gets_no_warning() -> None:
    """Rank 1 was kept off the CPU in three epochs of four, rank 0 (harder) in one: over the run
    rank 1 is the slower, and its extra wait for a CPU (5.9 ms a batch) is under half its excess
    (14 ms), but each epoch's slowest rank was the host's doing: its load moved, not rank 1's
    code (the DDP zoo's busy-host-moving read so once in six runs)."""
    epochs = [*_HOST_MOVES, _HOST_MOVES[0]]
    waits = [{0: 0.3, 1: 14.5}, {0: 20.0, 1: 0.3}, {0: 0.3, 1: 14.5}, {0: 0.3, 1: 14.5}]
    sent = payloads(epochs=epochs)
    for rank, payload in sent.items():
        for row, waited in zip(payload["clock"]["epochs"], waits, strict=True):
            row.append(waited[rank] * row[1] / 1000)
        payload["cpu_wait_s"] = sum(w[rank] for w in waits) * 100 / 1000  # 100 batches an epoch
    world = world_figures(sent)
    assert world["slowest_by_epoch"] == []  # every epoch the host's
    assert world["straggler"]["rank"] == 1
    assert world["straggler"]["part"] == "wait for a CPU"
    assert [f.severity for f in world_findings(world)] == ["info"]


def test_a_straggler_that_stays_is_not_moving() -> None:
    epochs = [{0: (2.0, 3.0), 1: (30.0, 3.0)}] * 3
    world = world_figures(payloads(epochs=epochs))
    assert world["slowest_by_epoch"] == [[0, 1], [1, 1], [2, 1]]
    assert world["straggler"]["moving"] is None
    assert "is the straggler" in world_findings(world)[0].message


def test_ranks_given_different_batch_sizes_or_counts_are_uneven() -> None:
    own = {0: (1.0, 3.0), 1: (1.0, 3.0)}
    assert find_imbalance(world_rows(payloads(own))) is None
    uneven = world_rows(payloads(own, samples={0: 800, 1: 1600}))
    imbalance = find_imbalance(uneven)
    assert imbalance is not None
    assert imbalance.ratio == 2.0
    assert imbalance.samples == {0: 800, 1: 1600}
    counts = world_rows(payloads(own, batch_counts={0: 100, 1: 90}))
    assert find_imbalance(counts) is not None  # a rank with fewer batches (drop_last, no sampler)
    world = world_figures(payloads(own, samples={0: 800, 1: 1600}))
    (finding,) = world_findings(world)
    assert finding.id == "rank-imbalance"
    assert finding.message.startswith(
        "the ranks trained on different amounts of data (2.00x from the fewest samples to the "
        "most): rank 0: 800 samples in 100 batches, batch size 8; rank 1: 1,600 samples"
    )
    assert "DistributedSampler" in (finding.fix or "")


def test_a_rank_that_did_not_answer_costs_a_line() -> None:
    sent = payloads({0: (1.0, 3.0), 1: (1.0, 3.0), 2: (1.0, 3.0)})
    world = world_figures(sent, ["rank 3: no answer in 30 s"], world_size=4)
    assert world["missing"] == ["rank 3: no answer in 30 s"]
    (finding,) = world_findings(world)
    assert finding.id == "ranks-missing"
    assert finding.message == "rank 3: no answer in 30 s; the world table has 3 of 4 ranks"


def test_more_than_16_ranks_are_summarised_slowest_fastest_p50_p90() -> None:
    own = {r: (1.0, 3.0 + 0.1 * r) for r in range(32)}
    own[21] = (40.0, 3.0)
    world = world_figures(payloads(own, nodes={r: r // 8 for r in range(32)}))
    assert world["straggler"]["rank"] == 21
    assert world["straggler"]["node"] == 2
    headers, rows = display_table(world)
    labels = [row[0] for row in rows]
    assert labels[0] == "21"  # the slowest first
    assert len(labels) == 4 + 4 + 3  # 4 slowest, 4 fastest, p50, p90, max/min
    assert labels[-3:] == ["p50", "p90", "max/min"]
    assert labels[4:8] == ["3", "2", "1", "0"]  # the fastest (least own time) last
    assert "slowest" in display_title(world)
    assert headers[:2] == ["rank", "node"]


def test_two_ranks_show_both_and_the_spread() -> None:
    world = world_figures(payloads({0: (2.5, 3.0), 1: (37.0, 3.0)}))
    headers, rows = display_table(world)
    assert [r[0] for r in rows] == ["0", "1", "max/min"]
    data = headers.index("data ms")
    assert rows[0][data] == "2.5"
    assert rows[1][data] == "37.0"
    assert rows[2][data] == "14.80x"
    assert rows[2][headers.index("waited ms")] == "-"  # the straggler waited for nobody


@pytest.mark.parametrize(
    ("medians", "named"),
    [
        ({0: 33.5, 1: 0.8}, True),  # rank 0 waited in most sampled steps: rank 1 is slow in each
        ({0: 1.1, 1: 0.8}, False),  # the means come from a few long stalls of rank 1
        (None, True),  # not measured: the means decide
    ],
    ids=["typical", "stalls", "unmeasured"],
)
def test_the_straggler_needs_the_others_to_wait_in_the_typical_step_where_measured(
    medians: dict[int, float] | None, named: bool
) -> None:
    # The same per-batch means each time: rank 1's own time 40 ms against 5.5 ms.
    figures = {r: {"comm_wait_median_ms": m} for r, m in (medians or {}).items()}
    world = world_figures(payloads({0: (2.5, 3.0), 1: (37.0, 3.0)}, figures=figures))
    assert (world["straggler"] is not None) == named
    assert ("straggler" in [f.id for f in world_findings(world)]) == named


def test_a_rank_that_waited_for_the_straggler_is_bound_by_it_not_by_its_model() -> None:
    # Rank 0 alone reads model-bound: its wait for rank 1's loader is inside its step.
    verdicts = {
        0: {"verdict": "model-bound: the model consumes 191 samples/s", "bound": "model"},
        1: {"verdict": "data-bound: the loader delivers 231 samples/s", "bound": "data"},
    }
    world = world_figures(payloads({0: (0.8, 7.6), 1: (35.2, 6.0)}, figures=verdicts))
    assert world["straggler"]["rank"] == 1
    row0, row1 = world["ranks"]
    assert row0["bound"] == "rank 1"
    assert row0["verdict"].startswith("waiting for rank 1: 32.8 ms a step in the gradient")
    assert (row0["rank_bound"], row0["rank_verdict"]) == ("model", verdicts[0]["verdict"])
    assert (row1["bound"], row1["verdict"]) == ("data", verdicts[1]["verdict"])
    assert "rank_bound" not in row1
    headers, rows = display_table(world)
    assert [r[headers.index("bound")] for r in rows[:2]] == ["rank 1", "data"]


@pytest.mark.parametrize(
    ("epochs", "own"),
    [
        (None, {0: (2.5, 3.0), 1: (2.6, 3.1)}),  # alike: no straggler
        ([{0: (2.0, 3.0), 1: (30.0, 3.0)}, {0: (30.0, 3.0), 1: (2.0, 3.0)}], None),  # it moves
    ],
    ids=["alike", "moving"],
)
def test_without_one_straggler_each_rank_keeps_its_own_bound(
    epochs: list[dict[int, tuple[float, float]]] | None,
    own: dict[int, tuple[float, float]] | None,
) -> None:
    verdicts = {r: {"verdict": "model-bound: ...", "bound": "model"} for r in (0, 1)}
    world = world_figures(payloads(own, epochs=epochs, figures=verdicts))
    assert [r["bound"] for r in world["ranks"]] == ["model", "model"]
    assert not any("rank_bound" in r for r in world["ranks"])


def test_epochs_dealt_uneven_batch_counts_are_an_imbalance_even_with_equal_totals() -> None:
    # A sampler that is not a DistributedSampler, cut by max_steps=64: 64 batches on each rank
    # in all, but epoch 0 gave rank 0 32 batches and rank 1 40 (found by benchmarks/world_zoo.py).
    from lightning_speedpack.world.engine import find_imbalance

    rows = [
        {"rank": 0, "samples": 512, "batches": 64, "batch_size_min": 8, "batch_size_max": 8},
        {"rank": 1, "samples": 512, "batches": 64, "batch_size_min": 8, "batch_size_max": 8},
    ]
    epochs = {
        0: [[0, 32, 1.0, 0.1, 32, 0.2], [1, 32, 1.0, 0.1, 32, 0.2]],
        1: [[0, 40, 1.0, 0.1, 40, 0.2], [1, 24, 0.6, 0.1, 24, 0.1]],
    }
    found = find_imbalance(rows, epochs=epochs)
    assert found is not None
    assert found.uneven_epochs == {0: {0: 32, 1: 40}}
    assert find_imbalance(rows) is None  # by the totals alone there is none
    even = {
        0: [[0, 32, 1.0, 0.1, 32, 0.2], [1, 30, 1.0, 0.1, 30, 0.2]],
        1: [[0, 32, 1.0, 0.1, 32, 0.2], [1, 28, 0.6, 0.1, 28, 0.1]],
    }
    assert find_imbalance(rows, epochs=even) is None  # only the last (cut) epoch differs
