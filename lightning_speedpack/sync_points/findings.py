"""What SyncPointWarnings reports: the kinds of sync, their fixes, one finding per call site."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CPU_TO_CPU",
    "FIXES",
    "SYNC_DEBUG_KIND",
    "SYNC_DEBUG_MESSAGE",
    "Origin",
    "SyncFinding",
    "SyncPointError",
    "SyncWarning",
]

Origin = Literal["user", "framework"]
"""Whose code a sync is reported at."""

#: How to avoid each kind of sync (used in warnings, errors and doctor findings).
FIXES: dict[str, str] = {
    "item": ".item() -> log the tensor with self.log(...) (Lightning reduces it without a sync) "
    "or accumulate on the device and read it once per epoch",
    "float": "float(tensor) -> log the tensor with self.log(...) or keep the value on the device",
    "int": "int(tensor) -> keep the value on the device, or compute it from shapes (metadata)",
    "bool": "`if tensor:` -> keep the decision on the device (torch.where, masking) or check it "
    "every N steps",
    "index": "a tensor used as a Python index -> use a Python int, or index with the tensor",
    "tolist": ".tolist() -> keep it a tensor; convert once per epoch",
    "numpy": ".numpy()/np.asarray(t) -> keep it a tensor; convert once per epoch",
    "cpu copy": ".cpu()/.to('cpu') -> keep it on the device; if the host needs it, copy with "
    "non_blocking=True into pinned memory and read it steps later",
    "pageable copy": "non_blocking copy from pageable memory -> pin the source (DataLoader "
    "pin_memory=True or tensor.pin_memory())",
    "repr": "print(t)/f'{t}' -> print every N steps, or log the tensor with self.log(...)",
    "nonzero": "nonzero() -> data-dependent output size; use a fixed-size alternative "
    "(torch.where(mask, x, 0), multiply by the mask, torch.nonzero_static)",
    "where": "torch.where(cond) with one argument is nonzero(); use the three-argument form",
    "masked select": "masked_select -> data-dependent size; multiply by the mask instead",
    "masked index": "x[mask] -> data-dependent size; use torch.where(mask, x, 0) or x * mask",
    "unique": "torch.unique -> data-dependent size; avoid it in the step or move it to the "
    "data pipeline",
    "cuda synchronize": "torch.cuda.synchronize() -> remove it; synchronise only to time "
    "something, and then every N steps",
    "empty cache": "torch.cuda.empty_cache() -> remove it from the loop",
    "event synchronize": "Event.synchronize() -> use event.query() or stream.wait_event(event)",
    "stream synchronize": "Stream.synchronize() -> use stream.wait_stream(other) instead",
    "cuda sync (debug mode)": "torch.cuda.set_sync_debug_mode flagged this op; see the kinds "
    "above for a device-side alternative",
}

SYNC_DEBUG_MESSAGE = "called a synchronizing CUDA operation"
SYNC_DEBUG_KIND = "cuda sync (debug mode)"
CPU_TO_CPU = "~cpu copy"  # a CPU->CPU copy under include_cpu: counted only when it is the user's


class SyncPointError(RuntimeError):
    """Raised by ``SyncPointWarnings(mode="error")`` at the first host-device sync in user code."""


class SyncWarning(UserWarning):
    """Emitted once per call site by ``SyncPointWarnings(mode="warn")``, at the user's line."""


@dataclass
class SyncFinding:
    """One call site that synchronises the host with the device.

    Attributes:
        kind: what syncs: ``"item"``, ``"cpu copy"``, ``"masked index"``, ... (keys of ``FIXES``).
        filename: the file of the attributed frame (the user's, or Lightning's for framework).
        lineno: the line in ``filename``.
        code: the source line, stripped.
        function: the function the line is in.
        count: how many syncs this site made.
        first_step: ``trainer.global_step`` when it was first seen.
        steps_seen: in how many watched batches it synced; ``count / steps_seen`` is per step.
        origin: ``"user"`` or ``"framework"`` (Lightning's or this pack's own code).
        library: the installed library the sync happened inside (``"torchmetrics"``), or "".
        library_location: the line inside that library (``torchmetrics/x.py:92``), or "".
        library_calls: the library's functions on the stack, outermost first
            (``("global_mean_pool", "scatter")``); picks the library's own remedy.

    Example:
        >>> f = SyncFinding("item", "train.py", 12, "loss.item()", "training_step", count=6,
        ...                 steps_seen=3)
        >>> f.per_step, f.location
        (2.0, 'train.py:12')
    """

    kind: str
    filename: str
    lineno: int
    code: str
    function: str
    count: int = 0
    first_step: int = 0
    steps_seen: int = 0
    origin: Origin = "user"
    library: str = ""
    library_location: str = ""
    library_calls: tuple[str, ...] = ()

    @property
    def location(self) -> str:
        """``"path/file.py:LINE"``, relative to the working directory when below it."""
        return f"{_display_path(self.filename)}:{self.lineno}"

    @property
    def per_step(self) -> float:
        """Syncs per batch in which this site synced."""
        return self.count / self.steps_seen if self.steps_seen else 0.0


def _display_path(filename: str) -> str:
    for marker in ("site-packages", "dist-packages"):
        _head, sep, tail = filename.partition(f"{os.sep}{marker}{os.sep}")
        if sep:
            return tail
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if rel.startswith("..") else rel
