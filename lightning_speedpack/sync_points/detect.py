"""The engine behind :class:`~lightning_speedpack.SyncPointWarnings`: find host-device syncs.

A *sync* is a call that makes the CPU wait until the device has finished its queued work:
reading a value (``.item()``, ``float(t)``, ``if t:``), copying to the host (``.cpu()``,
``.numpy()``, ``print(t)``), ops whose output size depends on the data (``nonzero``,
boolean-mask indexing, ``unique``) and explicit waits (``torch.cuda.synchronize``).

:class:`SyncDetector` puts the watching wrappers in place (:mod:`.patching`), arms them for
the watched region, attributes each sync to a call site (:mod:`.attribution`) and keeps one
:class:`~lightning_speedpack.sync_points.findings.SyncFinding` per site. The kinds, fixes and
attribution helpers are re-exported here.
"""

from __future__ import annotations

import linecache
import sys
import warnings
from collections.abc import Callable, Sequence
from threading import get_ident
from types import FrameType
from typing import Any

from lightning_speedpack.sync_points.attribution import (
    attribute,
    attribute_frame,
    framework_fix,
    library_calls,
    library_name,
    matches_allow,
)
from lightning_speedpack.sync_points.findings import (
    CPU_TO_CPU,
    FIXES,
    SYNC_DEBUG_KIND,
    SYNC_DEBUG_MESSAGE,
    SyncFinding,
    SyncPointError,
    SyncWarning,
    _display_path,
)
from lightning_speedpack.sync_points.patching import (
    Saved,
    apply,
    armed,
    patch_specs,
    restore,
    set_armed,
    set_indexing,
)

__all__ = [
    "FIXES",
    "SWAP_INDEXING_AT",
    "SyncDebugApi",
    "SyncDetector",
    "SyncFinding",
    "SyncPointError",
    "SyncWarning",
    "attribute_frame",
    "framework_fix",
    "matches_allow",
]

SyncDebugApi = tuple[Callable[[], Any], Callable[[Any], None]]
"""``(get_mode, set_mode)`` of ``torch.cuda``'s sync debug mode."""

_INSTALLED: SyncDetector | None = None

#: Indexing calls per batch between batches above which the wrappers are swapped out there
#: (a swap pair ~15 us plus the method-cache misses after it; an early return ~0.2 us).
SWAP_INDEXING_AT = 150
#: Batches measured before deciding.
_DECIDE_AFTER = 3


class SyncDetector:
    """Patches the sync points, records hits per call site, and restores everything exactly.

    Args:
        include_cpu: count CPU tensors as device tensors (what *would* sync on a GPU).
        raise_on_user: raise :class:`SyncPointError` at the first user sync.
        allow: call sites to ignore (see :func:`matches_allow`).
        on_new_site: called once with each new call site's finding (after it is recorded).
        sync_debug: ``(get_mode, set_mode)`` of ``torch.cuda``'s sync debug mode to arm as
            ``"warn"`` in the watched region (CUDA runs only), or None.

    Example:
        >>> import torch
        >>> det = SyncDetector(include_cpu=True)
        >>> det.install()
        >>> det.arm(step=0)
        >>> _ = torch.ones(()).item()
        >>> det.disarm(); det.uninstall()
        >>> [(f.kind, f.count) for f in det.findings()]
        [('item', 1)]
    """

    def __init__(
        self,
        include_cpu: bool = False,
        raise_on_user: bool = False,
        allow: Sequence[str] = (),
        on_new_site: Callable[[SyncFinding], None] | None = None,
        sync_debug: SyncDebugApi | None = None,
    ) -> None:
        self.include_cpu = include_cpu
        self.raise_on_user = raise_on_user
        self.allow = tuple(allow)
        self.on_new_site = on_new_site
        self.sync_debug = sync_debug
        self.thread = 0
        self.depth = 0
        self.step = 0
        self.batches = 0
        self._records: dict[tuple[str, int, str], SyncFinding] = {}
        self._last_batch: dict[tuple[str, int, str], int] = {}
        self._allowed: dict[tuple[str, int], bool] = {}
        self._saved: Saved = []
        self.in_tail = False
        self._indexing_watched = True
        # Whether to take the indexing wrappers out between batches: decided after the first
        # few batches from how much the main process indexes there (None: not decided yet).
        self.tail_indexing = 0
        self._tails = 0
        self._swap_indexing: bool | None = None
        self._warn_ctx: warnings.catch_warnings | None = None  # type: ignore[type-arg]
        self._debug_prev: Any = None
        self._armed_debug = False

    @property
    def installed(self) -> bool:
        """Whether the patches are in place."""
        return bool(self._saved)

    def install(self) -> None:
        """Replace the sync points with watching wrappers (idempotent).

        Raises:
            RuntimeError: another detector is installed (only one can watch at a time).
        """
        global _INSTALLED
        if self._saved:
            return
        if _INSTALLED is not None and _INSTALLED is not self:
            raise RuntimeError(
                "another SyncPointWarnings is already watching this process; use one at a time"
            )
        try:
            apply(patch_specs(), self._saved)
            self._indexing_watched = True
            if self.sync_debug is not None:
                self._install_debug_handler()
        except BaseException:
            self.uninstall()
            raise
        _INSTALLED = self

    def uninstall(self) -> None:
        """Put back exactly what :meth:`install` replaced (idempotent)."""
        global _INSTALLED
        self.disarm()
        restore(self._saved)
        if self._warn_ctx is not None:
            ctx, self._warn_ctx = self._warn_ctx, None
            ctx.__exit__(None, None, None)
        if _INSTALLED is self:
            _INSTALLED = None

    def arm(self, step: int, new_batch: bool = True) -> None:
        """Start watching the calling thread; ``new_batch`` starts a new per-step count."""
        if not self._saved:
            return
        self.step = step
        if new_batch:
            self.batches += 1
        self.thread = get_ident()
        self.depth = 0
        if self.in_tail and self._swap_indexing is None:
            self._tails += 1
            if self._tails >= _DECIDE_AFTER:
                self._swap_indexing = self.tail_indexing / self._tails > SWAP_INDEXING_AT
        self.in_tail = False
        self._watch_indexing(True)
        if self.sync_debug is not None and not self._armed_debug:
            get_mode, set_mode = self.sync_debug
            self._debug_prev = get_mode()
            _quietly(set_mode, "warn")
            self._armed_debug = True
        set_armed(self)

    def end_step(self) -> None:
        """Stay armed, except for masked indexing (watched in the step proper only).

        Between batches only DataLoader code indexes (once per sample): the wrappers return at
        once there, and are taken out until the next :meth:`arm` when the main process indexes
        more than :data:`SWAP_INDEXING_AT` times a batch (measured over the first batches),
        where the swap costs less than the early returns.
        """
        self.in_tail = True
        if self._swap_indexing:
            self._watch_indexing(False)

    def _watch_indexing(self, watched: bool) -> None:
        if self._indexing_watched != watched and self._saved:
            set_indexing(self._saved, watched)
            self._indexing_watched = watched

    def disarm(self, *, keep_indexing: bool = False) -> None:
        """Stop watching (idempotent); restores the previous CUDA sync debug mode.

        ``keep_indexing``: leave the indexing wrappers as they are (they return at once while
        nobody watches). Assigning ``torch.Tensor.__getitem__`` invalidates the cached lookups
        of every Tensor attribute, in every subclass, so Python code that uses tensors runs
        slower until they are cached again: a sampled detector does not swap at every stretch.
        """
        if armed() is self:
            set_armed(None)
        if not keep_indexing:
            self._watch_indexing(False)
        if self._armed_debug and self.sync_debug is not None:
            self._armed_debug = False
            _quietly(self.sync_debug[1], self._debug_prev)

    def _install_debug_handler(self) -> None:
        ctx = warnings.catch_warnings()
        ctx.__enter__()
        self._warn_ctx = ctx
        warnings.filterwarnings("always", message=f".*{SYNC_DEBUG_MESSAGE}")
        previous = warnings.showwarning
        detector = self

        def showwarning(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: Any = None,
            line: str | None = None,
        ) -> None:
            if SYNC_DEBUG_MESSAGE not in str(message):
                previous(message, category, filename, lineno, file, line)
                return
            # Ours to handle: count it unless a patched call already counted this sync.
            if armed() is detector and not detector.depth and get_ident() == detector.thread:
                detector.depth += 1
                try:
                    detector.hit(SYNC_DEBUG_KIND, sys._getframe(1))
                finally:
                    detector.depth -= 1

        warnings.showwarning = showwarning

    def hit(self, kind: str, frame: FrameType | None) -> None:
        """Record one sync of ``kind`` made at ``frame`` (called by the wrappers).

        Raises:
            SyncPointError: ``raise_on_user`` and the sync is the user's.
        """
        found = attribute(frame)
        if found is None:
            return
        f, origin, library = found
        if kind == CPU_TO_CPU:
            if origin == "framework":
                return  # Lightning moving a CPU tensor to its own (CPU) device
            kind = "cpu copy"
        filename, lineno = f.f_code.co_filename, f.f_lineno
        if self.allow:
            allowed = self._allowed.get((filename, lineno))
            if allowed is None:
                allowed = self._allowed[(filename, lineno)] = matches_allow(
                    filename, lineno, self.allow
                )
            if allowed:
                return
        key = (filename, lineno, kind)
        rec = self._records.get(key)
        new = rec is None
        if rec is None:
            rec = self._records[key] = SyncFinding(
                kind=kind,
                filename=filename,
                lineno=lineno,
                code=linecache.getline(filename, lineno).strip(),
                function=f.f_code.co_name,
                first_step=self.step,
                origin=origin,
            )
            if library is not None:
                inside = library.f_code.co_filename
                rec.library = library_name(inside)
                rec.library_location = f"{_display_path(inside)}:{library.f_lineno}"
                rec.library_calls = library_calls(library)
        rec.count += 1
        if self._last_batch.get(key) != self.batches:
            self._last_batch[key] = self.batches
            rec.steps_seen += 1
        if origin == "user" and self.raise_on_user:
            raise SyncPointError(
                f"{kind} at {rec.location} synchronises the host with the device: "
                f"`{rec.code}`. Fix: {FIXES.get(kind, '')}"
            )
        if new and self.on_new_site is not None:
            self.on_new_site(rec)

    def findings(self) -> list[SyncFinding]:
        """Every call site so far: the user's first, then the most syncs first."""
        return sorted(
            self._records.values(),
            key=lambda r: (r.origin != "user", -r.count, r.filename, r.lineno),
        )


#: What torch 2.11 says each time the mode is set (seen on an H200 by ``make gpu-check``): the
#: pack sets it for its own detection, so a job run with warnings as errors must not see it.
_PROTOTYPE_WARNING = "Synchronization debug mode is a prototype feature"


def _quietly(set_mode: Callable[[Any], Any], mode: Any) -> None:
    """``set_mode(mode)`` without torch's prototype-feature warning (the pack's own use)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PROTOTYPE_WARNING)
        set_mode(mode)
