"""The kernel's run-queue delay of the calling thread (``core.cpu_wait``)."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from lightning_speedpack.core.cpu_wait import thread_cpu_wait_s


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(thread_cpu_wait_s() is None, reason="the kernel keeps no schedstat")
def test_a_thread_that_shares_its_core_with_a_busy_process_waits_for_it() -> None:
    """Pinned to one core beside a spinning process, the thread is kept off the CPU a while:
    its wait grows (by about half of its spin; asserted only to grow)."""
    core = min(os.sched_getaffinity(0))
    before_affinity = os.sched_getaffinity(0)
    rival = multiprocessing.get_context("fork").Process(target=_spin, args=(3.0,))
    os.sched_setaffinity(0, {core})
    try:
        rival.start()  # forked after the pinning: the same single core
        before = thread_cpu_wait_s()
        _spin(0.4)
        after = thread_cpu_wait_s()
    finally:
        os.sched_setaffinity(0, before_affinity)
        rival.terminate()
        rival.join()
    assert before is not None
    assert after is not None
    assert after > before


def test_no_schedstat_is_none_not_an_error(tmp_path: Path) -> None:
    assert thread_cpu_wait_s(str(tmp_path / "missing")) is None
    (tmp_path / "odd").write_text("12")
    assert thread_cpu_wait_s(str(tmp_path / "odd")) is None
    (tmp_path / "good").write_text("100 2500000000 7\n")
    assert thread_cpu_wait_s(str(tmp_path / "good")) == 2.5
