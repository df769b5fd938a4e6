"""Processes a test starts: each in its own session, killed as a whole group in a ``finally``."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["REPO", "kill_group", "python_group", "read_line", "setsid_target"]

REPO = Path(__file__).resolve().parents[2]


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (a session leader), or just ``pid``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def read_line(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    """The next line ``proc`` prints, or an AssertionError with its stderr after ``timeout``."""
    stdout = proc.stdout
    assert stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True)
    reader.start()
    try:
        return lines.get(timeout=timeout).strip()
    except queue.Empty:
        kill_group(proc.pid)
        _, err = proc.communicate(timeout=30)
        raise AssertionError(
            f"no line from pid {proc.pid} in {timeout} s; stderr:\n{err}"
        ) from None


@contextlib.contextmanager
def python_group(script: Path, *args: str, **kwargs: Any) -> Iterator[subprocess.Popen[str]]:
    """``python script args...`` in a new session (the repo importable); killed as a group."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=kwargs.pop("env", env),
        **kwargs,
    )
    try:
        yield proc
    finally:
        kill_group(proc.pid)
        with contextlib.suppress(Exception):
            proc.communicate(timeout=30)


def setsid_target(target: Any, *args: Any) -> None:
    """A multiprocessing target that first makes its process a session (and group) leader."""
    os.setsid()
    target(*args)
