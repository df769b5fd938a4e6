from __future__ import annotations

import os
import sys
import threading
import time
import warnings

import pytest

from lightning_speedpack.throughput import nvml as _nvml
from lightning_speedpack.throughput.nvml import NvmlFunctions, NvmlSampler, nvml_indices, summarize


class FakeNvml:
    """A fake NVML: per-index values, and a record of what was called."""

    def __init__(self) -> None:
        self.shutdowns = 0
        self.util = {0: 40.0, 1: 60.0}

    def table(self) -> NvmlFunctions:
        def shutdown() -> None:
            self.shutdowns += 1

        return NvmlFunctions(
            handle=lambda i: i,
            utilization=lambda h: self.util[h],
            memory_used_bytes=lambda h: 2e9 * (h + 1),
            power_mw=lambda h: 100_000.0 + 1000.0 * h,
            temperature_c=lambda h: 50.0 + h,
            shutdown=shutdown,
        )


def _speedpack_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if "speedpack" in t.name]


def test_sampler_reads_the_values_of_the_table() -> None:
    fake = FakeNvml()
    sampler = NvmlSampler(fake.table(), [0, 1], interval=60.0)
    sampler.start()
    try:
        assert [t.name for t in _speedpack_threads()] == ["speedpack-nvml-sampler"]
        assert sampler.running
        assert sampler.read() == {
            "util": [40.0, 60.0],
            "mem_used_gb": [2.0, 4.0],
            "power_w": [100.0, 101.0],
            "temp_c": [50.0, 51.0],
        }
        fake.util = {0: 20.0, 1: 80.0}
        sampler.sample()
        sampler.sample()
        fake.util = {0: 80.0, 1: 80.0}
        sampler.sample()
        assert sampler.read()["util"] == [40.0, 80.0]  # mean since the previous read
        assert sampler.read()["util"] == [80.0, 80.0]  # no new sample: the last one
        assert sampler.peak_mem_used_gb == 4.0
    finally:
        sampler.stop()
    assert not sampler.running
    assert _speedpack_threads() == []
    assert fake.shutdowns == 1
    sampler.stop()
    assert fake.shutdowns == 1  # idempotent


def test_sampler_thread_samples_in_the_background() -> None:
    fake = FakeNvml()
    sampler = NvmlSampler(fake.table(), [0], interval=0.01)
    calls = 0
    original = sampler.sample

    def counting() -> None:
        nonlocal calls
        calls += 1
        original()

    sampler.sample = counting  # type: ignore[method-assign]
    sampler.start()
    deadline = time.monotonic() + 10
    while calls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert calls >= 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork only")
def test_a_forked_child_gets_a_stopped_sampler_with_a_free_lock() -> None:
    fake = FakeNvml()
    sampler = NvmlSampler(fake.table(), [0], interval=0.01)
    sampler.start()
    read_end, write_end = os.pipe()
    try:
        with sampler._lock:  # the thread may hold it at the moment of a fork
            with warnings.catch_warnings():  # Python 3.12+ warns about fork with threads
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # the child: report, then leave without running any cleanup
                try:
                    free = sampler._lock.acquire(timeout=5)
                    if free:
                        sampler._lock.release()
                    sampler.stop()  # must not shut down the parent's NVML
                    util = sampler.read()["util"] if free else "blocked"
                    report = f"{sampler.running} {free} {util} {fake.shutdowns}"
                    os.write(write_end, report.encode())
                finally:
                    os._exit(0)
        os.close(write_end)
        report = os.read(read_end, 1000).decode()
        os.waitpid(pid, 0)
        assert sampler.running  # the parent's thread is untouched
    finally:
        os.close(read_end)
        sampler.stop()
    assert report == "False True [40.0] 0"  # not running, lock free, readable, NVML left alone
    assert fake.shutdowns == 1


def test_sampler_needs_a_device() -> None:
    with pytest.raises(ValueError, match="at least one device"):
        NvmlSampler(FakeNvml().table(), [])


def test_summarize_stable_names() -> None:
    assert summarize({"util": [10.0, 30.0], "temp_c": [50.0, 50.0]}) == {
        "system/gpu/util": 20.0,
        "system/gpu/util_min": 10.0,
        "system/gpu/util_max": 30.0,
        "system/gpu/temp_c": 50.0,
        "system/gpu/temp_c_min": 50.0,
        "system/gpu/temp_c_max": 50.0,
    }
    assert summarize({"power_w": [250.0]}) == {"system/gpu/power_w": 250.0}


def test_nvml_indices_follow_cuda_visible_devices() -> None:
    assert nvml_indices([0, 1], visible="3,1") == [3, 1]
    assert nvml_indices([1], visible="") == [1]
    assert nvml_indices([0], visible="GPU-1234") == [0]


def test_load_functions_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    reason = _nvml.load_functions()
    assert isinstance(reason, str)
    assert "nvidia-ml-py is not installed" in reason


def test_load_functions_when_nvml_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    pynvml = pytest.importorskip("pynvml")

    def fail() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    reason = _nvml.load_functions()
    assert isinstance(reason, str)
    assert reason.startswith("NVML could not be initialised")
