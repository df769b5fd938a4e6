"""The loader side of the trials: each loader knob's ceiling on a side copy of the fit's loader.

``num_workers`` (memory checked first; a stream that does not shard never gets more workers),
``prefetch_factor`` and ``persistent_workers`` (with the worker count found so far),
``pin_memory`` (CUDA) and ``cache`` (a warm :class:`~lightning_speedpack.CachedDataset` subset).
Today's settings and the candidates alternate round by round, the order rotating. The first
loader pass also draws the batch the model side runs on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from lightning_speedpack.data_xray.ceilings import loader_ceiling
from lightning_speedpack.what_if import loader_trials as lt
from lightning_speedpack.what_if.knobs import GPU_ONLY, LOADER_KNOBS
from lightning_speedpack.what_if.measure import (
    NOT_APPLICABLE,
    NOT_TRIED,
    Measurement,
    best_of,
)
from lightning_speedpack.what_if.trial_base import (
    MAX_LOADER_BATCHES,
    OverBudget,
    TrialBase,
    calibrated,
    median,
    paired,
)

__all__ = ["LoaderSide"]


class LoaderSide(TrialBase):
    """The loader knobs' trials (see the module's docstring)."""

    def _loader_side(self) -> list[Measurement]:
        knobs = [k for k in self.plan.knobs if k in LOADER_KNOBS]
        if not knobs:
            return []
        loader = self.loader
        reason = self._loader_reason(loader)
        if reason is not None:
            self._draw_batch_main(loader)
            return [
                Measurement.skipped(k, "loader", _today(loader, k), NOT_APPLICABLE, reason)
                for k in knobs
            ]
        self.settings = {name: getattr(loader, name) for name in lt.SETTINGS}
        self.today_settings = dict(self.settings)
        self._loader_batches()  # today's pace first: the fit's projected length, the budget
        found = []
        for knob in knobs:
            today = _today(loader, knob)
            if knob == "pin_memory" and self.trainer.strategy.root_device.type != "cuda":
                found.append(Measurement.skipped(knob, "loader", today, NOT_APPLICABLE, GPU_ONLY))
                continue
            if not self._left():
                found.append(self._over_budget(knob, "loader", today))
                continue
            try:
                found.append(getattr(self, f"_knob_{knob}")(loader, today))
            except OverBudget:  # the fit's pace, measured first, left no time for the rounds
                found.append(self._over_budget(knob, "loader", today))
        if self.batch is None:
            self._draw_batch_main(loader)
        return found

    def _loader_reason(self, loader: Any) -> str | None:
        if not isinstance(loader, DataLoader):
            return f"the train loader is a {type(loader).__name__}, not a torch DataLoader"
        if lt.is_library_stream(loader.dataset):
            return (
                f"{type(loader.dataset).__name__} is a library stream: it is never read aside "
                "from the fit (a second reader would change its state)"
            )
        return None

    def _draw_batch_main(self, loader: Any) -> None:
        """One batch for the model trials when no loader trial drew one (never a library stream)."""
        dataset = getattr(loader, "dataset", None)
        if self.batch is not None or lt.is_library_stream(dataset):
            return
        if isinstance(loader, DataLoader):
            with lt.variant(loader, num_workers=0) as side:
                _, self.batch = lt.rate(side, batches=1)

    def _loader_batches(self) -> int:
        """Batches per loader trial: ``steps``, or more, so that a trial times ``MIN_TRIAL_S``."""
        if self.loader_batches is None:
            # Two timed batches tell the pace (a slow loader's ten would spend the budget), or
            # one round of today's workers: part of a round reads too fast (whole_cycles).
            with lt.variant(self.loader) as side:
                wall, cpu = time.perf_counter(), time.process_time()
                result = loader_ceiling(side, batches=lt.whole_cycles(2, side.num_workers))
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if not side.num_workers and wall > 0:
                    self.loader_cpu_shares.append(min(1.0, cpu / wall))
            self.batch = result.batch
            per_batch = result.seconds / result.batches if result.batches else 0.0
            self.loader_batch_s = per_batch or None
            # A slow loader's batch is a long sample already: a few of them time MIN_TRIAL_S.
            self.loader_batches = calibrated(lt.MIN_TIMED_BATCHES, per_batch, MAX_LOADER_BATCHES)
        return self.loader_batches

    def _rates(self, variants: Sequence[dict[str, Any]]) -> list[list[float]]:
        """Loader ceilings of each variant, per round (variant 0 is the baseline)."""
        rates: list[list[float]] = [[] for _ in variants]
        n = len(variants)
        batches = self._loader_batches()
        for r in self._rounds():
            for i in [(r + j) % n for j in range(n)]:  # the order rotates every round
                with lt.variant(self.loader, **variants[i]) as side:
                    value, batch = lt.rate(side, batches=batches, shares=self.loader_cpu_shares)
                if value is not None:
                    rates[i].append(value)
                if batch is not None and i == 0:
                    self.batch = batch
        return rates

    def _compare(
        self, knob: str, today: str, candidates: list[tuple[str, Any, dict[str, Any]]]
    ) -> Measurement:
        """Measure ``candidates`` (text, value, settings) against today's settings."""
        on_top = self.settings != self.today_settings
        rates = self._rates([dict(self.settings), *[c[2] for c in candidates]])
        found = []
        for (text, value, _), after in zip(candidates, rates[1:], strict=True):
            m = Measurement(knob, "loader", today, text, value)
            m.before, m.after = paired(rates[0], after)
            if on_top:
                m.extra["on_top"] = True
            found.append(m)
        best = best_of(found)
        return (
            best
            if best is not None
            else Measurement.skipped(
                knob,
                "loader",
                today,
                NOT_TRIED,
                "too few batches to time after the warm-up (the workers' prefetch, plus one)",
            )
        )

    def _knob_num_workers(self, loader: DataLoader[Any], today: str) -> Measurement:
        current = loader.num_workers
        counts = [n for n in range(0, self.plan.cores + 1) if n != current]
        stream = isinstance(loader.dataset, IterableDataset)
        if stream and any(n > 1 for n in counts) and lt.stream_duplicates(loader):
            return Measurement.skipped(
                "num_workers",
                "loader",
                today,
                NOT_APPLICABLE,
                "the stream does not shard by get_worker_info(): 2 workers yielded the "
                "same items (more workers would duplicate samples)",
            )
        memory = self._worker_memory(loader) if any(counts) else None
        notes = []
        if memory is not None:
            prefetch = loader.prefetch_factor or 2
            for n in [n for n in counts if n > 0]:
                why = lt.fits_in_memory(memory, n, prefetch)
                if why is not None:
                    counts.remove(n)
                    notes.append(f"num_workers={n} not tried: {why}")
        if not counts:
            return Measurement.skipped(
                "num_workers", "loader", today, NOT_APPLICABLE, "; ".join(notes) or "no other count"
            )
        candidates = [
            (str(n), n, {**self.settings, **_worker_settings(self.settings, n)}) for n in counts
        ]
        best = self._compare("num_workers", today, candidates)
        if notes:
            best.reason = "; ".join(notes)
        if memory is not None:
            best.extra["worker_bytes"] = memory.per_worker_bytes
        if best.gain is not None and best.gain >= 1.0:
            self.settings.update(_worker_settings(self.settings, int(best.value)))
        return best

    def _worker_memory(self, loader: DataLoader[Any]) -> lt.WorkerMemory | None:
        before = lt.children()
        with lt.variant(loader, num_workers=1, persistent_workers=False) as side:
            iterator = iter(side)
            batch = next(iterator, None)
            memory = lt.worker_memory(side, batch, before) if batch is not None else None
            del iterator
        return memory

    def _knob_prefetch_factor(self, loader: DataLoader[Any], today: str) -> Measurement:
        workers = self.settings.get("num_workers", 0)
        if not workers:
            return Measurement.skipped(
                "prefetch_factor", "loader", today, NOT_APPLICABLE, "no worker processes"
            )
        current = self.settings.get("prefetch_factor") or 2
        value = current * 2
        m = self._compare(
            "prefetch_factor",
            today,
            [(str(value), value, {**self.settings, "prefetch_factor": value})],
        )
        m.extra["with_num_workers"] = workers
        m.extra["workers"] = workers
        return m

    def _knob_persistent_workers(self, loader: DataLoader[Any], today: str) -> Measurement:
        workers = self.settings.get("num_workers", 0)
        skip = None
        if not workers:
            skip = "no worker processes"
        elif self.settings.get("persistent_workers"):
            skip = "on already"
        elif self.trainer.max_epochs == 1:
            skip = "one epoch: the workers start once anyway"
        else:
            try:
                length = len(loader)
            except TypeError:
                length = 0
            if not length:
                skip = "a stream has no epoch length to weigh the start-up against"
        if skip is not None:
            return Measurement.skipped("persistent_workers", "loader", today, NOT_APPLICABLE, skip)
        m = Measurement("persistent_workers", "loader", today, "True", True)
        ceiling = median(self._rates([dict(self.settings)])[0])
        if not ceiling:
            return Measurement.skipped(
                "persistent_workers", "loader", today, NOT_TRIED, "the loader delivered no batch"
            )
        samples = len(loader) * (loader.batch_size or 1)
        starts: dict[bool, list[float]] = {False: [], True: []}
        batches = 2 * int(workers)
        for r in self._rounds():
            for persistent in (False, True) if r % 2 == 0 else (True, False):
                settings = {**self.settings, "persistent_workers": persistent}
                with lt.variant(loader, **settings) as side:
                    seconds = lt.epoch_start_seconds(side, batches)
                if seconds is not None:
                    starts[persistent].append(seconds)
        if not starts[False] or not starts[True]:
            return Measurement.skipped(
                "persistent_workers", "loader", today, NOT_APPLICABLE, "a custom batch sampler"
            )
        epoch = samples / ceiling
        m.before = [samples / (epoch + s) for s in starts[False]]
        m.after = [samples / (epoch + s) for s in starts[True]]
        m.extra["epoch_start_s"] = (
            median(starts[False]),
            median(starts[True]),
        )
        m.extra["on_top"] = True
        m.extra["workers"] = workers
        m.extra["ceiling"] = ceiling  # the steady rate: the fit's projection adds the start-up
        return m

    def _knob_pin_memory(self, loader: DataLoader[Any], today: str) -> Measurement:
        if self.trainer.strategy.root_device.type != "cuda":
            return Measurement.skipped("pin_memory", "loader", today, NOT_APPLICABLE, GPU_ONLY)
        if loader.pin_memory:
            return Measurement.skipped("pin_memory", "loader", today, NOT_APPLICABLE, "on already")
        return self._compare(
            "pin_memory", today, [("True", True, {**self.settings, "pin_memory": True})]
        )

    def _knob_cache(self, loader: DataLoader[Any], today: str) -> Measurement:
        dataset = loader.dataset
        skip = None
        if isinstance(dataset, IterableDataset):
            skip = "a stream (CachedDataset caches map-style datasets; see CachedStream)"
        elif any(
            k.__module__.startswith("lightning_speedpack.cache") for k in type(dataset).__mro__
        ):
            skip = "cached already"
        elif not loader.batch_size:
            skip = "a custom batch sampler: no batch size to build the warm subset with"
        if skip is not None:
            return Measurement.skipped("cache", "loader", today, NOT_APPLICABLE, skip)
        size = loader.batch_size or 1
        warmup = loader.num_workers * (loader.prefetch_factor or 2) + 1
        samples = min(len(dataset), size * (self.plan.steps + warmup + 1))  # type: ignore[arg-type]
        m = Measurement("cache", "loader", today, "CachedDataset", "CachedDataset")
        key = f"speedpack-what-if-{os.getpid()}"
        with lt.cache_pair(loader, samples, key) as (plain, warm):
            for r in self._rounds():
                pair = [(plain, m.before), (warm, m.after)]
                for each, into in pair if r % 2 == 0 else pair[::-1]:
                    value, _ = lt.rate(each, batches=self._loader_batches())
                    if value is not None:
                        into.append(value)
        m.before, m.after = paired(m.before, m.after)
        m.reason = (
            f"measured on a warm subset of {samples:,} samples; assumes a deterministic __getitem__"
        )
        return m


def _worker_settings(settings: dict[str, Any], workers: int) -> dict[str, Any]:
    if workers == 0:
        return {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False}
    return {"num_workers": workers, "prefetch_factor": settings.get("prefetch_factor") or 2}


def _today(loader: Any, knob: str) -> str:
    if knob == "cache":
        return type(getattr(loader, "dataset", None)).__name__
    return str(getattr(loader, knob, "-"))
