"""The two ceilings of a training run and the verdict: which one the run is bound by.

- The *loader ceiling*: samples/s the training DataLoader delivers alone (a fresh iterator,
  after warm-up, nothing else running) -- the guide's "iterate the loader for 20 batches".
- The *model ceiling*: samples/s of real training steps on one batch already in memory
  (:func:`lightning_speedpack.core.trials.time_training_steps`, all state put back).
- :func:`verdict`: "data-bound: the loader delivers 310 samples/s, the model could consume
  2,400", with the number of workers that would close the gap from the measured per-worker rate.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lightning_speedpack.core.batch import BatchSizeError, infer_batch_size, read_batch_size

__all__ = ["LoaderCeiling", "Verdict", "cpu_count", "loader_ceiling", "samples_in_batch", "verdict"]

#: The model must beat the loader by this factor for the run to be called data-bound.
BOUND_MARGIN = 1.1


@dataclass
class LoaderCeiling:
    """What one pass of the loader alone measured."""

    samples_per_sec: float | None
    batches: int  # timed batches
    samples: int  # timed samples
    seconds: float
    first_batch_seconds: float  # start-up: iterator creation to the first batch
    batch: Any = None  # the last batch drawn (for the model ceiling)


def batch_unit(batch: Any) -> str:
    """What a batch's size counts: ``"samples"``, ``"graphs"`` (PyG), ``"nodes"``, ``"batches"``."""
    try:
        return read_batch_size(batch).unit
    except BatchSizeError:
        return "batches"


def samples_in_batch(batch: Any) -> int:
    """Samples in a batch (1 when it cannot be told)."""
    try:
        return infer_batch_size(batch)
    except BatchSizeError:
        return 1


def loader_ceiling(
    loader: Iterable[Any], batches: int = 20, warmup: int | None = None
) -> LoaderCeiling:
    """Iterate ``loader`` alone: ``warmup`` batches untimed, then time up to ``batches``.

    The default warm-up is ``num_workers * prefetch_factor + 1`` batches (the workers' start and
    the batches they prefetched are not the steady rate). The torch, numpy and Python RNG
    states are put back afterwards, so the fit's own iterator draws the same shuffle.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> probe = loader_ceiling(DataLoader(range(64), batch_size=8), batches=4, warmup=1)
        >>> probe.batches, probe.samples
        (4, 32)
    """
    if batches < 1:
        raise ValueError(f"`batches` must be a positive int, got {batches!r}")
    if warmup is None:
        workers = int(getattr(loader, "num_workers", 0) or 0)
        prefetch = int(getattr(loader, "prefetch_factor", None) or 2)
        warmup = workers * prefetch + 1
        try:
            length = len(loader)  # type: ignore[arg-type]
        except TypeError:  # a stream
            length = None
        if length is not None:
            warmup = max(1, min(warmup, length // 2))
    rng = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    try:
        start = time.perf_counter()
        iterator = iter(loader)
        batch: Any = None
        first = None
        drawn = 0
        for item in iterator:
            batch = item
            drawn += 1
            if first is None:
                first = time.perf_counter() - start
            if drawn >= warmup:
                break
        timed_start = last = time.perf_counter()
        samples = count = 0
        if drawn >= warmup:
            for batch in iterator:
                last = time.perf_counter()  # not the shutdown that follows the last batch
                samples += samples_in_batch(batch)
                count += 1
                if count >= batches:
                    break
        seconds = last - timed_start
        del iterator
    finally:
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
    rate = samples / seconds if count and seconds > 0 else None
    return LoaderCeiling(rate, count, samples, seconds, first or 0.0, batch)


@dataclass
class Verdict:
    """Which ceiling binds, the numbers, and the workers that would close a data gap."""

    bound: str  # "data", "model" or "unknown"
    loader_samples_per_sec: float | None
    model_samples_per_sec: float | None
    workers_needed: int | None = None
    per_worker_samples_per_sec: float | None = None
    warm: bool = False  # the loader figure is the warm cache's (a cache filled earlier)
    reason: str | None = None  # why "unknown"
    model_spread: tuple[float, float] | None = None  # lowest, highest per-epoch model rate
    cpu_share: float | None = None  # CPU time / wall time of the fetches, when measured
    more_than_cores: bool = False  # workers_needed exceeds the cores: the fetch waits
    cores: int | None = None  # set when workers on these cores cannot close the gap
    instead: str | None = None  # then: what can
    transfer_note: str | None = None  # data-bound by the handover, not the loading itself
    # Set when no loader figure was measured and the run's wait at the fetch decided the bound:
    wait_fraction: float | None = None  # that wait, over the training time
    delivered: float | None = None  # samples/s that reached the steps
    unit: str = "samples"  # what a sample is: "graphs" for PyG batches (core.batch)

    @property
    def message(self) -> str:
        """The verdict in one sentence, with the numbers (in graphs/s for PyG batches)."""
        text = self._message()
        return text if self.unit == "samples" else text.replace(" samples/s", f" {self.unit}/s")

    def _message(self) -> str:
        loader, model = self.loader_samples_per_sec, self.model_samples_per_sec
        if self.bound != "unknown" and model is not None and self.wait_fraction is not None:
            return self._wait_message(model, self.wait_fraction)
        if self.bound == "unknown" or loader is None or model is None:
            return f"unknown: {self.reason or 'a ceiling could not be measured'}"
        if self.bound == "data":
            text = (
                f"data-bound: the loader delivers {loader:,.0f} samples/s, "
                f"the model could consume {model:,.0f}"
            )
            return text + self._workers_text()
        return (
            f"model-bound: the model consumes {model:,.0f} samples/s{self._spread_text()}, "
            f"the loader could deliver {loader:,.0f}{' warm' if self.warm else ''}"
        )

    def _wait_message(self, model: float, wait: float) -> str:
        """A bound the wait at the fetch decided: no loader ceiling was measured, none is given."""
        waited = f"the run waited for data {wait:.0%} of its training time"
        unmeasured = "(the loader's own ceiling was not measured)"
        if self.bound == "data":
            got = f"; the steps got {self.delivered:,.0f} samples/s" if self.delivered else ""
            return f"data-bound: {waited}{got}, the model could consume {model:,.0f} {unmeasured}"
        return (
            f"model-bound: the model consumes {model:,.0f} samples/s{self._spread_text()}; "
            f"{waited} {unmeasured}"
        )

    def _spread_text(self) -> str:
        if self.model_spread is None:
            return ""
        lo, hi = self.model_spread
        return f" ({lo:,.0f}-{hi:,.0f} over epochs)"

    def _workers_text(self) -> str:
        if self.transfer_note is not None:
            return f"; {self.transfer_note}"
        per = self.per_worker_samples_per_sec
        if self.cores is not None and per:
            text = (
                f"; {self.cores} core(s) for loading cannot close it with workers (one delivers "
                f"{per:,.0f} samples/s while busy)"
            )
            return text + (f"; instead: {self.instead}" if self.instead else "")
        if self.workers_needed is None or not per:
            return ""
        workers = f"{self.workers_needed} worker{'s' if self.workers_needed != 1 else ''}"
        text = f"; about {workers} at the measured {per:,.0f} samples/s each would close the gap"
        if self.more_than_cores and self.cpu_share is not None:
            text += (
                f" (more workers than cores pay here: the fetch waits, CPU "
                f"{self.cpu_share:.0%} of its time)"
            )
        return text


def verdict(
    loader_sps: float | None,
    model_sps: float | None,
    per_worker_sps: float | None = None,
    cpus: int | None = None,
    workers: int = 0,
) -> Verdict:
    """Compare the ceilings; estimate the workers that would feed the model.

    Args:
        loader_sps: the loader ceiling (samples/s).
        model_sps: the model ceiling (samples/s).
        per_worker_sps: samples/s one loading process produces while busy (measured).
        cpus: the CPUs available (caps nothing, only noted); default ``os.cpu_count()``.
        workers: the loader's ``num_workers`` when measured. Data-bound although that many
            workers could feed the model at the per-worker rate: the gap is not the number
            of workers, and the verdict says where it is instead (``transfer_note``).

    Example:
        >>> v = verdict(310.0, 2400.0, per_worker_sps=80.0)
        >>> v.bound, v.workers_needed
        ('data', 30)
        >>> v.message
        'data-bound: the loader delivers 310 samples/s, the model could consume 2,400; ...'
    """
    del cpus  # reserved: the message does not cap workers at the CPU count
    if loader_sps is None or model_sps is None:
        return Verdict("unknown", loader_sps, model_sps)
    if model_sps > loader_sps * BOUND_MARGIN:
        needed = None
        if per_worker_sps and per_worker_sps > 0:
            needed = max(1, math.ceil(model_sps / per_worker_sps))
        if needed is not None and workers and needed <= workers:
            found = Verdict("data", loader_sps, model_sps, None, per_worker_sps)
            found.transfer_note = _handover_note(workers, per_worker_sps or 0.0, loader_sps)
            return found
        return Verdict("data", loader_sps, model_sps, needed, per_worker_sps)
    return Verdict("model", loader_sps, model_sps, None, per_worker_sps)


def _handover_note(workers: int, per_worker: float, loader: float) -> str:
    plural = "s" if workers != 1 else ""
    return (
        f"the {workers} worker{plural} could load {per_worker * workers:,.0f} samples/s, yet the "
        f"loader delivered {loader:,.0f}: more workers would not close the gap, which lies in "
        f"handing batches from the worker process{'es' if workers != 1 else ''} to the training "
        f"process (or in their start); {HANDOVER_REMEDY}"
    )


#: What removes the handover of batches from worker processes (the probe's and the run's verdict).
HANDOVER_REMEDY = (
    "larger batches, or num_workers=0 when a sample is cheap to read (e.g. from a cache), "
    "remove that handover"
)


def cpu_count() -> int:
    """CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
