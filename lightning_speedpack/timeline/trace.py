"""A ``torch.profiler`` window over a few training steps, exported as a Chrome/Perfetto trace.

:class:`TraceWindow` starts the profiler when the run reaches the first step of the window and
stops it after the last, then writes the trace (open it in https://ui.perfetto.dev or
``chrome://tracing``) and ranks the operators by self time. Zero-length ranges named
``speedpack/sync/...`` (the sync points seen during the window) become instant events in the
written file, so they draw as markers on the timeline.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile

__all__ = [
    "SYNC_PREFIX",
    "TopOp",
    "TraceWindow",
    "check_trace_steps",
    "parse_trace_steps",
]

#: Name prefix of the instant events that mark sync points.
SYNC_PREFIX = "speedpack/sync/"
_OWN_PREFIX = "speedpack/"


def parse_trace_steps(text: str) -> tuple[int, int]:
    """Parse ``"START:COUNT"`` (the doctor's ``--trace``) into ``(start, count)``.

    Raises:
        ValueError: not two integers ``START >= 0`` and ``COUNT >= 1`` separated by ``:``.

    Example:
        >>> parse_trace_steps("5:3")
        (5, 3)
    """
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if match is None or int(match.group(2)) < 1:
        raise ValueError(
            f"a trace window must be START:COUNT with START >= 0 and COUNT >= 1, got {text!r}"
        )
    return int(match.group(1)), int(match.group(2))


def check_trace_steps(value: Any) -> tuple[int, int] | None:
    """Validate ``trace_steps``: None or ``(start, count)`` with ``start >= 0``, ``count >= 1``.

    Raises:
        TypeError: not None and not a pair of ints.
        ValueError: ``start`` is negative or ``count`` is below 1.
    """
    if value is None:
        return None
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise TypeError(
            f"`trace_steps` must be None or a pair (start, count) of ints, got {value!r}"
        )
    start, count = value
    if start < 0 or count < 1:
        raise ValueError(
            f"`trace_steps` must have start >= 0 and count >= 1, got (start={start}, count={count})"
        )
    return int(start), int(count)


@dataclass(frozen=True)
class TopOp:
    """One operator's total self time over the window."""

    name: str
    self_ms: float
    calls: int


class TraceWindow:
    """Profile steps ``start .. start + count - 1`` and write one trace file for them.

    Args:
        start: the first ``trainer.global_step`` profiled.
        count: how many steps are profiled.
        directory: where the trace file goes (created if missing).
        rank: the global rank, part of the file name.
        cuda: profile CUDA activity too.
        record_shapes: ``torch.profiler.profile(record_shapes=...)``.
        profile_memory: ``torch.profiler.profile(profile_memory=...)``.
        with_stack: ``torch.profiler.profile(with_stack=...)``.
        top: how many operators :attr:`top_ops` keeps.

    Example:
        >>> import tempfile, torch
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     window = TraceWindow(0, 1, Path(tmp), rank=0)
        ...     window.start(0) if window.should_start(0) else None
        ...     _ = torch.ones(8) @ torch.ones(8)
        ...     window.stop()
        >>> window.path.name, window.done
        ('speedpack-steps0-0-rank0.pt.trace.json', True)
    """

    def __init__(
        self,
        start: int,
        count: int,
        directory: Path,
        rank: int = 0,
        cuda: bool = False,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        top: int = 10,
    ) -> None:
        self.start_step = start
        self.count = count
        self.directory = directory
        self.rank = rank
        self.cuda = cuda
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.top = top
        self.done = False
        self.path: Path | None = None
        self.top_ops: list[TopOp] = []
        self.first_step: int | None = None
        self.last_step: int | None = None
        self._profiler: profile | None = None

    @property
    def running(self) -> bool:
        """Whether the profiler is recording."""
        return self._profiler is not None

    @property
    def end_step(self) -> int:
        """The first step after the window."""
        return self.start_step + self.count

    def should_start(self, step: int) -> bool:
        """Whether the batch about to run (of ``global_step == step``) opens the window."""
        return not self.done and self._profiler is None and self.start_step <= step < self.end_step

    def should_stop(self, step: int) -> bool:
        """Whether the window is over once ``global_step`` has reached ``step``."""
        return self._profiler is not None and step >= self.end_step

    def start(self, step: int) -> None:
        """Start the profiler, for steps from ``step`` on."""
        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        prof = profile(
            activities=activities,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        prof.start()
        self._profiler = prof
        self.first_step = step

    def saw_step(self, step: int) -> None:
        """Note that step ``step`` ran inside the window."""
        self.last_step = step

    def stop(self) -> None:
        """Stop the profiler, write the trace and rank the operators."""
        prof, self._profiler = self._profiler, None
        if prof is None:
            return
        self.done = True
        prof.stop()
        first = self.first_step if self.first_step is not None else self.start_step
        last = self.last_step if self.last_step is not None else first
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"speedpack-steps{first}-{last}-rank{self.rank}.pt.trace.json"
        prof.export_chrome_trace(str(path))
        _mark_instants(path)
        self.path = path
        self.top_ops = _top_ops(prof, self.cuda, self.top)

    def abort(self) -> None:
        """Stop the profiler and write nothing (after an exception)."""
        prof, self._profiler = self._profiler, None
        if prof is not None:
            self.done = True
            prof.stop()


def _top_ops(prof: profile, cuda: bool, top: int) -> list[TopOp]:
    def self_us(event: Any) -> float:
        if cuda:
            value = getattr(event, "self_device_time_total", None)
            if value is None:
                value = getattr(event, "self_cuda_time_total", 0.0)
            return float(value or 0.0)
        return float(event.self_cpu_time_total)

    ops = [
        TopOp(str(e.key), self_us(e) / 1000.0, int(e.count))
        for e in prof.key_averages()
        if not str(e.key).startswith(_OWN_PREFIX) and not str(e.key).startswith("ProfilerStep")
    ]
    ops.sort(key=lambda op: -op.self_ms)
    return ops[:top]


def _mark_instants(path: Path) -> None:
    """Rewrite the zero-length ``speedpack/sync/...`` ranges of a trace as instant events."""
    text = path.read_text()
    if SYNC_PREFIX not in text:
        return
    trace = json.loads(text)
    for event in trace.get("traceEvents", []):
        if str(event.get("name", "")).startswith(SYNC_PREFIX) and event.get("ph") == "X":
            event["ph"] = "i"
            event["s"] = "t"  # scoped to its thread
            event.pop("dur", None)
    path.write_text(json.dumps(trace))
