"""ThroughputLogger: sync-free samples/s, data-wait fraction and MFU, logged to every logger."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_speedpack.core.batch import infer_batch_size
from lightning_speedpack.core.collectives import (
    bounded_all_reduce,
    collective_timeout,
    validate_timeout,
)
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.lightning import Callback, classes, rank_zero_info
from lightning_speedpack.core.registry import register_diagnostic
from lightning_speedpack.throughput import nvml as _nvml
from lightning_speedpack.throughput.peak_flops import peak_flops
from lightning_speedpack.throughput.rates import (
    RATE_FIELDS,
    StepClock,
    WindowRates,
    combine_ranks,
    mfu,
    rates,
    window_rates,
)

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["ThroughputLogger"]

DATA_WAIT_THRESHOLD = 0.2
_TOTALS = ("samples", "batches", "items", "train_seconds", "wait_seconds", "flops")


class ThroughputLogger(Callback):
    r"""Log training throughput, the time spent waiting for data, MFU and GPU/CPU statistics.

    Use it to answer the first question of any speed-up: does a step's time go to waiting for
    the DataLoader or to computing? It times the wall-clock intervals between Lightning's batch
    hooks (``time.perf_counter``), never synchronises with the device, and sums over a window
    of steps, which is exact in steady state even with asynchronous kernels. Validation time is
    excluded. Under DDP nothing crosses ranks per step; on logging steps one all-reduce of a
    small float64 tensor sums what each rank processed (the world's samples/s is the sum over
    ranks, not rank 0 times the world size).

    Rank policy: measures on every rank; logs on rank 0 only, through every logger in
    ``trainer.loggers`` at ``trainer.global_step`` (public ``Logger.log_metrics``).

    ============================================  ================================================
    Key                                           Meaning
    ============================================  ================================================
    ``throughput/samples_per_sec``                samples/s of the world over the window
    ``throughput/batches_per_sec``                batches/s, summed over ranks
    ``throughput/device/samples_per_sec``         samples/s per device (world / devices)
    ``throughput/items_per_sec``                  ``items_fn`` units/s (only with ``items_fn``)
    ``throughput/step_time_ms``                   mean step time (data wait included)
    ``throughput/data_wait_ms``                   mean wait for the next batch per step
    ``throughput/data_wait_fraction``             data wait / step time over the window
    ``throughput/flops_per_sec``                  achieved FLOP/s (when FLOPs are known)
    ``throughput/mfu``                            FLOP/s over the devices' dense peak
    ``throughput/samples``, ``throughput/batches``  totals so far (continue after a resume)
    ``system/gpu/util``, ``mem_used_gb``,         NVML, sampled by a background thread; mean
    ``power_w``, ``temp_c``                       over local devices, plus ``_min``/``_max``
    ``system/cpu_util``, ``system/ram_used_gb``   psutil
    ============================================  ================================================

    With a ``WandbLogger``, every key uses ``trainer/global_step`` as its step axis
    (``define_metric``), the settings go into the run config under ``throughput_logger``, and
    the run summary gets ``throughput/mean_samples_per_sec``,
    ``throughput/mean_data_wait_fraction``, ``throughput/mean_mfu`` and
    ``system/gpu/peak_mem_used_gb`` at fit end.

    ``flops_per_batch="auto"`` runs the first real training step (forward, backward and
    optimizer step) under ``torch.utils.flop_counter.FlopCounterMode``; that step is left out
    of the window. GPU-only paths (NVML sampling, peak FLOPs lookup, MFU) were exercised on a
    CPU-only machine through injection only.

    Args:
        batch_size_fn: ``batch -> int`` samples in a batch; default: the first dimension of
            the batch's first tensor.
        items_fn: ``batch -> int`` items (tokens, pixels, ...) in a batch, for ``items_per_sec``.
        window: number of recent batches the rates are computed over.
        log_every_n_steps: log every this many optimizer steps; None follows the Trainer's.
        flops_per_batch: FLOPs of one training batch: an int, a ``batch -> int`` callable, or
            ``"auto"`` to measure them once. None: no FLOP/s or MFU.
        gpu_stats: sample NVML (``system/gpu/*``) and psutil (``system/*``) statistics.
        prefix: prefix of the throughput keys.
        collective_timeout: (keyword-only) seconds the DDP world combine may wait for the other
            ranks; default ``LIGHTNING_SPEEDPACK_COLLECTIVE_TIMEOUT`` or 300 s, never above the
            process group's timeout. A rank that died or is stuck makes the others raise
            ``CollectiveTimeoutError`` naming the step, instead of hanging.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``window``, ``log_every_n_steps`` or ``flops_per_batch`` is out of range.

    Example:
        >>> from pytorch_lightning import Trainer
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> monitor = ThroughputLogger(window=4, log_every_n_steps=2)
        >>> trainer = Trainer(max_steps=4, callbacks=[monitor], logger=False,
        ...                   enable_progress_bar=False, enable_model_summary=False,
        ...                   enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(BoringModel())
        >>> [step for step, _ in monitor.doctor_figures()["samples_per_sec_over_steps"]]
        [2, 4]
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        items_fn: Callable[[Any], int] | None = None,
        window: int = 50,
        log_every_n_steps: int | None = None,
        flops_per_batch: int | float | Callable[[Any], float] | str | None = None,
        gpu_stats: bool = True,
        prefix: str = "throughput/",
        *,
        collective_timeout: float | None = None,
    ) -> None:
        _check_args(
            batch_size_fn, items_fn, window, log_every_n_steps, flops_per_batch, gpu_stats, prefix
        )
        if collective_timeout is not None:
            collective_timeout = validate_timeout("collective_timeout", collective_timeout)
        self.collective_timeout = collective_timeout
        self.batch_size_fn = batch_size_fn
        self.items_fn = items_fn
        self.window = window
        self.log_every_n_steps = log_every_n_steps
        self.flops_per_batch = flops_per_batch
        self.gpu_stats = gpu_stats
        self.prefix = prefix

        self._state_key = self._generate_state_key(prefix=prefix, window=window)
        self._clock = StepClock(window)
        self._totals: dict[str, float] = dict.fromkeys(_TOTALS, 0.0)
        self._measured_flops: float | None = None
        self._over_steps: list[list[float]] = []
        self._last_logged_step = -1
        self._pending = 0  # batches since the last log
        self.last_metrics: dict[str, float] = {}
        self.last_local: WindowRates | None = None
        self._run_figures: dict[str, Any] = {}
        self._peak: float | None = None
        self._world_size = 1
        self._num_workers: int | None = None
        self._dataset_location: str | None = None
        # runtime-only: never pickled
        self._sampler: _nvml.NvmlSampler | None = None
        self._flop_mode: Any = None

    # ---- Lightning plumbing --------------------------------------------------------------

    @property
    @override
    def state_key(self) -> str:
        # Lightning reads this on every hook call (profiler names): build it once.
        return self._state_key

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_sampler"] = None
        state["_flop_mode"] = None
        return state

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "totals": dict(self._totals),
            "measured_flops": self._measured_flops,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Totals continue; the window restarts, so the first rates after resume do not spike.
        totals = state_dict.get("totals", {})
        self._totals = {k: float(totals.get(k, 0.0)) for k in _TOTALS}
        self._measured_flops = state_dict.get("measured_flops")
        self._clock.reset()
        self._pending = 0

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._clock.reset()
        self._totals = dict.fromkeys(_TOTALS, 0.0)  # a checkpoint restores them after setup
        self._over_steps = []
        self._run_figures = {}
        self._last_logged_step = -1
        self._pending = 0
        self._world_size = trainer.world_size
        self._peak = _device_peak_flops(trainer)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.gpu_stats and trainer.is_global_zero:
            self._start_sampler(trainer)
            _cpu_stats()  # primes psutil's cpu_percent interval
        if trainer.is_global_zero:
            self._setup_wandb(trainer)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clock.reset()
        self._pending = 0
        loader = trainer.train_dataloader
        if isinstance(loader, torch.utils.data.DataLoader):
            self._num_workers = loader.num_workers
            self._dataset_location = _getitem_location(loader.dataset)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clock.epoch_start(time.perf_counter())

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._clock.batch_start(time.perf_counter())
        if self.flops_per_batch == "auto" and self._measured_flops is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._flop_mode = FlopCounterMode(display=False)
            self._flop_mode.__enter__()

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        now = time.perf_counter()
        measuring = self._flop_mode is not None
        if measuring:
            self._measured_flops = float(self._flop_mode.get_total_flops())
            self._close_flop_mode()
        samples = self.batch_size_fn(batch) if self.batch_size_fn else _batch_size(batch)
        items = self.items_fn(batch) if self.items_fn else 0
        record = self._clock.batch_end(now, samples, items, self._batch_flops(batch))
        if record is None:
            return
        if measuring:  # the counted step ran slowly under the counter: keep it out of rates
            self._clock.window.pop()
        totals = self._totals
        totals["samples"] += record.samples
        totals["batches"] += 1
        totals["items"] += record.items
        totals["train_seconds"] += record.seconds
        totals["wait_seconds"] += record.data_wait
        totals["flops"] += record.flops
        self._pending += 1
        step = trainer.global_step
        every = self.log_every_n_steps or int(getattr(trainer, "log_every_n_steps", 50))
        if step % every == 0 and step != self._last_logged_step:
            self._log(trainer, pl_module)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clock.pause(time.perf_counter())

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clock.resume(time.perf_counter())

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Log the unlogged tail once, so short runs still get a point (same on every rank).
        if self._pending and trainer.global_step != self._last_logged_step:
            self._log(trainer, pl_module)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        world = self._combine(trainer, pl_module, self._totals_rates(), [])[0]
        if world is not None:
            self._run_figures = self._figures_from(world)
        peak_mem = self._sampler.peak_mem_used_gb if self._sampler is not None else None
        if peak_mem is not None:
            self._run_figures["peak_gpu_mem_used_gb"] = peak_mem
        self._stop_sampler()
        if trainer.is_global_zero and self._run_figures:
            self._write_wandb_summary(trainer)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._close_flop_mode()
        self._stop_sampler()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._close_flop_mode()
        self._stop_sampler()

    def _totals_rates(self) -> WindowRates | None:
        """This rank's rates over the whole run so far (None before the first timed step)."""
        t = self._totals
        return rates(
            int(t["batches"]),
            t["train_seconds"],
            int(t["samples"]),
            int(t["items"]),
            t["wait_seconds"],
            t["flops"],
        )

    # ---- doctor ----------------------------------------------------------------------------

    def doctor_figures(self) -> dict[str, Any]:
        """Whole-run figures: samples/s, data-wait fraction, step time, samples/s over steps."""
        figures = dict(self._run_figures)
        if not figures:  # the fit did not end normally: use this rank's totals
            local = self._totals_rates()
            if local is not None:
                figures = self._figures_from(local)
        figures["samples_per_sec_over_steps"] = [list(p) for p in self._over_steps]
        return figures

    def doctor_findings(self) -> list[Finding]:
        """A ``data-wait`` warning when more than 20% of the step time waits for data."""
        figures = self.doctor_figures()
        fraction = figures.get("data_wait_fraction")
        if fraction is None or fraction <= DATA_WAIT_THRESHOLD:
            return []
        workers = self._num_workers
        return [
            Finding(
                component="throughput",
                id="data-wait",
                message=(
                    f"{fraction:.0%} of each training step waits for the DataLoader's next batch "
                    f"(step {figures.get('step_time_ms', 0.0):.1f} ms)"
                ),
                location=self._dataset_location,
                figures={"data_wait_fraction": fraction, "num_workers": workers},
                severity="warning",
                fix=(
                    "cache the deterministic preprocessing with lightning_speedpack.CachedDataset "
                    f"and/or raise DataLoader(num_workers=...) (now {workers}) with "
                    "persistent_workers=True (and pin_memory=True on GPU)"
                ),
            )
        ]

    # ---- internals -------------------------------------------------------------------------

    def _batch_flops(self, batch: Any) -> float:
        spec = self.flops_per_batch
        if spec is None:
            return 0.0
        if spec == "auto":
            return self._measured_flops or 0.0
        if callable(spec):
            return float(spec(batch))
        return float(spec)  # type: ignore[arg-type]

    def _combine(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        local: WindowRates | None,
        extra: list[float],
    ) -> tuple[WindowRates | None, list[float]]:
        """Sum ``local`` rates (and ``extra`` values) over ranks with one small all-reduce."""
        vector = [
            *(local.vector() if local else [0.0] * len(RATE_FIELDS)),
            float(local is not None),
            *extra,
        ]
        if trainer.world_size > 1:
            local_sums = torch.tensor(vector, dtype=torch.float64, device=pl_module.device)
            if torch.distributed.is_initialized():
                # bounded: a rank that died or is stuck fails this one with a clear message
                summed = bounded_all_reduce(
                    local_sums,
                    timeout_s=collective_timeout(self.collective_timeout),
                    what=f"ThroughputLogger: world samples/s combine at step {trainer.global_step}",
                )
            else:  # a strategy without torch.distributed: its own reduce
                summed = trainer.strategy.reduce(local_sums, reduce_op="sum")
            vector = summed.tolist()
        n = len(RATE_FIELDS)
        ranks = round(vector[n])
        world = combine_ranks(vector[:n], ranks) if ranks > 0 else None
        return world, vector[n + 1 :]

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        step = trainer.global_step
        self._last_logged_step = step
        self._pending = 0
        local = window_rates(self._clock.window)
        self.last_local = local
        totals = [self._totals["samples"], self._totals["batches"]]
        world, (samples, batches) = self._combine(trainer, pl_module, local, totals)
        if world is None:
            return
        p = self.prefix
        metrics: dict[str, float] = {
            f"{p}samples_per_sec": world.samples_per_sec,
            f"{p}batches_per_sec": world.batches_per_sec,
            f"{p}device/samples_per_sec": world.samples_per_sec / trainer.world_size,
            f"{p}step_time_ms": world.step_time_ms,
            f"{p}data_wait_ms": world.data_wait_ms,
            f"{p}data_wait_fraction": world.data_wait_fraction,
            f"{p}samples": samples,
            f"{p}batches": batches,
        }
        if self.items_fn is not None:
            metrics[f"{p}items_per_sec"] = world.items_per_sec
        if self.flops_per_batch is not None and world.flops_per_sec > 0:
            metrics[f"{p}flops_per_sec"] = world.flops_per_sec
            utilisation = mfu(world.flops_per_sec, self._peak, trainer.world_size)
            if utilisation is not None:
                metrics[f"{p}mfu"] = utilisation
        self._over_steps.append([step, world.samples_per_sec])
        if not trainer.is_global_zero:
            return
        if self._sampler is not None:
            metrics.update(_nvml.summarize(self._sampler.read()))
        if self.gpu_stats:
            metrics.update(_cpu_stats())
        self.last_metrics = metrics
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    def _figures_from(self, world: WindowRates) -> dict[str, Any]:
        figures: dict[str, Any] = {
            "samples_per_sec": world.samples_per_sec,
            "data_wait_fraction": world.data_wait_fraction,
            "step_time_ms": world.step_time_ms,
        }
        if world.flops_per_sec > 0:
            figures["flops_per_sec"] = world.flops_per_sec
            utilisation = mfu(world.flops_per_sec, self._peak, self._world_size)
            if utilisation is not None:
                figures["mfu"] = utilisation
        return figures

    def _start_sampler(self, trainer: pl.Trainer) -> None:
        indices = _local_cuda_indices(trainer)
        if isinstance(indices, str):
            rank_zero_info(f"ThroughputLogger: system/gpu/* not logged: {indices}")
            return
        functions = _nvml.load_functions()
        if isinstance(functions, str):
            rank_zero_info(f"ThroughputLogger: system/gpu/* not logged: {functions}")
            return
        sampler = _nvml.NvmlSampler(functions, _nvml.nvml_indices(indices))
        sampler.start()
        self._sampler = sampler

    def _stop_sampler(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()

    def _close_flop_mode(self) -> None:
        mode, self._flop_mode = self._flop_mode, None
        if mode is not None:
            mode.__exit__(None, None, None)

    def _settings(self) -> dict[str, Any]:
        flops = self.flops_per_batch
        return {
            "window": self.window,
            "log_every_n_steps": self.log_every_n_steps,
            "flops_per_batch": flops
            if isinstance(flops, (int, float, str)) or flops is None
            else getattr(flops, "__name__", "callable"),
            "batch_size_fn": getattr(self.batch_size_fn, "__name__", None),
            "items_fn": getattr(self.items_fn, "__name__", None),
            "gpu_stats": self.gpu_stats,
            "peak_flops_per_device": self._peak,
        }

    def _setup_wandb(self, trainer: pl.Trainer) -> None:
        for run in _wandb_runs(trainer):
            run.define_metric("trainer/global_step")
            for pattern in (f"{self.prefix}*", "system/*"):
                run.define_metric(pattern, step_metric="trainer/global_step")
            run.config.update({"throughput_logger": self._settings()}, allow_val_change=True)

    def _write_wandb_summary(self, trainer: pl.Trainer) -> None:
        f = self._run_figures
        names = {
            "samples_per_sec": f"{self.prefix}mean_samples_per_sec",
            "data_wait_fraction": f"{self.prefix}mean_data_wait_fraction",
            "mfu": f"{self.prefix}mean_mfu",
            "peak_gpu_mem_used_gb": "system/gpu/peak_mem_used_gb",
        }
        summary = {key: f[name] for name, key in names.items() if name in f}
        for run in _wandb_runs(trainer):
            run.summary.update(summary)


def _check_args(
    batch_size_fn: Any,
    items_fn: Any,
    window: Any,
    log_every_n_steps: Any,
    flops_per_batch: Any,
    gpu_stats: Any,
    prefix: Any,
) -> None:
    for name, fn in (("batch_size_fn", batch_size_fn), ("items_fn", items_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(f"`{name}` must be a callable(batch) -> int or None, got {fn!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"`window` must be a positive int, got {window!r}")
    if log_every_n_steps is not None and (
        isinstance(log_every_n_steps, bool)
        or not isinstance(log_every_n_steps, int)
        or log_every_n_steps < 1
    ):
        raise ValueError(
            f"`log_every_n_steps` must be a positive int or None, got {log_every_n_steps!r}"
        )
    if isinstance(flops_per_batch, str):
        if flops_per_batch != "auto":
            raise ValueError(
                f"`flops_per_batch` as a string must be 'auto', got {flops_per_batch!r}"
            )
    elif isinstance(flops_per_batch, bool) or not (
        flops_per_batch is None
        or callable(flops_per_batch)
        or isinstance(flops_per_batch, (int, float))
    ):
        raise TypeError(
            "`flops_per_batch` must be an int, a callable(batch), 'auto' or None, "
            f"got {flops_per_batch!r}"
        )
    elif isinstance(flops_per_batch, (int, float)) and flops_per_batch <= 0:
        raise ValueError(f"`flops_per_batch` must be positive, got {flops_per_batch!r}")
    if not isinstance(gpu_stats, bool):
        raise TypeError(f"`gpu_stats` must be a bool, got {gpu_stats!r}")
    if not isinstance(prefix, str):
        raise TypeError(f"`prefix` must be a str, got {prefix!r}")


def _batch_size(batch: Any) -> int:
    # Fast path for the common (inputs, targets) tuple; infer_batch_size handles the rest.
    first = batch[0] if type(batch) in (tuple, list) and batch else batch
    if type(first) is torch.Tensor and first.ndim:
        return int(first.shape[0])
    return infer_batch_size(batch)


def _device_peak_flops(trainer: pl.Trainer) -> float | None:
    """Dense peak FLOP/s of the trainer's device at its precision (None off CUDA or unknown)."""
    device = trainer.strategy.root_device
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = peak_flops(name, str(trainer.precision), torch.get_float32_matmul_precision())
    if peak is None:
        rank_zero_info(f"ThroughputLogger: no peak FLOPs known for {name!r}; MFU not logged")
    return peak


def _local_cuda_indices(trainer: pl.Trainer) -> list[int] | str:
    """The CUDA indices of this node's training devices, or why there are none."""
    if trainer.strategy.root_device.type != "cuda":
        return "training does not run on a CUDA GPU"
    return list(trainer.device_ids)


def _cpu_stats() -> dict[str, float]:
    import psutil

    return {
        "system/cpu_util": float(psutil.cpu_percent(interval=None)),
        "system/ram_used_gb": psutil.virtual_memory().used / 1e9,
    }


def _wandb_runs(trainer: pl.Trainer) -> list[Any]:
    wandb_loggers = classes("loggers.WandbLogger")  # either namespace's
    return [lg.experiment for lg in trainer.loggers if isinstance(lg, wandb_loggers)]


def _getitem_location(dataset: Any) -> str | None:
    """``file.py:LINE`` of the dataset's ``__getitem__`` when it is the user's own code."""
    getitem = getattr(type(dataset), "__getitem__", None)
    if not inspect.isfunction(getitem):
        return None
    try:
        source = inspect.getsourcefile(getitem)
        line = inspect.getsourcelines(getitem)[1] if source else None
    except (OSError, TypeError):
        return None
    if source is None or line is None:
        return None
    parts = Path(source).parts
    if "site-packages" in parts or "torch" in parts:
        return None
    return f"{Path(source).name}:{line}"


register_diagnostic(
    "throughput",
    ThroughputLogger,
    factory=lambda ctx: ThroughputLogger(log_every_n_steps=10, window=10),
    order=10,
)
