"""GPU statistics from NVML, sampled by a background thread so no training step pays for them.

All NVML calls go through an :class:`NvmlFunctions` table. :func:`load_functions` builds the
real one from ``nvidia-ml-py`` (``pynvml``); tests replace ``load_functions`` (or pass a table
to :class:`NvmlSampler`) to inject a fake NVML on machines without a GPU.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GPU_STATS",
    "NvmlFunctions",
    "NvmlSampler",
    "load_functions",
    "nvml_indices",
    "summarize",
]

THREAD_NAME = "speedpack-nvml-sampler"
# Per-device statistic -> how one sample is read from a handle through the table.
GPU_STATS: tuple[str, ...] = ("util", "mem_used_gb", "power_w", "temp_c")


@dataclass(frozen=True)
class NvmlFunctions:
    """The few NVML calls the sampler makes; every field is replaceable for tests.

    ``utilization``: percent busy (0-100); ``memory_used_bytes``; ``power_mw`` (milliwatts);
    ``temperature_c``; ``handle(index)``: the device handle for an NVML device index.
    """

    handle: Callable[[int], Any]
    utilization: Callable[[Any], float]
    memory_used_bytes: Callable[[Any], float]
    power_mw: Callable[[Any], float]
    temperature_c: Callable[[Any], float]
    shutdown: Callable[[], None] = lambda: None


def load_functions() -> NvmlFunctions | str:
    """Initialise NVML and return its function table, or a reason why it is unavailable."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed (pip install 'lightning-speedpack[nvml]')"
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return f"NVML could not be initialised ({type(err).__name__}: {err})"
    return NvmlFunctions(
        handle=pynvml.nvmlDeviceGetHandleByIndex,
        utilization=lambda h: float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
        memory_used_bytes=lambda h: float(pynvml.nvmlDeviceGetMemoryInfo(h).used),
        power_mw=lambda h: float(pynvml.nvmlDeviceGetPowerUsage(h)),
        temperature_c=lambda h: float(
            pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        ),
        shutdown=pynvml.nvmlShutdown,
    )


def nvml_indices(cuda_indices: Sequence[int], visible: str | None = None) -> list[int]:
    """Map CUDA device indices to NVML indices through ``CUDA_VISIBLE_DEVICES``.

    NVML numbers every GPU of the machine; CUDA numbers only the visible ones. UUID entries
    in ``CUDA_VISIBLE_DEVICES`` are not resolved (the CUDA index is used as is).

    Example:
        >>> nvml_indices([0, 1], visible="2,3")
        [2, 3]
        >>> nvml_indices([0], visible=None)
        [0]
    """
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return list(cuda_indices)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not all(e.isdigit() for e in entries):
        return list(cuda_indices)
    return [int(entries[i]) if i < len(entries) else i for i in cuda_indices]


class NvmlSampler:
    """Samples GPU utilisation, memory, power and temperature every ``interval`` seconds.

    One daemon thread (named ``speedpack-nvml-sampler``) reads NVML; :meth:`read` returns
    the per-device means over the samples since the previous read (the last sample when
    there were none). :meth:`stop` ends the thread, joins it and shuts NVML down.

    Fork-safe: a process forked while the sampler runs (e.g. a DataLoader worker) gets a
    sampler that is stopped, with a fresh lock (the thread may have held the parent's at the
    moment of the fork) and that does not shut NVML down (the parent owns it).

    Example:
        >>> table = NvmlFunctions(handle=lambda i: i, utilization=lambda h: 50.0,
        ...                       memory_used_bytes=lambda h: 2e9, power_mw=lambda h: 1e5,
        ...                       temperature_c=lambda h: 60.0)
        >>> sampler = NvmlSampler(table, [0])
        >>> sampler.sample()
        >>> sampler.read()["util"], sampler.peak_mem_used_gb
        ([50.0], 2.0)
    """

    def __init__(
        self, functions: NvmlFunctions, indices: Sequence[int], interval: float = 0.5
    ) -> None:
        if not indices:
            raise ValueError("NvmlSampler needs at least one device index")
        self._functions = functions
        self._handles = [functions.handle(i) for i in indices]
        self._interval = interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._window: dict[str, list[list[float]]] = {s: [[] for _ in indices] for s in GPU_STATS}
        self._last: dict[str, list[float]] = {}
        self.peak_mem_used_gb = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False
        _SAMPLERS.add(self)

    def _after_fork_in_child(self) -> None:
        """In a forked child: no thread, a fresh (unheld) lock, and NVML left to the parent."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stop.set()
        self._thread = None
        self._closed = True

    def sample(self) -> None:
        """Take one sample of every device now (the thread calls this every ``interval``)."""
        f = self._functions
        values = {
            "util": [f.utilization(h) for h in self._handles],
            "mem_used_gb": [f.memory_used_bytes(h) / 1e9 for h in self._handles],
            "power_w": [f.power_mw(h) / 1000.0 for h in self._handles],
            "temp_c": [f.temperature_c(h) for h in self._handles],
        }
        with self._lock:
            for stat, per_device in values.items():
                for series, value in zip(self._window[stat], per_device, strict=True):
                    series.append(value)
            self._last = values
            self.peak_mem_used_gb = max(self.peak_mem_used_gb, *values["mem_used_gb"])

    def start(self) -> None:
        """Take a first sample synchronously, then sample in the background thread."""
        self.sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sample()
            except Exception:  # a device that went away must not kill training
                return

    def read(self) -> dict[str, list[float]]:
        """Per-device mean of each statistic since the previous read."""
        with self._lock:
            out = {
                stat: [
                    statistics.fmean(series) if series else self._last[stat][i]
                    for i, series in enumerate(per_device)
                ]
                for stat, per_device in self._window.items()
            }
            for per_device in self._window.values():
                for series in per_device:
                    series.clear()
        return out

    @property
    def running(self) -> bool:
        """Whether the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop and join the thread and shut NVML down (idempotent)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5.0)
        if not self._closed:
            self._closed = True
            with contextlib.suppress(Exception):  # best effort
                self._functions.shutdown()


_SAMPLERS: weakref.WeakSet[NvmlSampler] = weakref.WeakSet()


def _reset_samplers_in_child() -> None:
    for sampler in list(_SAMPLERS):
        sampler._after_fork_in_child()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_reset_samplers_in_child)


def summarize(per_device: dict[str, list[float]], prefix: str = "system/gpu/") -> dict[str, float]:
    """Flatten per-device stats into stable keys: the mean, plus ``_min``/``_max`` for several.

    Example:
        >>> summarize({"util": [40.0, 60.0]})
        {'system/gpu/util': 50.0, 'system/gpu/util_min': 40.0, 'system/gpu/util_max': 60.0}
        >>> summarize({"util": [40.0]})
        {'system/gpu/util': 40.0}
    """
    out: dict[str, float] = {}
    for stat, values in per_device.items():
        if not values:
            continue
        out[f"{prefix}{stat}"] = statistics.fmean(values)
        if len(values) > 1:
            out[f"{prefix}{stat}_min"] = min(values)
            out[f"{prefix}{stat}_max"] = max(values)
    return out
