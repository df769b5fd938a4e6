"""BatchSizeTuner never forks a worker pool per trial and never waits for ever on a dead rank."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Trainer
from pytorch_lightning.demos.boring_classes import RandomDataset
from torch.utils.data import DataLoader
from torch.utils.data import dataloader as torch_dataloader

from lightning_speedpack import BatchSizeTuner
from tests.batch_size.test_callback import LimitedModel, _expected, _fit
from tests.helpers.ddp import run_ddp
from tests.helpers.models import quiet_trainer_kwargs

# The tuner's advice on these tiny datasets is asserted in test_caveats.py.
pytestmark = pytest.mark.filterwarnings("ignore::lightning_speedpack.batch_size.BatchSizeWarning")


class WorkerModel(LimitedModel):
    """LimitedModel whose loaders use worker processes; it keeps every loader it built."""

    def __init__(self, workers: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.workers = workers
        self.loaders: list[DataLoader[Any]] = []

    def train_dataloader(self) -> DataLoader[Any]:
        loader = DataLoader(
            RandomDataset(32, self.length),
            batch_size=self.batch_size,
            num_workers=self.workers,
            multiprocessing_context="fork" if self.workers else None,
        )
        self.loaders.append(loader)
        return loader

    def val_dataloader(self) -> DataLoader[Any]:
        return self.train_dataloader()


@pytest.mark.slow
def test_trials_start_no_worker_pool_and_choose_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools: list[bool] = []  # for each worker pool started: were the trials over?
    tuner: BatchSizeTuner | None = None
    original_init = torch_dataloader._MultiProcessingDataLoaderIter.__init__

    def counting_init(self: Any, loader: Any) -> None:
        assert tuner is not None
        pools.append(tuner.tuned)
        original_init(self, loader)

    monkeypatch.setattr(torch_dataloader._MultiProcessingDataLoaderIter, "__init__", counting_init)

    def run(workers: int) -> tuple[BatchSizeTuner, WorkerModel]:
        nonlocal tuner
        torch.manual_seed(3)
        model = WorkerModel(workers, limit=300, length=1024)
        tuner = BatchSizeTuner(verbose=False, steps_per_trial=2)
        _fit(model, tmp_path / str(workers), tuner, max_steps=2, limit_val_batches=1)
        return tuner, model

    with_tuner, with_workers = run(2)
    assert len(with_workers.loaders) > len(with_tuner.trials) > 3  # a loader per trial at least
    assert pools == [True, True]  # the fit's sanity-check and train loaders; none in trials
    assert all(loader.num_workers == 2 for loader in with_workers.loaders)  # put back

    pools.clear()
    plain_tuner, plain = run(0)
    assert pools == []
    assert [t[:2] for t in with_tuner.trials] == [t[:2] for t in plain_tuner.trials]
    assert with_tuner.batch_size == plain_tuner.batch_size == _expected(300)
    assert with_workers.train_sizes == plain.train_sizes == [with_tuner.batch_size] * 2
    final, plain_final = with_workers.state_dict(), plain.state_dict()
    assert all(torch.equal(final[k], plain_final[k]) for k in final)  # bit for bit


def test_collective_timeout_is_checked_at_construction() -> None:
    with pytest.raises(TypeError, match="`collective_timeout` must be a number of seconds"):
        BatchSizeTuner(collective_timeout="60")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="got -1"):
        BatchSizeTuner(collective_timeout=-1)
    assert BatchSizeTuner(collective_timeout=60).collective_timeout == 60


def _ddp_rank_stuck(tmp: str) -> str:
    rank = int(os.environ["RANK"])
    done = Path(tmp, "rank0-done")

    class StuckOnRank1(LimitedModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if rank == 1 and batch.shape[0] == 16:  # trial 2: stuck (a deadlocked fork, say)
                deadline = time.monotonic() + 60
                while not done.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                raise KeyError("rank 1 was stuck")
            return super().training_step(batch, batch_idx)

    trainer = Trainer(
        callbacks=[BatchSizeTuner(verbose=False, collective_timeout=2)],
        **quiet_trainer_kwargs(tmp, devices=2, strategy="ddp", max_steps=2, limit_val_batches=0),
    )
    try:
        trainer.fit(StuckOnRank1())
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    finally:
        if rank == 0:
            done.touch()
    return "no error"


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_ddp_a_stuck_rank_fails_the_agreement_with_a_clear_error(tmp_path: Path) -> None:
    rank0, rank1 = run_ddp(_ddp_rank_stuck, str(tmp_path), timeout=200)
    assert rank0 == (
        "CollectiveTimeoutError: BatchSizeTuner: rank agreement for batch size 16 (trial 2) did "
        "not complete within 2 s: another rank died or is stuck (set "
        "LIGHTNING_SPEEDPACK_COLLECTIVE_TIMEOUT to wait longer)"
    )
    assert rank1 == "KeyError: 'rank 1 was stuck'"  # its own error, not a timeout
