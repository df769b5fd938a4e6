"""A tiny publish/subscribe point, so one tool can announce what another listens for.

Tools never import each other (see the layout rules); when one tool's observation is useful to
another, the first *publishes* it here and the second *subscribes*. The first use: the
sync-point detector publishes every host-device sync it records (:data:`SYNC_POINT`, a
:class:`SyncPoint`), and the step timeline marks each one in its trace.

Publishing costs one dict lookup when nobody listens; a publisher that has to do work to build
its message asks :func:`has_subscribers` first. Listeners run synchronously, on the
publisher's thread, in subscription order; an exception in a listener reaches the publisher.
The second use: the data profiler publishes its measured verdict (:data:`DATA_VERDICT`, a
:class:`DataVerdict`), and the advisor's ``dataloader-workers`` finding carries the measured
number of workers instead of a rule of thumb. The third: the step timeline publishes its
measured copy of the training batches to the device (:data:`BATCH_TRANSFER`, a
:class:`BatchTransfer`), and the advisor's ``pin-memory`` finding carries the copy's share of
the step, or goes when the copy is too small to matter. The fourth: ``WhatIf`` publishes the
remedies it tried on the user's own model and data (:data:`WHAT_IF`, a :class:`WhatIfResults`),
and every advisor finding whose knob was measured carries the measured gain.
This module imports nothing but the standard library.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BATCH_TRANSFER",
    "DATA_VERDICT",
    "SYNC_POINT",
    "WHAT_IF",
    "BatchTransfer",
    "DataVerdict",
    "KnobResult",
    "Subscription",
    "SyncPoint",
    "WhatIfResults",
    "has_subscribers",
    "publish",
    "subscribe",
    "subscriber_count",
]

#: Topic of :class:`SyncPoint` messages: one per host-device sync a detector records.
SYNC_POINT = "sync_point"

#: Topic of :class:`DataVerdict` messages: one per fit whose data ceilings were measured.
DATA_VERDICT = "data_verdict"

#: Topic of :class:`BatchTransfer` messages: the run so far, after each measured training batch.
BATCH_TRANSFER = "batch_transfer"

#: Topic of :class:`WhatIfResults` messages: one per fit whose remedies ``WhatIf`` tried.
WHAT_IF = "what_if"

Listener = Callable[[Any], None]

# topic -> listeners; replaced (never mutated) on change, so `publish` reads it without a lock.
_LISTENERS: dict[str, tuple[Listener, ...]] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class SyncPoint:
    """One host-device synchronisation, as published on :data:`SYNC_POINT`.

    Attributes:
        kind: what synced (``"item"``, ``"cpu copy"``, ...).
        location: ``"path/file.py:LINE"`` of the call site.
        origin: ``"user"`` or ``"framework"``.
        step: ``trainer.global_step`` when it happened.
    """

    kind: str
    location: str
    origin: str = "user"
    step: int = 0


@dataclass(frozen=True)
class DataVerdict:
    """The measured data/model ceilings of a fit, as published on :data:`DATA_VERDICT`.

    Attributes:
        bound: ``"data"``, ``"model"`` or ``"unknown"``.
        loader_samples_per_sec: the training loader alone.
        model_samples_per_sec: training steps on a batch already in memory.
        workers_needed: DataLoader workers that would feed the model at the measured
            per-worker rate (None when not estimated).
        per_worker_samples_per_sec: what one loading process delivered.
        num_workers: the loader's ``num_workers`` when it was measured.
        data_wait_fraction: the share of the run's training time spent waiting for the
            loader (None: a verdict from the probe alone, before the run).
        data_wait_ms_per_batch: the mean wait for one batch in that run.
        workers_close_gap: False when workers on the cores this rank's loader can use cannot
            feed the model (the verdict then says what can).
    """

    bound: str
    loader_samples_per_sec: float | None
    model_samples_per_sec: float | None
    workers_needed: int | None = None
    per_worker_samples_per_sec: float | None = None
    num_workers: int = 0
    data_wait_fraction: float | None = None
    data_wait_ms_per_batch: float | None = None
    workers_close_gap: bool = True

    def confirms_data_wait(self, threshold: float) -> bool | None:
        """Whether a "waits for data" finding at ``threshold`` stands on this measurement.

        None when the run's wait was not measured (a verdict from the probe alone). False
        when the loader's measured wait is at most ``threshold`` of the training time or under
        1 ms a batch (a tiny model's own loop between batches), or when the run is measured
        data-bound (that finding states the wait and its fix); True otherwise.

        Example:
            >>> DataVerdict("model", 1.0, 2.0, data_wait_fraction=0.03).confirms_data_wait(0.2)
            False
        """
        fraction, ms = self.data_wait_fraction, self.data_wait_ms_per_batch
        if fraction is None:
            return None
        small = fraction <= threshold or (ms is not None and ms < 1.0)
        return not (small or self.bound == "data")


@dataclass(frozen=True)
class BatchTransfer:
    """The measured copy of the training batches to the device, as published on the topic.

    :data:`BATCH_TRANSFER` carries the means over the run's training batches so far (host
    time), from the step timeline.

    Attributes:
        transfer_ms_per_batch: Lightning's batch transfer (``on_before_batch_transfer`` to the
            end of ``on_after_batch_transfer``), mean host milliseconds per batch.
        step_ms_per_batch: the whole training step, every phase, mean host ms per batch.
        batches: how many training batches the means are over.
        bytes_per_batch: tensor bytes of a sampled batch after the copy (None: none sampled).
        pinned: whether the train loaders pin the batches they hand to the copy.
        gb_per_sec: the copy's rate on the device, from CUDA events (None: not on CUDA, or not
            read yet).

    Example:
        >>> round(BatchTransfer(13.6, 186.0, 50).share, 4)
        0.0731
    """

    transfer_ms_per_batch: float
    step_ms_per_batch: float
    batches: int
    bytes_per_batch: int | None = None
    pinned: bool = False
    gb_per_sec: float | None = None

    @property
    def share(self) -> float:
        """The transfer's fraction of the step's host time (0.0 when nothing was timed)."""
        if self.step_ms_per_batch <= 0:
            return 0.0
        return self.transfer_ms_per_batch / self.step_ms_per_batch


@dataclass(frozen=True)
class KnobResult:
    """One remedy ``WhatIf`` tried (or could not), as carried by :class:`WhatIfResults`.

    Attributes:
        knob: the knob's name (``"num_workers"``, ``"channels_last"``, ``"precision"``, ...).
        today: the setting the run has, as text (``"0"``, ``"32-true"``).
        candidate: the best setting tried, as text (None: nothing was tried).
        gain: the candidate's ceiling over today's, median of the rounds (None: not measured).
        verdict: ``"apply"``, ``"no gain here"``, ``"changes the numerics"`` or
            ``"not applicable"``, ``"not tried"``.
        reason: why not applicable / not tried (None otherwise).
        side: ``"loader"`` or ``"model"``.
        applied: ``WhatIf`` applied the candidate for this fit.
    """

    knob: str
    today: str
    candidate: str | None
    gain: float | None
    verdict: str
    reason: str | None = None
    side: str = "model"
    applied: bool = False

    @property
    def measured(self) -> bool:
        """Whether a gain was measured for this knob."""
        return self.gain is not None


@dataclass(frozen=True)
class WhatIfResults:
    """What ``WhatIf`` measured on this fit, as published on :data:`WHAT_IF`.

    Attributes:
        knobs: one :class:`KnobResult` per knob considered, in the order tried.
        min_gain: the gain below which a remedy counts as "no gain here".

    Example:
        >>> r = WhatIfResults((KnobResult("num_workers", "0", "2", 0.98, "no gain here"),), 1.05)
        >>> r.get("num_workers").gain, r.get("precision")
        (0.98, None)
    """

    knobs: tuple[KnobResult, ...]
    min_gain: float = 1.05

    def get(self, knob: str) -> KnobResult | None:
        """The result for ``knob``, or None when it was not considered."""
        return next((k for k in self.knobs if k.knob == knob), None)


class Subscription:
    """A listener's registration; :meth:`close` (or leaving a ``with`` block) removes it.

    Example:
        >>> seen = []
        >>> with subscribe("demo", seen.append):
        ...     publish("demo", 1)
        >>> publish("demo", 2)
        >>> seen
        [1]
    """

    def __init__(self, topic: str, listener: Listener) -> None:
        self.topic = topic
        self.listener = listener
        self.closed = False

    def close(self) -> None:
        """Remove the listener (idempotent)."""
        if self.closed:
            return
        self.closed = True
        with _LOCK:
            remaining = list(_LISTENERS.get(self.topic, ()))
            if self.listener in remaining:
                remaining.remove(self.listener)
            if remaining:
                _LISTENERS[self.topic] = tuple(remaining)
            else:
                _LISTENERS.pop(self.topic, None)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def subscribe(topic: str, listener: Listener) -> Subscription:
    """Call ``listener(message)`` for every message published on ``topic`` until closed.

    Raises:
        TypeError: ``topic`` is not a string or ``listener`` is not callable.
    """
    if not isinstance(topic, str):
        raise TypeError(f"`topic` must be a str, got {topic!r}")
    if not callable(listener):
        raise TypeError(f"`listener` must be callable, got {listener!r}")
    with _LOCK:
        _LISTENERS[topic] = (*_LISTENERS.get(topic, ()), listener)
    return Subscription(topic, listener)


def has_subscribers(topic: str) -> bool:
    """Whether anyone listens on ``topic`` (cheap: ask before building a costly message)."""
    return topic in _LISTENERS


def subscriber_count(topic: str | None = None) -> int:
    """How many listeners ``topic`` has (every topic's when None); tests check it drops to 0."""
    if topic is not None:
        return len(_LISTENERS.get(topic, ()))
    return sum(len(v) for v in _LISTENERS.values())


def publish(topic: str, message: Any) -> None:
    """Hand ``message`` to every listener of ``topic``, in subscription order."""
    for listener in _LISTENERS.get(topic, ()):
        listener(message)
