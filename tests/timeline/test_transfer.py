"""The copy to the device as plain functions: action names, batch bytes, pinning, event timing."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_speedpack.timeline import transfer
from lightning_speedpack.timeline.transfer import CopyTimer, DeviceTiming


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("[_TrainingEpochLoop].train_dataloader_next", transfer.FETCH),
        ("[LightningModule]TinyCNN.on_before_batch_transfer", transfer.BEFORE),
        ("[LightningDataModule]MyData.on_before_batch_transfer", transfer.BEFORE),
        ("[Strategy]SingleDeviceStrategy.batch_to_device", transfer.TRANSFER),
        ("[Strategy]DDPStrategy.batch_to_device", transfer.TRANSFER),
        # the validation loop's own fetch, hooks of the same names elsewhere, other actions
        ("[_EvaluationLoop].val_next", ""),
        ("[Callback]Mine.on_before_batch_transfer", ""),
        ("[LightningModule]TinyCNN.batch_to_device", ""),
        ("[Strategy]SingleDeviceStrategy.on_train_batch_start", ""),
        ("run_training_batch", ""),
    ],
)
def test_action_kind(name: str, kind: str) -> None:
    assert transfer.action_kind(name) == kind


@dataclass
class _Sample:
    image: torch.Tensor
    label: int


class _Pair(NamedTuple):
    left: torch.Tensor
    right: torch.Tensor


def test_batch_bytes_walks_nested_batches() -> None:
    batch = {
        "images": [_Sample(torch.zeros(2, 3, dtype=torch.float32), 1)],  # 24 bytes
        "pair": _Pair(torch.zeros(4, dtype=torch.float16), torch.zeros(1, dtype=torch.int64)),
        "view": torch.zeros(10, dtype=torch.uint8)[:5],  # a view counts its own elements: 5
        "ids": ("a", 3),
    }
    assert transfer.batch_bytes(batch) == 24 + 8 + 8 + 5
    assert transfer.batch_bytes(torch.zeros(3, dtype=torch.float64)) == 24
    assert transfer.batch_bytes(["no", "tensors"]) == 0


def test_loader_pins_only_every_loader_for_cuda() -> None:
    pinned = DataLoader(range(4), pin_memory=True)
    pageable = DataLoader(range(4))
    cuda = torch.device("cuda", 0)
    assert transfer.loader_pins([pinned], cuda)
    assert not transfer.loader_pins([pinned, pageable], cuda)
    assert not transfer.loader_pins([pinned], torch.device("cpu"))
    assert not transfer.loader_pins([], cuda)


class _Clock:
    """Fake device time: each record() is one tick of ``tick_ms`` later."""

    def __init__(self, tick_ms: float) -> None:
        self.now = 0.0
        self.tick_ms = tick_ms
        self.ready = False
        self.made = 0

    def event(self) -> _Event:
        self.made += 1
        return _Event(self)


class _Event:
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.at: float | None = None

    def record(self) -> None:
        self.clock.now += self.clock.tick_ms
        self.at = self.clock.now

    def query(self) -> bool:
        return self.clock.ready

    def elapsed_time(self, end: Any) -> float:
        if not self.clock.ready or self.at is None or end.at is None:
            raise RuntimeError("elapsed_time on an event the device has not reached")
        return float(end.at - self.at)


def _timer(tick_ms: float = 2.0) -> tuple[CopyTimer, _Clock]:
    clock = _Clock(tick_ms)
    return CopyTimer(DeviceTiming(applies=lambda d: True, event=clock.event)), clock


def test_copy_timer_reads_only_a_completed_pair() -> None:
    timer, clock = _timer(tick_ms=4.0)
    assert timer.read() is None  # nothing recorded
    assert timer.begin()
    timer.end()
    timer.set_bytes(8_000_000)
    assert timer.read() is None  # the device has not reached the end event: no wait, no value
    assert timer.busy
    clock.ready = True
    assert timer.read() == pytest.approx(2.0)  # 8 MB in 4 ms
    assert not timer.busy
    assert timer.read() is None  # read once


def test_copy_timer_keeps_an_unread_pair_and_its_bytes() -> None:
    timer, clock = _timer()
    assert timer.begin()
    timer.end()
    timer.set_bytes(2_000_000)
    assert not timer.begin()  # still unread: no second pair over it
    timer.set_bytes(999)  # a later sample does not resize it
    clock.ready = True
    assert timer.read() == pytest.approx(1.0)  # 2 MB in 2 ms
    assert timer.begin()  # the same two events again
    assert clock.made == 2


def test_copy_timer_without_bytes_or_after_abandon() -> None:
    timer, clock = _timer()
    clock.ready = True
    timer.begin()
    timer.end()
    assert timer.read() is None  # the batch never reached on_train_batch_start
    timer.begin()
    timer.abandon()
    assert not timer.busy
    timer.end()  # an end without its begin records nothing
    assert timer.read() is None


def test_default_timing_is_cuda_only() -> None:
    assert transfer.TIMING.applies(torch.device("cuda", 0))
    assert not transfer.TIMING.applies(torch.device("cpu"))


def _sampler(
    monkeypatch: pytest.MonkeyPatch, sampling: bool = True
) -> tuple[transfer.CopySampler, _Clock]:
    clock = _Clock(tick_ms=4.0)
    monkeypatch.setattr(transfer, "TIMING", DeviceTiming(lambda d: True, clock.event))
    sampler = transfer.CopySampler()
    sampler.start(torch.device("cuda", 0), [DataLoader(range(4), pin_memory=True)], sampling)
    return sampler, clock


def test_copy_sampler_times_one_batch_per_window(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler, clock = _sampler(monkeypatch)
    sampler.begin()
    sampler.end()
    sampler.sample(torch.zeros(1_000_000, dtype=torch.float64))  # 8 MB, the sampled batch
    sampler.begin()  # the next batch's copy is not timed
    sampler.end()
    sampler.sample(torch.zeros(3))
    assert sampler.take_metrics() == {
        transfer.BYTES_KEY: 8_000_000.0,
        transfer.PINNED_KEY: 1.0,
    }  # the device has not reached the end event yet
    clock.ready = True
    assert sampler.take_metrics() == {
        transfer.BYTES_KEY: 8_000_000.0,
        transfer.PINNED_KEY: 1.0,
        transfer.RATE_KEY: pytest.approx(2.0),  # 8 MB in 4 ms
    }
    assert clock.made == 2
    assert sampler.gb_per_sec == pytest.approx(2.0)
    sampler.reset()
    assert (sampler.bytes, sampler.gb_per_sec) == (None, None)


def test_copy_sampler_on_a_rank_that_does_not_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler, clock = _sampler(monkeypatch, sampling=False)
    sampler.begin()
    sampler.end()
    sampler.sample(torch.zeros(4))
    clock.ready = True
    assert sampler.take_metrics() == {}
    assert clock.made == 0


def test_copy_sampler_stop_and_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler, _ = _sampler(monkeypatch)
    sampler.begin()
    sampler.stop()  # interrupted mid-copy: the pair is forgotten, nothing more is sampled
    assert sampler.timer is not None
    assert not sampler.timer.busy
    sampler.sample(torch.zeros(4))
    assert sampler.bytes is None
    clone = pickle.loads(pickle.dumps(sampler))
    assert (clone.timer, clone.pinned, clone.sampling) == (None, True, True)
    assert sampler.timer is not None  # pickling leaves the original its timer
