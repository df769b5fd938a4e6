"""The test harness itself: real DDP ranks, processes that cannot outlive a test, and W&B read
back from the run's own files."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from pytorch_lightning import Trainer
from pytorch_lightning.loggers import WandbLogger

from tests.helpers.ddp import DDPRunError, DDPTimeout, run_ddp
from tests.helpers.models import SizedBoringModel, quiet_trainer_kwargs
from tests.helpers.procs import ProcessTimeout, own_children, reap_children, run_in_session

# A child that forks two grandchildren -- one stays in the session, one leaves it with setsid
# (as torchrun's ranks do) -- prints their pids, and all three sleep forever.
FAMILY = textwrap.dedent(
    """
    import os, sys, time

    def hung_grandchild():
        while True:
            time.sleep(0.5)

    def hung_escaped_grandchild():
        while True:
            time.sleep(0.5)

    def hung_child():
        while True:
            time.sleep(0.5)

    first = os.fork()
    if first == 0:
        hung_grandchild()
    second = os.fork()
    if second == 0:
        os.setsid()
        hung_escaped_grandchild()
    print(os.getpid(), first, second, flush=True)
    hung_child()
    """
)


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def _rank_world(tmp: str) -> tuple[int, int, float]:
    trainer = Trainer(**quiet_trainer_kwargs(tmp, devices=2, strategy="ddp", max_steps=2))
    model = SizedBoringModel()
    trainer.fit(model)
    weight = model.layer.weight.detach().sum().item()
    return trainer.global_rank, trainer.world_size, weight


def _raises(tmp: str) -> None:
    raise ValueError("rank failure is reported")


def _hangs(tmp: str) -> None:
    import time

    time.sleep(60)


@pytest.mark.ddp
def test_run_ddp_runs_real_ranks_that_agree(tmp_path: Path) -> None:
    results = run_ddp(_rank_world, str(tmp_path))
    assert [r[:2] for r in results] == [(0, 2), (1, 2)]
    assert results[0][2] == pytest.approx(results[1][2])  # DDP kept the replicas in sync


@pytest.mark.slow
def test_run_ddp_reports_a_rank_failure(tmp_path: Path) -> None:
    with pytest.raises(DDPRunError, match="rank failure is reported"):
        run_ddp(_raises, str(tmp_path))


@pytest.mark.slow
def test_run_ddp_times_out_with_every_rank_stack_and_kills_the_ranks(tmp_path: Path) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(DDPRunError, match="did not finish") as info:
        run_ddp(_hangs, str(tmp_path), timeout=8)
    assert isinstance(info.value, DDPTimeout)
    # Both ranks' stacks (where they are depends on the load: importing, or sleeping in _hangs).
    assert info.value.stacks.count("spawn_main (multiprocessing/spawn.py") == 2, info.value.stacks
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert _alive([p.pid for p in left if "resource_tracker" not in " ".join(p.cmdline())]) == []


@pytest.mark.slow
def test_a_hung_command_is_killed_with_its_grandchildren_and_their_stacks_reported(
    tmp_path: Path,
) -> None:
    with pytest.raises(ProcessTimeout) as info:
        run_in_session([sys.executable, "-c", FAMILY], timeout=10, cwd=tmp_path)
    message = str(info.value)
    pids = [int(x) for x in info.value.stdout.split()]
    assert len(pids) == 3, info.value.stdout
    for function in (
        "hung_child",
        "hung_grandchild",
        "hung_escaped_grandchild",
    ):
        assert f"{function} (<string>" in message  # py-spy's "function (file:line)"
    assert all(f"pid {pid} " in message for pid in pids)
    assert _alive(pids) == []


@pytest.mark.slow
def test_what_a_finished_command_leaves_running_is_killed_and_listed(tmp_path: Path) -> None:
    script = FAMILY.rsplit("hung_child()", 1)[0] + "sys.exit(3)\n"
    proc = run_in_session([sys.executable, "-c", script], timeout=60, cwd=tmp_path, grace=1)
    assert proc.returncode == 3
    pids = [int(x) for x in proc.stdout.split()]
    assert len(proc.leftovers) == 2  # both grandchildren, the escaped one too
    assert {int(line.split()[1]) for line in proc.leftovers} == set(pids[1:]), proc.leftovers
    assert _alive(pids) == []


def _stray_worker_sleeping() -> None:
    import time

    time.sleep(600)


def test_a_process_a_test_leaves_behind_is_reported_with_its_stack_and_killed() -> None:
    # What the autouse fixture in conftest.py does after every test.
    import multiprocessing as mp

    before = set(own_children())
    stray = mp.get_context("fork").Process(target=_stray_worker_sleeping, daemon=False)
    stray.start()
    report = reap_children(before, grace=0.5)
    assert _alive([stray.pid]) == []  # killed and reaped, not orphaned
    assert f"pid {stray.pid} " in report
    assert "_stray_worker_sleeping (" in report  # its stack, as py-spy printed it
    assert reap_children(before, grace=0.1) == ""  # nothing left the second time


def test_wandb_reader_reads_the_run_files(wandb_offline, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    logger = WandbLogger(project="harness", save_dir=str(wandb_offline.dir))
    logger.experiment.define_metric("custom/*", step_metric="trainer/global_step")
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"custom/value": 1.5}, step=3)
    logger.experiment.summary["done"] = 7
    logger.experiment.finish()
    run = wandb_offline.only_run()
    assert run.values("custom/value") == [1.5]
    assert run.config["lr"] == 0.1
    assert run.summary["done"] == 7
    assert run.metrics["custom/*"]["step_metric"] == "trainer/global_step"
