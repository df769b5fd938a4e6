"""StepTimeline's fetch and copy phases on real Trainers: a user's own transfer with a nested
batch in both namespaces, the copy's logged bytes, CUDA events through injected fakes, the
measurement published for the advisor, and the profiler given back."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Trainer
from pytorch_lightning.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_speedpack.core import events
from lightning_speedpack.timeline import NvtxApi, StepTimeline, transfer
from lightning_speedpack.timeline.transfer import DeviceTiming
from tests.helpers.models import TinyCNN, quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace, load

BATCH = 4
FEATURES = 32
# what the user's transfer returns per batch: float32 features and int64 targets (the ids'
# strings are no tensors)
BATCH_BYTES = BATCH * FEATURES * 4 + BATCH * 8


class _Ranges:
    """An NVTX table that keeps the open ranges, so code can ask where it runs."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.pushed: list[str] = []
        self.api = NvtxApi(push=self._push, pop=self._pop, mark=lambda name: None)

    def _push(self, name: str) -> None:
        self.stack.append(name)
        self.pushed.append(name)

    def _pop(self) -> None:
        self.stack.pop()

    def innermost(self) -> str | None:
        return self.stack[-1] if self.stack else None


class _Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Tells ``where`` which range each sample is read in."""

    def __init__(self, where: list[str | None], ranges: _Ranges, n: int = 24) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = torch.randint(0, 8, (n,), generator=g)
        self.where, self.ranges = where, ranges

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.where.append(self.ranges.innermost())
        return self.x[i], self.y[i]


def _nested_model(ns: Namespace, ranges: _Ranges) -> Any:
    """A module with its own transfer hooks, which turn ``(x, y)`` into a nested dict."""

    class OwnTransfer(ns.LightningModule):  # type: ignore[name-defined, misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(FEATURES, 8)
            self.seen: list[tuple[str, bool, str | None]] = []
            self.samples: list[str | None] = []

        def _saw(self, hook: str) -> None:
            self.seen.append((hook, self.trainer.training, ranges.innermost()))

        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            self._saw("before")
            return batch

        def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
            self._saw("transfer")
            x, y = batch
            return {
                "inputs": {"x": x.to(device)},
                "targets": [y.to(device)],
                "ids": [f"sample-{i}" for i in range(len(y))],
            }

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            self._saw("after")
            return batch

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            logits = self.net(batch["inputs"]["x"])
            return nn.functional.cross_entropy(logits, batch["targets"][0])

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.net(batch["inputs"]["x"])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(_Samples(self.samples, ranges), batch_size=BATCH)

        def val_dataloader(self) -> DataLoader[Any]:
            return DataLoader(_Samples(self.samples, ranges, n=8), batch_size=BATCH)

    return OwnTransfer()


class _BatchEndProbe:
    """Where a callback after the timeline runs its on_train_batch_end (a slow logger, say)."""

    def __init__(self, ns: Namespace, ranges: _Ranges) -> None:
        class Probe(ns.Callback):  # type: ignore[name-defined, misc]
            def __init__(self) -> None:
                self.where: list[str | None] = []

            def on_train_batch_end(self, *args: Any) -> None:
                self.where.append(ranges.innermost())

        self.callback = Probe()


def _rows(logger_dir: Path) -> dict[int, dict[str, str]]:
    (path,) = logger_dir.glob("**/metrics.csv")
    with path.open() as f:
        return {int(r["step"]): r for r in csv.DictReader(f) if r.get("throughput/phase/other_ms")}


def _untapped(trainer: Any) -> bool:
    return not {"start", "stop"} & set(vars(trainer.profiler))


@each_namespace
def test_own_transfer_with_a_nested_batch_is_its_own_phase(ns: Namespace, tmp_path: Path) -> None:
    ranges = _Ranges()
    timeline = StepTimeline(nvtx=ranges.api, log_every_n_steps=2)
    probe = _BatchEndProbe(ns, ranges).callback
    logger = ns.sub("loggers").CSVLogger(tmp_path / "logs")
    trainer = ns.Trainer(
        callbacks=[timeline, probe],
        profiler="simple",  # a profiler of the user's own keeps working under the tap
        **quiet_trainer_kwargs(
            tmp_path, max_steps=6, logger=logger, val_check_interval=3, limit_val_batches=2
        ),
    )
    model = _nested_model(ns, ranges)
    trainer.fit(model)

    copy = "speedpack/batch_transfer"
    train = [(hook, where) for hook, training, where in model.seen if training]
    assert train == [("before", copy), ("transfer", copy), ("after", copy)] * 6
    # the validation loop's copies (sanity check and two runs of 2 batches) are not timed
    val = [where for _hook, training, where in model.seen if not training]
    assert val == [None] * 3 * (2 + 2 + 2)
    assert ranges.pushed.count(copy) == 6
    # the fetch alone is the data wait; a later callback's on_train_batch_end is `other`
    assert len(model.samples) == 6 * BATCH + 3 * 2 * BATCH
    assert model.samples[:BATCH] == [None] * BATCH  # the sanity check's validation batch
    train_samples = [w for w in model.samples if w is not None]
    assert train_samples == ["speedpack/data_wait"] * (6 * BATCH)
    assert probe.where == ["speedpack/other"] * 6

    rows = _rows(tmp_path / "logs")
    assert sorted(rows) == [2, 4, 6]
    for row in rows.values():
        assert float(row["data/h2d_bytes_per_batch"]) == BATCH_BYTES
        assert float(row["data/h2d_pinned"]) == 0.0
        assert not row.get("data/h2d_gb_per_sec")  # no CUDA: no device timing
    assert timeline.phase_ms()["batch_transfer"] > 0
    assert timeline.doctor_figures()["h2d_bytes_per_batch"] == BATCH_BYTES
    assert "h2d_gb_per_sec" not in timeline.doctor_figures()
    strategy = type(trainer.strategy).__name__
    assert f"[Strategy]{strategy}.batch_to_device" in trainer.profiler.recorded_durations
    assert _untapped(trainer)
    assert ranges.stack == []


# ---- the CUDA path, through fake events ----------------------------------------------------


class _FakeDevice:
    """Fake CUDA events: each record() is ``tick_ms`` of device time later; an event reads as
    done from the second ``query()`` after its record (the first log finds the copy running)."""

    def __init__(self, ranges: _Ranges, tick_ms: float = 0.5) -> None:
        self.ranges = ranges
        self.tick_ms = tick_ms
        self.now = 0.0
        self.made = 0
        self.recorded_in: list[str | None] = []

    def event(self) -> _FakeEvent:
        self.made += 1
        return _FakeEvent(self)


class _FakeEvent:
    def __init__(self, device: _FakeDevice) -> None:
        self.device = device
        self.at = 0.0
        self.queries = 0

    def record(self) -> None:
        self.device.now += self.device.tick_ms
        self.at, self.queries = self.device.now, 0
        self.device.recorded_in.append(self.device.ranges.innermost())

    def query(self) -> bool:
        self.queries += 1
        return self.queries > 1

    def elapsed_time(self, end: _FakeEvent) -> float:
        if not (self.queries > 1 or end.queries > 1):
            raise RuntimeError("elapsed_time before the device reached the event")
        return end.at - self.at


def test_cuda_events_time_the_sampled_copies_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranges = _Ranges()
    device = _FakeDevice(ranges)
    fake = DeviceTiming(applies=lambda d: True, event=device.event)
    monkeypatch.setattr(transfer, "TIMING", fake)
    timeline = StepTimeline(nvtx=ranges.api, log_every_n_steps=2)
    trainer = Trainer(
        callbacks=[timeline],
        **quiet_trainer_kwargs(
            tmp_path,
            max_steps=6,
            logger=CSVLogger(tmp_path / "logs"),
            val_check_interval=3,
            limit_val_batches=2,
        ),
    )
    trainer.fit(_nested_model(load("pytorch_lightning"), ranges))

    # batch 0 is timed; the log at step 2 finds its end event running (no value, no wait);
    # step 4 reads it and times batch 4; step 6 finds that one running
    assert device.made == 2  # one pair for the fit
    assert device.recorded_in == ["speedpack/batch_transfer"] * 4
    rows = _rows(tmp_path / "logs")
    rates = {step: row.get("data/h2d_gb_per_sec") for step, row in rows.items()}
    expected = BATCH_BYTES / (device.tick_ms * 1e6)
    assert rates[2] == ""
    assert float(rates[4]) == pytest.approx(expected)
    assert rates[6] == ""
    measured = timeline.measured_transfer()
    assert measured is not None
    assert measured.gb_per_sec == pytest.approx(expected)
    assert timeline.doctor_figures()["h2d_gb_per_sec"] == round(expected, 3)
    assert _untapped(trainer)


# ---- published for the advisor ---------------------------------------------------------------


def test_each_logging_step_and_epoch_end_publish_the_run_so_far(tmp_path: Path) -> None:
    # Not every batch (that cost a few microseconds a step): every logging step, the end of
    # every epoch (before anyone's on_train_end) and the end of training.
    seen: list[events.BatchTransfer] = []
    timeline = StepTimeline(nvtx=False, log_every_n_steps=3)
    trainer = Trainer(callbacks=[timeline], **quiet_trainer_kwargs(tmp_path, max_steps=4))
    with events.subscribe(events.BATCH_TRANSFER, seen.append):
        trainer.fit(TinyCNN())
    assert [m.batches for m in seen] == [3, 4, 4]
    last = seen[-1]
    assert last == timeline.measured_transfer()
    assert last.bytes_per_batch == 16 * 3 * 32 * 32 * 4 + 16 * 8
    assert last.pinned is False
    assert last.gb_per_sec is None
    assert last.share == pytest.approx(timeline.phase_shares()["batch_transfer"])
    assert events.subscriber_count() == 0
    assert _untapped(trainer)
