"""Find the node's speedpack arenas and remove those nobody uses any more (even after SIGKILL).

A run killed with ``SIGKILL`` (the OOM killer, a scheduler's time limit, a test's timeout)
cannot unlink its ``/dev/shm/speedpack-*`` file, and ``/dev/shm`` is RAM. Every process that
maps an arena holds a lock on it (:mod:`~lightning_speedpack.cache.liveness`) which the kernel
drops when the process dies, so an arena is *dead* exactly when this process can lock it
exclusively: a reused pid cannot make a dead arena look used, nor a live one look dead.

:func:`scan` is what ``CachedDataset`` runs on every construction (``remove=True``) and what
``speedpack cache clean`` prints. It removes a dead file while holding that exclusive lock;
a process that opened the file just before takes its own lock only afterwards, sees the path
no longer names its file, and looks again (:meth:`Arena.open`), so a live arena is never
removed. Files of another format version are listed as ``"unknown"`` and left alone (their
users may not take these locks).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Literal

from lightning_speedpack.cache import liveness

__all__ = ["PREFIX", "SHM_DIR", "ArenaFile", "scan"]

SHM_DIR = "/dev/shm"
PREFIX = "speedpack-"

ArenaStatus = Literal["in use", "dead", "unknown"]


@dataclass(frozen=True)
class ArenaFile:
    """One ``speedpack-*`` file found by :func:`scan`.

    Attributes:
        path: the file.
        size_bytes: memory (or disk) it really occupies (allocated blocks, not its sparse size).
        status: ``"in use"`` (a live process maps it), ``"dead"`` (nobody does), or
            ``"unknown"`` (another format version, or not readable by this user).
        removed: whether :func:`scan` removed it.
    """

    path: str
    size_bytes: int
    status: ArenaStatus
    removed: bool = False


def _is_ours(fd: int, name: str) -> bool:
    """This format version, or a draft (``.tmp``) this version writes."""
    if name.endswith(".tmp"):
        return True
    head = os.pread(fd, 16, 0)
    return len(head) == 16 and (
        int.from_bytes(head[:8], "little", signed=True) == liveness.MAGIC
        and int.from_bytes(head[8:], "little", signed=True) == liveness.VERSION
    )


def _inspect(path: str, *, remove: bool) -> ArenaFile | None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # removed meanwhile (its last owner closed, or another reclaimer)
    except OSError:
        with contextlib.suppress(OSError):
            return ArenaFile(path, os.stat(path).st_blocks * 512, "unknown")
        return None
    try:
        st = os.fstat(fd)
        size = st.st_blocks * 512
        if not liveness.try_lock(fd, liveness.USERS, exclusive=True):
            return ArenaFile(path, size, "in use")
        if not _is_ours(fd, os.path.basename(path)):
            return ArenaFile(path, size, "unknown")
        removed = False
        if remove:
            try:
                same = os.stat(path)
            except FileNotFoundError:
                return None
            if (same.st_ino, same.st_dev) == (st.st_ino, st.st_dev):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # still holding the lock: nobody can start using it now
                    removed = True
        return ArenaFile(path, size, "dead", removed)
    finally:
        os.close(fd)


def scan(directory: str = SHM_DIR, *, remove: bool = False) -> list[ArenaFile]:
    """List every ``speedpack-*`` file in ``directory``; with ``remove``, delete the dead ones.

    Args:
        directory: where to look (``/dev/shm``, where ``storage="shared"`` arenas live).
        remove: delete each file no live process uses.

    Returns:
        The files found, sorted by path; ``removed`` says which were deleted.

    Raises:
        FileNotFoundError: ``directory`` does not exist.
        PermissionError: a dead file could not be removed (the directory is not writable).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     scan(tmp, remove=True)
        []
    """
    found: list[ArenaFile] = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith(PREFIX) and os.path.isfile(path) and not os.path.islink(path):
            entry = _inspect(path, remove=remove)
            if entry is not None:
                found.append(entry)
    return found
