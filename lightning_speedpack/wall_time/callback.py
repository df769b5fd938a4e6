"""WallTimeLedger: the whole fit's wall time, charged to what the run was doing.

The ledger listens where Lightning already names every second of a fit: the actions it times
through ``trainer.profiler`` (:mod:`~lightning_speedpack.core.profiler_tap`): each hook of each
callback, the training batch, the DataLoader fetch, the copy to the device, each checkpoint
save. Four places Lightning does not name are bracketed on the Trainer's own loop objects for
the fit (instance attributes, removed at teardown or on an exception): the validation loop's
``run`` (validation, or the sanity check), the fit loop's ``setup_data`` (building the train
loader and starting its workers) and ``on_advance_start`` (an epoch begins), its ``on_run_end``
(the end of fit), and the logger connector's ``log_metrics`` (the loggers' writes).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, replace
from time import perf_counter
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_speedpack.core.batch import BatchSizeError, infer_batch_size
from lightning_speedpack.core.cpu_wait import usable_cores
from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.hook_hub import HookHub, callbacks_of
from lightning_speedpack.core.lightning import Callback
from lightning_speedpack.core.profiler_tap import tap, untap
from lightning_speedpack.core.registry import register_diagnostic
from lightning_speedpack.core.tables import TABLES, log_fit_end, log_summary, log_table
from lightning_speedpack.wall_time.actions import (
    FETCHED,
    HUB_CARVED,
    IGNORED,
    ActionKeys,
    callback_key,
)
from lightning_speedpack.wall_time.collector import CollectorClock, carve_collections
from lightning_speedpack.wall_time.findings import wall_findings
from lightning_speedpack.wall_time.ledger import (
    CALLBACK_PREFIX,
    PARTS,
    Ledger,
    carve,
    part_of,
    share_out,
)
from lightning_speedpack.wall_time.settings import RunSettings, ValidationRun

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["WallTimeLedger"]

_LOGGER_WRITES = ("log_metrics", "log_hyperparams", "save", "finalize")


@dataclass
class _Patch:
    owner: Any
    name: str
    saved: Any  # the instance attribute it replaced, or _ABSENT

    def undo(self) -> None:
        if self.saved is _ABSENT:
            with suppress(AttributeError):
                delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.saved)


_ABSENT = object()


class WallTimeLedger(Callback):
    """Charge every second of ``fit`` to its cause: setup, epoch starts, steps, validation, ...

    Use it to answer the first question of a slow run, *where does the time go?*, for the whole
    fit and not only the training step. The parts (seconds and share of the wall time):

    ==================  ========================================================================
    ``setup``           from the start of fit (the ``setup`` hook, or ``fit`` itself under the
                        doctor) to the first epoch, the loaders' ``*_dataloader()`` calls
    ``sanity_check``    Lightning's validation sanity check, whatever runs inside it
    ``epoch_start``     each epoch's start: starting the loader's workers, the first batch
    ``data_wait``       inside the DataLoader's fetch (the fetcher's ``next``), after the first
    ``batch_transfer``  Lightning's copy of the batch to the device (``batch_to_device``)
    ``training_step``   ``run_training_batch``: forward, backward, optimizer step
    ``validation``      the validation loop, without the checkpoints, logging and other
                        callbacks' hooks that run inside it
    ``checkpoint``      ``save_checkpoint`` and every hook of a checkpoint callback
    ``logging``         the loggers' writes (``log_metrics``) and the progress bar's hooks
    ``callbacks``       every other callback's hooks, per class (this one's and the pack's too)
    ``end_of_fit``      from the end of the last epoch to ``teardown``
    ``unaccounted``     Lightning's loop between all of the above
    ==================  ========================================================================

    Each part is exclusive (a checkpoint saved during validation is checkpointing, not
    validation) and they sum to the span from the start to ``teardown``. Cheap enough to leave
    on: two clock reads per action Lightning already times. At the end of fit it logs the
    ``speedpack/wall_time`` table and ``speedpack/wall/<part>_fraction`` summary fields (rank 0,
    every logger, see :mod:`lightning_speedpack.core.tables`), and gives the doctor findings for
    the causes outside the step (validation, checkpoints, logging, epoch starts, a callback's
    hooks, CPU threads, anomaly detection, a profiler left on, a tiny batch). The findings are
    fixed at the first ask after training ended (what the run's findings table logs at
    ``on_fit_end`` is what the doctor prints); the seconds keep counting to ``teardown``. Every
    rank keeps its own ledger; the report is rank 0's.

    Example:
        >>> from pytorch_lightning import Trainer
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> ledger = WallTimeLedger()
        >>> trainer = Trainer(max_steps=4, callbacks=[ledger], logger=False,
        ...                   enable_progress_bar=False, enable_model_summary=False,
        ...                   enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(BoringModel())
        >>> seconds = ledger.seconds()
        >>> abs(sum(seconds.values()) - ledger.total_s) < 1e-9, seconds["training_step"] > 0
        (True, True)
    """

    def __init__(self) -> None:
        self._fit_entered: float | None = None
        self._reset()

    def _reset(self) -> None:
        if (previous := getattr(self, "collector", None)) is not None:
            previous.stop()  # a fit that ended without teardown: its clock leaves gc
        self.ledger = Ledger()
        self.collector = CollectorClock(self.ledger)  # Python's collections, apart
        self.validation_runs: list[ValidationRun] = []
        self.epoch_starts: list[float] = []
        self.settings: RunSettings | None = None
        self.saves = 0
        self.train_batches = 0
        self._ended = False  # the fit loop has ended: the findings are final at the next ask
        self._findings: list[Finding] | None = None
        self._first_fetch = False  # the next fetch is the epoch's first
        self._epoch_started = 0.0
        self._keys = ActionKeys({}, None)  # action name -> (key, detail)
        self._hubs: list[HookHub] = []  # whose brackets hold other callbacks' hooks
        self._val: ValidationRun | None = None
        self._patches: list[_Patch] = []
        self._trainer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # Runtime-only references (the Trainer, the patches) are never pickled.
        state = self.__dict__.copy()
        if self._hubs or self.collector.seconds:  # the hubs and collections go in as charged
            seconds, details = self._charged()
            state["ledger"] = replace(
                self.ledger,
                seconds=defaultdict(float, seconds),
                details=defaultdict(float, details),
                _stack=list(self.ledger._stack),
            )
            state["collector"] = self.collector.settled(state["ledger"])
        state.update(_patches=[], _trainer=None, _keys=ActionKeys({}, None), _hubs=[])
        return state

    # ---- the public view -----------------------------------------------------------------

    @property
    def total_s(self) -> float:
        """The seconds the ledger has charged (the whole span once fit has ended)."""
        return self.ledger.total_s

    def seconds(self) -> dict[str, float]:
        """Seconds per part (:data:`~lightning_speedpack.wall_time.ledger.PARTS` order)."""
        out = dict.fromkeys(PARTS, 0.0)
        for key, value in self._charged()[0].items():
            out[part_of(key)] += value
        return out

    def callback_seconds(self) -> dict[str, float]:
        """Seconds of each other callback's hooks, by class name, largest first."""
        mine = {
            key[len(CALLBACK_PREFIX) :]: value
            for key, value in self._charged()[0].items()
            if key.startswith(CALLBACK_PREFIX)
        }
        return dict(sorted(mine.items(), key=lambda kv: -kv[1]))

    @property
    def doctor_callbacks(self) -> frozenset[str]:
        """The class names of the callbacks the doctor's HookHub runs (not the user's own)."""
        return frozenset(type(m).__name__ for hub in self._hubs if hub.owns for m in hub.present)

    def details(self) -> dict[tuple[str, str], float]:
        """Seconds per ``(key, detail)``, e.g. ``("callback:Mine", "on_train_batch_end")``."""
        return self._charged()[1]

    def _charged(self) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
        # A HookHub's bracket holds its members' per-batch hooks: each gets its measured share.
        seconds, details = dict(self.ledger.seconds), dict(self.ledger.details)
        # First the collector's pauses, wherever they fell (a hub's bracket included).
        carve_collections(self.collector.seconds, seconds, details)
        for hub in self._hubs:
            shares: dict[tuple[str, str], float] = {}
            for (member, hook), spent in hub.seconds().items():
                share = (callback_key(member), hook)
                shares[share] = shares.get(share, 0.0) + spent
            # The hub's per-batch training hooks are not bracketed (`actions.HUB_CARVED`): they
            # were charged to the part they ran in, and the hub timed each member's call.
            for source in dict.fromkeys(HUB_CARVED.values()):  # in a fixed order
                measured = {
                    h: sum(s for (_, d), s in shares.items() if d == h)
                    for h, part in HUB_CARVED.items()
                    if part == source
                }
                carve(source, callback_key(hub), measured, seconds, details)
            share_out(callback_key(hub), shares, seconds, details)
        return seconds, details

    def fractions(self) -> dict[str, float]:
        """Share of the wall time per part (0 when nothing was measured)."""
        total = self.total_s
        return {k: (v / total if total > 0 else 0.0) for k, v in self.seconds().items()}

    def fit_entered(self, now: float) -> None:
        """Start the ledger at ``now`` (a ``perf_counter()``), when ``Trainer.fit`` was entered.

        The doctor calls this so the ledger also counts what Lightning does before the first
        hook (the strategy's environment, the process group, ``prepare_data``).
        """
        self._fit_entered = now

    def fit_returned(self, now: float) -> None:
        """Extend the ledger to ``now``, when ``Trainer.fit`` returned (or raised).

        What Lightning runs after the callbacks' ``teardown`` (the module's ``teardown``, the
        profiler's ``describe()``) is then counted as ``end_of_fit``; the doctor calls this.
        """
        self.ledger.extend(now, "end_of_fit")

    # ---- Lightning hooks -----------------------------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        now = perf_counter()
        start = self._fit_entered_from(now)
        self._reset()  # a new fit, a new ledger
        self._trainer = trainer
        self.ledger.open(start, "setup")
        self.collector.start()
        self._keys = ActionKeys({cb.state_key: cb for cb in callbacks_of(trainer)}, pl_module)
        self._hubs = [cb for cb in trainer.callbacks if isinstance(cb, HookHub)]  # type: ignore[attr-defined]
        self._install(trainer)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.settings = RunSettings.read(trainer, cores=usable_cores())

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.train_batches += 1
        if self.train_batches == 1 and self.settings is not None:
            with suppress(BatchSizeError):
                self.settings.batch_size = infer_batch_size(batch)

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
        if self._val is None:
            return
        self._val.batches += 1
        try:
            self._val.samples += infer_batch_size(batch)
        except BatchSizeError:
            self._val.samples += 1

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log_fit_end(trainer, self)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._finish(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._finish(trainer)

    # ---- the profiler's actions ----------------------------------------------------------

    def wants(self, name: str) -> bool:
        """Whether the ledger brackets the profiled action ``name`` (asked once per name)."""
        return self._keys[name] is not IGNORED

    def handler(self, name: str) -> Callable[[str, bool, float], None] | None:
        """What hears the profiled action ``name`` (asked once per name by the tap).

        A plain bracket (a callback's hook, the training batch) gets a closure that opens and
        closes it with no look-up, the fetch and the copy theirs; a save keeps
        :meth:`on_action`'s count.
        """
        found = self._keys[name]
        if found is IGNORED:
            return None
        key, detail = found
        if found is FETCHED:
            return self._on_fetch
        if name == "save_checkpoint":
            return self.on_action
        if key == "batch_transfer":
            return self._transfer_action(detail)

        def bracket(action: str, started: bool, now: float) -> None:
            if started:
                self.ledger.enter(now, key, token=action, detail=detail)
            else:
                self.ledger.leave(now, action)

        return bracket

    def _transfer_action(self, detail: str) -> Callable[[str, bool, float], None]:
        def transfer(action: str, started: bool, now: float) -> None:
            if not started:
                self.ledger.leave(now, action)
            elif self.ledger.top not in ("validation", "sanity_check"):
                # (the validation loop's own copy is validation)
                self.ledger.enter(now, "batch_transfer", token=action, detail=detail)

        return transfer

    def on_action(self, name: str, started: bool, now: float) -> None:
        """Charge a profiled action (see :mod:`~lightning_speedpack.core.profiler_tap`)."""
        found = self._keys[name]  # found once a name (ActionKeys.__missing__)
        if found is IGNORED:
            return
        if found is FETCHED:
            self._on_fetch(name, started, now)
            return
        if not started:
            self.ledger.leave(now, name)
            return
        key, detail = found
        if key == "batch_transfer" and self.ledger.top in ("validation", "sanity_check"):
            return  # the validation loop's own copy is validation
        if name == "save_checkpoint":
            self.saves += 1
        self.ledger.enter(now, key, token=name, detail=detail)

    def _on_fetch(self, name: str, started: bool, now: float) -> None:
        if started:
            self.ledger.enter(now, "epoch_start" if self._first_fetch else "data_wait", token=name)
            return
        self.ledger.leave(now, name)
        if self._first_fetch:
            self._first_fetch = False
            self.epoch_starts.append(now - self._epoch_started)
            self.ledger.switch(now, "unaccounted")

    # ---- brackets on the Trainer's loops -------------------------------------------------

    def _install(self, trainer: pl.Trainer) -> None:
        tap(trainer, self)
        fit_loop = trainer.fit_loop
        self._wrap(fit_loop, "setup_data", self._bracketed("epoch_start", "setup_data"))
        self._wrap(fit_loop, "on_advance_start", self._before(self._epoch_begins))
        self._wrap(fit_loop, "on_run_end", self._before(self._fit_loop_ends))
        self._wrap(fit_loop.epoch_loop.val_loop, "run", self._validation)
        connector = getattr(trainer, "_logger_connector", None)
        if connector is not None and hasattr(connector, "log_metrics"):
            self._wrap(connector, "log_metrics", self._bracketed("logging", "log_metrics"))
        # Each logger's own writes, whoever calls them (a callback logging its figures too).
        for logger in trainer.loggers:
            for method in _LOGGER_WRITES:
                self._wrap(logger, method, self._bracketed("logging", f"logger.{method}"))

    def _wrap(self, owner: Any, name: str, wrapper: Callable[[Callable[..., Any]], Any]) -> None:
        original = getattr(owner, name, None)
        if original is None or not hasattr(owner, "__dict__"):
            return  # another Lightning version: that part goes to its neighbour
        saved = owner.__dict__.get(name, _ABSENT)
        setattr(owner, name, functools.wraps(original)(wrapper(original)))
        self._patches.append(_Patch(owner, name, saved))

    def _bracketed(self, key: str, token: str) -> Callable[[Callable[..., Any]], Any]:
        ledger = self.ledger

        def wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
            def bracketed(*args: Any, **kwargs: Any) -> Any:
                ledger.enter(perf_counter(), key, token=token, detail=token)
                try:
                    return original(*args, **kwargs)
                finally:
                    ledger.leave(perf_counter(), token)

            return bracketed

        return wrapper

    @staticmethod
    def _before(mark: Callable[[], None]) -> Callable[[Callable[..., Any]], Any]:
        def wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
            def marked(*args: Any, **kwargs: Any) -> Any:
                mark()
                return original(*args, **kwargs)

            return marked

        return wrapper

    def _epoch_begins(self) -> None:
        now = perf_counter()
        self.ledger.switch(now, "epoch_start")
        self._first_fetch, self._epoch_started = True, now

    def _fit_loop_ends(self) -> None:
        self._first_fetch, self._ended = False, True
        self.ledger.switch(perf_counter(), "end_of_fit")

    def _validation(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            sanity = bool(getattr(self._trainer, "sanity_checking", False))
            key = "sanity_check" if sanity else "validation"
            start = perf_counter()
            self.ledger.enter(start, key, token="val_loop.run")
            self._val = None if sanity else ValidationRun()
            try:
                return original(*args, **kwargs)
            finally:
                end = perf_counter()
                self.ledger.leave(end, "val_loop.run")
                if self._val is not None:
                    self._val.seconds = end - start
                    self.validation_runs.append(self._val)
                self._val = None

        return run

    def _finish(self, trainer: pl.Trainer) -> None:
        self._ended = True
        self.ledger.close(perf_counter())
        self.collector.stop()
        for patch in reversed(self._patches):
            patch.undo()
        self._patches.clear()
        untap(trainer, self)
        self._trainer = None

    def _fit_entered_from(self, now: float) -> float:
        entered, self._fit_entered = self._fit_entered, None
        return entered if entered is not None and entered <= now else now

    # ---- the report ----------------------------------------------------------------------

    def rows(self) -> list[list[Any]]:
        """The ``speedpack/wall_time`` table: part, detail, seconds, fraction, count."""
        total = self.total_s
        seconds = self.seconds()
        rows: list[list[Any]] = []
        for part in PARTS:
            if part == "callbacks":
                for name, value in self.callback_seconds().items():
                    rows.append(["callbacks", name, round(value, 4), _share(value, total), None])
                continue
            detail, count = self._detail(part)
            rows.append(
                [part, detail, round(seconds[part], 4), _share(seconds[part], total), count]
            )
        return rows

    def _detail(self, part: str) -> tuple[str, int | None]:
        if part == "validation" and self.validation_runs:
            runs = self.validation_runs
            batches, samples = sum(r.batches for r in runs), sum(r.samples for r in runs)
            return f"{len(runs)} runs, {batches} batches, {samples} samples", len(runs)
        if part == "epoch_start":
            return f"{len(self.epoch_starts)} epochs", len(self.epoch_starts)
        if part == "checkpoint":
            return f"{self.saves} saves", self.saves
        if part == "training_step":
            return f"{self.train_batches} batches", self.train_batches
        return "", None

    def log_tables(self, trainer: pl.Trainer) -> None:
        """Log ``speedpack/wall_time`` and ``speedpack/wall/<part>_fraction`` (rank 0)."""
        if self.ledger.started is None:
            return
        log_table(trainer, "speedpack/wall_time", list(TABLES["speedpack/wall_time"]), self.rows())
        fields: dict[str, Any] = {
            f"speedpack/wall/{part}_fraction": round(share, 4)
            for part, share in self.fractions().items()
        }
        fields["speedpack/wall/total_s"] = round(self.total_s, 3)
        log_summary(trainer, fields)

    def doctor_figures(self) -> dict[str, Any]:
        """``{"wall_time": {"total_s", "parts", "fractions", "callbacks", ...}}``."""
        if self.ledger.started is None:
            return {}
        return {
            "wall_time": {
                "total_s": round(self.total_s, 4),
                "parts": {k: round(v, 4) for k, v in self.seconds().items()},
                "fractions": {k: round(v, 4) for k, v in self.fractions().items()},
                "callbacks": {k: round(v, 4) for k, v in self.callback_seconds().items()},
                "validation_runs": len(self.validation_runs),
                "epoch_starts_s": [round(s, 4) for s in self.epoch_starts],
                "checkpoint_saves": self.saves,
                "collections": list(self.collector.collections),
                "longest_collection_s": round(self.collector.longest_s, 4),
                "collect_calls": self.collector.explicit,
            }
        }

    def doctor_findings(self) -> list[Finding]:
        """The causes outside the training step, each with its share of the wall time."""
        if self.ledger.started is None:
            return []
        if self._findings is not None:
            return list(self._findings)
        found = wall_findings(self)
        if self._ended or not self.ledger.is_open:
            # Frozen at the first ask after training ended: the findings table the run logs at
            # on_fit_end and the report printed after fit are then the same findings.
            self._findings = found
        return list(found)


def _share(value: float, total: float) -> float:
    return round(value / total, 4) if total > 0 else 0.0


def _doctor_factory(ctx: Any) -> WallTimeLedger:
    return WallTimeLedger()


register_diagnostic("wall_time", WallTimeLedger, factory=_doctor_factory, order=5)
