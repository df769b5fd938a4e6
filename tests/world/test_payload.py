"""What a rank sends: its clock, its identity, its figures in plain scalars."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_speedpack.core.collectives import ENV_TIMEOUT
from lightning_speedpack.world.payload import (
    GATHER_TIMEOUT_S,
    StepClock,
    gather_timeout,
    gather_world,
    node_identity,
    scalar_figures,
)


def test_the_clock_leaves_out_validation_and_the_first_gap_of_an_epoch() -> None:
    clock = StepClock()
    for epoch, t0 in ((0, 0.0), (1, 10.0)):
        clock.epoch_start(epoch)
        for i in range(3):
            t = t0 + 0.1 * i
            if i == 2:  # validation ran between batches 1 and 2 for 5 s
                clock.pause(t - 0.06)
                clock.resume(t - 0.06 + 5.0)
                t += 5.0
            clock.batch_start(t)
            clock.backward_start(t + 0.02)
            clock.backward_end(t + 0.05)
            clock.batch_end(t + 0.06, 4 if i < 2 else 2)
        clock.epoch_end()
    figures = clock.figures()
    assert figures["batches"] == 6
    assert figures["span_ms"] == pytest.approx(60.0)
    assert figures["gap_ms"] == pytest.approx(40.0)  # 0.1 s apart, 60 ms inside each batch
    assert figures["backward_ms"] == pytest.approx(30.0)
    assert (figures["batch_size_min"], figures["batch_size_max"]) == (2, 4)
    assert [row[:2] for row in figures["epochs"]] == [[0, 3], [1, 3]]
    assert figures["epochs"][0][4] == 2  # two gaps in an epoch of three batches


def test_each_epoch_keeps_its_wait_for_a_cpu() -> None:
    waited = iter([1.0, 1.25, 2.0, 2.0])  # the thread's run-queue delay so far, as read
    clock = StepClock(cpu_wait=lambda: next(waited))
    for epoch in (0, 1):
        clock.epoch_start(epoch)
        clock.batch_start(0.0)
        clock.batch_end(0.01, 4)
        clock.epoch_end()
    assert [row[6] for row in clock.figures()["epochs"]] == [0.25, 0.0]


def test_an_epoch_whose_wait_for_a_cpu_is_not_known_says_none() -> None:
    clock = StepClock(cpu_wait=lambda: None)  # not Linux, or no scheduler statistics
    clock.epoch_start(0)
    clock.batch_start(0.0)
    clock.batch_end(0.01, 4)
    clock.epoch_end()
    assert clock.figures()["epochs"][0][6] is None


def test_scalar_figures_flatten_and_drop_what_is_not_a_plain_scalar() -> None:
    figures = {
        "samples_per_sec": np.float64(10.5),
        "batches": np.int64(3),
        "verdict": "data-bound",
        "table": "x" * 1000,
        "series": [[1, 2.0]],
        "tensor": torch.ones(1),
        "nan": float("nan"),
        "wall_time": {"parts": {"setup": 1.0}, "callbacks": {"A": 0.5}},
    }
    assert scalar_figures(figures) == {
        "samples_per_sec": 10.5,
        "batches": 3,
        "verdict": "data-bound",
        "nan": None,
        "wall_time/parts/setup": 1.0,
        "wall_time/callbacks/A": 0.5,
    }


@pytest.mark.parametrize(
    ("env", "node", "local"),
    [
        ({"GROUP_RANK": "1", "NODE_RANK": "0", "LOCAL_RANK": "3"}, 1, 3),  # torchrun
        ({"SLURM_NODEID": "2", "SLURM_LOCALID": "1"}, 2, 1),  # srun
        ({"NODE_RANK": "4", "LOCAL_RANK": "0"}, 4, 0),  # Lightning
        ({}, None, None),
    ],
)
def test_the_node_comes_from_the_launchers_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], node: int | None, local: int | None
) -> None:
    for name in ("GROUP_RANK", "SLURM_NODEID", "NODE_RANK", "LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    identity = node_identity()
    assert (identity["node"], identity["local_rank"]) == (node, local)
    assert isinstance(identity["host"], str)
    assert identity["host"]


def test_one_rank_gathers_its_own_payload_and_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TIMEOUT, raising=False)
    assert gather_timeout() == GATHER_TIMEOUT_S == 30.0
    monkeypatch.setenv(ENV_TIMEOUT, "90")
    assert gather_timeout() == 90.0  # the user's setting wins
    world = gather_world({"rank": 0, "samples": 4})
    assert world is not None
    assert world.payloads == {0: {"rank": 0, "samples": 4}}
    assert world.missing == []
