"""The test harness itself: real DDP ranks and W&B read back from the run's own files."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytorch_lightning import Trainer
from pytorch_lightning.loggers import WandbLogger

from tests.helpers.ddp import DDPRunError, run_ddp
from tests.helpers.models import SizedBoringModel, quiet_trainer_kwargs


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


def test_run_ddp_reports_a_rank_failure(tmp_path: Path) -> None:
    with pytest.raises(DDPRunError, match="rank failure is reported"):
        run_ddp(_raises, str(tmp_path))


def test_run_ddp_times_out_instead_of_hanging(tmp_path: Path) -> None:
    with pytest.raises(DDPRunError, match="did not finish"):
        run_ddp(_hangs, str(tmp_path), timeout=3)


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
