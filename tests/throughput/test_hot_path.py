"""The per-step path of ThroughputLogger: cheap, and logging exactly where it logged before.

The end hook reads ``trainer.global_step`` only on the batches where the step can have reached
a logging step; these tests pin that it still logs at exactly the steps a read on every batch
would pick (gradient accumulation, manual optimization with two optimizers, validation in the
middle, a resume), and that psutil and the dataset's source lines are read only when used.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from pytorch_lightning.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, Dataset

from lightning_speedpack import ThroughputLogger
from lightning_speedpack.throughput import diagnosis, system
from lightning_speedpack.throughput.metrics import KEYS, metric_keys, throughput_metrics
from lightning_speedpack.throughput.rates import StepClock, StepRecord, WindowRates, window_rates
from tests.helpers.models import quiet_trainer_kwargs


class StepsSeen(Callback):
    """Reference: the global step after every training batch, read on every batch."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        self.steps.append(trainer.global_step)


def _reference_log_steps(steps: list[int], every: int) -> list[int]:
    """The steps the logger logged at when it read the global step on every batch."""
    logged, last = [], -1
    for step in steps:
        if step % every == 0 and step != last:
            logged.append(step)
            last = step
    if steps and steps[-1] != last:  # the tail, logged at train end
        logged.append(steps[-1])
    return logged


class TwoOptimizers(BoringModel):
    """Manual optimization stepping two optimizers per batch (the global step grows by two)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.other = torch.nn.Linear(32, 2)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        for optimizer, layer in zip(self.optimizers(), (self.layer, self.other), strict=True):
            loss = layer(batch).sum()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        return None

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.SGD(self.layer.parameters(), lr=0.01),
            torch.optim.SGD(self.other.parameters(), lr=0.01),
        ]


@pytest.mark.parametrize(
    ("model", "every", "trainer_kwargs"),
    [
        (BoringModel, 3, {"max_steps": 20}),
        (BoringModel, 4, {"max_steps": 13, "accumulate_grad_batches": 3}),
        (BoringModel, 2, {"max_steps": 9, "val_check_interval": 5, "limit_val_batches": 2}),
        (BoringModel, 1, {"max_steps": 5}),
        (TwoOptimizers, 3, {"max_steps": 22}),
        (TwoOptimizers, 4, {"max_steps": 22}),
    ],
)
def test_logs_at_the_steps_a_read_on_every_batch_picks(
    tmp_path: Path, model: type[LightningModule], every: int, trainer_kwargs: dict[str, Any]
) -> None:
    seen = StepsSeen()
    callback = ThroughputLogger(window=4, log_every_n_steps=every, gpu_stats=False)
    trainer = Trainer(
        callbacks=[seen, callback],
        **quiet_trainer_kwargs(tmp_path, max_epochs=-1, limit_train_batches=7, **trainer_kwargs),
    )
    trainer.fit(model())
    logged = [step for step, _ in callback.doctor_figures()["samples_per_sec_over_steps"]]
    assert logged == _reference_log_steps(seen.steps, every)
    assert len(logged) >= 2


def test_global_step_is_read_only_near_logging_steps(tmp_path: Path) -> None:
    reads: list[int] = []

    class CountingTrainer(Trainer):
        @property
        def global_step(self) -> int:
            step = super().global_step
            reads.append(step)
            return step

    callback = ThroughputLogger(window=4, log_every_n_steps=10, gpu_stats=False)
    trainer = CountingTrainer(callbacks=[callback], **quiet_trainer_kwargs(tmp_path, max_steps=40))
    trainer.fit(BoringModel())
    ours = len(reads)
    assert [s for s, _ in callback.doctor_figures()["samples_per_sec_over_steps"]] == [
        10,
        20,
        30,
        40,
    ]
    reads.clear()
    trainer = CountingTrainer(**quiet_trainer_kwargs(tmp_path, max_steps=40))
    trainer.fit(BoringModel())
    lightning_alone = len(reads)
    # One read per logging step (and the first batch), not one per batch.
    assert ours - lightning_alone <= 6


def test_cpu_stats_are_read_only_for_a_logger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    read = system.cpu_stats

    def counting() -> dict[str, float]:
        calls.append("read")
        return read()

    monkeypatch.setattr(system, "cpu_stats", counting)
    callback = ThroughputLogger(window=2, log_every_n_steps=2)
    Trainer(callbacks=[callback], **quiet_trainer_kwargs(tmp_path, max_steps=6)).fit(BoringModel())
    assert calls == []  # logger=False: nobody receives system/*
    assert len(callback.doctor_figures()["samples_per_sec_over_steps"]) == 3


class LocalDataset(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(32)


class LocalDatasetModel(BoringModel):
    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(LocalDataset(), batch_size=4)


def test_dataset_location_is_looked_up_only_for_a_finding_and_survives_pickling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups: list[Any] = []
    real = diagnosis.getitem_location

    def counting(getitem: Any) -> str | None:
        lookups.append(getitem)
        return real(getitem)

    from lightning_speedpack.throughput import callback as throughput_module

    monkeypatch.setattr(throughput_module, "getitem_location", counting)

    callback = ThroughputLogger(window=2, log_every_n_steps=2, gpu_stats=False)
    trainer = Trainer(callbacks=[callback], **quiet_trainer_kwargs(tmp_path, max_steps=4))
    trainer.fit(LocalDatasetModel())
    assert lookups == []  # not during the fit
    location = f"test_hot_path.py:{LocalDataset.__getitem__.__code__.co_firstlineno}"
    copy = pickle.loads(pickle.dumps(callback))
    assert copy._locate_dataset() == location
    assert callback._locate_dataset() == location
    assert len(lookups) == 1  # looked up once, by the pickling


def test_data_wait_findings_locate_only_when_there_is_a_finding() -> None:
    asked: list[bool] = []

    def locate() -> str:
        asked.append(True)
        return "data.py:3"

    assert diagnosis.data_wait_findings({"data_wait_fraction": 0.1}, 2, locate) == []
    assert asked == []
    (finding,) = diagnosis.data_wait_findings({"data_wait_fraction": 0.5}, 2, locate)
    assert finding.location == "data.py:3"
    assert finding.figures == {"data_wait_fraction": 0.5, "num_workers": 2}


def test_throughput_metrics_keys() -> None:
    keys = metric_keys("p/")
    assert keys == tuple(f"p/{k}" for k in KEYS)
    world = WindowRates(10.0, 1.0, 5.0, 100.0, 1000.0, 100.0, 0.1)
    plain = throughput_metrics(keys, world, 50.0, 5.0, devices=1)
    assert set(plain) == {f"p/{k}" for k in KEYS[:8]}
    full = throughput_metrics(
        keys, world, 50.0, 5.0, devices=2, items=True, flops=True, peak_flops_per_device=100.0
    )
    assert full["p/items_per_sec"] == 5.0
    assert full["p/flops_per_sec"] == 100.0
    assert full["p/mfu"] == 0.5
    assert full["p/device/samples_per_sec"] == 5.0


# ---- StepClock: the ring buffer and the totals equal a deque and running sums -------------


class ReferenceClock:
    """The former StepClock: a list of records and running totals."""

    def __init__(self, window: int) -> None:
        self.size = window
        self.records: list[StepRecord] = []
        self.totals = [0.0] * 6
        self.offset = 0.0
        self.paused_at: float | None = None
        self.last_end: float | None = None
        self.started = False
        self.wait = 0.0

    def epoch_start(self, now: float) -> None:
        self.last_end, self.started, self.wait = now - self.offset, False, 0.0

    def batch_start(self) -> None:
        self.started = True

    def add_wait(self, seconds: float) -> None:
        self.wait += seconds

    def batch_end(self, now: float, samples: int, items: int, flops: float) -> StepRecord | None:
        end = now - self.offset
        previous, started, wait = self.last_end, self.started, self.wait
        self.last_end, self.started, self.wait = end, False, 0.0
        if previous is None or not started:
            return None
        record = StepRecord(max(0.0, end - previous), samples, items, wait, flops)
        self.records = [*self.records, record][-self.size :]
        t = self.totals
        for k, v in enumerate((samples, 1, items, record.seconds, record.data_wait, flops)):
            t[k] += v
        return record

    def pause(self, now: float) -> None:
        if self.paused_at is None:
            self.paused_at = now

    def resume(self, now: float) -> None:
        if self.paused_at is not None:
            self.offset += max(0.0, now - self.paused_at)
            self.paused_at = None

    def reset(self) -> None:
        self.records = []
        self.offset, self.paused_at, self.last_end = 0.0, None, None
        self.started, self.wait = False, 0.0


@pytest.mark.parametrize("seed", range(20))
def test_step_clock_equals_records_and_running_sums(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.randint(1, 6)
    clock, reference = StepClock(size), ReferenceClock(size)
    t = 0.0
    clock.epoch_start(t)
    reference.epoch_start(t)
    for _ in range(60):
        event = rng.random()
        if event < 0.05:
            t += 1.0
            clock.epoch_start(t)
            reference.epoch_start(t)
        elif event < 0.10:
            clock.pause(t)
            reference.pause(t)
            t += 5.0
            clock.resume(t)
            reference.resume(t)
        elif event < 0.12:
            clock.reset()
            reference.reset()
        elif event < 0.14:
            totals = [float(rng.randint(0, 99)) for _ in range(6)]
            clock.set_totals(*totals)
            reference.totals = totals
        for _ in range(rng.choice((0, 1, 1, 1, 2))):  # the fetches of this step
            seconds = rng.random()
            t += seconds
            clock.add_wait(seconds)
            reference.add_wait(seconds)
        if rng.random() < 0.95:
            clock.batch_start()
            reference.batch_start()
        t += rng.random()
        args = (t, rng.randint(1, 9), rng.randint(0, 5), rng.random())
        record = clock.batch_end(*args)
        assert record == reference.batch_end(*args)
        if record is not None and rng.random() < 0.1:
            clock.drop_last()
            reference.records.pop()
        assert clock.window == reference.records
        # Exact before Python 3.12; from 3.12 on, sum() of floats rounds better than a loop.
        ours, theirs = clock.window_rates(), window_rates(reference.records)
        assert (ours is None) == (theirs is None)
        if ours is not None and theirs is not None:
            assert ours.vector() == pytest.approx(theirs.vector(), rel=1e-12)
        assert clock.totals() == pytest.approx(reference.totals, rel=1e-12)
