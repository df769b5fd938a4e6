"""SyncPointWarnings: every host-device synchronisation in the training step, with file:line."""

from __future__ import annotations

import warnings
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import torch
from typing_extensions import override

from lightning_speedpack.core import events, sampling
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.hook_hub import hub_of
from lightning_speedpack.core.lightning import Callback
from lightning_speedpack.core.registry import register_diagnostic
from lightning_speedpack.core.tables import TABLES, Cell, log_fit_end, log_summary, log_table
from lightning_speedpack.sync_points.attribution import library_fix
from lightning_speedpack.sync_points.detect import (
    FIXES,
    SyncDebugApi,
    SyncDetector,
    SyncFinding,
    SyncPointError,
    SyncWarning,
    framework_fix,
)

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["SyncFinding", "SyncPointError", "SyncPointWarnings", "SyncWarning"]

Mode = Literal["warn", "error", "summary", "record"]
_MODES = ("warn", "error", "summary", "record")
#: What a sampled detector leaves uncalled under the doctor's hub until its next sampled step.
_TRAIN_BATCH_HOOKS = ("on_train_batch_start", "on_train_batch_end")


def _sync_debug_api(trainer: pl.Trainer) -> SyncDebugApi | None:
    """``torch.cuda``'s sync debug mode getter/setter on a CUDA run, else None."""
    if trainer.strategy.root_device.type != "cuda":
        return None
    return torch.cuda.get_sync_debug_mode, torch.cuda.set_sync_debug_mode


class _PublishingDetector(SyncDetector):
    """A :class:`SyncDetector` that also publishes each recorded sync on ``events.SYNC_POINT``.

    Other tools (the step timeline) listen there without importing this one. When nobody
    listens it costs one dict lookup per sync.
    """

    @override
    def hit(self, kind: str, frame: FrameType | None) -> None:
        if not events.has_subscribers(events.SYNC_POINT):
            super().hit(kind, frame)
            return
        before = {key: rec.count for key, rec in self._records.items()}
        try:
            super().hit(kind, frame)
        finally:  # published before a SyncPointError propagates, too
            for key, rec in self._records.items():
                if rec.count != before.get(key, 0):
                    events.publish(
                        events.SYNC_POINT,
                        events.SyncPoint(rec.kind, rec.location, rec.origin, self.step),
                    )
                    break


class SyncPointWarnings(Callback):
    r"""Find every GPU->CPU synchronisation in the training step, with its file:line and count.

    A step that calls ``.item()``, ``.cpu()``, ``print(t)`` or ``if t:`` on a GPU tensor makes
    the CPU wait until the GPU's queue drains, so the GPU idles while Python prepares the
    next kernels. Add this callback to see each such call site once, with how often it syncs
    per step, and to get a fix for each kind. Leave it on in ``"warn"`` mode while
    developing, or use ``"error"`` in a test to keep a step sync-free.

    It watches the training batch: from ``on_train_batch_start`` through ``training_step``,
    backward, the optimizer step, every ``on_train_batch_end`` hook (yours, other callbacks',
    the LightningModule's) and Lightning's work up to the next batch (the DDP SIGTERM
    broadcast, logging). Masked indexing is watched up to this callback's own
    ``on_train_batch_end`` only (DataLoader code indexes once per sample, so watching it
    there would cost). Validation batches are watched with ``validation=True``. Dataset
    code that a ``DataLoader`` runs in this process is not counted. Syncs in the pack's other
    callbacks count as yours: they promise to add none (``mode="error"`` proves it).

    What counts: ``.item()``, ``float()/int()/bool()`` (``if (x != 0).all():``),
    ``__index__``, ``.tolist()``, ``.numpy()``/``np.asarray(t)``, ``.cpu()``, ``.to("cpu")`` of
    a device tensor, ``print(t)``/``repr``/``str``/f-strings, ``nonzero``, one-argument
    ``torch.where``, ``masked_select``, ``unique``, boolean-mask indexing ``x[mask]`` and
    ``x[mask] = v``, non-blocking copies from pageable memory, ``torch.cuda.synchronize``,
    ``empty_cache``, ``Event.synchronize``, ``Stream.synchronize``; on CUDA also whatever
    ``torch.cuda.set_sync_debug_mode("warn")`` flags (armed only for the watched region,
    mapped to your frame, previous mode restored). A call is reported at the first frame
    outside torch, numpy, the standard library and Lightning; syncs made by Lightning itself
    (progress-bar metrics, the DDP SIGTERM broadcast) are kept apart as
    ``origin="framework"`` with the Trainer setting that avoids them; they never warn or raise.
    ``self.log(tensor)`` is not a sync and is not reported.

    How: the few ``torch.Tensor`` methods and ``torch``/``torch.cuda`` functions that can sync
    are wrapped during ``fit`` (a global read and a thread-id compare per call when not
    watching; other threads are unaffected) and restored exactly at fit end, after an
    exception, and before the next Trainer. Measured overhead (``benchmarks/sync_points.py``)
    is within the noise on a small CNN and a few percent on a tiny MLP step. Names imported
    before the fit (``from torch import where``) keep the unwrapped function and are missed.

    ``include_cpu=True`` counts CPU tensors as device tensors, so a CPU run shows what *would*
    sync on a GPU (the doctor uses it). ``.to("cpu")`` of a CPU tensor then counts, but
    ``.to(self.device)`` does not (a ``torch.device`` may be the module's own device).

    At the end of fit (once, rank 0, through the Trainer's loggers; see
    :mod:`lightning_speedpack.core.tables` for what W&B, CSV and TensorBoard get):

    ===========================  ==========================================================
    key                          what
    ===========================  ==========================================================
    ``speedpack/sync_points``    table, one row per call site: ``origin``, ``kind``,
                                 ``location`` (file:line), ``code``, ``function``,
                                 ``per_step``, ``steps_seen``, ``first_step``
    ``speedpack/syncs_per_step`` summary: your syncs per watched training batch
    ===========================  ==========================================================

    When it is the last of the pack's callbacks on the Trainer it also logs
    ``speedpack/findings`` (every pack callback's findings) and their counts.

    Rank policy: every rank records its own :attr:`report`; only rank 0 warns, prints and logs.
    The CUDA paths (``set_sync_debug_mode``, ``torch.cuda.synchronize``, ``Event``/``Stream``
    ``.synchronize``, real device tensors) were exercised on a CPU-only machine through
    injection only (fake debug-mode API and warnings, fake CUDA functions, ``meta`` tensors).
    While armed on CUDA, the warning filters are saved and restored around the fit
    (``warnings.catch_warnings``), so filters a hook adds during the fit do not outlive it.

    Args:
        mode: ``"warn"``: one :class:`SyncWarning` per user call site, at your file and line;
            ``"error"``: raise :class:`SyncPointError` at the first user sync;
            ``"summary"``: nothing during training, a table at the end of fit;
            ``"record"``: nothing printed or raised, the call sites kept for :attr:`report`,
            the findings and the figures (``speedpack doctor``'s: its report shows them).
        include_cpu: treat CPU tensors as device tensors (default: only non-CPU tensors).
        validation: also watch validation batches.
        allow: call sites to ignore: ``"path/file.py:123"``, ``"file.py"`` (every line) or a
            glob (``"*/losses.py:*"``).
        sample_every_n_steps: watch every training step before step 16, then one step in this
            many, and from step 64 one in eight times as many (``1``: every step; see
            :mod:`~lightning_speedpack.core.sampling`). On the steps between nothing is
            watched: a wrapper returns at once. Counts per step are per watched step; a sync
            made only on steps that are never watched is missed. The doctor watches one step
            in 8, from step 64 one in 64 (the steps its StepTimeline times), ``--deep``
            every step.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: ``mode`` is not one of ``"warn"``, ``"error"``, ``"summary"``, ``"record"``, or
            ``sample_every_n_steps`` is below 1.

    Example:
        >>> from pytorch_lightning import Trainer
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> class Chatty(BoringModel):
        ...     def training_step(self, batch, batch_idx):
        ...         out = super().training_step(batch, batch_idx)
        ...         self.last = out["loss"].item()
        ...         return out
        >>> sync = SyncPointWarnings(mode="summary", include_cpu=True)
        >>> trainer = Trainer(accelerator="cpu", max_steps=3, callbacks=[sync], logger=False,
        ...                   enable_progress_bar=False, enable_checkpointing=False,
        ...                   enable_model_summary=False)
        >>> trainer.fit(Chatty())
        >>> [(f.kind, f.function, f.per_step) for f in sync.user_findings]
        [('item', 'training_step', 1.0)]
    """

    def __init__(
        self,
        mode: Mode = "warn",
        include_cpu: bool = False,
        validation: bool = False,
        allow: str | tuple[str, ...] | list[str] = (),
        sample_every_n_steps: int = 1,
    ) -> None:
        self.sample_every_n_steps = sampling.check_sample_every(sample_every_n_steps)
        errors: list[str] = []
        if not isinstance(mode, str) or mode not in _MODES:
            errors.append(f"`mode` must be one of {', '.join(map(repr, _MODES))}, got {mode!r}")
        for name, value in (("include_cpu", include_cpu), ("validation", validation)):
            if not isinstance(value, bool):
                errors.append(f"`{name}` must be a bool, got {value!r}")
        allowed = (allow,) if isinstance(allow, str) else allow
        if not isinstance(allowed, (tuple, list)) or not all(isinstance(a, str) for a in allowed):
            errors.append(f"`allow` must be a string or a sequence of strings, got {allow!r}")
        if errors:
            wrong_type = any("must be a bool" in e or "`allow`" in e for e in errors)
            raise (TypeError if wrong_type else ValueError)("; ".join(errors))
        self.mode: Mode = mode
        self.include_cpu = include_cpu
        self.validation = validation
        self.allow: tuple[str, ...] = tuple(allowed)
        self._detector: SyncDetector | None = None
        self._report: list[SyncFinding] = []
        self._train_batches = 0
        self._device_type: str | None = None
        self._warn = False

    @property
    def report(self) -> list[SyncFinding]:
        """Every call site that synced in the last fit: the user's first, most syncs first."""
        return self._detector.findings() if self._detector is not None else list(self._report)

    @property
    def user_findings(self) -> list[SyncFinding]:
        """The call sites in your code (``origin == "user"``)."""
        return [f for f in self.report if f.origin == "user"]

    @property
    def syncs_per_step(self) -> float:
        """User syncs per watched training batch."""
        total = sum(f.count for f in self.user_findings)
        return total / self._train_batches if self._train_batches else 0.0

    # -------------------------------------------------------------- lifecycle

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop()
        self._report = []
        self._train_batches = 0
        # On a CPU run (include_cpu=True) the syncs found cost nothing yet: they are GPU advice.
        self._device_type = trainer.strategy.root_device.type
        self._warn = self.mode == "warn" and trainer.is_global_zero
        self._detector = _PublishingDetector(
            include_cpu=self.include_cpu,
            raise_on_user=self.mode == "error",
            allow=self.allow,
            on_new_site=self._on_new_site,
            sync_debug=_sync_debug_api(trainer),
        )
        self._detector.install()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        detector = self._detector
        if detector is None:
            return
        step = trainer.global_step
        every = self.sample_every_n_steps
        if not sampling.sampled(step, every):
            # Watch nothing until the next sampled step: the wrappers then return at once
            # (~0.8 us a call). Until a sampled step within `every`, the indexing ones stay as
            # the detector left them at the last step's end: out where the loader indexes a
            # lot in the main process, else in (a swap would cost more: see
            # `SyncDetector.disarm`). Before a longer stretch (one step in 64 from step 64)
            # they come out: a dataset's per-sample indexing would call them at every sample.
            wake = sampling.next_sampled(step, every)
            detector.disarm(keep_indexing=wake - step <= every)
            hub = hub_of(self)
            if hub is not None:  # the doctor's: not called at all until then
                hub.sleep(self, _TRAIN_BATCH_HOOKS, wake)
            return
        self._train_batches += 1
        detector.arm(step)

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # Stays armed: the other callbacks' and the module's on_train_batch_end and Lightning's
        # work before the next batch are watched too (masked indexing excepted: the per-sample
        # indexing of DataLoader code would make it costly).
        if self._detector is not None:
            self._detector.end_step()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._disarm()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._disarm()

    @override
    def on_validation_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.validation and self._detector is not None and not trainer.sanity_checking:
            self._detector.arm(trainer.global_step)

    @override
    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._disarm()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop()
        if self.mode == "summary" and trainer.is_global_zero:
            self.print_summary()

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log_fit_end(trainer, self)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._stop()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stop()

    def _disarm(self) -> None:
        if self._detector is not None:
            self._detector.disarm()

    def _stop(self) -> None:
        if self._detector is not None:
            detector, self._detector = self._detector, None
            detector.uninstall()
            self._report = detector.findings()

    def _on_new_site(self, finding: SyncFinding) -> None:
        if not self._warn or finding.origin != "user":
            return
        warnings.warn_explicit(
            f"{finding.kind} synchronises the host with the device at {finding.location}: "
            f"`{finding.code}`. Fix: {FIXES.get(finding.kind, '')}",
            SyncWarning,
            finding.filename,
            finding.lineno,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_report"] = self.report
        state["_detector"] = None  # wrappers and saved originals do not travel
        return state

    # -------------------------------------------------------------- output

    def print_summary(self, console: Any = None) -> None:
        """Print the call sites as a rich table, the user's top offenders first."""
        # A table in a terminal; in a log file, records unless the table fits (core.console).
        from lightning_speedpack.core.console import make_console, print_paragraph, print_table

        console = console or make_console()
        report = self.report
        if not report:
            print_paragraph(
                console, "SyncPointWarnings: no host-device syncs in the watched steps."
            )
            return
        columns = ("origin", "kind", "where", "code", "per step", "steps", "first step")
        rows = [
            [
                f.origin,
                f.kind,
                f.location,
                f.code,
                f"{f.per_step:.2f}",
                str(f.steps_seen),
                str(f.first_step),
            ]
            for f in report
        ]
        title = f"Host-device syncs ({self.syncs_per_step:.2f} of yours per step)"
        print_table(console, title, columns, rows)

    def log_tables(self, trainer: pl.Trainer) -> None:
        """Log ``speedpack/sync_points`` and ``speedpack/syncs_per_step`` (rank 0; no sync)."""
        rows: list[list[Cell]] = [
            [
                f.origin,
                f.kind,
                f.location,
                f.code,
                f.function,
                f.per_step,
                f.steps_seen,
                f.first_step,
            ]
            for f in self.report
        ]
        log_table(trainer, "speedpack/sync_points", TABLES["speedpack/sync_points"], rows)
        log_summary(trainer, {"speedpack/syncs_per_step": round(self.syncs_per_step, 4)})

    def doctor_findings(self) -> list[Finding]:
        """One finding per call site: warnings for yours, info for Lightning's.

        ``figures`` carry the source line (``code``) and its ``function``; on a CPU run
        (``include_cpu=True``) each finding has ``pays_on="GPU"``: a CPU has no device to wait
        for, so removing the sync pays once the model trains on a GPU.
        """
        out: list[Finding] = []
        pays_on = "GPU" if self._device_type == "cpu" else None
        for f in self.report:
            figures = {
                "count": f.count,
                "per_step": round(f.per_step, 3),
                "kind": f.kind,
                "code": f.code,
                "function": f.function,
            }
            if f.library:
                figures["library"], figures["library_location"] = f.library, f.library_location
            if f.origin == "user":
                inside = f" inside {f.library} ({f.library_location})" if f.library else ""
                out.append(
                    Finding(
                        "sync_points",
                        f"sync-{f.kind.replace(' ', '-')}",
                        f"`{f.code}` makes the CPU wait for the device{inside} ({f.kind}, "
                        f"{f.per_step:.2g}x per step)",
                        location=f.location,
                        figures=figures,
                        severity="warning",
                        fix=(
                            library_fix(f.library, f.kind, f.library_location, f.library_calls)
                            if f.library
                            else FIXES.get(f.kind)
                        ),
                        pays_on=pays_on,
                    )
                )
            else:
                out.append(
                    Finding(
                        "sync_points",
                        f"framework-sync-{f.kind.replace(' ', '-')}",
                        f"Lightning syncs in {f.function} ({f.kind}, {f.per_step:.2g}x per step)",
                        location=f.location,
                        figures=figures,
                        severity="info",
                        fix=framework_fix(f),
                        pays_on=pays_on,
                    )
                )
        return out

    def doctor_figures(self) -> dict[str, Any]:
        """``{"syncs_per_step": <user syncs per training step>}``."""
        return {"syncs_per_step": round(self.syncs_per_step, 4)}


register_diagnostic(
    "sync_points",
    SyncPointWarnings,
    # CPU tensors count too, so a CPU run shows what would sync on a GPU.
    # "record": the report shows the call sites; a table of its own at the end of training
    # repeated them (and cost the fit ~8 ms inside its last hook).
    factory=lambda ctx: SyncPointWarnings(
        mode="record",
        include_cpu=True,
        sample_every_n_steps=1 if ctx.deep else sampling.DOCTOR_SAMPLE_EVERY,
    ),
    order=20,
    deep_adds=(
        "watching every step for syncs (by default one step in 8 after the first 16, one in 64"
        " from step 64)"
    ),
)
