"""StepTimeline on real Trainers: ranges, the live breakdown, the trace window, cleanup."""

from __future__ import annotations

import csv
import json
import pickle
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Callback, Trainer
from pytorch_lightning.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_speedpack.core import events, sampling
from lightning_speedpack.core.hook_hub import HookHub
from lightning_speedpack.core.registry import DoctorContext, registered_diagnostics
from lightning_speedpack.sync_points import SyncPointWarnings
from lightning_speedpack.timeline import PHASES, NvtxApi, RecordingNvtx, StepTimeline
from lightning_speedpack.timeline.callback import TRACE_DIR_ENV, TRACE_ENV
from tests.helpers import global_state
from tests.helpers.loggers import MemoryLogger
from tests.helpers.models import TinyCNN, quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace

PHASE_RANGES = {f"speedpack/{p}" for p in PHASES}


def _clean() -> None:
    """What every fit must leave: no profiler, no sync listener."""
    assert not torch.autograd._profiler_enabled()
    assert events.subscriber_count() == 0


# ---- arguments ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"ranges": 1}, TypeError, "`ranges` must be a bool"),
        ({"nvtx": "on"}, ValueError, "`nvtx` must be 'auto'"),
        ({"nvtx": 1}, TypeError, "`nvtx` must be 'auto'"),
        ({"trace_steps": 5}, TypeError, "`trace_steps` must be None or a pair"),
        ({"trace_steps": (-1, 2)}, ValueError, "start >= 0"),
        ({"trace_dir": 3}, TypeError, "`trace_dir` must be a path"),
        ({"log_every_n_steps": 0}, ValueError, "positive int, got 0"),
        ({"log_every_n_steps": 2.0}, TypeError, "`log_every_n_steps` must be an int"),
        ({"record_shapes": "yes"}, TypeError, "`record_shapes` must be a bool"),
        ({"with_stack": True}, ValueError, "`with_stack` only apply to a trace window"),
        ({"sample_every_n_steps": 0}, ValueError, "must be >= 1"),
        ({"sample_every_n_steps": True}, TypeError, "`sample_every_n_steps` must be an int"),
        ({"sample_every_n_steps": 2.0}, TypeError, "`sample_every_n_steps` must be an int"),
    ],
)
def test_arguments_are_validated(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        StepTimeline(**kwargs)


def test_nvtx_true_needs_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="needs CUDA"):
        StepTimeline(nvtx=True)


# ---- the trace window, both namespaces -------------------------------------------------------


def _syncing_model(ns: Namespace) -> Any:
    class Syncing(ns.BoringModel):  # type: ignore[name-defined, misc]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.last = out["loss"].item()  # the planted sync
            return out

    return Syncing()


def _planted_line(model: Any) -> int:
    return int(type(model).training_step.__code__.co_firstlineno) + 2


def _metrics(logger_dir: Path) -> list[dict[str, str]]:
    (path,) = logger_dir.glob("**/metrics.csv")
    with path.open() as f:
        return list(csv.DictReader(f))


@each_namespace
def test_trace_window_phases_syncs_and_logged_keys(ns: Namespace, tmp_path: Path) -> None:
    before = global_state.snapshot()
    timeline = StepTimeline(trace_steps=(5, 3), trace_dir=tmp_path / "traces", log_every_n_steps=2)
    sync = SyncPointWarnings(mode="summary", include_cpu=True)
    logger = ns.sub("loggers").CSVLogger(tmp_path / "logs")
    trainer = ns.Trainer(
        callbacks=[timeline, sync],
        **quiet_trainer_kwargs(tmp_path, max_steps=10, logger=logger),
    )
    model = _syncing_model(ns)
    trainer.fit(model)

    (trace,) = (tmp_path / "traces").iterdir()
    assert trace.name == "speedpack-steps5-7-rank0.pt.trace.json"
    assert timeline.trace_path == trace
    events_ = json.loads(trace.read_text())["traceEvents"]
    ranges = [e for e in events_ if str(e.get("name", "")).startswith("speedpack/")]
    steps = sorted(e["name"] for e in ranges if e["name"].startswith("speedpack/step_"))
    assert steps == ["speedpack/step_5", "speedpack/step_6", "speedpack/step_7"]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in ranges if e["name"] in steps]
    phases = [e for e in ranges if e["name"] in PHASE_RANGES]
    assert {e["name"] for e in phases} == PHASE_RANGES
    for name in PHASE_RANGES - {"speedpack/other"}:  # exactly one per profiled step
        # training_step twice: reopened inside optimizer.step's own range (the closure)
        per_step = 2 if name == "speedpack/training_step" else 1
        assert sum(e["name"] == name for e in phases) == 3 * per_step, name
    # every phase range lies inside one of the three step ranges
    assert all(any(a <= e["ts"] and e["ts"] + e["dur"] <= b for a, b in spans) for e in phases)
    instants = [e for e in ranges if e["name"].startswith("speedpack/sync/")]
    assert {e["name"] for e in instants} == {
        f"speedpack/sync/item@tests/timeline/test_callback.py:{_planted_line(model)}"
    }
    assert len(instants) == 3
    assert all(e["ph"] == "i" for e in instants)
    assert "aten::addmm" in [op.name for op in timeline.top_ops]

    rows = [r for r in _metrics(tmp_path / "logs") if r.get("throughput/phase/backward_ms")]
    assert [int(r["step"]) for r in rows] == [2, 4, 6, 8, 10]
    keys = {k for r in rows for k, v in r.items() if k.startswith("throughput/phase/") and v}
    assert keys == {f"throughput/phase/{p}_ms" for p in PHASES}
    _clean()
    assert global_state.diff(before, global_state.snapshot()) == {}


# ---- accounting: the logged phases add up to the step time ---------------------------------


class _SlowData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.004)
        return torch.randn(3, 32, 32), torch.tensor(i % 10)


class _SlowStep(TinyCNN):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(_SlowData(), batch_size=2)


class _BatchEndClock(Callback):
    """An independent clock: wall time at each on_train_batch_end, by global_step."""

    def __init__(self) -> None:
        self.ends: dict[int, float] = {}

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        self.ends[trainer.global_step] = time.perf_counter()


@pytest.mark.slow
def test_logged_phases_add_up_to_the_step_time(tmp_path: Path) -> None:
    timeline = StepTimeline(log_every_n_steps=4)
    clock = _BatchEndClock()
    trainer = Trainer(
        callbacks=[clock, timeline],
        **quiet_trainer_kwargs(tmp_path, max_steps=12, logger=CSVLogger(tmp_path / "logs")),
    )
    trainer.fit(_SlowStep())
    rows = {int(r["step"]): r for r in _metrics(tmp_path / "logs")}
    for step in (8, 12):  # windows of batches 4..7 and 8..11
        phases = {p: float(rows[step][f"throughput/phase/{p}_ms"]) for p in PHASES}
        measured_ms = (clock.ends[step] - clock.ends[step - 4]) / 4 * 1000
        assert sum(phases.values()) == pytest.approx(measured_ms, rel=0.10)
        assert phases["training_step"] >= 20.0  # the 20 ms sleep is the forward's
        assert phases["data_wait"] >= 8.0  # two samples of 4 ms each
    assert sum(timeline.phase_shares().values()) == pytest.approx(1.0)
    # the doctor's series: the same windows, the same means, in the order logged
    series = timeline.doctor_figures()["phase_ms_over_steps"]
    assert [step for step, _ in series] == sorted(rows) == [4, 8, 12]
    for step, means in series:
        assert set(means) == set(PHASES)
        for phase, value in means.items():
            assert value == pytest.approx(
                float(rows[step][f"throughput/phase/{phase}_ms"]), abs=1e-3
            )
    # a new fit starts a new series
    again = Trainer(callbacks=[timeline], **quiet_trainer_kwargs(tmp_path / "again", max_steps=4))
    again.fit(_SlowStep())
    assert [step for step, _ in timeline.phase_ms_over_steps] == [4]


@pytest.mark.slow
def test_a_sampled_timeline_times_one_step_in_n_with_its_data_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sampling, "SAMPLED_FROM_STEP", 4)  # 16 in use: a short fit
    timeline = StepTimeline(log_every_n_steps=4, sample_every_n_steps=4, nvtx=False)
    trainer = Trainer(
        callbacks=[timeline],
        **quiet_trainer_kwargs(tmp_path, max_steps=12, logger=CSVLogger(tmp_path / "logs")),
    )
    trainer.fit(_SlowStep())
    # steps 0-3 (before sampling starts), then 4 and 8 timed, each whole: the fetch before it
    # (opened at the previous step's end), the 20 ms forward, nothing of the steps left out
    assert timeline._clock.run.batches == 6
    phases = timeline.doctor_figures()["phase_ms"]
    assert phases["training_step"] >= 20.0
    assert phases["data_wait"] >= 8.0  # two samples of 4 ms each
    assert sum(timeline.phase_shares().values()) == pytest.approx(1.0)
    # each logged window holds one timed step: its means, never a window of zeros
    series = timeline.doctor_figures()["phase_ms_over_steps"]
    assert [step for step, _ in series] == [4, 8, 12]
    assert all(means["training_step"] >= 20.0 for _, means in series)
    figures = timeline.doctor_figures()
    assert (figures["phase_sample_every"], figures["phase_batches_timed"]) == (4, 6)
    assert (
        "(timed on 1 step in 4: 6 batches)"  # a fit too short to reach the back-off
        in timeline.doctor_findings()[0].message
    )


@pytest.mark.slow
def test_a_sampled_timeline_asleep_under_a_hub_times_and_logs_as_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under the doctor's hub the timeline sleeps between its samples: its batch hooks are not
    # called, yet it wakes for each logging step (6, 12) that falls between samples (4, 8, 12).
    monkeypatch.setattr(sampling, "SAMPLED_FROM_STEP", 4)
    runs = {}
    for hub in (False, True):
        timeline = StepTimeline(log_every_n_steps=6, sample_every_n_steps=4, nvtx=False)
        starts: list[int] = []
        start = timeline.on_train_batch_start
        timeline.on_train_batch_start = lambda t, *a, s=start, n=starts: (  # type: ignore[method-assign]
            n.append(t.global_step),
            s(t, *a),
        )
        logger = MemoryLogger()
        callbacks = [timeline, *([HookHub([timeline])] if hub else [])]
        trainer = Trainer(
            callbacks=callbacks, **quiet_trainer_kwargs(tmp_path, max_steps=14, logger=logger)
        )
        trainer.fit(_SlowStep())
        series = [step for step, _ in timeline.doctor_figures()["phase_ms_over_steps"]]
        logged = [
            step for step, m in logger.rows if any(k.startswith("throughput/phase/") for k in m)
        ]
        runs[hub] = (timeline._clock.run.batches, series, logged, starts)
    assert runs[True][:3] == runs[False][:3]
    assert runs[False][0] == 7  # steps 0-3, then 4, 8 and 12 timed
    assert runs[False][1] == runs[False][2] == [6, 12, 14]  # logged where the series is
    assert runs[False][3] == list(range(14))  # alone: called every batch
    # under the hub: the timed steps (4, 8, 12) and the batches whose end opens one (7, 11)
    # or logs (5, 11); asleep on 6, 9-10 and 13
    assert runs[True][3] == [0, 1, 2, 3, 4, 5, 7, 8, 11, 12]


@pytest.mark.slow
@pytest.mark.parametrize("hub", [False, True])
def test_a_sampled_timeline_hears_the_fetch_and_copy_of_its_timed_steps_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub: bool
) -> None:
    # Between samples the timeline has nothing to hear: it mutes itself on the profiler tap, so
    # the fetch and the copy of the steps left out (three actions a batch, six calls) do not
    # call it at all.
    monkeypatch.setattr(sampling, "SAMPLED_FROM_STEP", 0)
    timeline = StepTimeline(sample_every_n_steps=4, nvtx=False)
    heard: list[int] = []
    on_action = timeline.on_action

    def counted(name: str, started: bool, now: float) -> None:
        heard.append(trainer.global_step)
        on_action(name, started, now)

    timeline.on_action = counted  # type: ignore[method-assign]
    callbacks = [timeline, *([HookHub([timeline])] if hub else [])]
    trainer = Trainer(callbacks=callbacks, **quiet_trainer_kwargs(tmp_path, max_steps=9))
    trainer.fit(_SlowStep())
    # the timed steps 0, 4 and 8, each heard from its fetch to its copy, and no other
    assert sorted(set(heard)) == [0, 4, 8]
    assert timeline._clock.run.batches == 3
    phases = timeline.doctor_figures()["phase_ms"]
    assert phases["data_wait"] >= 8.0  # each timed step's fetch: two samples of 4 ms each
    assert phases["batch_transfer"] > 0.0


class _HubHooks(Callback):
    """Whether the hub's zero-grad hook is on, at each batch start (after the hub's own), and
    how many step hooks the optimizer has."""

    def __init__(self, hub: HookHub) -> None:
        self.hub, self.on, self.step_hooks = hub, [], []

    def on_train_batch_start(self, trainer: Trainer, *args: Any) -> None:
        self.on.append(self.hub.on_before_zero_grad is not None)
        optimizer = trainer.optimizers[0]
        hooks = (optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks)
        self.step_hooks.append(tuple(len(h) for h in hooks))


@pytest.mark.slow
def test_under_a_hub_the_steps_left_out_skip_the_timelines_hooks_altogether(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sampling, "SAMPLED_FROM_STEP", 0)
    timeline = StepTimeline(sample_every_n_steps=4, nvtx=False)
    hub = HookHub([timeline])
    spy = _HubHooks(hub)
    trainer = Trainer(callbacks=[timeline, hub, spy], **quiet_trainer_kwargs(tmp_path, max_steps=9))
    trainer.fit(_SlowStep())
    # the timeline alone took the hook: Lightning calls it on the sampled steps only
    assert spy.on == [True, False, False, False, True, False, False, False, True]
    # the optimizer's step hooks are in place on those steps only
    assert [n != (0, 0) for n in spy.step_hooks] == spy.on
    assert set(spy.step_hooks) == {(0, 0), (1, 1)}
    assert trainer.optimizers[0]._optimizer_step_pre_hooks == {}  # and gone after the fit
    assert timeline._clock.run.batches == 3
    assert timeline.doctor_figures()["phase_ms"]["data_wait"] >= 8.0  # the fetch before each
    assert hub.on_before_zero_grad is not None  # the fit is over: nothing is left quiet


# ---- NVTX through an injected table ---------------------------------------------------------


def _per_batch(rec: RecordingNvtx) -> list[list[str]]:
    """The pushes of each batch (split at each step range), `speedpack/` prefix dropped."""
    batches: list[list[str]] = []
    for name in rec.pushed():
        short = name.removeprefix("speedpack/")
        if short == "step":
            batches.append([])
        else:
            batches[-1].append(short)
    return batches


#: What a step opens before its training_step: the fetch and the copy, with Lightning between.
BEFORE_STEP = ["other", "data_wait", "other", "batch_transfer", "other"]


def test_nvtx_ranges_automatic_and_accumulation(tmp_path: Path) -> None:
    rec = RecordingNvtx()
    timeline = StepTimeline(nvtx=rec.api)
    trainer = Trainer(
        callbacks=[timeline],
        **quiet_trainer_kwargs(tmp_path, max_steps=2, accumulate_grad_batches=2),
    )
    trainer.fit(TinyCNN())
    assert rec.depth == 0
    assert rec.max_depth == 2
    batches = _per_batch(rec)
    # Lightning zeroes the gradients on the first batch of an accumulation, steps on the last
    first = [*BEFORE_STEP, "training_step", "zero_grad", "backward", "other"]
    last = [*BEFORE_STEP, "training_step", "backward", "other", "optimizer_step", "other"]
    assert batches[:4] == [first, last, first, last]
    # after the last batch: steps opened (after it, after validation) and closed unused
    assert all(b == ["other"] for b in batches[4:])
    _clean()


class _TwoOptimizers(TinyCNN):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.head = nn.Linear(10, 10)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt_a, opt_b = self.optimizers()  # type: ignore[misc]
        x, y = batch
        for opt, extra in ((opt_a, None), (opt_b, self.head)):
            opt.zero_grad()
            logits = self(x) if extra is None else extra(self(x).detach())
            self.manual_backward(nn.functional.cross_entropy(logits, y))
            opt.step()

    def configure_optimizers(self) -> Any:
        return (
            torch.optim.SGD(self.net.parameters(), lr=0.01),
            torch.optim.SGD(self.head.parameters(), lr=0.01),
        )


def test_nvtx_ranges_manual_optimisation_two_optimizers(tmp_path: Path) -> None:
    rec = RecordingNvtx()
    trainer = Trainer(
        callbacks=[StepTimeline(nvtx=rec.api)], **quiet_trainer_kwargs(tmp_path, max_steps=4)
    )
    trainer.fit(_TwoOptimizers())
    assert rec.depth == 0
    assert rec.max_depth == 3  # backward and optimizer_step nest inside training_step
    nested = ["backward", "optimizer_step"] * 2
    assert _per_batch(rec)[0] == [*BEFORE_STEP, "training_step", *nested]
    # the nesting itself: training_step stays open around the backward/step pairs
    ops = [(op, (n or "").removeprefix("speedpack/")) for op, n in rec.calls][:22]
    assert ops == [
        ("push", "step"),
        *[(op, name) for phase in BEFORE_STEP for op, name in (("push", phase), ("pop", ""))],
        ("push", "training_step"),
        ("push", "backward"),
        ("pop", ""),
        ("push", "optimizer_step"),
        ("pop", ""),
        ("push", "backward"),
        ("pop", ""),
        ("push", "optimizer_step"),
        ("pop", ""),
        ("pop", ""),
        ("pop", ""),
    ]
    _clean()


# ---- nothing left behind after an exception or KeyboardInterrupt -----------------------------


class _Crash(TinyCNN):
    def __init__(self, error: BaseException, at: int = 6) -> None:
        super().__init__()
        self.error, self.at = error, at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.trainer.global_step == self.at:
            raise self.error
        return loss


def _fit_crashing(
    tmp_path: Path, error: BaseException, raised: type[BaseException]
) -> tuple[RecordingNvtx, StepTimeline]:
    """Fit until ``error`` in step 6; the fit must end in ``raised``; check what it left."""
    rec = RecordingNvtx()
    timeline = StepTimeline(nvtx=rec.api, trace_steps=(5, 3), trace_dir=tmp_path / "traces")
    trainer = Trainer(
        callbacks=[timeline, SyncPointWarnings(mode="summary", include_cpu=True)],
        **quiet_trainer_kwargs(tmp_path, max_steps=10, max_epochs=5),
    )
    model = _Crash(error)
    params = list(model.parameters())
    try:
        with pytest.raises(raised):
            trainer.fit(model)
    finally:
        handler = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning ignores SIGINT
    assert handler is not None
    # the optimizer post-step hooks are gone
    opt = torch.optim.SGD(params, lr=0.1)
    assert not opt._optimizer_step_post_hooks
    assert all(not o._optimizer_step_post_hooks for o in trainer.optimizers)
    assert not {"start", "stop"} & set(vars(trainer.profiler))  # the profiler tap is gone
    return rec, timeline


def test_cleanup_after_an_exception_mid_step(tmp_path: Path) -> None:
    before = global_state.snapshot()
    _fit_crashing(tmp_path, RuntimeError("boom"), RuntimeError)
    _clean()
    assert global_state.diff(before, global_state.snapshot()) == {}
    assert not (tmp_path / "traces").exists()  # an interrupted window writes no file


def test_cleanup_after_keyboard_interrupt(tmp_path: Path) -> None:
    # Lightning's graceful shutdown ends in sys.exit(1)
    _rec, _ = _fit_crashing(tmp_path, KeyboardInterrupt(), SystemExit)
    _clean()


def test_nvtx_balanced_after_exception(tmp_path: Path) -> None:
    rec = RecordingNvtx()
    trainer = Trainer(
        callbacks=[StepTimeline(nvtx=rec.api)], **quiet_trainer_kwargs(tmp_path, max_steps=10)
    )
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(_Crash(RuntimeError("boom"), at=2))
    assert not {"start", "stop"} & set(vars(trainer.profiler))
    assert rec.depth == 0
    assert rec.max_depth == 2
    assert rec.calls[-1] == ("pop", None)
    _clean()


def test_nvtx_balanced_after_keyboard_interrupt(tmp_path: Path) -> None:
    rec = RecordingNvtx()
    trainer = Trainer(
        callbacks=[StepTimeline(nvtx=rec.api)], **quiet_trainer_kwargs(tmp_path, max_steps=10)
    )
    try:
        with pytest.raises(SystemExit):
            trainer.fit(_Crash(KeyboardInterrupt(), at=2))
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert rec.depth == 0
    assert rec.pushed()[-1] == "speedpack/training_step"
    _clean()


# ---- validation, W&B, doctor, pickling --------------------------------------------------------


@pytest.mark.slow
def test_validation_is_not_charged_and_fits_twice(tmp_path: Path) -> None:
    rec = RecordingNvtx()
    timeline = StepTimeline(nvtx=rec.api)
    for _ in range(2):
        trainer = Trainer(
            callbacks=[timeline],
            **quiet_trainer_kwargs(tmp_path, max_epochs=2, val_check_interval=2),
        )
        trainer.fit(TinyCNN(n=64, batch_size=16))
        assert rec.depth == 0
        assert timeline._clock.run.batches == 8  # 2 epochs x 4 batches, counted afresh
    _clean()


def test_trace_logged_to_wandb_as_artifact(tmp_path: Path, wandb_offline: Any) -> None:
    from pytorch_lightning.loggers import WandbLogger

    from tests.helpers.wandb_files import _records

    logger = WandbLogger(project="speedpack-tests", save_dir=str(wandb_offline.dir))
    timeline = StepTimeline(trace_steps=(1, 1), trace_dir=tmp_path / "traces")
    trainer = Trainer(
        callbacks=[timeline], **quiet_trainer_kwargs(tmp_path, max_steps=3, logger=logger)
    )
    trainer.fit(TinyCNN())
    import wandb

    wandb.finish()
    from wandb.proto import wandb_internal_pb2 as pb

    def read_artifacts() -> list[Any]:
        found = []
        for path in wandb_offline.dir.glob("**/run-*.wandb"):
            for raw in _records(path):
                record = pb.Record()
                record.ParseFromString(raw)
                if record.WhichOneof("record_type") == "artifact":
                    found.append(record.artifact)
        return found

    # W&B's service process writes the run file; on a loaded machine the artifact record can
    # land just after `finish()` returns. Read again for a while before concluding it is absent.
    deadline = time.monotonic() + 30.0
    artifacts = read_artifacts()
    while not artifacts and time.monotonic() < deadline:
        time.sleep(0.5)
        artifacts = read_artifacts()
    assert [(a.type, a.name.startswith("speedpack-trace-")) for a in artifacts] == [
        ("profile", True)
    ]
    files = [e.path for a in artifacts for e in a.manifest.contents]
    assert files == ["speedpack-steps1-1-rank0.pt.trace.json"]
    _clean()


def test_doctor_registration_and_factory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import lightning_speedpack.timeline.doctor  # noqa: F401  (registers the diagnostic)

    (diagnostic,) = [d for d in registered_diagnostics() if d.name == "timeline"]
    assert diagnostic.callback_type is StepTimeline
    monkeypatch.delenv(TRACE_ENV, raising=False)
    plain = diagnostic.factory(DoctorContext())
    assert isinstance(plain, StepTimeline)
    assert plain.trace_steps is None
    assert plain.sample_every_n_steps == 8  # the doctor times one step in 8
    deep = diagnostic.factory(DoctorContext(deep=True))
    assert isinstance(deep, StepTimeline)
    assert deep.sample_every_n_steps == 1  # --deep: every step
    assert "every step" in diagnostic.deep_adds
    monkeypatch.setenv(TRACE_ENV, "5:3")
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path))
    traced = diagnostic.factory(DoctorContext())
    assert isinstance(traced, StepTimeline)
    assert (traced.trace_steps, traced.trace_dir) == ((5, 3), str(tmp_path))
    monkeypatch.setenv(TRACE_ENV, "5")
    with pytest.raises(ValueError, match="START:COUNT"):
        diagnostic.factory(DoctorContext())


def test_doctor_findings_and_figures(tmp_path: Path) -> None:
    timeline = StepTimeline(trace_steps=(1, 2), trace_dir=tmp_path)
    assert timeline.doctor_findings() == []
    assert timeline.doctor_figures() == {}
    trainer = Trainer(callbacks=[timeline], **quiet_trainer_kwargs(tmp_path, max_steps=4))
    trainer.fit(TinyCNN())
    figures = timeline.doctor_figures()
    assert set(figures["phase_share"]) == set(PHASES)
    assert sum(figures["phase_share"].values()) == pytest.approx(1.0, abs=1e-3)
    phases, trace = timeline.doctor_findings()
    assert phases.id == "step-phases"
    assert phases.severity == "info"
    assert "training_step" in phases.message
    assert trace.id == "trace"
    assert trace.location == str(tmp_path / "speedpack-steps1-2-rank0.pt.trace.json")


def test_pickles_with_an_injected_table(tmp_path: Path) -> None:
    timeline = StepTimeline(nvtx=False, trace_steps=(0, 1), trace_dir=tmp_path)
    trainer = Trainer(callbacks=[timeline], **quiet_trainer_kwargs(tmp_path, max_steps=2))
    trainer.fit(TinyCNN())
    clone = pickle.loads(pickle.dumps(timeline))
    assert clone.trace_steps == (0, 1)
    assert clone.phase_shares() == timeline.phase_shares()
    table = NvtxApi(push=torch.cuda.nvtx.range_push, pop=torch.cuda.nvtx.range_pop, mark=print)
    assert pickle.loads(pickle.dumps(StepTimeline(nvtx=table))).nvtx == table
