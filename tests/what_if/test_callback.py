"""WhatIf on real fits: invisible to the fit, applies what it is told, safe with streams and errors.

No test here asserts a speed: which candidate wins is the benchmark's business
(``benchmarks/what_if.py``). The tests that are about *applying* winners give the callback its
measurements through ``Trials.run`` (said where they do); everything else runs real trials.
"""

from __future__ import annotations

import copy
import csv
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_speedpack import WhatIf, WhatIfError
from lightning_speedpack.core.tables import TABLES, csv_file_name
from lightning_speedpack.data_xray.ceilings import cpu_count
from lightning_speedpack.what_if import engine
from lightning_speedpack.what_if import loader_trials as lt
from lightning_speedpack.what_if.measure import NOT_APPLICABLE, Measurement
from lightning_speedpack.what_if.report import COLUMNS
from tests.helpers import global_state, namespaces
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace
from tests.helpers.wandb_files import read_table
from tests.what_if.planted import Stream, conv_model

# A budget of its own: these fits are a few steps long, and by default the trials of a fit of
# known length get 5% of it.
QUICK = {"steps": 2, "rounds": 1, "verbose": False, "budget_s": 60}


def _recorder(ns: Namespace) -> Any:
    class Recorder(ns.Callback):  # type: ignore[misc, name-defined]
        """The first batch the fit trains on, the parameters at train start, what it ran with."""

        def __init__(self) -> None:
            self.first: Any = None
            self.params: list[torch.Tensor] = []
            self.loader: Any = None
            self.channels_last: list[bool] = []
            self.fused: list[bool] = []

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.params = [p.detach().clone() for p in pl_module.parameters()]
            self.loader = trainer.train_dataloader

        def on_train_batch_start(
            self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
        ) -> None:
            if self.first is None:
                self.first = [t.clone() for t in batch]
            x = batch[0]
            self.channels_last.append(
                x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
            )
            self.fused.append(bool(trainer.optimizers[0].param_groups[0].get("fused")))

    return Recorder()


def _fit(ns: Namespace, tmp_path: Path, callbacks: list[Any], **model: Any) -> tuple[Any, Any]:
    torch.manual_seed(0)
    recorder = _recorder(ns)
    trainer = ns.Trainer(
        callbacks=[*callbacks, recorder],
        **quiet_trainer_kwargs(tmp_path, max_steps=3, limit_val_batches=0),
    )
    trainer.fit(conv_model(ns.name)(**model))
    return trainer, recorder


@pytest.mark.slow
@each_namespace
def test_the_fit_sees_the_same_first_batch_and_parameters_as_without_it(
    ns: Namespace, tmp_path: Path
) -> None:
    _, plain = _fit(ns, tmp_path / "plain", [])
    knobs = ["num_workers", "cache", "channels_last", "fused_optimizer", "precision"]
    what_if = WhatIf(knobs=knobs, **QUICK)
    _, tried = _fit(ns, tmp_path / "tried", [what_if])

    assert [m.knob for m in what_if.measurements] == knobs
    for m in what_if.measurements:  # each knob was measured here (none needs CUDA)
        assert m.gain is not None, (m.knob, m.reason)
    assert all(torch.equal(a, b) for a, b in zip(plain.first, tried.first, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(plain.params, tried.params, strict=True))
    assert tried.loader.num_workers == 0  # nothing applied without `apply`
    assert not any(tried.channels_last)
    assert not any(tried.fused)


@each_namespace
def test_cuda_only_knobs_say_why_they_do_not_apply_on_a_cpu_run(
    ns: Namespace, tmp_path: Path
) -> None:
    what_if = WhatIf(knobs=["pin_memory", "cudnn_benchmark", "tf32", "prefetch_factor"], **QUICK)
    _fit(ns, tmp_path, [what_if])
    reasons = {m.knob: (m.status, m.reason) for m in what_if.measurements}
    for knob in ("pin_memory", "cudnn_benchmark", "tf32"):
        assert reasons[knob] == (NOT_APPLICABLE, "needs a CUDA device (this run is on CPU)")
    assert reasons["prefetch_factor"] == (NOT_APPLICABLE, "no worker processes")


def _given(monkeypatch: pytest.MonkeyPatch, *found: Measurement) -> list[int]:
    """Give WhatIf these measurements instead of running trials (the tests of *applying*)."""
    calls: list[int] = []

    def run(self: engine.Trials) -> list[Measurement]:
        calls.append(1)
        return copy.deepcopy(list(found))

    monkeypatch.setattr(engine.Trials, "run", run)
    return calls


def _won(knob: str, value: Any, side: str = "loader", **extra: Any) -> Measurement:
    m = Measurement(knob, side, "today", str(value), value, [100.0] * 3, [200.0] * 3)
    m.extra.update(extra)
    return m


@each_namespace
def test_apply_rebuilds_the_fits_loader_and_a_resume_keeps_it(
    ns: Namespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    _given(monkeypatch, _won("num_workers", 2), _won("persistent_workers", True, workers=2))
    what_if = WhatIf(apply=["num_workers", "persistent_workers"], **QUICK)
    ckpt = ns.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    with caplog.at_level(logging.INFO):
        trainer = ns.Trainer(
            callbacks=[what_if, ckpt],
            **quiet_trainer_kwargs(
                tmp_path,
                max_epochs=2,
                limit_train_batches=2,
                limit_val_batches=0,
                enable_checkpointing=True,
            ),
        )
        model = conv_model(ns.name)()
        trainer.fit(model)
    loader = trainer.train_dataloader
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == (2, True, 2)
    assert type(loader.dataset).__name__ == "NappingImages"
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler)  # shuffle kept
    assert what_if.state_dict() == {"applied": {"num_workers": 2, "persistent_workers": True}}
    assert "WhatIf: num_workers today -> 2 for this fit: measured 2.00x (2.00-2.00)" in caplog.text
    saved = torch.load(ckpt.last_model_path, weights_only=True)
    assert saved["callbacks"][what_if.state_key] == what_if.state_dict()

    calls = _given(monkeypatch)  # a resume runs no trials
    resumed = WhatIf(apply=["num_workers", "persistent_workers"], **QUICK)
    trainer = ns.Trainer(
        callbacks=[resumed, ns.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)],
        **quiet_trainer_kwargs(
            tmp_path,
            max_epochs=3,
            limit_train_batches=2,
            limit_val_batches=0,
            enable_checkpointing=True,
        ),
    )
    trainer.fit(conv_model(ns.name)(), ckpt_path=ckpt.last_model_path)
    assert calls == []
    assert (trainer.train_dataloader.num_workers, trainer.train_dataloader.persistent_workers) == (
        2,
        True,
    )


def test_persistent_workers_measured_with_workers_not_applied_are_not_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # num_workers 0 -> 2 only "uncertain"; persistent_workers won with those 2 workers.
    uncertain = _won("num_workers", 2)
    uncertain.after = [200.0, 200.0, 101.0]
    _given(monkeypatch, uncertain, _won("persistent_workers", True, workers=2))
    what_if = WhatIf(apply=["num_workers", "persistent_workers"], **QUICK)
    trainer, _ = _fit(namespaces.NAMESPACES[0], tmp_path, [what_if])
    assert what_if.applied.settings == {}
    assert (trainer.train_dataloader.num_workers, trainer.train_dataloader.persistent_workers) == (
        0,
        False,
    )


@each_namespace
def test_channels_last_and_a_fused_optimizer_are_applied_for_the_fit_and_taken_back(
    ns: Namespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _given(
        monkeypatch,
        _won("channels_last", True, "model"),
        _won("fused_optimizer", True, "model"),
        _won("precision", "bf16-mixed", "model"),  # a winner never applied at run time
    )
    before = global_state.snapshot()
    what_if = WhatIf(apply=True, **QUICK)
    trainer, recorder = _fit(ns, tmp_path, [what_if])
    assert recorder.channels_last == [True] * 3
    assert recorder.fused == [True] * 3
    assert set(what_if.applied.settings) == {"channels_last", "fused_optimizer"}
    assert str(trainer.precision) == "32-true"
    module = trainer.lightning_module
    assert "on_after_batch_transfer" not in module.__dict__
    assert module.net[0].weight.is_contiguous()
    assert global_state.diff(before, global_state.snapshot()) == {}
    precision = next(f for f in what_if.doctor_findings() if f.id == "what-if-precision")
    assert precision.severity == "warning"
    assert precision.fix == 'Trainer(precision="bf16-mixed")'


@each_namespace
def test_a_stream_that_ignores_its_workers_never_gets_more_of_them(
    ns: Namespace, tmp_path: Path
) -> None:
    duplicating = WhatIf(knobs=["num_workers", "cache"], **QUICK)
    _fit(ns, tmp_path / "dup", [duplicating], stream=True, shards=False, n=64)
    workers, cache = duplicating.measurements
    assert workers.status == NOT_APPLICABLE
    assert "does not shard by get_worker_info()" in (workers.reason or "")
    assert cache.status == NOT_APPLICABLE

    sharding = WhatIf(knobs=["num_workers"], **QUICK)
    _fit(ns, tmp_path / "shard", [sharding], stream=True, shards=True, n=256)
    assert sharding.measurements[0].gain is not None


class _LibraryStream(Stream):
    """A stream a library would own: never read aside from the fit."""

    reads = 0

    def __iter__(self) -> Any:
        type(self).reads += 1
        return super().__iter__()


_LibraryStream.__module__ = "litdata.streaming.dataset"


@each_namespace
def test_a_library_stream_is_never_read_aside_from_the_fit(ns: Namespace, tmp_path: Path) -> None:
    base = conv_model(ns.name)

    class Model(base):  # type: ignore[misc, valid-type]
        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(_LibraryStream(32), batch_size=8)

    _LibraryStream.reads = 0
    what_if = WhatIf(knobs=["num_workers", "channels_last"], **QUICK)
    trainer = ns.Trainer(
        callbacks=[what_if], **quiet_trainer_kwargs(tmp_path, max_steps=2, limit_val_batches=0)
    )
    trainer.fit(Model(stream=True))
    assert _LibraryStream.reads == 1  # the fit's own iterator, nobody else's
    assert all(m.status == NOT_APPLICABLE for m in what_if.measurements)
    assert "library stream" in (what_if.measurements[0].reason or "")


@pytest.mark.skipif(cpu_count() < 2, reason="needs 2 cores: a grid of 1 and 2 workers")
def test_a_worker_count_that_would_not_fit_in_memory_is_not_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A machine with 12 GiB free whose workers take 5 GiB each (mocked: this one has more).
    def five_gib(side: Any, batch: Any, before: set[int]) -> lt.WorkerMemory:
        return lt.WorkerMemory(5 * 2**30, 12 * 2**30, None, lt.batch_bytes(batch))

    monkeypatch.setattr(lt, "worker_memory", five_gib)
    what_if = WhatIf(knobs=["num_workers"], **QUICK)
    _fit(namespaces.NAMESPACES[0], tmp_path, [what_if])
    (workers,) = what_if.measurements
    assert workers.candidate == "1"
    assert workers.reason == (
        "num_workers=2 not tried: 2 workers x 5.0 GiB measured each > 80% of the 12.0 GiB available"
    )


@each_namespace
def test_a_candidate_that_runs_out_of_memory_is_not_applicable_and_the_fit_goes_on(
    ns: Namespace, tmp_path: Path
) -> None:
    _, plain = _fit(ns, tmp_path / "plain", [])
    what_if = WhatIf(knobs=["channels_last", "fused_optimizer"], **QUICK)
    _, tried = _fit(ns, tmp_path / "oom", [what_if], oom_channels_last=True)
    channels_last, fused = what_if.measurements
    assert channels_last.status == NOT_APPLICABLE
    assert "ran out of memory" in (channels_last.reason or "")
    assert fused.gain is not None  # the next knob still ran
    assert all(torch.equal(a, b) for a, b in zip(plain.params, tried.params, strict=True))


@each_namespace
def test_a_training_step_that_raises_gives_a_clear_error_and_leaves_nothing_behind(
    ns: Namespace, tmp_path: Path
) -> None:
    before = namespaces.snapshot()
    model = conv_model(ns.name)(fail=True)
    initial = [p.detach().clone() for p in model.parameters()]
    trainer = ns.Trainer(
        callbacks=[WhatIf(knobs=["channels_last"], **QUICK)],
        **quiet_trainer_kwargs(tmp_path, max_steps=2, limit_val_batches=0),
    )
    with pytest.raises(WhatIfError, match="training_step raised in a trial") as info:
        trainer.fit(model)
    assert isinstance(info.value.__cause__, ValueError)
    assert all(torch.equal(a, p) for a, p in zip(initial, model.parameters(), strict=True))
    assert "process_dataloader" not in trainer.strategy.__dict__
    assert global_state.diff(before, namespaces.snapshot()) == {}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.filterwarnings("ignore:Consider setting `persistent_workers=True`")
def test_spawned_workers_are_tried_too(tmp_path: Path) -> None:
    ns = namespaces.NAMESPACES[0]
    what_if = WhatIf(knobs=["num_workers"], **QUICK)
    trainer, _ = _fit(ns, tmp_path, [what_if], workers=1, context="spawn", n=256)
    (workers,) = what_if.measurements
    assert workers.today == "1"
    assert workers.gain is not None
    assert trainer.train_dataloader.multiprocessing_context is not None


@each_namespace
def test_the_table_reaches_wandb_and_csv(ns: Namespace, tmp_path: Path, wandb_offline: Any) -> None:
    import wandb

    what_if = WhatIf(knobs=["num_workers", "fused_optimizer"], **QUICK)
    loggers = ns.sub("loggers")
    csv_logger = loggers.CSVLogger(tmp_path, name="run")
    wandb_logger = loggers.WandbLogger(offline=True, save_dir=str(wandb_offline.dir))
    trainer = ns.Trainer(
        callbacks=[what_if],
        **quiet_trainer_kwargs(
            tmp_path, max_steps=2, limit_val_batches=0, logger=[wandb_logger, csv_logger]
        ),
    )
    trainer.fit(conv_model(ns.name)())
    wandb.finish()

    run = wandb_offline.only_run()
    table = read_table(run, "speedpack/what_if")
    assert tuple(table["columns"]) == TABLES["speedpack/what_if"] == COLUMNS
    assert [row[0] for row in table["data"]] == ["num_workers", "fused_optimizer"]
    gains = {m.knob: round(m.gain, 3) for m in what_if.measurements if m.gain is not None}
    assert gains  # what the summary carries was measured
    for knob, gain in gains.items():
        assert run.summary[f"speedpack/what_if/{knob}_gain"] == gain

    path = Path(csv_logger.log_dir) / csv_file_name("speedpack/what_if")
    with path.open() as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == COLUMNS
    assert [row[0] for row in rows[1:]] == ["num_workers", "fused_optimizer"]
    figures = what_if.doctor_figures()["what_if"]
    assert figures["columns"] == list(COLUMNS)
    assert len(figures["rows"]) == 2


@each_namespace
def test_a_short_fit_gets_a_short_budget_and_says_how_to_give_more(
    ns: Namespace, tmp_path: Path
) -> None:
    # 3 steps of a few milliseconds: 5% of that is far less than one trial's 0.25 s.
    what_if = WhatIf(knobs=["num_workers", "fused_optimizer"], steps=2, rounds=1, verbose=False)
    _fit(ns, tmp_path, [what_if])
    for m in what_if.measurements:  # today's pace, measured first, leaves no time for rounds
        assert m.status == "not tried"
        assert "5% of this fit's projected" in (m.reason or "")
        assert "WhatIf(budget_s=...)" in (m.reason or "")
    assert what_if.trial_seconds is not None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"knobs": ["workers"]}, ValueError, "unknown knob"),
        ({"knobs": "num_workers"}, TypeError, "list of knob names"),
        ({"steps": 1}, ValueError, "`steps` must be an int >= 2"),
        ({"rounds": 0}, ValueError, "`rounds` must be an int >= 1"),
        ({"budget_s": -1}, ValueError, "`budget_s` must be a positive number"),
        ({"min_gain": 0.9}, ValueError, "`min_gain` must be a number >= 1.0"),
        ({"apply": ["precision"]}, ValueError, "never applied at run time"),
        ({"apply": "yes"}, TypeError, "`apply` must be a bool or a list"),
    ],
)
def test_bad_arguments_are_refused_at_construction(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        WhatIf(**kwargs)


def _ddp_apply(root: str) -> dict[str, Any]:
    """A rank: its own trials disagree; the fit must use rank 0's winner on every rank."""
    import os

    import pytorch_lightning as pl

    rank = int(os.environ["RANK"])

    def run(self: engine.Trials) -> list[Measurement]:
        return [_won("num_workers", 2 if rank == 0 else 1)]

    engine.Trials.run = run  # type: ignore[method-assign]  # this rank's process only
    what_if = WhatIf(apply=["num_workers"], **QUICK)
    trainer = pl.Trainer(
        callbacks=[what_if],
        strategy="ddp",
        **quiet_trainer_kwargs(root, devices=2, max_steps=2, limit_val_batches=0),
    )
    trainer.fit(conv_model("pytorch_lightning")(n=64))
    return {
        "workers": trainer.train_dataloader.num_workers,
        "sampler": type(trainer.train_dataloader.sampler).__name__,
        "applied": what_if.applied.settings,
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_under_ddp_every_rank_applies_rank_zeros_winners(tmp_path: Path) -> None:
    from tests.helpers.ddp import run_ddp

    ranks = run_ddp(_ddp_apply, str(tmp_path), timeout=240)
    assert [r["workers"] for r in ranks] == [2, 2]
    assert [r["sampler"] for r in ranks] == ["DistributedSampler"] * 2
    assert ranks[0]["applied"] == ranks[1]["applied"] == {"num_workers": 2}


@each_namespace
def test_the_ledger_charges_the_trials_to_whatif_as_a_one_time_cost(
    ns: Namespace, tmp_path: Path
) -> None:
    from lightning_speedpack import WallTimeLedger

    what_if = WhatIf(knobs=["num_workers", "fused_optimizer"], **QUICK)
    ledger = WallTimeLedger()
    _fit(ns, tmp_path, [what_if, ledger])
    assert what_if.trial_seconds is not None
    charged = ledger.callback_seconds()["WhatIf"]
    # Python's own collections during the trials went to `garbage_collection`; WhatIf's clock
    # counted them, so they are added back to compare
    collected = sum(s for (k, _), s in ledger.collector.seconds.items() if k == "callback:WhatIf")
    assert charged + collected >= what_if.trial_seconds  # the trials, inside the data setup
    assert ledger.seconds()["epoch_start"] < what_if.trial_seconds
    (finding,) = [f for f in ledger.doctor_findings() if f.id == "callback-time"]
    assert finding.severity == "info"
    assert finding.message.startswith("WhatIf's trials took")
