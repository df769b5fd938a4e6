"""CommMonitor on one process: arguments, what it says without DDP, and its wiring to DDP's API.

The wiring is checked against a stand-in for DDP's prototype logging API (one process has no
gradient all-reduce to read); tests/comm/test_ddp.py runs the real thing on 2 ranks.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Trainer

from lightning_speedpack.comm import CommMonitor, ddp_stats
from lightning_speedpack.comm import callback as comm_callback
from lightning_speedpack.core.registry import registered_diagnostics
from tests.helpers.models import SizedBoringModel, quiet_trainer_kwargs


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"ddp_sample_rate": 0}, ValueError, "`ddp_sample_rate` must be a positive int, got 0"),
        ({"ddp_sample_rate": 2.5}, TypeError, "`ddp_sample_rate` must be an int or None, got 2.5"),
        ({"ddp_sample_rate": True}, TypeError, "`ddp_sample_rate` must be an int or None"),
        ({"watch_sync_dist": 1}, TypeError, "`watch_sync_dist` must be a bool, got 1"),
    ],
)
def test_arguments_are_checked_at_construction(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        CommMonitor(**kwargs)


def test_registered_with_the_doctor_as_comm() -> None:
    [diagnostic] = [d for d in registered_diagnostics() if d.name == "comm"]
    assert diagnostic.callback_type is CommMonitor
    assert not diagnostic.deep


def test_one_process_says_why_nothing_is_measured_and_finds_nothing(tmp_path: Path) -> None:
    monitor = CommMonitor()
    model = SizedBoringModel()
    Trainer(callbacks=[monitor], **quiet_trainer_kwargs(tmp_path, max_steps=4)).fit(model)
    figures = monitor.doctor_figures()
    assert figures["comm_not_measured"] == "one process: no gradient all-reduce"
    assert set(figures) == {"comm_not_measured", "step_ms"}
    assert figures["step_ms"] > 0
    assert monitor.doctor_findings() == []
    assert "log" not in vars(model)  # nothing wrapped on one process
    copy.deepcopy(pickle.loads(pickle.dumps(monitor)))


class FakeDDP(torch.nn.Module):
    """DDP's prototype logging API over a module: logs iteration N at the forward of N + 1."""

    def __init__(self, module: torch.nn.Module, find_unused: bool = True) -> None:
        super().__init__()
        self.module = module
        self.find_unused_parameters = find_unused
        self.static_graph = False
        self.rate = ddp_stats.DDP_DEFAULT_SAMPLE_RATE
        self.rates: list[int] = []
        self.iteration = 0  # DDP iterations so far (the model's training_step counts them)
        self.reads = 0
        self.seen = self.logged = 0  # iterations looked at; the last one logged

    def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
        self._catch_up()  # what was logged under the old rate stays logged
        self.rate = rate
        self.rates.append(rate)

    def _catch_up(self) -> None:
        done = self.iteration - 1  # the current iteration is logged at the next forward
        for i in range(self.seen + 1, done + 1):
            if i <= 10 or i % self.rate == 0:
                self.logged = i
        self.seen = max(self.seen, done)

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        self.reads += 1
        self._catch_up()
        if not self.logged:
            return {"iteration": 0, "find_unused_parameters": int(self.find_unused_parameters)}
        i = self.logged
        return {
            "iteration": i,
            "find_unused_parameters": int(self.find_unused_parameters),
            "unused_parameter_size": 0,
            "forward_compute_time": 1_000_000 * i,
            "backward_compute_time": 2_000_000,
            "backward_comm_time": 3_000_000,
            "backward_compute_comm_overlap_time": 1_000_000,
        }


class CountsIterations(SizedBoringModel):
    def __init__(self, fake: list[FakeDDP]) -> None:
        super().__init__(length=8 * 25)  # 25 training batches
        self.fake = fake

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.fake[0].iteration += 1
        return super().training_step(batch, batch_idx)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> list[FakeDDP]:
    """DDP as the monitor finds it: one fake per test, made from the model it wraps."""
    made: list[FakeDDP] = []

    def find_ddp(model: Any) -> FakeDDP:
        if not made:
            made.append(FakeDDP(model))
        return made[0]

    monkeypatch.setattr(ddp_stats, "find_ddp", find_ddp)
    return made


def test_reads_ddps_samples_on_schedule_and_gives_the_rate_back(
    tmp_path: Path, fakes: list[FakeDDP]
) -> None:
    monitor = CommMonitor(ddp_sample_rate=5)
    model = CountsIterations(fakes)
    Trainer(callbacks=[monitor], **quiet_trainer_kwargs(tmp_path, limit_val_batches=0)).fit(model)
    [fake] = fakes
    assert fake.rates == [5, ddp_stats.DDP_DEFAULT_SAMPLE_RATE]  # set for the fit, then given back
    # one at the start (is the API there?), the due reads at batches 2..11, 16, 21 (iterations
    # 1..10, 15, 20), one at the end
    assert fake.reads == 1 + 10 + 2 + 1
    figures = monitor.doctor_figures()
    # iterations 2..10, 15, 20; iteration 1 is warm-up. Forward = iteration ms in the fake.
    assert figures["comm_samples"] == 11
    assert figures["forward_ms"] == pytest.approx((sum(range(2, 11)) + 15 + 20) / 11, abs=1e-4)
    assert figures["comm_ms_per_step"] == 3.0
    assert figures["comm_wait_ms"] == 2.0
    assert figures["overlap_fraction"] == pytest.approx(1 / 3, abs=1e-4)
    assert figures["backward_compute_ms"] == 2.0
    assert figures["comm_wait_fraction"] == pytest.approx(2.0 / figures["step_ms"], rel=1e-3)
    [finding] = monitor.doctor_findings()
    assert finding.id == "find-unused-parameters"
    assert "any of the 11 steps DDP sampled (of 25 training batches)" in finding.message


def test_enough_samples_give_ddp_its_own_rate_back_before_the_end(
    tmp_path: Path, fakes: list[FakeDDP], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long fit stops paying for one sampled iteration in `ddp_sample_rate` once the monitor
    # holds SAMPLES_ENOUGH (30; 11 here, for a 25-batch fit): iterations 1..10 and 15.
    monkeypatch.setattr(comm_callback, "SAMPLES_ENOUGH", 11)
    monitor = CommMonitor(ddp_sample_rate=5)
    Trainer(callbacks=[monitor], **quiet_trainer_kwargs(tmp_path, limit_val_batches=0)).fit(
        CountsIterations(fakes)
    )
    [fake] = fakes
    default = ddp_stats.DDP_DEFAULT_SAMPLE_RATE
    assert fake.rates == [5, default, default]  # at the 11th sample, and again at the end
    assert fake.reads == 1 + 10 + 1 + 1  # no read due at iteration 20 any more
    assert monitor.doctor_figures()["comm_samples"] == 10  # iterations 2..10, 15


def test_with_no_sample_rate_ddps_own_setting_is_left_alone(
    tmp_path: Path, fakes: list[FakeDDP]
) -> None:
    monitor = CommMonitor(ddp_sample_rate=None)
    Trainer(callbacks=[monitor], **quiet_trainer_kwargs(tmp_path, limit_val_batches=0)).fit(
        CountsIterations(fakes)
    )
    assert fakes[0].rates == []
    assert monitor.doctor_figures()["comm_samples"] == 9  # iterations 2..10 of 25


class AccumulatesTwo(CountsIterations):
    """With accumulate_grad_batches=2, only every second batch's forward syncs under DDP."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx % 2 == 1:
            self.fake[0].iteration += 1
        return SizedBoringModel.training_step(self, batch, batch_idx)


def test_with_gradient_accumulation_ddp_iterations_are_windows_of_batches(
    tmp_path: Path, fakes: list[FakeDDP]
) -> None:
    monitor = CommMonitor(ddp_sample_rate=5)
    trainer = Trainer(
        callbacks=[monitor],
        accumulate_grad_batches=2,
        **quiet_trainer_kwargs(tmp_path, limit_val_batches=0, limit_train_batches=24),
    )
    trainer.fit(AccumulatesTwo(fakes))
    # 12 iterations: iteration N is read at batch 2 (N + 1); 1..10 sampled, 11 is not
    assert fakes[0].reads == 1 + 10 + 1
    figures = monitor.doctor_figures()
    assert figures["comm_samples"] == 9  # iterations 2..10
    # one 2 ms wait per iteration, i.e. per two batches
    assert figures["comm_wait_fraction"] == pytest.approx(1.0 / figures["step_ms"], rel=1e-3)
