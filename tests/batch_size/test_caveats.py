"""BatchSizeTuner's warnings after a choice: few steps per epoch, a learning rate left unscaled."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning_speedpack import BatchSizeTuner
from lightning_speedpack.batch_size import BatchSizeWarning
from lightning_speedpack.batch_size.caveats import (
    few_steps_caveat,
    optimizer_steps_per_epoch,
    unscaled_lr_caveat,
)
from tests.batch_size.helpers import FakeClock, model, recording_model
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import NAMESPACES, Namespace, each_namespace

PL = NAMESPACES[0]

HYDRA_STEPS = (
    "BatchSizeTuner: batch size 2048 leaves 2 optimizer steps per epoch on 4,096 samples (batch "
    "size 50 left 82), so per-epoch learning-rate schedules, validation and checkpoints come "
    'every 2 steps: pass `max_val=408` (10 steps per epoch) or `mode="nearest"` (the multiple '
    "of 8 next to the script's size) if the run should keep more steps"
)
HYDRA_LR = (
    "BatchSizeTuner: batch size 2048 is 41x the batch size 50 the script set, with the learning "
    "rate unchanged: pass scale_lr=True or set the learning rate for the new size"
)


def _fit(ns: Namespace, net: Any, tmp_path: Path, tuner: BatchSizeTuner, **kwargs: Any) -> Any:
    kwargs.setdefault("max_steps", 1)
    kwargs.setdefault("limit_val_batches", 0)
    trainer = ns.Trainer(callbacks=[tuner], **quiet_trainer_kwargs(tmp_path, **kwargs))
    trainer.fit(net)
    return trainer


def _warned(ns: Namespace, net: Any, tmp_path: Path, tuner: BatchSizeTuner, **kw: Any) -> list[str]:
    """Fit; return the BatchSizeWarning messages, in order (every one, none filtered)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BatchSizeWarning)
        _fit(ns, net, tmp_path, tuner, **kw)
    return [str(w.message) for w in caught if w.category is BatchSizeWarning]


# --- on real Trainers -----------------------------------------------------------------------------


@each_namespace
def test_the_hydra_case_throughput_from_50_to_2048_says_so(
    ns: Namespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 4,096-sample dataset and batch size 50; every step costs the same on the fake clock, so
    # the largest size is the fastest per sample and mode="throughput" takes it.
    clock = FakeClock(monkeypatch)
    clock.cost = lambda b: 1e-3
    net = model(ns, batch_size=50, length=4096, clock=clock)
    tuner = BatchSizeTuner(mode="throughput", max_val=2048, steps_per_trial=2, verbose=False)
    with pytest.warns(BatchSizeWarning) as record:
        _fit(ns, net, tmp_path, tuner)
    assert tuner.batch_size == net.batch_size == 2048
    assert [str(w.message) for w in record if w.category is BatchSizeWarning] == [
        HYDRA_STEPS,
        HYDRA_LR,
    ]
    findings = {f.id: f for f in tuner.doctor_findings()}
    steps, lr = findings["batch-size-few-steps"], findings["batch-size-lr-unscaled"]
    assert (steps.severity, lr.severity) == ("warning", "warning")
    assert f"{steps.message}: {steps.fix}" == HYDRA_STEPS
    assert f"{lr.message}: {lr.fix}" == HYDRA_LR
    assert steps.figures == {
        "batch_size": 2048,
        "original_batch_size": 50,
        "samples": 4096,
        "steps_per_epoch": 2,
        "original_steps_per_epoch": 82,
    }
    assert lr.figures == {"batch_size": 2048, "original_batch_size": 50}


@pytest.mark.parametrize("scale_lr", [False, True])
def test_max_mode_warns_and_scale_lr_silences_the_learning_rate_one(
    scale_lr: bool, tmp_path: Path
) -> None:
    tuner = BatchSizeTuner(max_val=64, steps_per_trial=1, scale_lr=scale_lr, verbose=False)
    messages = _warned(PL, model(PL, batch_size=4, length=256), tmp_path, tuner)
    assert tuner.batch_size == 64
    steps = (
        "BatchSizeTuner: batch size 64 leaves 4 optimizer steps per epoch on 256 samples (batch "
        "size 4 left 64), so per-epoch learning-rate schedules, validation and checkpoints come "
        'every 4 steps: pass `max_val=24` (10 steps per epoch) or `mode="nearest"` (the '
        "multiple of 8 next to the script's size) if the run should keep more steps"
    )
    lr = (
        "BatchSizeTuner: batch size 64 is 16x the batch size 4 the script set, with the "
        "learning rate unchanged: pass scale_lr=True or set the learning rate for the new size"
    )
    assert messages == ([steps] if scale_lr else [steps, lr])
    ids = [f.id for f in tuner.doctor_findings() if f.severity == "warning"]
    assert ids == ["batch-size-few-steps"] + ["batch-size-lr-unscaled"] * (not scale_lr)


def test_accumulated_batches_count_towards_the_steps(tmp_path: Path) -> None:
    tuner = BatchSizeTuner(max_val=64, steps_per_trial=1, scale_lr=True, verbose=False)
    net = model(PL, batch_size=8, length=640)
    (message,) = _warned(PL, net, tmp_path, tuner, accumulate_grad_batches=2)
    assert message.startswith(
        "BatchSizeTuner: batch size 64 leaves 5 optimizer steps per epoch on 640 samples with "
        "accumulate_grad_batches=2 (batch size 8 left 40), so "
    )
    assert "pass `max_val=32` (10 steps per epoch)" in message


def test_no_warning_when_the_choice_keeps_the_run_as_written(tmp_path: Path) -> None:
    # 64 is 4x 16 (not more) and leaves 32 steps on 2,048 samples: nothing to say. (The suite
    # turns warnings into errors: a warning here fails the fit.)
    tuner = BatchSizeTuner(max_val=64, steps_per_trial=1, verbose=False)
    _fit(PL, model(PL, batch_size=16, length=2048), tmp_path, tuner)
    assert tuner.batch_size == 64
    assert [f.id for f in tuner.doctor_findings()] == ["batch-size-trials"]


def test_a_shorter_epoch_the_script_set_itself_is_not_the_tuners_doing(tmp_path: Path) -> None:
    # 64 samples: batch size 8 already leaves 8 steps, 16 leaves 4; nor is 16 more than 4x 8.
    tuner = BatchSizeTuner(max_val=16, steps_per_trial=1, verbose=False)
    messages = _warned(PL, model(PL, batch_size=8, length=64), tmp_path, tuner)
    assert tuner.batch_size == 16
    assert messages == [
        "BatchSizeTuner: batch size 16 leaves 4 optimizer steps per epoch on 64 samples (batch "
        "size 8 left 8), so per-epoch learning-rate schedules, validation and checkpoints come "
        'every 4 steps: pass `mode="nearest"` (the multiple of 8 next to the script\'s size) if '
        "the run should keep more steps"
    ]


def test_nearest_mode_warns_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 70 samples: batch size 6 leaves 12 steps, 8 leaves 9; 8 is the fastest on the fake clock.
    clock = FakeClock(monkeypatch)
    clock.cost = lambda b: 1e-3
    tuner = BatchSizeTuner(mode="nearest", verbose=False)
    messages = _warned(PL, model(PL, batch_size=6, length=70, clock=clock), tmp_path, tuner)
    assert [t.batch_size for t in tuner.trials] == [6, 8]
    assert tuner.batch_size == 8
    assert messages == [
        "BatchSizeTuner: batch size 8 leaves 9 optimizer steps per epoch on 70 samples (batch "
        "size 6 left 12), so per-epoch learning-rate schedules, validation and checkpoints come "
        "every 9 steps"  # no max_val gives 10 steps of a multiple of 8; already mode="nearest"
    ]


def test_dry_run_reports_the_caveats_as_info_without_a_warning(tmp_path: Path) -> None:
    tuner = BatchSizeTuner(max_val=64, steps_per_trial=1, dry_run=True, verbose=False)
    net = model(PL, batch_size=4, length=256)
    assert _warned(PL, net, tmp_path, tuner) == []
    assert net.batch_size == 4
    findings = {f.id: f for f in tuner.doctor_findings()}
    steps, lr = findings["batch-size-few-steps"], findings["batch-size-lr-unscaled"]
    assert (steps.severity, lr.severity) == ("info", "info")
    assert steps.message.startswith("BatchSizeTuner: batch size 64 would leave 4 optimizer steps")
    assert "checkpoints would come every 4 steps" in steps.message
    assert lr.message.startswith("BatchSizeTuner: batch size 64 would be 16x the batch size 4")


class _Endless(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        while True:
            yield torch.randn(32)


def test_a_dataset_without_a_length_has_no_steps_to_count(tmp_path: Path) -> None:
    class Streaming(recording_model(PL.name)):  # type: ignore[misc]
        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(_Endless(), batch_size=self.batch_size)

    tuner = BatchSizeTuner(max_val=64, steps_per_trial=1, verbose=False)
    messages = _warned(PL, Streaming(batch_size=4), tmp_path, tuner)
    assert tuner.batch_size == 64
    assert [m.split(" is ")[1][:4] for m in messages] == ["16x "]  # the learning rate one only


# --- the pure rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("samples", "batch", "accumulate", "drop_last", "steps"),
    [
        (4096, 2048, 1, False, 2),
        (4096, 50, 1, False, 82),  # the last, partial batch is a step too
        (4096, 50, 1, True, 81),
        (4096, 50, 4, False, 21),  # 82 batches: 20 full accumulations and the epoch's end
        (10, 64, 1, False, 1),
        (10, 64, 1, True, 0),
    ],
)
def test_optimizer_steps_per_epoch(
    samples: int, batch: int, accumulate: int, drop_last: bool, steps: int
) -> None:
    assert optimizer_steps_per_epoch(samples, batch, accumulate, drop_last) == steps


def test_few_steps_caveat_per_rank_and_one_step() -> None:
    caveat = few_steps_caveat(chosen=2048, original=50, samples=2048, per_rank=True)
    assert caveat is not None
    assert caveat.message == (
        "batch size 2048 leaves 1 optimizer step per epoch on 2,048 samples per rank (batch size "
        "50 left 41), so per-epoch learning-rate schedules, validation and checkpoints come "
        "every step"
    )
    assert caveat.fix == "pass `max_val=200` (10 steps per epoch) if the run should keep more steps"
    assert few_steps_caveat(chosen=256, original=50, samples=4096) is None  # 16 steps
    assert few_steps_caveat(chosen=48, original=50, samples=400) is None  # 9 steps, as before


@pytest.mark.parametrize(
    ("chosen", "original", "times"), [(2048, 50, "41x"), (36, 8, "4.5x"), (40, 8, "5x")]
)
def test_unscaled_lr_caveat_growth(chosen: int, original: int, times: str) -> None:
    caveat = unscaled_lr_caveat(chosen=chosen, original=original, scale_lr=False)
    assert caveat is not None
    assert caveat.message == (
        f"batch size {chosen} is {times} the batch size {original} the script set, with the "
        "learning rate unchanged"
    )
    assert caveat.text == f"{caveat.message}: {caveat.fix}"
    assert unscaled_lr_caveat(chosen=32, original=8, scale_lr=False) is None  # 4x is not more
