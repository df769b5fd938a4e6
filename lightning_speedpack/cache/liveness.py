"""Who still uses an arena file: open-file-description locks, which no reused pid can fake.

Every process that maps an arena holds a *shared* lock on byte :data:`USERS` of the file for as
long as it maps it, every process that opened the cache itself (an owner) also holds one on
byte :data:`OWNERS`, and the process that claimed counter row ``i`` holds an *exclusive* lock on
byte ``ROWS + i``. The kernel drops a process's locks when its last descriptor of that open file
description closes -- at exit, also after ``SIGKILL`` -- so "nobody holds a lock here" means
"nobody uses this any more", whatever pids were reused since, and across pid namespaces
(containers sharing ``/dev/shm``), where a pid in the file names nothing at all.

These are Linux open-file-description (OFD) byte-range locks (``F_OFD_SETLK``): like ``flock``
they belong to the open file description, not to the process, so a forked child that keeps an
inherited descriptor keeps the lock alive too (the arena gives each forked child its own
description, see :mod:`lightning_speedpack.cache.arena`); unlike ``flock`` they do not
interact with the whole-file ``flock`` the arena uses as its short protocol lock, so both live on
one file and there is no second file to leak. Where OFD locks do not exist (not Linux), classic
``fcntl`` record locks are used: correct between processes, but a forked child does not inherit
them and closing any descriptor of the file drops them, so liveness is only best effort there.

The file's identity (``MAGIC``, ``VERSION``) is here too, so the reclaimer and the
``speedpack cache`` command read it without importing torch.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct

__all__ = [
    "MAGIC",
    "OWNERS",
    "ROWS",
    "USERS",
    "VERSION",
    "held_by_other",
    "lock",
    "try_lock",
    "unlock",
]

MAGIC = int.from_bytes(b"SPKCACHE", "little")
# 2: liveness by OFD locks, writers named by (row, generation); 3: stream fillers;
# 4: structure texts kept once per arena, blobs of data only (issue 38)
VERSION = 4

USERS = 0
OWNERS = 1
ROWS = 2

_SETLK: int = getattr(fcntl, "F_OFD_SETLK", fcntl.F_SETLK)
_SETLKW: int = getattr(fcntl, "F_OFD_SETLKW", fcntl.F_SETLKW)
_GETLK: int = getattr(fcntl, "F_OFD_GETLK", fcntl.F_GETLK)
# struct flock {short l_type, l_whence; off_t l_start, l_len; pid_t l_pid;}: native alignment,
# padded to the C size; l_pid must be 0 for OFD locks.
_FLOCK = "@hhqqi4x" if struct.calcsize("@hhqqi") % 8 else "@hhqqi"
_BUSY = (errno.EAGAIN, errno.EACCES)


def _request(kind: int, byte: int) -> bytes:
    return struct.pack(_FLOCK, kind, os.SEEK_SET, byte, 1, 0)


def lock(fd: int, byte: int, *, exclusive: bool = False) -> None:
    """Take (waiting for it) a shared or exclusive lock on ``byte`` for ``fd``'s description.

    Taking a lock of the other kind on a byte this description already locks converts it
    atomically.
    """
    fcntl.fcntl(fd, _SETLKW, _request(fcntl.F_WRLCK if exclusive else fcntl.F_RDLCK, byte))


def try_lock(fd: int, byte: int, *, exclusive: bool = True) -> bool:
    """Take the lock on ``byte`` if no other description holds a conflicting one; say whether."""
    kind = fcntl.F_WRLCK if exclusive else fcntl.F_RDLCK
    try:
        fcntl.fcntl(fd, _SETLK, _request(kind, byte))
    except OSError as err:
        if err.errno in _BUSY:
            return False
        raise
    return True


def unlock(fd: int, byte: int) -> None:
    """Drop ``fd``'s description's lock on ``byte`` (nothing happens if it holds none)."""
    fcntl.fcntl(fd, _SETLK, _request(fcntl.F_UNLCK, byte))


def held_by_other(fd: int, byte: int) -> bool:
    """Whether another open file description holds any lock on ``byte`` (nothing is taken)."""
    answer = fcntl.fcntl(fd, _GETLK, _request(fcntl.F_WRLCK, byte))
    kind: int = struct.unpack(_FLOCK, answer)[0]
    return kind != fcntl.F_UNLCK
