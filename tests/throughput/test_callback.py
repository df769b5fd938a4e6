from __future__ import annotations

import functools
import logging
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning import Callback, LightningModule, Trainer
from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader, Dataset
from torch.utils.flop_counter import FlopCounterMode

import lightning_speedpack
from lightning_speedpack import ThroughputLogger
from lightning_speedpack.core import profiler_tap
from lightning_speedpack.doctor.runner import run_script
from lightning_speedpack.throughput import callback as throughput_module
from lightning_speedpack.throughput import nvml as _nvml
from tests.helpers import global_state
from tests.helpers.ddp import run_ddp
from tests.helpers.loggers import MemoryLogger
from tests.helpers.models import quiet_trainer_kwargs

P = "throughput/"


class SleepyDataset(Dataset[torch.Tensor]):
    """Random vectors; ``__getitem__`` sleeps ``delay`` seconds (a slow decode)."""

    def __init__(self, n: int = 64, delay: float = 0.0) -> None:
        self.data = torch.randn(n, 32)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return self.data[i]


class TimedModel(BoringModel):
    """BoringModel with a training step that takes ``step_delay`` s and a slow validation."""

    def __init__(
        self,
        batch_size: int = 4,
        n: int = 64,
        step_delay: float = 0.0,
        data_delay: float = 0.0,
        val_delay: float = 0.0,
    ) -> None:
        super().__init__()
        self.batch_size, self.n = batch_size, n
        self.step_delay, self.data_delay, self.val_delay = step_delay, data_delay, val_delay

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.step_delay:
            time.sleep(self.step_delay)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        if self.val_delay:
            time.sleep(self.val_delay)
        return super().validation_step(batch, batch_idx)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(SleepyDataset(self.n, self.data_delay), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(RandomDataset(32, 8), batch_size=4)


def _trainer(tmp_path: Path, callback: Callback, **kwargs: Any) -> Trainer:
    extra = kwargs.pop("callbacks", [])
    return Trainer(callbacks=[callback, *extra], **quiet_trainer_kwargs(tmp_path, **kwargs))


class FakeNvml:
    def __init__(self) -> None:
        self.shutdowns = 0

    def table(self) -> _nvml.NvmlFunctions:
        def shutdown() -> None:
            self.shutdowns += 1

        return _nvml.NvmlFunctions(
            handle=lambda i: i,
            utilization=lambda h: [30.0, 70.0][h],
            memory_used_bytes=lambda h: [1e9, 3e9][h],
            power_mw=lambda h: [200_000.0, 300_000.0][h],
            temperature_c=lambda h: [60.0, 70.0][h],
            shutdown=shutdown,
        )


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """Two fake GPUs: the trainer's devices are CUDA 0 and 1 and NVML answers for them."""
    fake = FakeNvml()
    monkeypatch.setattr(throughput_module, "_local_cuda_indices", lambda trainer: [0, 1])
    monkeypatch.setattr(_nvml, "load_functions", fake.table)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def _speedpack_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if "speedpack" in t.name]


# ---- constructor ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"window": 0}, ValueError, "`window` must be a positive int, got 0"),
        ({"window": True}, ValueError, "`window` must be a positive int, got True"),
        (
            {"log_every_n_steps": -1},
            ValueError,
            "`log_every_n_steps` must be a positive int or None",
        ),
        ({"batch_size_fn": 3}, TypeError, "`batch_size_fn` must be a callable"),
        ({"items_fn": "x"}, TypeError, "`items_fn` must be a callable"),
        ({"flops_per_batch": "measure"}, ValueError, "must be 'auto', got 'measure'"),
        ({"flops_per_batch": -5}, ValueError, "`flops_per_batch` must be positive, got -5"),
        ({"flops_per_batch": [1]}, TypeError, "`flops_per_batch` must be an int, a callable"),
        ({"gpu_stats": "yes"}, TypeError, "`gpu_stats` must be a bool"),
        ({"prefix": None}, TypeError, "`prefix` must be a str"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ThroughputLogger(**kwargs)


def test_exported() -> None:
    assert lightning_speedpack.ThroughputLogger is ThroughputLogger
    assert "ThroughputLogger" in lightning_speedpack.__all__


def test_docstring_example_runs() -> None:
    import doctest

    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(
        ThroughputLogger, "ThroughputLogger", globs={"ThroughputLogger": ThroughputLogger}
    ):
        runner.run(test)
    assert runner.failures == 0
    assert runner.tries > 0


# ---- measurements ------------------------------------------------------------------------


class TickingDataset(SleepyDataset):
    """Moves the mocked clock: fetching a batch of ``batch_size`` items takes 1 s."""

    def __init__(self, now: list[float], batch_size: int) -> None:
        super().__init__()
        self.now, self.step = now, 1.0 / batch_size

    def __getitem__(self, i: int) -> torch.Tensor:
        self.now[0] += self.step
        return self.data[i]


def test_exact_values_with_a_mocked_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]

    def hook_read() -> float:
        now[0] += 1.0
        return now[0] - 1.0

    # The logger's hooks read the clock once each and move it 1 s; the loader's fetch, heard at
    # the profiler (which reads the clock without moving it), takes 1 s. Epoch start t, fetch
    # t+1..t+2, batch end t+2, fetch t+3..t+4, batch end t+4, ...
    monkeypatch.setattr(throughput_module, "perf_counter", hook_read)
    monkeypatch.setattr(profiler_tap, "perf_counter", lambda: now[0])

    class TickingModel(TimedModel):
        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(TickingDataset(now, self.batch_size), batch_size=self.batch_size)

    logger = MemoryLogger()
    callback = ThroughputLogger(window=4, log_every_n_steps=4, gpu_stats=False)
    trainer = _trainer(tmp_path, callback, max_steps=8, logger=logger, limit_val_batches=0)
    trainer.fit(TickingModel(batch_size=4))
    assert [step for step, _ in logger.rows] == [4, 8]
    metrics = logger.rows[-1][1]
    assert metrics == {
        f"{P}samples_per_sec": 2.0,  # 4 samples every 2 s
        f"{P}batches_per_sec": 0.5,
        f"{P}device/samples_per_sec": 2.0,
        f"{P}step_time_ms": 2000.0,
        f"{P}data_wait_ms": 1000.0,
        f"{P}data_wait_fraction": 0.5,
        f"{P}samples": 32.0,
        f"{P}batches": 8.0,
    }


def test_samples_per_sec_matches_wall_time_and_excludes_validation(tmp_path: Path) -> None:
    class Stopwatch(Callback):
        """Independent measure: training wall time minus validation time."""

        def __init__(self) -> None:
            self.t0 = self.t1 = self.val_start = 0.0
            self.val_spans: list[tuple[float, float]] = []

        def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, *args: Any) -> None:
            self.t1 = time.perf_counter()

        def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
            self.val_start = time.perf_counter()

        def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
            self.val_spans.append((self.val_start, time.perf_counter()))

        def val_within(self) -> float:
            return sum(b - a for a, b in self.val_spans if b <= self.t1)

    batches, batch_size = 12, 4
    stopwatch = Stopwatch()
    logger = MemoryLogger()
    callback = ThroughputLogger(window=batches, log_every_n_steps=batches, gpu_stats=False)
    trainer = _trainer(
        tmp_path,
        callback,
        callbacks=[stopwatch],
        logger=logger,
        max_epochs=1,
        val_check_interval=4,
        limit_val_batches=2,
        num_sanity_val_steps=0,
    )
    trainer.fit(
        TimedModel(batch_size=batch_size, n=batches * batch_size, step_delay=0.02, val_delay=0.05)
    )
    assert stopwatch.val_within() > 0.15  # validation ran (2 x 2 batches x 50 ms, at least)
    expected = batches * batch_size / (stopwatch.t1 - stopwatch.t0 - stopwatch.val_within())
    (logged,) = logger.values(f"{P}samples_per_sec")
    assert logged == pytest.approx(expected, rel=0.10)
    assert callback.doctor_figures()["samples_per_sec"] == pytest.approx(expected, rel=0.10)


def test_data_wait_fraction_high_for_a_sleeping_dataset(tmp_path: Path) -> None:
    callback = ThroughputLogger(window=8, log_every_n_steps=8, gpu_stats=False)
    _trainer(tmp_path, callback, max_steps=8).fit(TimedModel(batch_size=4, n=32, data_delay=0.01))
    figures = callback.doctor_figures()
    assert figures["data_wait_fraction"] > 0.5
    (finding,) = callback.doctor_findings()
    assert finding.component == "throughput"
    assert finding.id == "data-wait"
    assert finding.severity == "warning"
    assert "CachedDataset" in (finding.fix or "")
    assert "num_workers" in (finding.fix or "")
    line = SleepyDataset.__getitem__.__code__.co_firstlineno
    assert finding.location == f"test_callback.py:{line}"
    assert finding.figures["num_workers"] == 0


def test_data_wait_fraction_low_when_data_is_ready(tmp_path: Path) -> None:
    callback = ThroughputLogger(window=8, log_every_n_steps=8, gpu_stats=False)
    _trainer(tmp_path, callback, max_steps=8).fit(TimedModel(batch_size=4, n=32, step_delay=0.02))
    assert callback.doctor_figures()["data_wait_fraction"] < 0.2
    assert callback.doctor_findings() == []


def test_batch_size_fn_items_fn_and_flops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throughput_module, "_device_peak_flops", lambda trainer: 1e6)
    logger = MemoryLogger()
    callback = ThroughputLogger(
        batch_size_fn=lambda b: 2 * len(b),
        items_fn=lambda b: b.numel(),
        flops_per_batch=1000,
        window=4,
        log_every_n_steps=4,
        gpu_stats=False,
    )
    _trainer(tmp_path, callback, max_steps=4, logger=logger).fit(TimedModel(batch_size=4))
    m = logger.rows[-1][1]
    batches_per_sec = m[f"{P}batches_per_sec"]
    assert m[f"{P}samples_per_sec"] == pytest.approx(8 * batches_per_sec)
    assert m[f"{P}items_per_sec"] == pytest.approx(4 * 32 * batches_per_sec)
    assert m[f"{P}flops_per_sec"] == pytest.approx(1000 * batches_per_sec)
    assert m[f"{P}mfu"] == pytest.approx(m[f"{P}flops_per_sec"] / 1e6)
    assert m[f"{P}samples"] == 32


class _NamesModel(BoringModel):
    """Batches of strings: nothing in them says the batch's size."""

    def __init__(self, log_batch_size: bool = False) -> None:
        super().__init__()
        self.log_batch_size = log_batch_size

    def train_dataloader(self) -> Any:
        return DataLoader([{"name": "a"}] * 12, batch_size=3)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self.layer(torch.randn(3, 32)).sum()
        if self.log_batch_size:
            self.log("loss", loss, batch_size=len(batch["name"]))
        return loss


def test_unsizable_batch_is_not_measured_and_the_fit_goes_on(tmp_path: Path) -> None:
    callback = ThroughputLogger(gpu_stats=False, log_every_n_steps=1)
    model = _NamesModel()
    _trainer(tmp_path, callback, max_steps=4).fit(model)
    assert model.global_step == 4
    figures = callback.doctor_figures()
    assert figures["sample_unit"] == "batches"
    assert "cannot infer the batch size of a dict" in figures["samples_not_measured"]
    [finding] = [f for f in callback.doctor_findings() if f.id == "batch-size-not-measured"]
    assert finding.severity == "info"
    assert finding.figures["unsized_batches"] == 4
    assert "batch_size_fn" in (finding.fix or "")
    assert "self.log" in (finding.fix or "")
    assert "log" not in vars(model)  # the self.log reader is gone after the fit


def test_strict_raises_at_the_first_batch_with_the_fix(tmp_path: Path) -> None:
    model = _NamesModel()
    trainer = _trainer(tmp_path, ThroughputLogger(gpu_stats=False, strict=True), max_steps=2)
    with pytest.raises(TypeError, match=r"batch_size_fn=lambda batch: \.\.\."):
        trainer.fit(model)
    assert model.global_step == 1  # raised at the end of the first batch
    assert "log" not in vars(model)


def test_strict_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="`strict` must be a bool, got 'yes'"):
        ThroughputLogger(strict="yes")  # type: ignore[arg-type]


def test_the_batch_size_given_to_self_log_is_used(tmp_path: Path) -> None:
    logger = MemoryLogger()
    callback = ThroughputLogger(gpu_stats=False, log_every_n_steps=4, strict=True)
    model = _NamesModel(log_batch_size=True)
    _trainer(tmp_path, callback, max_steps=4, logger=logger).fit(model)
    figures = callback.doctor_figures()
    assert figures["sample_unit"] == "samples"
    assert "samples_not_measured" not in figures
    assert logger.rows[-1][1][f"{P}samples"] == 12  # 4 batches of 3, as the step told self.log
    assert "log" not in vars(model)


def test_auto_flops_measures_one_real_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throughput_module, "_device_peak_flops", lambda trainer: 1e9)
    model = TimedModel(batch_size=4)
    reference = BoringModel()
    with FlopCounterMode(display=False) as counter:
        reference.layer(torch.randn(4, 32)).sum().backward()
    callback = ThroughputLogger(
        flops_per_batch="auto", window=4, log_every_n_steps=4, gpu_stats=False
    )
    logger = MemoryLogger()
    before = global_state.snapshot()
    _trainer(tmp_path, callback, max_steps=5, logger=logger).fit(model)
    assert global_state.diff(before, global_state.snapshot()) == {}  # the counter mode is gone
    assert callback.state_dict()["measured_flops"] == counter.get_total_flops() > 0
    m = logger.rows[0][1]
    assert m[f"{P}flops_per_sec"] == pytest.approx(
        counter.get_total_flops() * m[f"{P}batches_per_sec"]
    )
    assert m[f"{P}mfu"] == pytest.approx(m[f"{P}flops_per_sec"] / 1e9)


def test_over_steps_recorded_without_any_logger(tmp_path: Path) -> None:
    callback = ThroughputLogger(window=2, log_every_n_steps=3, gpu_stats=False)
    _trainer(tmp_path, callback, max_steps=7, logger=False).fit(TimedModel(batch_size=4))
    points = callback.doctor_figures()["samples_per_sec_over_steps"]
    assert [step for step, _ in points] == [3, 6, 7]  # 7: the tail, flushed at train end
    assert all(sps > 0 for _, sps in points)


def test_log_every_n_steps_follows_the_trainer(tmp_path: Path) -> None:
    logger = MemoryLogger()
    _trainer(
        tmp_path, ThroughputLogger(gpu_stats=False), max_steps=6, logger=logger, log_every_n_steps=2
    ).fit(TimedModel(batch_size=4))
    assert [step for step, m in logger.rows if f"{P}samples_per_sec" in m] == [2, 4, 6]


def test_log_every_n_steps_0_logs_the_end_alone_as_the_trainer_logs_no_step(
    tmp_path: Path,
) -> None:
    # `Trainer(log_every_n_steps=0)` (what `barebones=True` sets) stopped the fit with a
    # ZeroDivisionError at the first batch end.
    logger = MemoryLogger()
    _trainer(
        tmp_path, ThroughputLogger(gpu_stats=False), max_steps=6, logger=logger, log_every_n_steps=0
    ).fit(TimedModel(batch_size=4))
    assert [step for step, m in logger.rows if f"{P}samples_per_sec" in m] == [6]


# ---- GPU statistics ----------------------------------------------------------------------


def test_no_gpu_no_gpu_keys_and_one_info_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logger = MemoryLogger()
    with caplog.at_level(logging.INFO):
        _trainer(
            tmp_path, ThroughputLogger(window=2, log_every_n_steps=2), max_steps=4, logger=logger
        ).fit(TimedModel())
    keys = set().union(*(m for _, m in logger.rows))
    assert not any(k.startswith("system/gpu/") for k in keys)
    assert {"system/cpu_util", "system/ram_used_gb"} <= keys
    lines = [r.getMessage() for r in caplog.records if "system/gpu/* not logged" in r.getMessage()]
    assert lines == [
        "ThroughputLogger: system/gpu/* not logged: training does not run on a CUDA GPU"
    ]


def test_gpu_but_no_nvml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(throughput_module, "_local_cuda_indices", lambda trainer: [0])
    monkeypatch.setattr(_nvml, "load_functions", lambda: "nvidia-ml-py is not installed")
    logger = MemoryLogger()
    with caplog.at_level(logging.INFO):
        _trainer(
            tmp_path, ThroughputLogger(window=2, log_every_n_steps=2), max_steps=4, logger=logger
        ).fit(TimedModel())
    assert not any(k.startswith("system/gpu/") for _, m in logger.rows for k in m)
    assert "system/gpu/* not logged: nvidia-ml-py is not installed" in caplog.text


def test_injected_nvml_values_are_logged_and_the_thread_stops(
    tmp_path: Path, fake_gpus: FakeNvml
) -> None:
    logger = MemoryLogger()
    before = global_state.snapshot()
    _trainer(
        tmp_path, ThroughputLogger(window=2, log_every_n_steps=2), max_steps=4, logger=logger
    ).fit(TimedModel())
    m = logger.rows[-1][1]
    assert {k: v for k, v in m.items() if k.startswith("system/gpu/")} == {
        "system/gpu/util": 50.0,
        "system/gpu/util_min": 30.0,
        "system/gpu/util_max": 70.0,
        "system/gpu/mem_used_gb": 2.0,
        "system/gpu/mem_used_gb_min": 1.0,
        "system/gpu/mem_used_gb_max": 3.0,
        "system/gpu/power_w": 250.0,
        "system/gpu/power_w_min": 200.0,
        "system/gpu/power_w_max": 300.0,
        "system/gpu/temp_c": 65.0,
        "system/gpu/temp_c_min": 60.0,
        "system/gpu/temp_c_max": 70.0,
    }
    assert _speedpack_threads() == []
    assert fake_gpus.shutdowns == 1
    assert global_state.diff(before, global_state.snapshot()) == {}


def test_sampler_stops_on_an_exception(tmp_path: Path, fake_gpus: FakeNvml) -> None:
    class Boom(TimedModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == 2:
                assert _speedpack_threads() == ["speedpack-nvml-sampler"]
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    before = global_state.snapshot()
    trainer = _trainer(tmp_path, ThroughputLogger(flops_per_batch="auto"), max_steps=4)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom())
    assert _speedpack_threads() == []
    assert global_state.diff(before, global_state.snapshot()) == {}


def test_exception_during_flop_counting_leaves_no_mode(tmp_path: Path) -> None:
    class Boom(TimedModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            raise RuntimeError("boom")

    before = global_state.snapshot()
    trainer = _trainer(tmp_path, ThroughputLogger(flops_per_batch="auto"), max_steps=4)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Boom())
    assert global_state.diff(before, global_state.snapshot()) == {}


# ---- W&B ---------------------------------------------------------------------------------


def test_keys_reach_the_offline_wandb_run(
    tmp_path: Path, wandb_offline: Any, fake_gpus: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb
    from pytorch_lightning.loggers import WandbLogger

    monkeypatch.setattr(throughput_module, "_device_peak_flops", lambda trainer: 1e6)
    logger = WandbLogger(project="throughput", save_dir=str(wandb_offline.dir), offline=True)
    callback = ThroughputLogger(
        items_fn=lambda b: b.numel(), flops_per_batch=100, window=2, log_every_n_steps=2
    )
    _trainer(tmp_path, callback, max_steps=4, logger=logger).fit(TimedModel())
    wandb.finish()
    run = wandb_offline.only_run()  # waits for the run's exit record
    expected = {
        f"{P}{k}"
        for k in (
            "samples_per_sec",
            "batches_per_sec",
            "device/samples_per_sec",
            "items_per_sec",
            "step_time_ms",
            "data_wait_ms",
            "data_wait_fraction",
            "flops_per_sec",
            "mfu",
            "samples",
            "batches",
        )
    } | {
        "system/gpu/util",
        "system/gpu/mem_used_gb",
        "system/gpu/power_w",
        "system/gpu/temp_c",
        "system/cpu_util",
        "system/ram_used_gb",
        "trainer/global_step",
    }
    assert expected <= run.keys()
    assert run.values("trainer/global_step") == [2, 4]
    assert run.values("system/gpu/util") == [50.0, 50.0]
    assert run.metrics[f"{P}*"]["step_metric"] == "trainer/global_step"
    assert run.metrics["system/*"]["step_metric"] == "trainer/global_step"
    config = run.config["throughput_logger"]
    assert config["window"] == 2
    assert config["log_every_n_steps"] == 2
    assert config["flops_per_batch"] == 100
    assert run.summary[f"{P}mean_samples_per_sec"] > 0
    assert 0.0 <= run.summary[f"{P}mean_data_wait_fraction"] <= 1.0
    assert run.summary[f"{P}mean_mfu"] > 0
    assert run.summary["system/gpu/peak_mem_used_gb"] == 3.0


# ---- checkpoint resume -------------------------------------------------------------------


def test_resume_continues_counters_without_a_spike(tmp_path: Path) -> None:
    batch_size, per_epoch = 4, 8
    first_logger = MemoryLogger()
    first = ThroughputLogger(window=4, log_every_n_steps=2, gpu_stats=False)
    trainer = _trainer(tmp_path, first, max_steps=per_epoch, logger=first_logger)
    trainer.fit(TimedModel(batch_size=batch_size, n=batch_size * per_epoch, step_delay=0.01))
    ckpt = tmp_path / "resume.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=False)["callbacks"][first.state_key]
    assert saved["totals"]["samples"] == batch_size * per_epoch

    second_logger = MemoryLogger()
    second = ThroughputLogger(window=4, log_every_n_steps=2, gpu_stats=False)
    trainer = _trainer(
        tmp_path, second, max_steps=2 * per_epoch, max_epochs=-1, logger=second_logger
    )
    trainer.fit(
        TimedModel(batch_size=batch_size, n=batch_size * per_epoch, step_delay=0.01), ckpt_path=ckpt
    )
    steps = [step for step, _ in second_logger.rows]
    assert steps == [10, 12, 14, 16]
    assert second_logger.values(f"{P}samples") == [40, 48, 56, 64]  # counters continue
    assert second_logger.values(f"{P}batches")[-1] == 2 * per_epoch
    before = first_logger.values(f"{P}samples_per_sec")[-1]
    after = second_logger.values(f"{P}samples_per_sec")[0]
    assert 0.5 < after / before < 2.0  # the first window after resume does not spike


# ---- DDP ---------------------------------------------------------------------------------


class RankSizedModel(TimedModel):
    """Rank 0 trains on batches of 4, rank 1 on batches of 12: unequal per-rank throughput."""

    def train_dataloader(self) -> DataLoader[Any]:
        batch_size = 4 if self.trainer.global_rank == 0 else 12
        return DataLoader(SleepyDataset(8 * batch_size), batch_size=batch_size)


def _ddp_fit(
    tmp: str, floor: int = 1, combine: str = "log", keep_at_most: int | None = None
) -> dict[str, Any]:
    from lightning_speedpack.throughput import world

    if keep_at_most is not None:
        world.KEEP_AT_MOST = keep_at_most  # this rank's process only
    logger = MemoryLogger()
    callback = ThroughputLogger(
        window=4, log_every_n_steps=4, gpu_stats=False, world_combine=combine
    )
    callback.world_log_floor = floor
    ended: list[bool] = []

    class TrainEnd(Callback):  # before the logger: its on_train_end runs first
        def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
            ended.append(True)

    trainer = Trainer(
        callbacks=[TrainEnd(), callback],
        use_distributed_sampler=False,
        **quiet_trainer_kwargs(tmp, devices=2, strategy="ddp", max_steps=8, logger=logger),
    )
    collectives: list[tuple[int, bool]] = []  # (global step, before training ended)
    reduce = world.bounded_all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        collectives.append((trainer.global_step, not ended))
        return reduce(*args, **kwargs)

    world.bounded_all_reduce = counted  # type: ignore[assignment]
    try:
        trainer.fit(RankSizedModel(step_delay=0.005))
    finally:
        world.bounded_all_reduce = reduce  # type: ignore[assignment]
    local = callback.last_local
    assert local is not None
    return {
        "rank": trainer.global_rank,
        "collectives": collectives,
        "rows": logger.rows,
        "local": local.samples_per_sec,
        "local_batches": local.batches_per_sec,
        "figures": callback.doctor_figures(),
    }


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_ddp_world_rate_is_the_sum_over_ranks(tmp_path: Path) -> None:
    rank0, rank1 = run_ddp(_ddp_fit, str(tmp_path), timeout=200)
    assert rank1["rows"] == []  # rank 0 logs, nobody else
    assert [step for step, _ in rank0["rows"]] == [4, 8]
    logged = rank0["rows"][-1][1]
    assert logged[f"{P}samples_per_sec"] == pytest.approx(rank0["local"] + rank1["local"])
    assert logged[f"{P}device/samples_per_sec"] == pytest.approx(
        (rank0["local"] + rank1["local"]) / 2
    )
    assert logged[f"{P}samples"] == 8 * 4 + 8 * 12
    # Ranks step in lockstep, so rank 1 (3x the samples per batch) has about 3x the rate;
    # rank 0 x world size (Lightning's extrapolation) would be half the true figure.
    assert 2.0 < rank1["local"] / rank0["local"] < 4.5
    assert logged[f"{P}samples_per_sec"] > 1.5 * 2 * rank0["local"]
    assert rank0["figures"]["samples_per_sec"] == pytest.approx(rank1["figures"]["samples_per_sec"])


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_ddp_logging_steps_keep_the_world_floor_apart(tmp_path: Path) -> None:
    # Each logging step is an all-reduce: the doctor's floor (50) keeps its 10-step window from
    # adding one every 10 steps. Here a floor of 8 over log_every_n_steps=4.
    rank0, _ = run_ddp(functools.partial(_ddp_fit, floor=8), str(tmp_path), timeout=200)
    assert [step for step, _ in rank0["rows"]] == [8]
    assert rank0["rows"][0][1][f"{P}samples"] == 8 * 4 + 8 * 12


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_ddp_world_combine_at_the_end_adds_no_collective_to_the_loop(tmp_path: Path) -> None:
    each_log = run_ddp(_ddp_fit, str(tmp_path / "log"), timeout=200)
    at_end = run_ddp(functools.partial(_ddp_fit, combine="end"), str(tmp_path / "end"), timeout=200)
    # "log": one all-reduce at each logging step (4, 8) and one at fit end, on every rank.
    assert [len(r["collectives"]) for r in each_log] == [3, 3]
    # "end": a single one, once the last batch has run; the same figures reach the logger.
    for rank in at_end:
        assert len(rank["collectives"]) == 1
        step, in_loop = rank["collectives"][0]
        assert step == 8
        assert not in_loop
    rank0, rank1 = at_end
    assert rank1["rows"] == []
    assert [step for step, _ in rank0["rows"]] == [4, 8]
    logged = rank0["rows"][-1][1]
    assert logged[f"{P}samples"] == 8 * 4 + 8 * 12
    assert logged[f"{P}samples_per_sec"] == pytest.approx(rank0["local"] + rank1["local"])
    ends = [dict(r["rows"])[8] for r in (each_log[0], rank0)]
    assert set(ends[0]) == set(ends[1])  # the same keys as when combined live
    assert rank0["figures"]["samples_per_sec"] == pytest.approx(rank1["figures"]["samples_per_sec"])
    series = rank0["figures"]["samples_per_sec_over_steps"]
    assert [step for step, _ in series] == [4, 8]
    assert series == rank1["figures"]["samples_per_sec_over_steps"]


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_ddp_world_combine_at_the_end_keeps_a_bounded_number_of_steps(tmp_path: Path) -> None:
    # A long run sums its kept steps every KEEP_AT_MOST logging steps (here 1: at each one),
    # at the same step on every rank, and the figures are the same.
    fit = functools.partial(_ddp_fit, combine="end", keep_at_most=1)
    rank0, rank1 = run_ddp(fit, str(tmp_path), timeout=200)
    for rank in (rank0, rank1):
        assert rank["collectives"] == [(4, True), (8, True), (8, False)]
    assert [step for step, _ in rank0["rows"]] == [4, 8]
    assert rank0["rows"][-1][1][f"{P}samples"] == 8 * 4 + 8 * 12
    assert (
        rank0["figures"]["samples_per_sec_over_steps"]
        == rank1["figures"]["samples_per_sec_over_steps"]
    )


def test_world_combine_is_checked() -> None:
    with pytest.raises(ValueError, match="`world_combine` must be 'log' or 'end', got 'each'"):
        ThroughputLogger(world_combine="each")  # type: ignore[arg-type]


def test_world_combine_at_the_end_logs_live_in_one_process(tmp_path: Path) -> None:
    seen: list[int] = []

    class Watch(Callback):
        def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
            seen.extend(step for step, _ in logger.rows)  # logged before training ended

    logger = MemoryLogger()
    callback = ThroughputLogger(window=4, log_every_n_steps=4, gpu_stats=False, world_combine="end")
    trainer = Trainer(
        callbacks=[Watch(), callback],
        **quiet_trainer_kwargs(str(tmp_path), max_steps=8, logger=logger),
    )
    trainer.fit(TimedModel())
    assert seen == [4, 8]
    assert [step for step, _ in logger.rows] == [4, 8]


def test_the_world_floor_leaves_a_single_process_fit_alone(tmp_path: Path) -> None:
    logger = MemoryLogger()
    callback = ThroughputLogger(window=4, log_every_n_steps=4, gpu_stats=False)
    callback.world_log_floor = 8
    trainer = Trainer(
        callbacks=[callback], **quiet_trainer_kwargs(str(tmp_path), max_steps=8, logger=logger)
    )
    trainer.fit(TimedModel())
    assert [step for step, _ in logger.rows] == [4, 8]


# ---- doctor ------------------------------------------------------------------------------


def test_doctor_reports_throughput_and_a_data_wait_finding(tmp_path: Path) -> None:
    script = tmp_path / "train_slow.py"
    script.write_text(
        textwrap.dedent(
            """
        import time
        import torch
        from pytorch_lightning import Trainer
        from pytorch_lightning.demos.boring_classes import BoringModel
        from torch.utils.data import DataLoader, Dataset


        class Slow(Dataset):
            def __len__(self):
                return 80

            def __getitem__(self, i):
                time.sleep(0.004)
                return torch.randn(32)


        class Model(BoringModel):
            def train_dataloader(self):
                return DataLoader(Slow(), batch_size=4)


        trainer = Trainer(max_steps=20, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False,
                          accelerator="cpu", devices=1, limit_val_batches=0)
        trainer.fit(Model())
        """
        )
    )
    result = run_script(script)
    assert result.exit_code == 0
    figures = result.report.runs[0].figures
    assert figures["data_wait_fraction"] > 0.5
    assert figures["samples_per_sec"] > 0
    assert figures["step_time_ms"] > 0
    points = figures["samples_per_sec_over_steps"]
    assert [step for step, _ in points] == [10, 20]
    # With the data profiler beside it (the doctor's default), the wait it timed at the
    # loader's `next` is stated once, in its verdict, at the same line:
    ids = {(f.component, f.id): f for f in result.report.findings}
    assert ("throughput", "data-wait") not in ids
    bound = ids["data", "data-bound"]
    assert bound.location == "train_slow.py:13"
    assert "waited for data" in bound.message
    # ThroughputLogger alone still says it
    alone = run_script(script, only=["throughput"])
    assert alone.exit_code == 0
    findings = [f for f in alone.report.findings if f.component == "throughput"]
    assert [f.id for f in findings] == ["data-wait"]
    assert findings[0].location == "train_slow.py:13"
