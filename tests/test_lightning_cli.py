"""LightningCLI: every callback and the strategy configured from YAML, in both namespaces."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import lightning_speedpack
from lightning_speedpack import (
    BatchSizeTuner,
    DataPipelineProfiler,
    LossRetentionDetector,
    SpeedAdvisor,
    StepTimeline,
    SyncPointWarnings,
    ThroughputLogger,
    WallTimeLedger,
)
from tests.helpers.namespaces import Namespace, each_namespace

pytest.importorskip("jsonargparse")

# Lightning 2.6's LightningCLI calls a jsonargparse API that jsonargparse >= 4.4x deprecates.
pytestmark = pytest.mark.filterwarnings(
    "ignore::jsonargparse._deprecated.JsonargparseDeprecationWarning"
)

TRAINER = """\
trainer:
  accelerator: cpu
  devices: 1
  max_steps: 2
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {root}
"""

CALLBACKS = """\
  callbacks:
    - class_path: lightning_speedpack.ThroughputLogger
      init_args:
        window: 2
        log_every_n_steps: 1
        gpu_stats: false
        prefix: tp/
    - class_path: lightning_speedpack.SyncPointWarnings
      init_args:
        mode: summary
        include_cpu: true
        allow: ["vendor/*.py"]
    - class_path: lightning_speedpack.LossRetentionDetector
      init_args:
        mode: error
        check_every_n_steps: 1
        deep_scan_every_n_steps: 10
    - class_path: lightning_speedpack.BatchSizeTuner
      init_args:
        mode: max
        max_val: 16
        steps_per_trial: 1
        dry_run: true
        verbose: false
    - class_path: lightning_speedpack.SpeedAdvisor
      init_args:
        measure_steps: 2
        apply: []
        data_wait_threshold: 0.5
        verbose: false
    - class_path: lightning_speedpack.StepTimeline
      init_args:
        nvtx: auto
        trace_steps: [1, 2]
        trace_dir: {root}/traces
        log_every_n_steps: 1
    - class_path: lightning_speedpack.DataPipelineProfiler
      init_args:
        probe: start
        probe_batches: 2
        model_steps: 1
        log_every_n_steps: 1
    - class_path: lightning_speedpack.WallTimeLedger
"""


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def _cli(ns: Namespace, tmp_path: Path, args: list[str], **kwargs: Any) -> Any:
    # The CLI warns when it gets `args` and the process has command-line arguments too
    # (pytest's own): run it as `python train.py ...` would.
    with mock.patch.object(sys, "argv", ["train.py"]):
        return ns.LightningCLI(
            ns.SizedBoringModel,
            args=args,
            seed_everything_default=0,
            save_config_kwargs={"overwrite": True},
            **kwargs,
        )


def _pack_callbacks(trainer: Any) -> dict[str, Any]:
    return {
        type(c).__name__: c
        for c in trainer.callbacks
        if type(c).__module__.startswith("lightning_speedpack.")
    }


@each_namespace
def test_every_callback_is_configurable_from_yaml(ns: Namespace, tmp_path: Path) -> None:
    config = _config(tmp_path, (TRAINER + CALLBACKS).format(root=tmp_path))
    cli = _cli(ns, tmp_path, ["--config", str(config)], run=False)
    assert isinstance(cli.trainer, ns.Trainer)
    found = _pack_callbacks(cli.trainer)
    assert sorted(found) == sorted(
        c.__name__
        for c in (
            BatchSizeTuner,
            DataPipelineProfiler,
            LossRetentionDetector,
            SpeedAdvisor,
            StepTimeline,
            SyncPointWarnings,
            ThroughputLogger,
            WallTimeLedger,
        )
    )
    assert all(isinstance(c, ns.Callback) for c in found.values())
    throughput = found["ThroughputLogger"]
    assert (throughput.window, throughput.log_every_n_steps, throughput.prefix) == (2, 1, "tp/")
    assert throughput.gpu_stats is False
    sync = found["SyncPointWarnings"]
    assert (sync.mode, sync.include_cpu, tuple(sync.allow)) == ("summary", True, ("vendor/*.py",))
    retention = found["LossRetentionDetector"]
    assert (retention.mode, retention.deep_scan_every_n_steps) == ("error", 10)
    tuner = found["BatchSizeTuner"]
    assert (tuner.max_val, tuner.steps_per_trial, tuner.dry_run, tuner.verbose) == (
        16,
        1,
        True,
        False,
    )
    advisor = found["SpeedAdvisor"]
    assert (advisor.measure_steps, advisor.data_wait_threshold) == (2, 0.5)
    timeline = found["StepTimeline"]
    assert timeline.trace_steps == (1, 2)
    assert Path(timeline.trace_dir) == tmp_path / "traces"
    profiler = found["DataPipelineProfiler"]
    assert (profiler.probe, profiler.probe_batches, profiler.model_steps) == ("start", 2, 1)


@each_namespace
def test_a_yaml_config_with_the_packs_callbacks_fits(ns: Namespace, tmp_path: Path) -> None:
    config = _config(tmp_path, (TRAINER + CALLBACKS).format(root=tmp_path))
    cli = _cli(ns, tmp_path, ["fit", "--config", str(config), "--trainer.max_steps", "2"])
    assert cli.trainer.global_step == 2
    found = _pack_callbacks(cli.trainer)
    assert found["ThroughputLogger"].doctor_figures()["samples_per_sec"] > 0
    assert found["BatchSizeTuner"].trials  # the dry run tried sizes, kept the batch size
    assert cli.model.batch_size == 8
    assert found["DataPipelineProfiler"].loader_ceiling is not None  # its probe ran
    traces = list((tmp_path / "traces").glob("*.json"))
    assert len(traces) == 1  # StepTimeline's trace window (steps 1..2) was written


@each_namespace
def test_a_wrong_argument_is_rejected_by_the_parser(ns: Namespace, tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        TRAINER.format(root=tmp_path)
        + "  callbacks:\n    - class_path: lightning_speedpack.ThroughputLogger\n"
        "      init_args: {window: not-a-number}\n",
    )
    with pytest.raises(SystemExit):
        _cli(ns, tmp_path, ["--config", str(config)], run=False)


@each_namespace
@pytest.mark.parametrize("name", ["ddp_speedpack", "ddp_speedpack_spawn"])
def test_the_strategy_by_name(ns: Namespace, name: str, tmp_path: Path) -> None:
    config = _config(tmp_path, TRAINER.format(root=tmp_path) + f"  strategy: {name}\n")
    cli = _cli(ns, tmp_path, ["--config", str(config), "--trainer.devices", "2"], run=False)
    assert type(cli.trainer.strategy) is ns.strategy_class


@each_namespace
def test_the_strategy_by_class_path(ns: Namespace, tmp_path: Path) -> None:
    cls = ns.strategy_class
    config = _config(
        tmp_path,
        TRAINER.format(root=tmp_path)
        + f"""\
  strategy:
    class_path: {cls.__module__}.{cls.__name__}
    init_args:
      compress_gradients: false
      limit_cpu_threads: false
      find_unused_parameters: true
""",
    )
    cli = _cli(ns, tmp_path, ["--config", str(config), "--trainer.devices", "2"], run=False)
    strategy = cli.trainer.strategy
    assert type(strategy) is cls
    assert (strategy.compress_gradients, strategy.limit_cpu_threads) == (False, False)
    assert strategy.ddp_comm_hook is None
    assert strategy.ddp_kwargs["find_unused_parameters"] is True


def test_the_public_strategy_name_is_the_first_namespaces_class() -> None:
    from tests.helpers.namespaces import NAMESPACES

    assert lightning_speedpack.DDPSpeedpackStrategy is NAMESPACES[0].strategy_class
