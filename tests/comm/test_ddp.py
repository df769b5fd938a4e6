"""CommMonitor on real 2-process DDP (gloo, CPU): the planted cases and a clean job.

Four fits in all: sync_dist every step together with a needless ``find_unused_parameters=True``;
a clean job; a job with an unused layer; a GAN-like step optimized by hand.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import LightningModule, Trainer
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedpack.comm import CommMonitor
from tests.helpers.ddp import run_ddp
from tests.helpers.models import quiet_trainer_kwargs

pytestmark = [pytest.mark.ddp, pytest.mark.timeout(240)]

STEPS = 24  # DDP samples iterations 1..10 and 20 at the monitor's rate of 10


class MLP(LightningModule):
    """About a millisecond a step on a CPU; optionally logs 6 values with sync_dist."""

    def __init__(self, sync: bool = False, unused_layer: bool = False) -> None:
        super().__init__()
        self.sync = sync
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
        )
        if unused_layer:
            self.unused = torch.nn.Linear(16, 16)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        if self.sync:
            values = (loss, logits.mean(), logits.std(), logits.max(), logits.min(), loss * 2)
            for i, value in enumerate(values):
                self.log(f"v{i}", value, sync_dist=True)  # SYNC LINE
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[Any]:
        g = torch.Generator().manual_seed(0)
        n = STEPS * 8 * 2  # 2 ranks, batch 8
        data = TensorDataset(
            torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
        )
        return DataLoader(data, batch_size=8)


class TwoParts(MLP):
    """A GAN's shape: one backward for the net, then one for a critic of its detached output."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.critic = torch.nn.Linear(10, 1)

    def training_step(self, batch: Any, batch_idx: int) -> None:  # type: ignore[override]
        x, y = batch
        net_opt, critic_opt = self.optimizers()  # type: ignore[attr-defined,misc]
        loss = torch.nn.functional.cross_entropy(self(x), y)
        net_opt.zero_grad()
        self.manual_backward(loss)
        net_opt.step()
        critic_loss = self.critic(self(x).detach()).pow(2).mean()
        critic_opt.zero_grad()
        self.manual_backward(critic_loss)
        critic_opt.step()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out

    def configure_optimizers(self) -> Any:
        return (
            torch.optim.SGD(self.net.parameters(), lr=0.01),
            torch.optim.SGD(self.critic.parameters(), lr=0.01),
        )


SYNC_LINE = next(
    i
    for i, line in enumerate(inspect.getsource(inspect.getmodule(MLP)).splitlines(), start=1)  # type: ignore[arg-type]
    if line.endswith("# SYNC LINE")
)


def _fit(
    tmp: str, sync: bool, find_unused: bool, unused_layer: bool, two_parts: bool = False
) -> dict[str, Any]:
    monitor = CommMonitor()
    strategy = DDPStrategy(find_unused_parameters=find_unused)
    trainer = Trainer(
        callbacks=[monitor],
        **quiet_trainer_kwargs(tmp, devices=2, strategy=strategy, max_steps=STEPS),
    )
    model = TwoParts() if two_parts else MLP(sync=sync, unused_layer=unused_layer)
    trainer.fit(model)
    return {
        "rank": trainer.global_rank,
        "figures": monitor.doctor_figures(),
        "findings": [
            (f.id, f.severity, f.location, f.message, f.figures) for f in monitor.doctor_findings()
        ],
        "wrapped": sorted(k for k in ("log", "log_dict") if k in vars(model)),
    }


def _planted(findings: list[Any]) -> list[Any]:
    """The findings but ``comm-bound``, which these fits' timing decides and not their code.

    Two gloo ranks beside other tests on CI's 2-core machine can wait for each other to be
    scheduled in the all-reduce: stop 50's CI read a ``comm-bound`` beside the unused layer.
    ``comm-bound`` is tested on given figures (``test_comm_bound.py``) and on the DDP zoo
    (``benchmarks/world_zoo.py``, 0 false warnings on its clean jobs in ``make bench-check``).
    """
    return [f for f in findings if f[0] != "comm-bound"]


def test_sync_dist_every_step_and_a_needless_unused_parameter_search(tmp_path: Path) -> None:
    ranks = run_ddp(
        _fit, str(tmp_path), sync=True, find_unused=True, unused_layer=False, timeout=200
    )
    for result in ranks:
        ids = {f[0]: f for f in _planted(result["findings"])}
        assert set(ids) == {"sync-dist-every-step", "find-unused-parameters"}
        _, severity, location, message, figures = ids["sync-dist-every-step"]
        assert severity == "warning"
        assert location == f"tests/comm/test_ddp.py:{SYNC_LINE}"
        assert message.startswith(
            '`self.log(f"v{i}", value, sync_dist=True)  # SYNC LINE` reduces 6 values across '
            f"the 2 ranks in {STEPS} of {STEPS} training steps"
        )
        assert figures["values_per_step"] == 6.0
        assert figures["sync_ms_per_step"] > 0
        _, severity, _, message, figures = ids["find-unused-parameters"]
        assert severity == "warning"
        assert figures["sampled_steps"] == 10  # iterations 2..10 and 20
        assert figures["unused_parameter_bytes"] == 0
        assert result["figures"]["sync_dist_values_per_step"] == 6.0
        assert result["wrapped"] == []  # the module's log methods are its own again


def test_a_clean_ddp_job_has_its_comm_measured_and_no_finding(tmp_path: Path) -> None:
    ranks = run_ddp(
        _fit, str(tmp_path), sync=False, find_unused=False, unused_layer=False, timeout=200
    )
    for result in ranks:
        assert _planted(result["findings"]) == []
        figures = result["figures"]
        assert figures["comm_samples"] == 10
        assert figures["sync_dist_values_per_step"] == 0.0
        for key in ("comm_wait_fraction", "comm_ms_per_step", "backward_compute_ms", "forward_ms"):
            assert figures[key] > 0, key
        assert 0.0 <= figures["overlap_fraction"] <= 1.0
        assert figures["comm_wait_ms"] <= figures["comm_ms_per_step"]
        assert "comm_not_measured" not in figures


def test_an_unused_layer_is_named(tmp_path: Path) -> None:
    ranks = run_ddp(
        _fit, str(tmp_path), sync=False, find_unused=True, unused_layer=True, timeout=200
    )
    for result in ranks:
        [(fid, severity, location, message, figures)] = _planted(result["findings"])
        assert (fid, severity, location) == ("find-unused-parameters", "info", "unused")
        assert figures["unused_parameter_bytes"] == (16 * 16 + 16) * 4
        assert figures["steps_with_unused"] == figures["sampled_steps"] == 10
        assert "(2 tensors without a gradient after the last step: unused.weight, unused.bias)" in (
            message
        )


def test_a_step_with_a_backward_per_part_is_told_the_search_is_needed(tmp_path: Path) -> None:
    # Every layer is used, each in its own backward: none is to be removed, as the message for
    # an unused layer (and its list of every parameter, read after the critic's backward) said.
    ranks = run_ddp(
        _fit,
        str(tmp_path),
        sync=False,
        find_unused=True,
        unused_layer=False,
        two_parts=True,
        timeout=200,
    )
    for result in ranks:
        [(fid, severity, location, message, figures)] = _planted(result["findings"])
        assert (fid, severity, location) == ("find-unused-parameters", "info", "training_step")
        assert figures["manual_optimization"] is True
        assert figures["unused_parameter_bytes"] > 0
        assert "`automatic_optimization=False`" in message
        assert "is needed for that" in message
        assert "tensors without a gradient" not in message
