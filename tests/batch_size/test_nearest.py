"""BatchSizeTuner(mode="nearest") and measure_sizes on real Trainers: the sizes tried, the pick."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_speedpack import BatchSizeTuner, BatchSizeTuningError
from lightning_speedpack.batch_size.measure import measure_sizes
from lightning_speedpack.batch_size.search import Trial
from tests.batch_size.helpers import FakeClock, model, recording_model
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import NAMESPACES, Namespace, each_namespace

PL = NAMESPACES[0]


def _fit(ns: Namespace, net: Any, tmp_path: Path, *callbacks: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("max_steps", 2)
    kwargs.setdefault("limit_val_batches", 0)
    ckpt_path = kwargs.pop("ckpt_path", None)
    trainer = ns.Trainer(callbacks=list(callbacks), **quiet_trainer_kwargs(tmp_path, **kwargs))
    trainer.fit(net, ckpt_path=ckpt_path)
    return trainer


def _params(net: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


@each_namespace
def test_nearest_tries_todays_size_and_the_multiples_around_it(
    ns: Namespace, tmp_path: Path
) -> None:
    class Probe(ns.Callback):  # type: ignore[misc, name-defined]
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.params = _params(pl_module)
            self.optimizer_state = trainer.optimizers[0].state_dict()["state"]

    net, probe = model(ns, batch_size=50, length=512), Probe()
    before = _params(net)
    tuner = BatchSizeTuner(mode="nearest", verbose=False)
    _fit(ns, net, tmp_path, tuner, probe)
    assert [t.batch_size for t in tuner.trials] == [48, 50, 56]
    assert all(t.fits and t.samples_per_sec and t.samples_per_sec > 0 for t in tuner.trials)
    assert net.trial_sizes == [48] * 3 + [50] * 3 + [56] * 3  # steps_per_trial=3, in that order
    assert tuner.batch_size in (48, 50, 56)
    assert net.batch_size == tuner.batch_size
    assert net.train_sizes == [tuner.batch_size] * 2  # the fit trained with it
    # the trials left the model as it was: bit-identical parameters, an untouched optimizer
    assert probe.params.keys() == before.keys()
    assert all(torch.equal(probe.params[k], before[k]) for k in before)
    assert probe.optimizer_state == {}
    findings = {f.id: f for f in tuner.doctor_findings()}
    kept = tuner.batch_size == 50  # not a multiple of 8: the finding says so
    assert list(findings) == ["batch-size-multiple"] * kept + ["batch-size-trials"]
    assert findings["batch-size-trials"].message.startswith(
        f"BatchSizeTuner (mode='nearest') chose batch size {tuner.batch_size} after 3 trials:"
    )


@pytest.mark.parametrize(
    ("cost", "chosen"),
    [
        (lambda b: 1e-3, 56),  # a step costs the same at any size: the largest is fastest
        (lambda b: 1e-5 * b, 50),  # the same cost per sample: a tie, today's size stays
        (lambda b: 1e-5 * b * (1.0 if b % 8 == 0 else 1.5), 48),  # 48 and 56 tie: 48 is closer
    ],
    ids=["per-step", "per-sample", "multiples-faster"],
)
def test_nearest_keeps_the_fastest_and_ties_go_to_todays_size(
    cost: Any, chosen: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(monkeypatch)
    clock.cost = cost
    net = model(PL, batch_size=50, length=512, clock=clock)
    tuner = BatchSizeTuner(mode="nearest", verbose=False)
    _fit(PL, net, tmp_path, tuner)
    speeds = {t.batch_size: t.samples_per_sec for t in tuner.trials}
    assert speeds == {b: pytest.approx(b / cost(b)) for b in (48, 50, 56)}
    assert tuner.batch_size == net.batch_size == chosen


@pytest.mark.parametrize(
    ("length", "max_val", "tried"),
    [
        (52, 8192, [48, 50]),  # 56 is more than the dataset holds
        (40, 8192, [40, 50]),  # a dataset smaller than today's size: the largest multiple in it
        (512, 48, [48, 50]),  # max_val caps the multiples; today's size is measured anyway
    ],
)
def test_nearest_is_capped_by_the_dataset_and_max_val(
    length: int, max_val: int, tried: list[int], tmp_path: Path
) -> None:
    tuner = BatchSizeTuner(mode="nearest", max_val=max_val, verbose=False)
    net = model(PL, batch_size=50, length=length)
    _fit(PL, net, tmp_path, tuner, max_steps=1)
    assert [t.batch_size for t in tuner.trials] == tried
    assert tuner.batch_size in tried


@pytest.mark.slow
def test_nearest_a_size_out_of_memory_does_not_fit(tmp_path: Path) -> None:
    tuner = BatchSizeTuner(mode="nearest", verbose=False)
    net = model(PL, batch_size=50, length=512, limit=49)
    _fit(PL, net, tmp_path, tuner)
    assert tuner.trials[0] == Trial(48, True, tuner.trials[0].samples_per_sec)
    assert [t[:2] for t in tuner.trials] == [(48, True), (50, False), (56, False)]
    assert [t.samples_per_sec for t in tuner.trials[1:]] == [None, None]
    assert tuner.batch_size == net.batch_size == 48
    assert net.train_sizes == [48, 48]


@pytest.mark.slow
def test_nearest_nothing_fits_is_an_error_and_leaves_the_size(tmp_path: Path) -> None:
    net = model(PL, batch_size=50, length=512, limit=40)
    with pytest.raises(
        BatchSizeTuningError, match=r"none of the batch sizes \[48, 50, 56\] fits in memory"
    ):
        _fit(PL, net, tmp_path, BatchSizeTuner(mode="nearest", verbose=False))
    assert net.batch_size == 50


def test_nearest_keeps_a_multiple_without_trials(tmp_path: Path) -> None:
    tuner = BatchSizeTuner(mode="nearest", verbose=False)
    net = model(PL, batch_size=64, length=512)
    _fit(PL, net, tmp_path, tuner)
    assert net.trial_sizes == []
    assert tuner.trials == []
    assert (tuner.batch_size, tuner.tuned, net.batch_size) == (64, True, 64)
    (finding,) = tuner.doctor_findings()
    assert (finding.id, finding.severity) == ("batch-size-trials", "info")
    assert finding.message == (
        "BatchSizeTuner (mode='nearest') kept batch size 64 without trials: batch size 64 is "
        "already a multiple of 8"
    )
    assert finding.figures == {"tuned_batch_size": 64, "trials": []}
    assert tuner.doctor_figures() == {"batch_size": 64}  # no trials: no tuned size to log


def test_nearest_with_no_multiple_in_the_dataset_keeps_the_size(tmp_path: Path) -> None:
    tuner = BatchSizeTuner(mode="nearest", verbose=False)
    net = model(PL, batch_size=5, length=4)
    _fit(PL, net, tmp_path, tuner, max_steps=1)
    assert (net.trial_sizes, tuner.trials, tuner.batch_size) == ([], [], 5)
    assert tuner.doctor_findings()[-1].message == (
        "BatchSizeTuner (mode='nearest') kept batch size 5 without trials: no multiple of 8 is "
        "<= 4 (the smaller of max_val and the dataset's length per rank)"
    )


def test_nearest_resumes_from_the_checkpoint_without_new_trials(tmp_path: Path) -> None:
    def checkpointing() -> dict[str, Any]:
        ckpt = PL.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
        return {"callbacks": [ckpt], "enable_checkpointing": True}

    first = BatchSizeTuner(mode="nearest", verbose=False)
    net = model(PL, batch_size=50, length=1024)
    kwargs = checkpointing()
    _fit(PL, net, tmp_path, first, *kwargs.pop("callbacks"), max_steps=-1, **kwargs)
    assert [t.batch_size for t in first.trials] == [48, 50, 56]
    assert first.state_key == "BatchSizeTuner{'mode': 'nearest', 'attr_name': 'batch_size'}"

    resumed = BatchSizeTuner(mode="nearest", verbose=False)
    net = model(PL, batch_size=50, length=1024)
    kwargs = checkpointing()
    _fit(
        PL,
        net,
        tmp_path,
        resumed,
        *kwargs.pop("callbacks"),
        max_steps=-1,
        max_epochs=2,
        ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"),
        **kwargs,
    )
    assert net.trial_sizes == []
    assert resumed.trials == first.trials
    assert net.batch_size == resumed.batch_size == first.batch_size
    assert first.batch_size is not None
    assert set(net.train_sizes) == {first.batch_size, 1024 % first.batch_size}  # epoch 2


# --- measure_sizes: the same engine for another tool --------------------------------------------


class Measure:
    """Calls measure_sizes at fit start, as a what-if tool would, and keeps what it returned."""

    def __init__(self, ns: Namespace, sizes: list[int], **kwargs: Any) -> None:
        outer = self
        self.trials: list[Trial] = []
        self.before: dict[str, torch.Tensor] = {}
        self.after: dict[str, torch.Tensor] = {}
        self.batch_size: int | None = None

        class Hook(ns.Callback):  # type: ignore[misc, name-defined]
            def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
                outer.before = _params(pl_module)
                outer.trials = measure_sizes(trainer, pl_module, sizes, **kwargs)
                outer.after = _params(pl_module)
                outer.batch_size = pl_module.batch_size

        self.callback = Hook()


@pytest.mark.slow
@each_namespace
def test_measure_sizes_measures_and_puts_everything_back(ns: Namespace, tmp_path: Path) -> None:
    measure = Measure(ns, [16, 24, 40], steps=2, owner="WhatIf")
    net = model(ns, batch_size=20, length=512, limit=32)
    _fit(ns, net, tmp_path, measure.callback, max_steps=1)
    assert [t[:2] for t in measure.trials] == [(16, True), (24, True), (40, False)]
    assert [t.samples_per_sec is not None for t in measure.trials] == [True, True, False]
    assert net.trial_sizes == [16, 16, 24, 24, 40]  # the size that ran out stopped at step 1
    assert measure.batch_size == net.batch_size == 20  # the attribute put back
    assert all(torch.equal(measure.after[k], measure.before[k]) for k in measure.before)
    assert net.train_sizes == [20]


def test_measure_sizes_names_its_caller_in_errors(tmp_path: Path) -> None:
    class NoSize(recording_model(PL.name)):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            del self.batch_size
            self.bs = 8

        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(PL.RandomDataset(32, 64), batch_size=self.bs)

    measure = Measure(PL, [8], owner="WhatIf")
    with pytest.raises(
        BatchSizeTuningError, match=r"^WhatIf: no batch-size attribute `batch_size`"
    ):
        _fit(PL, NoSize(), tmp_path, measure.callback)


@pytest.mark.parametrize(
    ("sizes", "kwargs", "error", "message"),
    [
        ([0], {}, ValueError, "`size` must be a positive int, got 0"),
        ([8.0], {}, TypeError, "`size` must be an int, got float 8.0"),
        ([8], {"steps": 0}, ValueError, "`steps` must be a positive int, got 0"),
    ],
)
def test_measure_sizes_checks_its_arguments_first(
    sizes: list[Any], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        measure_sizes(None, None, sizes, **kwargs)  # type: ignore[arg-type]
