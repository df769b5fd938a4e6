"""ThroughputLogger's world combine: a rank that is stuck fails the others, naming the step."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pytorch_lightning import Callback, Trainer
from pytorch_lightning.strategies import DDPStrategy

from lightning_speedpack import ThroughputLogger
from tests.helpers.ddp import run_ddp
from tests.helpers.models import SizedBoringModel, quiet_trainer_kwargs


class StuckOnRank1(Callback):
    """On rank 1, after step 2's backward (so past DDP's own gradient all-reduce), wait for
    rank 0 to finish, as a rank stuck in a deadlocked fork would; then give up."""

    def __init__(self, done: Path) -> None:
        self.done = done

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_rank == 1 and trainer.global_step == 2:
            deadline = time.monotonic() + 60
            while not self.done.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise RuntimeError("rank 1 gave up")


def _ddp_fit_stuck(tmp: str) -> str:
    done = Path(tmp, "rank0-done")
    rank = int(os.environ["RANK"])
    trainer = Trainer(
        # the stuck callback runs before ThroughputLogger's combine in the same hook
        callbacks=[StuckOnRank1(done), ThroughputLogger(log_every_n_steps=2, gpu_stats=False)],
        use_distributed_sampler=False,
        **quiet_trainer_kwargs(
            tmp,
            devices=2,
            strategy=DDPStrategy(timeout=timedelta(seconds=60)),
            max_steps=4,
            limit_val_batches=0,
        ),
    )
    try:
        trainer.fit(SizedBoringModel(batch_size=4))
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    finally:
        if rank == 0:
            done.touch()
    return "no error"


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_ddp_a_stuck_rank_fails_the_world_combine_with_a_clear_error(tmp_path: Path) -> None:
    rank0, rank1 = run_ddp(
        _ddp_fit_stuck,
        str(tmp_path),
        timeout=200,
        env={"LIGHTNING_SPEEDPACK_COLLECTIVE_TIMEOUT": "2"},
    )
    assert rank0 == (
        "CollectiveTimeoutError: ThroughputLogger: world samples/s combine at step 2 did not "
        "complete within 2 s: another rank died or is stuck (set "
        "LIGHTNING_SPEEDPACK_COLLECTIVE_TIMEOUT to wait longer)"
    )
    assert rank1 == "RuntimeError: rank 1 gave up"
