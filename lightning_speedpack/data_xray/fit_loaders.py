"""The fit's training loaders as the X-ray reads them: instrumented, windowed, waited on.

:class:`FitLoaders` is the mechanism under
:class:`~lightning_speedpack.data_xray.profiler.DataPipelineProfiler`: it gives each training
DataLoader a :class:`~lightning_speedpack.data_xray.instrument.LoaderProbe` as Lightning sets
the loader up (one listener on ``strategy.process_dataloader``), gives the loaders back when
they leave the fit, reads the probes' shared tables into windows of
:class:`~lightning_speedpack.data_xray.pipeline.PipelineTotals`, and keeps the time the training
process waited for data: inside the DataLoaders' own ``next``, or -- when a training loader is
not a DataLoader (:mod:`~lightning_speedpack.data_xray.loaders`) -- the whole fetch as
``trainer.profiler`` times it for any iterable
(:class:`~lightning_speedpack.core.profiler_tap.FetchTimer`, tapped only then: a tap is one
more call on each of the ~150 actions a batch).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from lightning_speedpack.core import stages as _stages
from lightning_speedpack.core.lightning import namespace_of
from lightning_speedpack.core.loader_hook import LoaderHook, hook_dataloaders
from lightning_speedpack.core.nested import leaves
from lightning_speedpack.core.profiler_tap import FetchTimer, tap, untap
from lightning_speedpack.core.stages import RowSnapshot
from lightning_speedpack.data_xray.instrument import LoaderProbe
from lightning_speedpack.data_xray.loaders import opaque_loaders
from lightning_speedpack.data_xray.pipeline import PipelineTotals, delta, read_table

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["FitLoaders"]


class FitLoaders:
    """The training loaders of one fit: probes on the DataLoaders, the wait on all of them.

    Runtime only: a fresh one replaces it when the profiler is pickled.
    """

    def __init__(self) -> None:
        self.probes: list[LoaderProbe] = []
        self.opaque = False  # a training loader is not a DataLoader (seen this fit)
        self.fetch_seconds = 0.0  # every training fetch, any loader (trainer.profiler)
        self._waited_closed = 0.0  # data wait of DataLoaders no longer in the fit
        self._reads: dict[int, tuple[list[RowSnapshot], float]] = {}
        self._waits: dict[int, tuple[float, int]] = {}
        self._shadowed: LoaderHook | None = None
        self._main_probe: LoaderProbe | None = None
        self._main_recorder: Any = None
        self._fetches: FetchTimer | None = None
        self._tapped: Any = None  # the trainer whose profiler _fetches listens to

    def new_fit(self) -> None:
        """A fit starts: its waits count from zero."""
        self.opaque, self.fetch_seconds, self._waited_closed = False, 0.0, 0.0

    @property
    def workers(self) -> int:
        """``num_workers`` of the first training DataLoader (0 without one)."""
        return self.probes[0].workers if self.probes else 0

    def shadow(self, trainer: pl.Trainer) -> None:
        """Instrument each training DataLoader as Lightning processes it (before any iterator)."""
        if self._shadowed is not None:
            return
        namespace = namespace_of(trainer).__name__
        seed_module = (
            "lightning.fabric.utilities.seed"
            if namespace.startswith("lightning.")
            else "lightning_fabric.utilities.seed"
        )

        def instrument(dataloader: object) -> object:
            if (
                trainer.training
                and not trainer.sanity_checking
                and isinstance(dataloader, torch.utils.data.DataLoader)
                and not any(p.loader is dataloader for p in self.probes)
            ):
                self.probes.append(LoaderProbe(dataloader, seed_module, trainer.global_rank))
                self.activate_main()  # the fit's first batches are fetched before train start
            return dataloader

        # After every other listener (WhatIf's rebuilt loader is the one the fit iterates).
        self._shadowed = hook_dataloaders(trainer.strategy, instrument, priority=90)

    def keep_train(self, trainer: pl.Trainer) -> tuple[list[Any], list[Any]]:
        """Give back the loaders no longer training; the training DataLoaders and the others."""
        loaders = leaves(trainer.train_dataloader, torch.utils.data.DataLoader)
        keep = []
        for probe in self.probes:
            if any(probe.loader is dl for dl in loaders):
                keep.append(probe)
            else:
                self._close(probe)
        self.probes = keep
        opaque = opaque_loaders(trainer.train_dataloader)
        self.opaque = self.opaque or bool(opaque)
        if self.opaque and self._fetches is None:  # only then: a tap is a call on every action
            self._listen(trainer)
        return loaders, opaque

    def _listen(self, trainer: pl.Trainer) -> None:
        """Time every training fetch, whatever the loader, through ``trainer.profiler``."""
        self.stop_listening()
        self._fetches, self._tapped = FetchTimer(self._charge), trainer
        tap(trainer, self._fetches)

    def _charge(self, seconds: float) -> None:
        self.fetch_seconds += seconds

    def stop_listening(self) -> None:
        """Stop timing the fetches."""
        fetches, trainer, self._fetches, self._tapped = self._fetches, self._tapped, None, None
        if fetches is not None:
            untap(trainer, fetches)

    def activate_main(self) -> None:
        """Record the main process's fetches when a training loader has no workers."""
        main = next((p for p in self.probes if p.workers == 0), None)
        if main is None:
            self._main_probe = self._main_recorder = None
            _stages.deactivate()
            return
        if main is not self._main_probe or self._main_recorder is None:
            self._main_probe = main
            self._main_recorder = _stages.activate(main.table, 0)
        _stages._ACTIVE = self._main_recorder  # resumed: the row keeps counting

    def waited(self) -> float:
        """Seconds the fit has spent waiting for its training batches so far.

        Read on the DataLoaders' own iterators; with a loader that is not one, the whole
        fetch as ``trainer.profiler`` times it.
        """
        if self.opaque:
            return self.fetch_seconds
        return self._waited_closed + sum(p.next_seconds for p in self.probes)

    def mark(self) -> None:
        """Start the fit's window here: what ran before (the probes) is not counted."""
        now = time.perf_counter()
        for probe in self.probes:
            probe.count_from = now
            rows = read_table(probe.table)
            for r in probe.live_rows():  # the fit's own processes: counted from their start
                rows[r].pid = 0
            self._reads[id(probe)] = (rows, now)
            self._waits[id(probe)] = (probe.wait_seconds, probe.waits)

    def window(self) -> PipelineTotals:
        """Read every table: what the loading processes did since the last read."""
        window = PipelineTotals()
        now = time.perf_counter()
        for probe in self.probes:
            rows = read_table(probe.table)
            before, t_before = self._reads.get(id(probe), (None, now))
            if before is None:
                t_before = min((r.start for r in rows if r.pid), default=now)
            waited, n_waited = self._waits.get(id(probe), (0.0, 0))
            window.add(
                delta(before, rows, t_before, now, probe.live_rows()),
                probe.wait_seconds - waited,
                probe.waits - n_waited,
            )
            self._reads[id(probe)] = (rows, now)
            self._waits[id(probe)] = (probe.wait_seconds, probe.waits)
        return window

    def _close(self, probe: LoaderProbe) -> None:
        self._waited_closed += probe.next_seconds
        probe.next_seconds = 0.0
        probe.restore()
        self._reads.pop(id(probe), None)
        self._waits.pop(id(probe), None)

    def close(self) -> None:
        """Give every loader back, stop recording and listening; the strategy's own method back."""
        _stages.deactivate()
        self.stop_listening()
        if self._shadowed is not None:
            hook, self._shadowed = self._shadowed, None
            hook.remove()
        for probe in self.probes:
            self._close(probe)
        self.probes = []
        self._main_probe = self._main_recorder = None
