"""How long a thread waited for a CPU: the kernel's run-queue delay (Linux ``schedstat``).

A process that is ready to run but finds every core busy (other jobs on the host, more
threads than cores) loses wall time that no profiler of its own code sees: its hooks, its
step, its data wait all just take longer. The kernel counts that time per thread, as the
second field of ``/proc/thread-self/schedstat`` (``run_delay``, in nanoseconds; kernels with
``CONFIG_SCHED_INFO``, which every mainstream distribution builds). Reading it is one small
file read, done at the start and the end of a fit and of each training epoch, never in a
step.
"""

from __future__ import annotations

import os

__all__ = ["SCHEDSTAT", "thread_cpu_wait_s", "usable_cores"]

#: The calling thread's scheduler statistics: time on a CPU, time waiting for one, timeslices.
SCHEDSTAT = "/proc/thread-self/schedstat"


def thread_cpu_wait_s(path: str = SCHEDSTAT) -> float | None:
    """Seconds the calling thread has spent ready to run but waiting for a CPU, since it began.

    None where the kernel does not say (not Linux, or a kernel without scheduler statistics).

    Example:
        >>> wait = thread_cpu_wait_s()
        >>> wait is None or wait >= 0.0
        True
    """
    try:
        with open(path, "rb") as stats:
            fields = stats.read().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity where the OS says, else the machine's).

    Example:
        >>> usable_cores() >= 1
        True
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
