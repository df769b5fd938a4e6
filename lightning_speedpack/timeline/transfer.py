"""The copy of each training batch to the device: its profiled actions, bytes and device rate.

Lightning announces the copy through ``trainer.profiler`` (see
:mod:`~lightning_speedpack.core.profiler_tap`):
``[LightningModule]<cls>.on_before_batch_transfer`` (or ``[LightningDataModule]...`` when the
datamodule has the hook), then ``[Strategy]<cls>.batch_to_device``, which wraps
``transfer_batch_to_device`` and ``on_after_batch_transfer``. The fetch before it is
``[_TrainingEpochLoop].train_dataloader_next``. :func:`action_kind` sorts an action name into
one of these; :func:`batch_bytes` and :func:`loader_pins` describe what was copied.

The device-side rate needs CUDA events. They are made through :data:`TIMING`, a module-level
table that a test replaces with fake events, which is how the CUDA path is exercised on a
CPU-only machine. :class:`CopyTimer` records one pair around a sampled copy and reads it only
once the end event has completed (``query()``), so timing never waits for the device.
:class:`CopySampler` holds what the timeline knows of the run's copies: one sampled batch per
logging window (its bytes and, on CUDA, its rate) and whether the loaders pin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from lightning_speedpack.core.batch import batch_bytes
from lightning_speedpack.core.events import BatchTransfer
from lightning_speedpack.core.profiler_tap import TRAIN_FETCH
from lightning_speedpack.timeline.phases import PhaseTotals

__all__ = [
    "BEFORE",
    "BYTES_KEY",
    "FETCH",
    "PINNED_KEY",
    "RATE_KEY",
    "TIMING",
    "TRANSFER",
    "CopySampler",
    "CopyTimer",
    "DeviceTiming",
    "TimingEvent",
    "action_kind",
    "batch_bytes",
    "cuda_timing",
    "loader_pins",
]

#: The kinds :func:`action_kind` returns (and ``""``: an action the timeline ignores).
FETCH = "fetch"
BEFORE = "before_transfer"
TRANSFER = "transfer"

#: The keys :meth:`CopySampler.take_metrics` returns for the timeline to log.
BYTES_KEY = "data/h2d_bytes_per_batch"
PINNED_KEY = "data/h2d_pinned"
RATE_KEY = "data/h2d_gb_per_sec"

_BEFORE_SUFFIX = ".on_before_batch_transfer"
_BEFORE_PREFIXES = ("[LightningModule]", "[LightningDataModule]")
_TRANSFER_PREFIX = "[Strategy]"
_TRANSFER_SUFFIX = ".batch_to_device"


def action_kind(name: str) -> str:
    """Which part of the way to a training batch the profiled action ``name`` is.

    Example:
        >>> action_kind("[_TrainingEpochLoop].train_dataloader_next")
        'fetch'
        >>> action_kind("[LightningModule]BoringModel.on_before_batch_transfer")
        'before_transfer'
        >>> action_kind("[Strategy]SingleDeviceStrategy.batch_to_device")
        'transfer'
        >>> action_kind("[Callback]ModelCheckpoint.on_train_batch_end")
        ''
    """
    if name.endswith(TRAIN_FETCH):
        return FETCH
    if name.startswith(_TRANSFER_PREFIX) and name.endswith(_TRANSFER_SUFFIX):
        return TRANSFER
    if name.endswith(_BEFORE_SUFFIX) and name.startswith(_BEFORE_PREFIXES):
        return BEFORE
    return ""


def loader_pins(loaders: Iterable[Any], device: torch.device) -> bool:
    """Whether batches reach the copy to ``device`` in pinned memory: every loader pins for CUDA.

    The loader pins each fetched batch (``pin_memory=True``) only for a CUDA device; a callback
    never sees the batch before Lightning copies it, so this is read from the loaders' settings.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> pinned = DataLoader(range(4), pin_memory=True)
        >>> loader_pins([pinned], torch.device("cuda")), loader_pins([pinned], torch.device("cpu"))
        (True, False)
    """
    found = list(loaders)
    return device.type == "cuda" and bool(found) and all(bool(x.pin_memory) for x in found)


class TimingEvent(Protocol):
    """What :class:`CopyTimer` uses of a ``torch.cuda.Event(enable_timing=True)``."""

    def record(self) -> Any:
        """Enqueue the event on the current stream."""
        ...

    def query(self) -> bool:
        """Whether the device has reached the event (never waits)."""
        ...

    def elapsed_time(self, end_event: Any) -> float:
        """Milliseconds between this event and ``end_event``, both completed."""
        ...


@dataclass(frozen=True)
class DeviceTiming:
    """How to time copies on a device: whether it applies, and how to make an event."""

    applies: Callable[[torch.device], bool]
    event: Callable[[], TimingEvent]


def _cuda_event() -> TimingEvent:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def cuda_timing() -> DeviceTiming:
    """CUDA events on a CUDA device (what :data:`TIMING` holds unless a test replaces it)."""
    return DeviceTiming(applies=lambda device: device.type == "cuda", event=_cuda_event)


#: The table the timeline times copies with; tests replace it with fake events on a CPU machine.
TIMING: DeviceTiming = cuda_timing()


class CopyTimer:
    """One pair of events around one sampled copy, read without waiting for the device.

    :meth:`begin` records the start event (unless a pair is still unread), :meth:`end` the end
    event; :meth:`read` returns the copy's GB/s once the end event has completed and the bytes
    are known, and None until then, so the caller tries again at its next logging step.

    Example:
        >>> class Fake:
        ...     t = 0.0
        ...     def record(self): Fake.t += 2.0; self.at = Fake.t
        ...     def query(self): return True
        ...     def elapsed_time(self, end): return end.at - self.at
        >>> timer = CopyTimer(DeviceTiming(applies=lambda d: True, event=Fake))
        >>> timer.begin(), timer.end(), timer.set_bytes(4_000_000)
        (True, None, None)
        >>> timer.read()  # 4 MB in 2 ms
        2.0
    """

    def __init__(self, timing: DeviceTiming) -> None:
        self._timing = timing
        self._pair: tuple[TimingEvent, TimingEvent] | None = None
        self._state = "idle"  # idle -> recording -> pending -> (read) idle
        self._bytes = 0

    @property
    def busy(self) -> bool:
        """A pair is being recorded or waits to be read."""
        return self._state != "idle"

    def begin(self) -> bool:
        """Record the start event before a copy; False while the previous pair is unread."""
        if self._state != "idle":
            return False
        if self._pair is None:  # one pair for the whole fit, made when first needed
            self._pair = (self._timing.event(), self._timing.event())
        self._pair[0].record()
        self._state, self._bytes = "recording", 0
        return True

    def end(self) -> None:
        """Record the end event after the copy begun with :meth:`begin`."""
        if self._state == "recording" and self._pair is not None:
            self._pair[1].record()
            self._state = "pending"

    def set_bytes(self, nbytes: int) -> None:
        """The bytes the timed copy moved (once: a later sample never resizes an unread pair)."""
        if self._state != "idle" and not self._bytes:
            self._bytes = nbytes

    def read(self) -> float | None:
        """GB/s of the timed copy once the device finished it, else None (never waits)."""
        if self._state != "pending" or self._pair is None or not self._pair[1].query():
            return None
        start, end = self._pair
        ms, nbytes = start.elapsed_time(end), self._bytes
        self._state = "idle"
        if ms <= 0 or nbytes <= 0:
            return None
        return nbytes / (ms * 1e6)

    def abandon(self) -> None:
        """Forget an unfinished pair (the fit was interrupted); its events may be reused."""
        self._state, self._bytes = "idle", 0


class CopySampler:
    """The run's copies to the device as one batch sampled per logging window sees them.

    :meth:`start` decides, when training starts, whether copies are timed (:data:`TIMING`
    applies to the device), whether the loaders pin, and whether this rank samples at all. The
    first batch after :meth:`start` and after each :meth:`take_metrics` is sampled: its copy is
    timed between :meth:`begin` and :meth:`end` and its bytes are walked in :meth:`sample`.

    Example:
        >>> sampler = CopySampler()
        >>> sampler.start(torch.device("cpu"), [], sampling=True)
        >>> sampler.sample({"x": torch.zeros(2, 4)}); sampler.sample(torch.zeros(9))
        >>> sampler.take_metrics()
        {'data/h2d_bytes_per_batch': 32.0, 'data/h2d_pinned': 0.0}
    """

    def __init__(self) -> None:
        self.timer: CopyTimer | None = None
        self.pinned = False
        self.sampling = False  # this rank samples the copy's bytes (rank 0 logs them)
        self.pending = False  # the next batch is sampled
        self.bytes: int | None = None
        self.gb_per_sec: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        # a timer holds device events: runtime only, made again by the next start()
        return {**self.__dict__, "timer": None}

    def reset(self) -> None:
        """Forget the last fit's sampled bytes and rate (a new fit)."""
        self.bytes = self.gb_per_sec = None

    def start(self, device: torch.device, loaders: Iterable[Any], sampling: bool) -> None:
        """Training starts on ``device`` from ``loaders``; ``sampling``: this rank samples."""
        timing = TIMING  # read now: tests replace it
        self.timer = CopyTimer(timing) if timing.applies(device) else None
        self.pinned = loader_pins(loaders, device)
        self.sampling = self.pending = sampling

    def begin(self) -> None:
        """The copy of a batch starts (timed when that batch is sampled)."""
        if self.pending and self.timer is not None:
            self.timer.begin()

    def end(self) -> None:
        """The copy of a batch ended."""
        if self.timer is not None:
            self.timer.end()

    def sample(self, batch: Any) -> None:
        """Walk the copied ``batch``'s bytes if it is the sampled one."""
        if not self.pending:
            return
        self.pending = False
        self.bytes = batch_bytes(batch)
        if self.timer is not None:
            self.timer.set_bytes(self.bytes)

    def take_metrics(self) -> dict[str, float]:
        """The sampled copy's bytes, pinned-ness and GB/s (when just read); sample the next."""
        self.pending = self.sampling
        out: dict[str, float] = {}
        if self.bytes is not None:
            out[BYTES_KEY] = float(self.bytes)
            out[PINNED_KEY] = float(self.pinned)
        rate = self.timer.read() if self.timer is not None else None  # None: not done yet
        if rate is not None:
            self.gb_per_sec = out[RATE_KEY] = rate
        return out

    def stop(self) -> None:
        """Sample nothing more and forget an unfinished timing (the fit ended or failed)."""
        self.pending = False
        if self.timer is not None:
            self.timer.abandon()

    def measured(self, run: PhaseTotals) -> BatchTransfer | None:
        """The run's copy so far, from its phase totals (None before a batch)."""
        if not run.batches:
            return None
        ms = run.mean_ms()
        return BatchTransfer(
            transfer_ms_per_batch=ms["batch_transfer"],
            step_ms_per_batch=sum(ms.values()),
            batches=run.batches,
            bytes_per_batch=self.bytes,
            pinned=self.pinned,
            gb_per_sec=self.gb_per_sec,
        )
