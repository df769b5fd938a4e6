"""BatchSizeTuner on real Trainers with an injected memory limit (OOM above N samples)."""

from __future__ import annotations

import random
import textwrap
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pytorch_lightning import (
    Callback,
    LightningDataModule,
    LightningModule,
    Trainer,
    seed_everything,
)
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.demos.boring_classes import RandomDataset
from pytorch_lightning.loggers import Logger
from torch.utils.data import DataLoader

from lightning_speedpack import BatchSizeTuner, BatchSizeTuningError
from lightning_speedpack.batch_size.search import round_down
from lightning_speedpack.doctor.runner import run_script
from tests.helpers.ddp import run_ddp
from tests.helpers.models import SizedBoringModel, quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace

# These tests run the tuner on deliberately tiny datasets from tiny batch sizes, so most choices
# come with its advice (a size many times the script's, few steps per epoch): that advice is
# asserted in test_caveats.py, and ignored here.
pytestmark = pytest.mark.filterwarnings("ignore::lightning_speedpack.batch_size.BatchSizeWarning")


class LimitedModel(SizedBoringModel):
    """Raises ``torch.OutOfMemoryError`` for a batch larger than ``limit`` (the injected memory)."""

    def __init__(
        self,
        limit: int = 10**9,
        batch_size: int = 4,
        length: int = 2048,
        val_limit: int | None = None,
        shuffle: bool = False,
    ) -> None:
        super().__init__(batch_size=batch_size, length=length)
        self.limit, self.val_limit, self.shuffle = limit, val_limit, shuffle
        self.started = False
        self.trial_steps = 0  # training_step calls before training started
        self.train_sizes: list[int] = []

    def on_train_start(self) -> None:
        self.started = True

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if not self.started:
            self.trial_steps += 1
        else:
            self.train_sizes.append(batch.shape[0])
        if batch.shape[0] > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory (injected: {batch.shape[0]} > {self.limit})"
            )
        out = super().training_step(batch, batch_idx)
        self.log("train_loss", out["loss"])
        return out

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        if self.val_limit is not None and batch.shape[0] > self.val_limit:
            raise torch.OutOfMemoryError("CUDA out of memory (injected in validation)")
        return super().validation_step(batch, batch_idx)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            RandomDataset(32, self.length), batch_size=self.batch_size, shuffle=self.shuffle
        )

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


class RecordingLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[tuple[int | None, dict[str, float]]] = []
        self.hparams: list[dict[str, Any]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.append((step, dict(metrics)))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        self.hparams.append(dict(params))


def _expected(limit: int, margin: float = 0.05) -> int:
    # largest fitting multiple of 8, minus the margin, rounded down to a multiple of 8
    return max(8, round_down(round_down(limit, 8) * (1 - margin), 8))


def _fit(
    model: LightningModule, tmp_path: Path, tuner: Callback | None = None, **kwargs: Any
) -> Trainer:
    callbacks = [c for c in (tuner, *kwargs.pop("callbacks", [])) if c is not None]
    kwargs.setdefault("max_steps", 2)
    kwargs.setdefault("limit_val_batches", 1)
    ckpt_path = kwargs.pop("ckpt_path", None)
    trainer = Trainer(callbacks=callbacks, **quiet_trainer_kwargs(tmp_path, **kwargs))
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer


@pytest.mark.slow
@pytest.mark.parametrize("limit", [64, 100, 333, 700, 1000])
def test_chosen_is_the_largest_multiple_of_8_below_the_limit_minus_margin(
    limit: int, tmp_path: Path
) -> None:
    tuner = BatchSizeTuner(verbose=False, steps_per_trial=1)
    model = LimitedModel(limit)
    _fit(model, tmp_path, tuner)
    assert tuner.batch_size == _expected(limit)
    if limit % 8 == 0:  # the limit itself is found exactly
        assert tuner.batch_size == round_down(limit * 0.95, 8)
    assert all(t.batch_size % 8 == 0 for t in tuner.trials)
    assert {t.batch_size for t in tuner.trials if not t.fits} == {
        t.batch_size for t in tuner.trials if t.batch_size > limit
    }
    assert model.batch_size == tuner.batch_size  # the attribute Lightning builds loaders from
    assert model.train_sizes == [tuner.batch_size] * 2  # and training used it
    assert tuner.tuned


@pytest.mark.slow
def test_validation_memory_is_covered(tmp_path: Path) -> None:
    tuner = BatchSizeTuner(verbose=False, steps_per_trial=1, margin=0.0)
    _fit(LimitedModel(val_limit=200), tmp_path, tuner)
    assert tuner.batch_size == 200


@pytest.mark.slow
def test_state_is_bit_identical_to_a_run_without_tuning(tmp_path: Path) -> None:
    class Probe(Callback):
        def on_train_batch_start(
            self, trainer: Trainer, pl_module: Any, batch: Any, idx: int
        ) -> None:
            if idx == 0:
                optimizer = trainer.optimizers[0]
                self.at_first_step = {
                    "params": {k: v.clone() for k, v in pl_module.state_dict().items()},
                    "grads": [p.grad for p in pl_module.parameters()],
                    "optimizer": optimizer.state_dict(),
                    "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                    "numpy_rng": np.random.get_state()[1].copy(),
                    "python_rng": random.getstate(),
                    "batch": batch.clone(),
                    "step": (trainer.global_step, trainer.current_epoch),
                    "training": [m.training for m in pl_module.modules()],
                }

    def run(tuned: bool, batch_size: int) -> tuple[dict[str, Any], dict[str, torch.Tensor], Any]:
        seed_everything(7, verbose=False)
        model = LimitedModel(limit=300, batch_size=batch_size, shuffle=True)
        probe = Probe()
        tuner = BatchSizeTuner(verbose=False) if tuned else None
        _fit(model, tmp_path / str(tuned), tuner, callbacks=[probe], max_steps=3)
        return probe.at_first_step, model.state_dict(), tuner

    tuned_state, tuned_final, tuner = run(True, batch_size=4)
    assert tuner.batch_size == _expected(300)
    plain_state, plain_final, _ = run(False, batch_size=tuner.batch_size)
    assert tuned_state.keys() == plain_state.keys()
    for key in ("params",):
        assert all(torch.equal(tuned_state[key][k], plain_state[key][k]) for k in tuned_state[key])
    assert tuned_state["grads"] == plain_state["grads"] == [None, None]
    assert tuned_state["optimizer"] == plain_state["optimizer"]  # Adam state still empty
    assert tuned_state["scheduler"] == plain_state["scheduler"]
    assert torch.equal(tuned_state["torch_rng"], plain_state["torch_rng"])
    assert np.array_equal(tuned_state["numpy_rng"], plain_state["numpy_rng"])
    assert tuned_state["python_rng"] == plain_state["python_rng"]
    assert torch.equal(tuned_state["batch"], plain_state["batch"])  # same shuffle
    assert tuned_state["step"] == plain_state["step"] == (0, 0)
    assert tuned_state["training"] == plain_state["training"]
    # ... and so the whole run is identical, bit for bit
    assert all(torch.equal(tuned_final[k], plain_final[k]) for k in tuned_final)


def test_trials_log_nothing_and_loggers_get_the_batch_size(tmp_path: Path) -> None:
    logger = RecordingLogger()
    tuner = BatchSizeTuner(verbose=False, max_val=64)
    model = LimitedModel()
    _fit(model, tmp_path, tuner, logger=logger, log_every_n_steps=1, max_steps=3)
    assert model.trial_steps > 0
    steps = [step for step, metrics in logger.metrics if "train_loss" in metrics]
    assert steps == [0, 1, 2]  # the real steps only
    assert {"batch_size": 64, "tuned_batch_size": 64} in logger.hparams  # max_val, no OOM


def test_non_oom_error_propagates_with_its_traceback(tmp_path: Path) -> None:
    class Broken(LimitedModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch.shape[0] > 16:
                self.raise_shape_error(batch)
            return super().training_step(batch, batch_idx)

        def raise_shape_error(self, batch: torch.Tensor) -> None:
            raise ValueError(f"a real bug at batch size {batch.shape[0]}")

    model = Broken(batch_size=4)
    with pytest.raises(ValueError, match="a real bug at batch size 32") as info:
        _fit(model, tmp_path, BatchSizeTuner(verbose=False))
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert frames[-2:] == ["training_step", "raise_shape_error"]
    assert model.batch_size == 4  # left as found
    assert "log" not in vars(model)  # the trial-time no-op `log` is gone


@pytest.mark.slow
def test_resume_does_not_retune_unless_asked(tmp_path: Path) -> None:
    def checkpointing() -> dict[str, Any]:
        ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
        return {"callbacks": [ckpt], "enable_checkpointing": True}

    first = BatchSizeTuner(verbose=False)
    _fit(LimitedModel(limit=100, length=176), tmp_path, first, max_steps=-1, **checkpointing())
    assert first.batch_size == _expected(100)
    last = str(tmp_path / "ckpt" / "last.ckpt")

    resumed, model = BatchSizeTuner(verbose=False), LimitedModel(limit=100, length=176)
    _fit(model, tmp_path, resumed, max_steps=-1, max_epochs=2, ckpt_path=last, **checkpointing())
    assert model.trial_steps == 0
    assert model.batch_size == resumed.batch_size == first.batch_size
    assert resumed.trials == first.trials
    assert model.train_sizes == [first.batch_size] * 2

    again = BatchSizeTuner(verbose=False, retune_on_resume=True)
    model = LimitedModel(limit=50, length=176)
    _fit(model, tmp_path, again, max_steps=-1, max_epochs=3, ckpt_path=last, **checkpointing())
    assert model.trial_steps > 0
    assert model.batch_size == again.batch_size == _expected(50)


def test_dataset_smaller_than_a_candidate_caps_the_search(tmp_path: Path) -> None:
    tuner = BatchSizeTuner(verbose=False, margin=0.0)
    _fit(LimitedModel(length=100), tmp_path, tuner, max_steps=1)
    assert [t.batch_size for t in tuner.trials] == [8, 16, 32, 64, 96]
    assert tuner.batch_size == 96


def test_scale_lr_scales_param_groups_and_scheduler(tmp_path: Path) -> None:
    tuner = BatchSizeTuner(verbose=False, scale_lr=True, margin=0.0, max_val=64)
    model = LimitedModel(batch_size=16)
    trainer = _fit(model, tmp_path, tuner, max_steps=1)
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.base_lrs == [pytest.approx(0.04)]  # 0.01 * 64 / 16
    assert trainer.optimizers[0].param_groups[0]["initial_lr"] == pytest.approx(0.04)


@pytest.mark.slow
def test_dry_run_reports_but_keeps_the_batch_size(tmp_path: Path) -> None:
    logger = RecordingLogger()
    tuner = BatchSizeTuner(verbose=False, dry_run=True, scale_lr=True)
    model = LimitedModel(limit=200, batch_size=12)
    trainer = _fit(model, tmp_path, tuner, logger=logger)
    assert tuner.batch_size == _expected(200)
    assert model.batch_size == 12
    assert model.train_sizes == [12, 12]
    assert trainer.optimizers[0].param_groups[0]["initial_lr"] == pytest.approx(0.01)
    assert {"batch_size": 12, "tuned_batch_size": _expected(200)} in logger.hparams
    assert tuner.doctor_figures() == {"batch_size": 12, "tuned_batch_size": _expected(200)}
    assert [f.id for f in tuner.doctor_findings()] == ["batch-size-multiple", "batch-size-trials"]


@pytest.mark.slow
def test_throughput_mode_picks_the_fastest_per_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fake clock that only the training step advances: 2 ms per step plus 2 us per sample^2,
    # so the time per sample, 2ms/b + 2us*b, is lowest at b = sqrt(1000) ~ 32.
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    class Timed(LimitedModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            clock[0] += 2e-3 + 2e-6 * batch.shape[0] ** 2
            return super().training_step(batch, batch_idx)

    tuner = BatchSizeTuner(mode="throughput", verbose=False, max_val=512)
    _fit(Timed(limit=300), tmp_path, tuner)
    speeds = {t.batch_size: t.samples_per_sec for t in tuner.trials if t.fits}
    assert speeds[32] == pytest.approx(32 / (2e-3 + 2e-6 * 32**2))
    assert tuner.batch_size == 32
    assert all(t.samples_per_sec is None for t in tuner.trials if not t.fits)


class SizedDataModule(LightningDataModule):  # the batch size lives in the datamodule's hparams
    def __init__(self) -> None:
        super().__init__()
        self.save_hyperparameters({"batch_size": 4})

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(RandomDataset(32, 512), batch_size=self.hparams["batch_size"])

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(RandomDataset(32, 512), batch_size=self.hparams["batch_size"])


@pytest.mark.slow
def test_batch_size_on_the_datamodule_hparams(tmp_path: Path) -> None:
    class NoSize(LimitedModel):
        def __init__(self) -> None:
            super().__init__(limit=100)
            del self.batch_size

    tuner = BatchSizeTuner(verbose=False)
    datamodule = SizedDataModule()
    model = NoSize()
    trainer = Trainer(
        callbacks=[tuner], **quiet_trainer_kwargs(tmp_path, max_steps=1, limit_val_batches=0)
    )
    trainer.fit(model, datamodule=datamodule)
    assert datamodule.hparams["batch_size"] == tuner.batch_size == _expected(100)
    assert model.train_sizes == [_expected(100)]


def test_missing_attribute_says_where_it_looked(tmp_path: Path) -> None:
    class NoSize(LimitedModel):
        def __init__(self) -> None:
            super().__init__()
            del self.batch_size
            self.bs = 8

        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(RandomDataset(32, 64), batch_size=self.bs)

    with pytest.raises(BatchSizeTuningError, match=r"looked at `model.batch_size`, `model.hparams"):
        _fit(NoSize(), tmp_path, BatchSizeTuner(verbose=False))


def test_multiple_of_itself_does_not_fit(tmp_path: Path) -> None:
    model = LimitedModel(limit=7, batch_size=4)
    with pytest.raises(
        BatchSizeTuningError, match="not even a batch of `multiple_of`=8 samples fits"
    ):
        _fit(model, tmp_path, BatchSizeTuner(verbose=False))
    assert model.batch_size == 4


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"mode": "power"},
            ValueError,
            "`mode` must be 'max', 'throughput' or 'nearest', got 'power'",
        ),
        ({"multiple_of": 0}, ValueError, "`multiple_of` must be a positive int, got 0"),
        ({"init_val": 2.0}, TypeError, "`init_val` must be an int, got float 2.0"),
        ({"max_val": 4}, ValueError, r"`max_val` \(4\) must be >= `multiple_of` \(8\)"),
        ({"steps_per_trial": -1}, ValueError, "`steps_per_trial` must be a positive int, got -1"),
        ({"mode": "throughput", "steps_per_trial": 1}, ValueError, "one warm-up step"),
        ({"mode": "nearest", "steps_per_trial": 1}, ValueError, "in 'nearest' mode"),
        (
            {"init_val": 64, "max_val": 8},
            ValueError,
            r"`init_val` \(64\) must be <= `max_val` \(8\): .* lower `init_val` or raise "
            "`max_val`",
        ),
        ({"margin": 1.0}, ValueError, r"`margin` must be in \[0, 1\), got 1.0"),
        ({"margin": "5%"}, TypeError, "`margin` must be a float, got str"),
        ({"attr_name": ""}, TypeError, "`attr_name` must be a non-empty str"),
        ({"scale_lr": 1}, TypeError, "`scale_lr` must be a bool, got int 1"),
    ],
)
def test_bad_arguments_fail_at_construction(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        BatchSizeTuner(**kwargs)


@pytest.mark.slow
def test_rich_table_on_rank_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fit(LimitedModel(limit=40), tmp_path, BatchSizeTuner(max_val=64, margin=0.0), max_steps=1)
    err = capsys.readouterr().err
    assert "BatchSizeTuner (mode='max')" in err
    assert "40 <- chosen" in err


# ------------------------------------------------------------------------- DDP


def _ddp_rank(tmp: str, limits: list[int]) -> tuple[int | None, list[Any], list[int], float]:
    import os

    rank = int(os.environ["RANK"])
    tuner = BatchSizeTuner(verbose=False)
    model = LimitedModel(limit=limits[rank], batch_size=4)
    trainer = Trainer(
        callbacks=[tuner],
        **quiet_trainer_kwargs(tmp, devices=2, strategy="ddp", max_steps=2, limit_val_batches=1),
    )
    trainer.fit(model)
    return tuner.batch_size, list(tuner.trials), model.train_sizes, float(model.layer.weight.sum())


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_ddp_ranks_with_different_limits_agree_on_the_smaller(tmp_path: Path) -> None:
    (size0, trials0, sizes0, w0), (size1, trials1, sizes1, w1) = run_ddp(
        _ddp_rank, str(tmp_path), [500, 150], timeout=200
    )
    assert size0 == size1 == _expected(150)
    assert [t[:2] for t in trials0] == [t[:2] for t in trials1]  # same sizes, same verdicts
    assert sizes0 == sizes1 == [_expected(150)] * 2
    assert w0 == pytest.approx(w1)  # DDP replicas still in sync after the trials


def _ddp_rank_raises(tmp: str) -> str:
    import os

    rank = int(os.environ["RANK"])

    class BrokenOnRank1(LimitedModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if rank == 1 and batch.shape[0] > 16:
                raise KeyError("a real bug on rank 1")
            return super().training_step(batch, batch_idx)

    trainer = Trainer(
        callbacks=[BatchSizeTuner(verbose=False)],
        **quiet_trainer_kwargs(tmp, devices=2, strategy="ddp", max_steps=2, limit_val_batches=1),
    )
    try:
        trainer.fit(BrokenOnRank1())
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_ddp_error_on_one_rank_propagates_without_deadlock(tmp_path: Path) -> None:
    rank0, rank1 = run_ddp(_ddp_rank_raises, str(tmp_path), timeout=200)
    assert rank1 == "KeyError: 'a real bug on rank 1'"
    assert rank0.startswith("BatchSizeTuningError: BatchSizeTuner: 1 other rank(s) raised")


class RankLimitedModel(LimitedModel):
    """Each rank has its own memory limit (``limits[global_rank]``)."""

    def __init__(self, limits: tuple[int, int], out: str) -> None:
        super().__init__(limit=max(limits), length=1024)
        self.limits, self.out = limits, out

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.limit = self.limits[self.global_rank]
        return super().training_step(batch, batch_idx)

    def on_train_start(self) -> None:
        super().on_train_start()
        size = self.trainer.train_dataloader.batch_size
        Path(self.out, f"rank{self.global_rank}").write_text(str(size))


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_ddp_spawn_ranks_agree(tmp_path: Path) -> None:
    model = RankLimitedModel((90, 300), str(tmp_path))
    trainer = Trainer(
        callbacks=[BatchSizeTuner(verbose=False)],
        **quiet_trainer_kwargs(
            tmp_path, devices=2, strategy="ddp_spawn", max_steps=1, limit_val_batches=0
        ),
    )
    trainer.fit(model)
    sizes = [int((tmp_path / f"rank{r}").read_text()) for r in (0, 1)]
    assert sizes == [_expected(90)] * 2


# ---------------------------------------------------------------------- doctor


_SCRIPT = """
from typing import Any
import torch
from pytorch_lightning import Trainer
from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader
{imports}

class Model(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.batch_size = 30

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch.shape[0] > 100:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return super().training_step(batch, batch_idx)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 512), batch_size=self.batch_size)

model = Model()
trainer = Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                  callbacks={callbacks})
trainer.fit(model)
assert model.batch_size == {expected}, model.batch_size
"""


def test_doctor_reports_the_batch_size_without_changing_the_run(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT.format(imports="", callbacks="[]", expected=30)))
    result = run_script(script)
    assert result.exit_code == 0
    assert result.report.runs[0].figures["batch_size"] == 30
    # The tuner's finding and SpeedAdvisor's share an id: the report keeps the advisor's
    # (it names where: the train dataloader) and says the tuner found it too.
    (finding,) = [f for f in result.report.findings if f.id == "batch-size-multiple"]
    assert finding.severity == "info"  # on the CPU; a warning on a GPU
    assert finding.location == "train_dataloader"
    assert finding.figures["batch_size"] == 30
    assert finding.figures["also_reported_by"] == ["batch_size"]
    assert not [d for d in result.report.findings if d.component == "batch_size"]


@pytest.mark.slow
def test_doctor_shows_the_trials_of_a_tuner_the_script_added(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            _SCRIPT.format(
                imports="from lightning_speedpack import BatchSizeTuner",
                callbacks="[BatchSizeTuner(verbose=False)]",
                expected=88,
            )
        )
    )
    result = run_script(script)
    assert result.exit_code == 0
    assert result.report.runs[0].figures["batch_size"] == 88
    assert result.report.runs[0].figures["tuned_batch_size"] == 88
    by_id = {f.id: f for f in result.report.findings if f.component == "batch_size"}
    assert sorted(by_id) == ["batch-size-few-steps", "batch-size-trials"]
    steps = by_id["batch-size-few-steps"]  # 512 samples: 88 leaves 6 steps, 30 left 18
    assert steps.severity == "warning"
    assert steps.figures == {
        "batch_size": 88,
        "original_batch_size": 30,
        "samples": 512,
        "steps_per_epoch": 6,
        "original_steps_per_epoch": 18,
    }
    assert steps.fix is not None
    assert steps.fix.startswith("pass `max_val=48` (10 steps per epoch)")
    finding = by_id["batch-size-trials"]
    assert "chose batch size 88 after" in finding.message
    assert "88   yes" in finding.message
    assert "<- chosen" in finding.message
    assert [row[:2] for row in finding.figures["trials"]][:5] == [
        [8, True],
        [16, True],
        [32, True],
        [64, True],
        [128, False],
    ]


# --- tables in the run (issue 15) ----------------------------------------------------------------


def _csv(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@each_namespace
def test_csv_logger_gets_the_trials_table_and_tuned_size(ns: Namespace, tmp_path: Path) -> None:
    import json

    tuner = BatchSizeTuner(mode="throughput", max_val=32, steps_per_trial=2, verbose=False)
    logger = ns.sub("loggers").CSVLogger(tmp_path / "csv")
    trainer = ns.Trainer(
        callbacks=[tuner],
        **quiet_trainer_kwargs(tmp_path, max_steps=1, logger=logger, limit_val_batches=0),
    )
    # at most 4x the batch size and at least 32 steps per epoch: no caveat, one finding
    trainer.fit(ns.SizedBoringModel(batch_size=8, length=1024))
    log_dir = Path(logger.log_dir)
    rows = _csv(log_dir / "speedpack_batch_size_trials.csv")
    assert [(int(r["batch_size"]), r["fits"]) for r in rows] == [
        (t.batch_size, str(t.fits)) for t in tuner.trials
    ]
    assert [float(r["samples_per_sec"]) for r in rows] == [t.samples_per_sec for t in tuner.trials]
    assert [int(r["batch_size"]) for r in rows if r["chosen"] == "True"] == [tuner.batch_size]
    summary = json.loads((log_dir / "speedpack_summary.json").read_text())
    assert summary["speedpack/tuned_batch_size"] == tuner.batch_size
    assert summary["speedpack/batch_size"] == tuner.batch_size
    (finding,) = _csv(log_dir / "speedpack_findings.csv")
    assert (finding["component"], finding["id"]) == ("batch_size", "batch-size-trials")


@each_namespace
def test_report_only_logs_the_size_in_use_and_no_trials(ns: Namespace, tmp_path: Path) -> None:
    import json

    logger = ns.sub("loggers").CSVLogger(tmp_path / "csv")
    trainer = ns.Trainer(
        callbacks=[BatchSizeTuner(report_only=True, verbose=False)],
        **quiet_trainer_kwargs(tmp_path, max_steps=1, logger=logger, limit_val_batches=0),
    )
    trainer.fit(ns.SizedBoringModel(batch_size=12))
    log_dir = Path(logger.log_dir)
    assert not (log_dir / "speedpack_batch_size_trials.csv").exists()
    summary = json.loads((log_dir / "speedpack_summary.json").read_text())
    assert summary["speedpack/batch_size"] == 12
    assert "speedpack/tuned_batch_size" not in summary
    assert [r["id"] for r in _csv(log_dir / "speedpack_findings.csv")] == ["batch-size-multiple"]
