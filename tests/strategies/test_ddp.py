"""The ``ddp_speedpack`` strategy: registered once, usable by name, same numbers as plain DDP."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pytorch_lightning import Callback, LightningModule, Trainer, seed_everything
from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    bf16_compress_hook,
    fp16_compress_hook,
)

import lightning_speedpack
from lightning_speedpack import DDPSpeedpackStrategy
from lightning_speedpack.strategies.ddp import available_cpu_cores, cpu_threads_per_rank
from tests.helpers.ddp import run_ddp
from tests.helpers.models import SizedBoringModel, quiet_trainer_kwargs


def test_import_registers_both_names_once() -> None:
    assert lightning_speedpack.DDPSpeedpackStrategy is DDPSpeedpackStrategy
    for name, start_method in (("ddp_speedpack", "popen"), ("ddp_speedpack_spawn", "spawn")):
        entry = dict.get(StrategyRegistry, name)
        assert entry is not None, name
        assert entry["strategy"] is DDPSpeedpackStrategy
        assert entry["init_params"] == {"start_method": start_method}
    before = {k: dict(v) for k, v in StrategyRegistry.items()}
    DDPSpeedpackStrategy.register_strategies(StrategyRegistry)  # idempotent
    assert {k: dict(v) for k, v in StrategyRegistry.items()} == before


def test_someone_elses_registration_is_not_overwritten() -> None:
    registry = type(StrategyRegistry)()
    registry.register("ddp_speedpack", DDPStrategy, description="theirs")
    DDPSpeedpackStrategy.register_strategies(registry)
    assert registry["ddp_speedpack"]["strategy"] is DDPStrategy
    assert registry["ddp_speedpack_spawn"]["strategy"] is DDPSpeedpackStrategy


def test_usable_by_name_with_its_defaults() -> None:
    trainer = Trainer(strategy="ddp_speedpack", accelerator="cpu", devices=2, logger=False)
    strategy = trainer.strategy
    assert type(strategy) is DDPSpeedpackStrategy
    assert strategy.ddp_kwargs == {"gradient_as_bucket_view": True, "find_unused_parameters": False}
    assert strategy.ddp_comm_hook is bf16_compress_hook  # registered by Lightning on CUDA only
    assert strategy._start_method == "popen"
    spawn = Trainer(strategy="ddp_speedpack_spawn", accelerator="cpu", devices=2, logger=False)
    assert type(spawn.strategy) is DDPSpeedpackStrategy
    assert spawn.strategy._start_method == "spawn"


def test_choices_can_be_overridden() -> None:
    assert DDPSpeedpackStrategy(compress_gradients=False).ddp_comm_hook is None
    own = DDPSpeedpackStrategy(ddp_comm_hook=fp16_compress_hook)
    assert own.ddp_comm_hook is fp16_compress_hook
    strategy = DDPSpeedpackStrategy(find_unused_parameters=True, gradient_as_bucket_view=False)
    assert strategy.ddp_kwargs == {"gradient_as_bucket_view": False, "find_unused_parameters": True}


def test_cpu_threads_per_rank() -> None:
    assert [cpu_threads_per_rank(c, w) for c, w in ((16, 4), (2, 2), (2, 4), (7, 2))] == [
        4,
        1,
        1,
        3,
    ]
    assert available_cpu_cores() >= 1


@pytest.fixture
def restore_threads() -> Any:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_cpu_threads_are_shared_and_restored(
    monkeypatch: pytest.MonkeyPatch, restore_threads: None
) -> None:
    # Only this class's own part: the process group and DDP wrapping are not needed for it.
    monkeypatch.setattr(DDPStrategy, "setup_environment", lambda self: None)
    monkeypatch.setattr(DDPStrategy, "teardown", lambda self: None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    strategy = DDPSpeedpackStrategy(parallel_devices=[torch.device("cpu")] * 4)
    torch.set_num_threads(5)
    strategy.setup_environment()
    assert torch.get_num_threads() == cpu_threads_per_rank(available_cpu_cores(), 4)
    strategy.teardown()
    assert torch.get_num_threads() == 5

    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice wins
    preset = DDPSpeedpackStrategy(parallel_devices=[torch.device("cpu")] * 4)
    preset.setup_environment()
    assert torch.get_num_threads() == 5
    monkeypatch.delenv("OMP_NUM_THREADS")
    off = DDPSpeedpackStrategy(parallel_devices=[torch.device("cpu")] * 4, limit_cpu_threads=False)
    off.setup_environment()
    assert torch.get_num_threads() == 5


# --- real 2-rank runs ---------------------------------------------------------------------------


class GradRecorder(Callback):
    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []
        self.threads: list[int] = []

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.threads.append(torch.get_num_threads())
        self.grads.append(
            {
                n: p.grad.detach().clone()
                for n, p in pl_module.named_parameters()
                if p.grad is not None
            }
        )


def _train(tmp: str, strategy: str) -> dict[str, Any]:
    os.environ.pop("OMP_NUM_THREADS", None)
    torch.set_num_threads(3)  # what the rank had before: restored at teardown
    seed_everything(0)
    model = SizedBoringModel(batch_size=8, length=64)
    recorder = GradRecorder()
    trainer = Trainer(
        callbacks=[recorder],
        **quiet_trainer_kwargs(tmp, devices=2, strategy=strategy, max_steps=3),
    )
    trainer.fit(model)
    return {
        "strategy": type(trainer.strategy).__name__,
        # numpy arrays travel back by value (torch tensors would go through shared memory)
        "params": {k: v.numpy().copy() for k, v in model.state_dict().items()},
        "grads": [{k: g.numpy() for k, g in step.items()} for step in recorder.grads],
        "threads_in_fit": recorder.threads,
        "threads_after": torch.get_num_threads(),
    }


@pytest.mark.ddp
@pytest.mark.timeout(300)
def test_same_gradients_and_parameters_as_plain_ddp(tmp_path: Path) -> None:
    ours = run_ddp(_train, str(tmp_path / "ours"), "ddp_speedpack", timeout=200)
    plain = run_ddp(_train, str(tmp_path / "plain"), "ddp", timeout=200)
    expected_threads = cpu_threads_per_rank(available_cpu_cores(), 2)
    for rank in (0, 1):
        a, b = ours[rank], plain[rank]
        assert (a["strategy"], b["strategy"]) == ("DDPSpeedpackStrategy", "DDPStrategy")
        assert len(a["grads"]) == len(b["grads"]) == 3
        for ga, gb in zip(a["grads"], b["grads"], strict=True):
            assert ga.keys() == gb.keys()
            assert all(np.array_equal(ga[k], gb[k]) for k in ga), rank  # bit-identical
        assert all(np.array_equal(a["params"][k], b["params"][k]) for k in a["params"])
        # both share the cores between the ranks (Lightning's launcher does it for plain ddp)
        assert a["threads_in_fit"] == b["threads_in_fit"] == [expected_threads] * 3
        assert a["threads_after"] == b["threads_after"]
    # and the two ranks agree with each other (DDP kept the replicas in sync)
    assert all(
        np.array_equal(ours[0]["params"][k], ours[1]["params"][k]) for k in ours[0]["params"]
    )
