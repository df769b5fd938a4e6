"""Named ranges that show up in a ``torch.profiler`` trace and in Nsight Systems at once.

A :class:`RangeStack` opens each range as a ``torch.profiler.record_function`` (only while a
profiler records: one C call otherwise, instead of a few microseconds) and, when it has an
NVTX table, as an NVTX range of the same name. Ranges are opened and closed from different
Lightning hooks, so it keeps its own stack and can always unwind it completely
(:meth:`close_all`), which is what keeps NVTX balanced after an exception.
"""

from __future__ import annotations

from torch._C._autograd import _profiler_enabled
from torch.profiler import record_function

from lightning_speedpack.timeline.nvtx import NvtxApi

__all__ = ["RangeStack"]


class RangeStack:
    """A stack of open ranges, each a profiler ``record_function`` and an NVTX range.

    Args:
        nvtx: the NVTX table to mirror ranges into, or None.
        profiler: open ``record_function`` ranges while a ``torch.profiler`` records.

    Example:
        >>> from lightning_speedpack.timeline.nvtx import RecordingNvtx
        >>> rec = RecordingNvtx()
        >>> ranges = RangeStack(rec.api)
        >>> ranges.push("speedpack/step"); ranges.push("speedpack/backward")
        >>> ranges.depth
        2
        >>> ranges.close_all()
        >>> ranges.depth, rec.depth
        (0, 0)
    """

    def __init__(self, nvtx: NvtxApi | None = None, profiler: bool = True) -> None:
        self.nvtx = nvtx
        self.profiler = profiler
        self._open: list[record_function | None] = []
        self._recorded = 0  # open entries that are real profiler ranges (not None)

    @property
    def depth(self) -> int:
        """How many ranges are open."""
        return len(self._open)

    def push(self, name: str, nvtx_name: str | None = None) -> None:
        """Open range ``name`` inside the innermost open one (``nvtx_name`` for NVTX, if given)."""
        rf: record_function | None = None
        if self.profiler and _profiler_enabled():
            rf = record_function(name)
            rf.__enter__()  # type: ignore[no-untyped-call]
            self._recorded += 1
        self._open.append(rf)
        if self.nvtx is not None:
            self.nvtx.push(nvtx_name or name)

    def replace(self, depth: int, name: str) -> None:
        """Close ranges until ``depth`` remain open, then open ``name`` (one call a phase)."""
        if self.nvtx is None and not self._recorded:
            # Nothing to close but placeholders: the usual case, with no profiler recording
            # and no NVTX (several times a batch).
            del self._open[depth:]
            if self.profiler and _profiler_enabled():
                self.push(name)
            else:
                self._open.append(None)
            return
        self.pop_to(depth)
        self.push(name)

    def pop(self) -> None:
        """Close the innermost open range (no-op when none is open)."""
        if not self._open:
            return
        rf = self._open.pop()
        try:
            if rf is not None:
                self._recorded -= 1
                rf.__exit__(None, None, None)
        finally:
            if self.nvtx is not None:
                self.nvtx.pop()

    def renew(self, name: str) -> None:
        """Close and reopen the innermost range's profiler ``record_function`` as ``name``.

        The NVTX range stays as it is: only a ``torch.profiler`` trace sees two ranges. For a
        range that must be innermost again after someone else opened one inside it (torch's
        ``Optimizer.step#...`` around a closure that runs the forward).
        """
        if not self._open:
            return
        rf = self._open[-1]
        if rf is not None:
            self._recorded -= 1
            rf.__exit__(None, None, None)
        renewed: record_function | None = None
        if self.profiler and _profiler_enabled():
            renewed = record_function(name)
            renewed.__enter__()  # type: ignore[no-untyped-call]
            self._recorded += 1
        self._open[-1] = renewed

    def pop_to(self, depth: int) -> None:
        """Close ranges until ``depth`` remain open."""
        if self.nvtx is None and not self._recorded:
            del self._open[depth:]  # placeholders only
            return
        while len(self._open) > depth:
            self.pop()

    def close_all(self) -> None:
        """Close every open range."""
        self.pop_to(0)

    def instant(self, name: str) -> None:
        """Mark a moment: a zero-length profiler range and an NVTX mark named ``name``."""
        if self.profiler and _profiler_enabled():
            with record_function(name):
                pass
        if self.nvtx is not None:
            self.nvtx.mark(name)
