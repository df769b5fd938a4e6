"""The doctor's recorder: one fit's wall time and samples, and under DDP every rank's figures.

:class:`RunRecorder` is the callback ``speedpack doctor`` appends after every diagnostic on each
Trainer (see :mod:`lightning_speedpack.doctor.runner`).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_speedpack.core.batch import BatchSizer
from lightning_speedpack.core.cpu_wait import thread_cpu_wait_s
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.hook_hub import callbacks_of
from lightning_speedpack.core.lightning import Callback
from lightning_speedpack.core.logged_batch_size import unwatch, watch
from lightning_speedpack.core.profiler_tap import tap, untap
from lightning_speedpack.core.registry import Diagnosable
from lightning_speedpack.core.tables import log_fit_end, log_summary, log_table
from lightning_speedpack.doctor.report import RunSummary
from lightning_speedpack.world.figures import world_figures
from lightning_speedpack.world.payload import (
    StepClock,
    finding_items,
    gather_world,
    node_identity,
    scalar_figures,
)
from lightning_speedpack.world.revise import revise_figures, revise_findings
from lightning_speedpack.world.same_batches import (
    BatchPrints,
    data_parallel,
    repeated_batches_finding,
    repeated_in_epoch,
)
from lightning_speedpack.world.table import logged_table

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["WORLD_TABLE", "RunRecorder"]

#: The logged table of every rank's figures (columns: the engine's, then published figures).
WORLD_TABLE = "speedpack/world"


#: The method of Lightning's training epoch loop that broadcasts from rank 0 before each batch
#: (a SIGTERM flag), where the other ranks wait for a rank 0 still busy after the all-reduce.
BROADCAST = "_broadcast_sigterm_tensor"


def _time_broadcast(loop: Any, clock: StepClock) -> bool:
    """Time ``loop``'s per-batch broadcast into ``clock`` (an instance attribute over the method).

    False where the loop has no such broadcast (a Lightning without it: nothing waits there).
    """
    broadcast = getattr(loop, BROADCAST, None)
    if not callable(broadcast) or BROADCAST in vars(loop):
        return False

    def timed(*args: Any, **kwargs: Any) -> Any:
        # Whatever a later Lightning passes or returns goes through untouched.
        began = time.perf_counter()
        try:
            return broadcast(*args, **kwargs)
        finally:
            clock.broadcast_wait(time.perf_counter() - began)

    setattr(loop, BROADCAST, timed)
    return True


class RunRecorder(Callback):
    """Measures one fit's wall time and the samples it trained on (summed over ranks).

    Also records ``peak_rss_mb``: the peak resident memory of this (rank 0's main) process so
    far, from ``getrusage``; DataLoader workers are separate processes and not included; and
    what the run trained on: ``world_size`` (DDP ranks; ``samples`` sums them) and ``device``
    (the root device's type, ``"cpu"`` or ``"cuda"``).

    Runs on every rank. Each rank keeps its own clock of its training batches (the time between
    batches, inside a batch and inside backward, per epoch too: a few ``perf_counter`` reads a
    batch, no device sync, no collective). Under DDP, at the end of fit every rank sends rank 0
    its figures (its clock, wall time, samples, batches, host and node, and every scalar figure
    and finding of the diagnostics on its Trainer) in one bounded exchange
    (:func:`~lightning_speedpack.world.payload.gather_world`; a rank that does not answer within
    30 s is named, never waited for); rank 0 lays them out as ``figures["world"]``
    (:func:`~lightning_speedpack.world.engine.world_figures`).

    The doctor appends it after every diagnostic, so it is the last table source on the
    Trainer: at the end of fit it logs (rank 0, through the script's own loggers) the
    summary fields ``speedpack/wall_s`` and ``speedpack/peak_rss_mb``, the ``speedpack/world``
    table under DDP, and then, as the last one, ``speedpack/findings`` with every finding the
    doctor will print (the world's included), their counts and every diagnostic's figures (see
    :mod:`lightning_speedpack.core.tables`).
    """

    def __init__(self) -> None:
        self.runs: list[RunSummary] = []
        self._start = 0.0
        self._samples = 0
        self._sizer = BatchSizer()
        self._watched: Any = None
        self._tapped: Any = None  # the Trainer whose profiler it listens to (DDP)
        self._clock = StepClock()
        self._cpu_wait: float | None = None  # the fit thread's run-queue delay at fit start
        self._timed_loop: Any = None  # the epoch loop whose broadcast it times (DDP)
        self._prints = BatchPrints()  # the first batches of each epoch
        self._next_print = 0  # the next batch of this epoch to print (-1: none left)
        self._digests: dict[str, str] = {}  # their digests, read at the end of fit

    def __getstate__(self) -> dict[str, Any]:
        dropped = {"_watched": None, "_tapped": None, "_timed_loop": None}
        return {**self.__dict__, **dropped, "_prints": BatchPrints()}

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._samples = 0
        self._clock = StepClock()
        self._unwatch()
        self._watched = pl_module
        loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        if trainer.world_size > 1 and loop is not None and _time_broadcast(loop, self._clock):
            self._timed_loop = loop
        if trainer.world_size > 1:  # the backward's time goes in the world's payload
            tap(trainer, self)
            self._tapped = trainer
        self._sizer = BatchSizer(logged=watch(pl_module))
        self._prints = BatchPrints()
        self._cpu_wait = thread_cpu_wait_s()
        self._start = time.perf_counter()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clock.epoch_start(trainer.current_epoch)
        self._next_print = self._prints.next_wanted(trainer.current_epoch, 0)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clock.epoch_end()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clock.pause(time.perf_counter())

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clock.resume(time.perf_counter())

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._clock.batch_start(time.perf_counter())
        # A few batches of the first epochs are printed (see world.same_batches): one compare a
        # batch; -1 when none is left (a fit resumed mid-epoch prints from where it starts).
        if batch_idx >= self._next_print >= 0:
            epoch = trainer.current_epoch
            if self._prints.wants(epoch, batch_idx):
                self._prints.take(epoch, batch_idx, batch)
            self._next_print = self._prints.next_wanted(epoch, batch_idx + 1)

    def handler(self, name: str) -> Callable[[str, bool, float], None] | None:
        """What it hears of the profiled actions under DDP (``profiler_tap``): each backward.

        The backward starts when the module's ``on_before_backward``, the last hook before it,
        returns, and ends when the first ``on_after_backward`` (a callback's, or the
        module's) starts: heard from the profiler rather than from two callback hooks of its
        own, which Lightning would dispatch every batch (36 interpreted lines a step on one
        rank of the DDP zoo's clean MLP, ``benchmarks/doctor_lines.py``).
        """
        if name.endswith(".on_before_backward") and name.startswith("[LightningModule]"):
            return self._before_backward_heard
        return self._after_backward_heard if name.endswith(".on_after_backward") else None

    def on_action(self, name: str, started: bool, now: float) -> None:
        """As :meth:`handler` routes it (the tap asks ``handler``, once per action name)."""
        heard = self.handler(name)
        if heard is not None:
            heard(name, started, now)

    def _before_backward_heard(self, name: str, started: bool, now: float) -> None:
        if not started:
            self._clock.backward_start(now)

    def _after_backward_heard(self, name: str, started: bool, now: float) -> None:
        if started:
            self._clock.backward_end(now)

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
        size = self._sizer(batch)  # a batch it cannot size counts as one
        self._samples += size
        self._clock.batch_end(now, size)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        wall = time.perf_counter() - self._start
        samples = self._samples
        self._digests = self._prints.digests()  # once per fit: the prints' copies to the host
        figures: dict[str, Any] = {"repeated_batches": repeated_in_epoch(self._digests)}
        if trainer.world_size > 1 and torch.distributed.is_initialized():  # once per fit
            gathered = gather_world(self._payload(trainer, wall))
            if gathered is not None:  # rank 0
                figures["world"] = world_figures(
                    gathered.payloads, gathered.missing, trainer.world_size
                )
                samples = sum(int(p.get("samples") or 0) for p in gathered.payloads.values())
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        figures.update(
            {
                "peak_rss_mb": round(peak_rss_mb, 1),
                # what the figures were measured on: one page per run, ranks combined
                "world_size": trainer.world_size,
                "device": trainer.strategy.root_device.type,
                # what `samples` counts: samples, graphs (PyG), nodes, or batches when
                # no batch's size could be read
                "sample_unit": self._sizer.unit,
            }
        )
        self.runs.append(
            RunSummary(
                wall_s=wall, samples=samples, samples_per_sec=samples / wall, figures=figures
            )
        )
        log_fit_end(trainer, self)

    def _payload(self, trainer: pl.Trainer, wall: float) -> dict[str, Any]:
        """What this rank sends rank 0 (see :mod:`lightning_speedpack.world.payload`)."""
        figures: dict[str, Any] = {}
        found: list[Finding] = []
        for callback in callbacks_of(trainer):
            if callback is self or not isinstance(callback, Diagnosable):
                continue
            try:  # one failing diagnostic must not cost the rank its row
                figures.update(scalar_figures(callback.doctor_figures()))
                found.extend(callback.doctor_findings())
            except Exception:  # pragma: no cover - defensive
                continue
        return {
            "rank": trainer.global_rank,
            **node_identity(),
            "wall_s": wall,
            "samples": self._samples,
            "sample_unit": self._sizer.unit,
            "clock": self._clock.figures(),
            "cpu_wait_s": self._cpu_wait_s(),
            # compared between ranks where each should see its own (not tensor parallel)
            "batch_prints": self._digests if data_parallel(trainer.strategy) else {},
            "figures": figures,
            "findings": finding_items(found),
        }

    def _cpu_wait_s(self) -> float | None:
        """Seconds the fit's thread was ready to run but had no CPU, this fit (None: unknown)."""
        now = thread_cpu_wait_s()
        if now is None or self._cpu_wait is None:
            return None
        return round(max(now - self._cpu_wait, 0.0), 6)

    @property
    def world(self) -> dict[str, Any] | None:
        """The last fit's ``figures["world"]`` (rank 0 of a DDP fit), else None."""
        world = self.runs[-1].figures.get("world") if self.runs else None
        return world if isinstance(world, dict) else None

    def revise_findings(self, findings: list[Finding]) -> list[Finding]:
        """The diagnostics' findings (rank 0's) read with the world in view (DDP), and more.

        ``data/repeated-batches`` is added when the last fit's epoch repeated its batches.

        See :func:`~lightning_speedpack.world.revise.revise_findings`.
        """
        revised = revise_findings(findings, self.world)
        repeated = self.runs[-1].figures.get("repeated_batches") if self.runs else None
        return [*revised, repeated_batches_finding(repeated)] if repeated else revised

    def revise_figures(self, figures: dict[str, Any]) -> None:
        """The diagnostics' figures (rank 0's) as the world's, in place (DDP)."""
        revise_figures(figures, self.world)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._unwatch()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._unwatch()

    def _unwatch(self) -> None:
        tapped, self._tapped = self._tapped, None
        if tapped is not None:
            untap(tapped, self)
        module, self._watched = self._watched, None
        if module is not None:
            unwatch(module)
        loop, self._timed_loop = self._timed_loop, None
        if loop is not None and BROADCAST in vars(loop):
            delattr(loop, BROADCAST)  # the method again

    def log_tables(self, trainer: pl.Trainer) -> None:
        """Log the last fit's wall time and peak RSS (summary fields) and, under DDP, the world.

        ``speedpack/world``: a row per rank (:func:`~lightning_speedpack.world.table.logged_table`),
        with ``speedpack/world/straggler_rank``, ``speedpack/world/stalls_rank`` (-1: none) and
        ``speedpack/world/ranks_missing``.
        """
        if not self.runs:
            return
        run = self.runs[-1]
        fields: dict[str, Any] = {
            "speedpack/wall_s": round(run.wall_s, 3),
            "speedpack/peak_rss_mb": run.figures.get("peak_rss_mb"),
        }
        world = self.world
        if world is not None:
            columns, rows = logged_table(world)
            log_table(trainer, WORLD_TABLE, columns, rows)
            straggler = world.get("straggler") or {}
            fields["speedpack/world/straggler_rank"] = int(straggler.get("rank", -1))
            stalls = world.get("stalls") or {}
            fields["speedpack/world/stalls_rank"] = int(stalls.get("rank", -1))
            fields["speedpack/world/ranks_missing"] = len(world.get("missing") or [])
        log_summary(trainer, fields)
