"""The timing comm hook on real 2-process DDP (gloo, CPU), where DDP's statistics are missing.

Each rank deletes ``DistributedDataParallel._get_ddp_logging_data`` in its own (spawned)
process first: a stand-in for a torch without that private API. Lightning 2.6's
``DDPStrategy.teardown`` calls it too, so it is put back at the end of training, after the
monitor's ``on_train_end`` (a torch without it needs a Lightning that does not call it). Two
fits: no hook of the user's (the monitor's hook measures), and a hook the user registered (none
is added; the report says why).
"""

# No `from __future__ import annotations`: DDP checks a hook's annotations as objects.
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from pytorch_lightning import Callback, Trainer
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from lightning_speedpack.comm import CommMonitor
from lightning_speedpack.core.hook_hub import HookHub
from tests.comm.test_ddp import MLP, STEPS
from tests.helpers.ddp import run_ddp
from tests.helpers.models import quiet_trainer_kwargs

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(240)]


class Counted:
    """A user's comm hook state: how many buckets its hook all-reduced."""

    def __init__(self) -> None:
        self.calls = 0


def users_hook(state: Counted, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    state.calls += 1
    return allreduce_hook(None, bucket)  # type: ignore[arg-type]


class WithUsersHook(MLP):
    """Registers its own communication hook on the DDP wrapper, as a user would."""

    def on_fit_start(self) -> None:
        self.counted = Counted()
        self.trainer.strategy.model.register_comm_hook(self.counted, users_hook)


class PutBack(Callback):
    """Gives DDP its logging API back after the monitor's on_train_end, for Lightning's teardown."""

    def __init__(self, method: Any) -> None:
        self.method = method
        self.hooks: list[str] = []  # the names of the hooks on the DDP wrapper at the end

    def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
        DistributedDataParallel._get_ddp_logging_data = self.method  # type: ignore[method-assign]
        self.hooks = [hook.__name__ for hook, _ in trainer.strategy.model._comm_hooks]


def _fit(tmp: str, users: bool, hub: bool = False) -> dict[str, Any]:
    method = DistributedDataParallel._get_ddp_logging_data
    del DistributedDataParallel._get_ddp_logging_data  # this rank's process only (spawned)
    monitor, put_back = CommMonitor(), PutBack(method)
    trainer = Trainer(
        # under the doctor the monitor is a member of a hub that calls its hooks
        callbacks=[HookHub([monitor], owns=True) if hub else monitor, put_back],
        **quiet_trainer_kwargs(tmp, devices=2, strategy="ddp", max_steps=STEPS),
    )
    model = WithUsersHook() if users else MLP()
    trainer.fit(model)
    return {
        "figures": monitor.doctor_figures(),
        "findings": [f.id for f in monitor.doctor_findings()],
        "hooks": put_back.hooks,
        "user_calls": model.counted.calls if users else None,
    }


@pytest.mark.parametrize("hub", [False, True], ids=["alone", "under-a-hub"])
def test_without_ddp_statistics_a_timing_hook_measures_the_all_reduce(
    tmp_path: Path, hub: bool
) -> None:
    for result in run_ddp(_fit, str(tmp_path), users=False, hub=hub, timeout=200):
        figures = result["figures"]
        assert result["hooks"] == ["timed_allreduce"]  # one hook: the monitor's
        assert figures["comm_source"] == "a timing communication hook"
        assert "comm_not_measured" not in figures
        assert figures["comm_samples"] == 10  # iterations 2..10 and 20, as DDP samples them
        assert figures["comm_ms_per_step"] > 0
        assert 0 <= figures["comm_wait_ms"] <= figures["comm_ms_per_step"]
        assert 0 <= figures["comm_wait_fraction"] < 1
        assert 0 <= figures["comm_wait_least_ms"] <= figures["comm_wait_median_ms"]
        assert "forward_ms" not in figures  # the hook sees the buckets only
        assert "backward_compute_ms" not in figures


def test_a_users_hook_is_kept_alone_and_the_report_says_why(tmp_path: Path) -> None:
    for result in run_ddp(_fit, str(tmp_path), users=True, timeout=200):
        assert result["hooks"] == ["users_hook"]  # no second hook
        assert result["user_calls"] >= STEPS  # the user's hook did every all-reduce
        why = result["figures"]["comm_not_measured"]
        assert why.startswith("DDP's runtime statistics are unavailable")
        assert "the model has a communication hook of its own (users_hook): no second hook" in why
        assert "comm_wait_fraction" not in result["figures"]
        assert result["findings"] == []
