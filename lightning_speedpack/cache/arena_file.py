"""The arena's file: its layout, creating and placing it, and one process's handle on it.

Layout (int64 words, then bytes):

======================  =====================================================================
words 0-63              header: magic, version, sizes, bump pointer, budget flag, fingerprint,
                        and the stream bookkeeping (next item, fill configuration, complete)
counters (512 x 4)      ``(pid, generation, hits, misses)``: one row per process
fillers (1024 x 4)      ``(position, done, passes, 0)`` per stream shard (stream caches only)
structures (1024 x 2)   ``(offset, length)`` of each structure text kept once (``structures``)
slots (n x 4)           ``(state, writer, offset, nbytes | (structure + 1) << 48)`` per item
payload                 the encoded samples, each at a 64-byte boundary (see ``codec``): the
                        data alone when the slot names a structure, else the full blob
======================  =====================================================================

A file is written complete next to its final name and moved into place (``link`` or
``rename``), holding its liveness locks (:mod:`~lightning_speedpack.cache.liveness`) from the
start, so neither a reader nor a reclaimer ever sees half a header.

Fork safety. Each process's :class:`Handle` owns one descriptor and two ``threading.Lock``s;
an ``os.register_at_fork`` hook gives a forked child a new descriptor (its own users lock, not
the parent's owner or row locks) and new thread locks, so a lock another thread held at the
fork cannot deadlock the child. No thread is ever started here.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_speedpack.cache import liveness
from lightning_speedpack.cache.liveness import MAGIC, OWNERS, USERS, VERSION

__all__ = [
    "EMPTY",
    "HEADER_WORDS",
    "MAX_COUNTERS",
    "MAX_FILLERS",
    "MAX_STRUCTURES",
    "NBYTES_MASK",
    "READY",
    "SLOT_WORDS",
    "STRUCTURE_SHIFT",
    "WRITING",
    "ArenaState",
    "Handle",
    "create",
    "layout",
    "locked",
    "map_file",
    "only_user",
    "read_words",
    "release",
    "same_file",
    "usable",
]

HEADER_WORDS = 64
MAX_COUNTERS = 512
#: A slot's state word: free, being written (by the writer in the next word), or published.
EMPTY, READY, WRITING = 0, 1, 2
MAX_FILLERS = 1024
SLOT_WORDS = 4
#: Structure texts an arena keeps once each; a sample with yet another one is stored whole.
MAX_STRUCTURES = 1024
#: A slot's last word: the blob's size in the low bits, its structure number + 1 above (0: the
#: blob carries its own structure text).
STRUCTURE_SHIFT = 48
NBYTES_MASK = (1 << STRUCTURE_SHIFT) - 1

# header word indices
_MAGIC, _VERSION, _DATA_START, _NSLOTS, _CAPACITY, _USED, _EXHAUSTED, _RESERVED = range(8)
_RETIRED_HITS, _RETIRED_MISSES, _KIND, _NONCE, _FINGERPRINT = 8, 9, 10, 11, 12  # fp: 12-15
_NEXT, _FILL_EXPECTED, _FILL_WORKERS, _COMPLETE = 16, 17, 18, 19  # stream caches
_NSTRUCT = 20  # structure texts published (see the structures table)


def layout(n_slots: int) -> tuple[int, int, int, int, int]:
    """Word offsets of the counters, fillers, structures and slots tables; payload start (bytes)."""
    counters = HEADER_WORDS
    fillers = counters + MAX_COUNTERS * 4
    structures = fillers + MAX_FILLERS * 4
    slots = structures + MAX_STRUCTURES * 2
    end = (slots + n_slots * SLOT_WORDS) * 8
    return counters, fillers, structures, slots, (end + 4095) // 4096 * 4096


@dataclass(frozen=True)
class ArenaState:
    """What a pickled copy needs to re-attach: the file, and which file it must be."""

    path: str
    inode: int
    device: int
    nonce: int  # random per created file: inode numbers are reused on tmpfs


_handles: weakref.WeakSet[Handle] = weakref.WeakSet()


class Handle:
    """The OS resources of one arena in one process; closed by ``Arena.close`` or a finalizer."""

    def __init__(self, path: str, fd: int, mm: mmap.mmap, *, owner: bool, kind: str) -> None:
        self.path = path
        self.fd = fd  # holds the users lock (and the owners lock for an owner)
        self.fd_pid = os.getpid()
        self.mm = mm
        self.owner = owner
        self.kind = kind
        self.views: list[np.ndarray[Any, Any]] = []
        self.memoryviews: list[memoryview] = []
        self.thread_lock = threading.Lock()  # flock does not separate threads sharing one fd
        self.count_lock = threading.Lock()  # `+=` on a counter is not atomic between threads
        self.closed = False
        _handles.add(self)

    def lock_fd(self) -> int:
        """This process's descriptor (a forked child gets its own first, if the hook missed)."""
        if self.fd_pid != os.getpid():
            self.after_fork_in_child()
        return self.fd

    def after_fork_in_child(self) -> None:
        """Give this (forked) process its own open file description, users lock, thread locks.

        The inherited descriptor shares the parent's description -- its flock, owner lock and
        counter-row lock -- so it is closed: the parent's locks stay the parent's alone.
        """
        self.thread_lock = threading.Lock()  # another thread may have held it at the fork
        self.count_lock = threading.Lock()
        if self.closed or self.fd_pid == os.getpid():
            return
        inherited = self.fd
        try:
            fd = os.open(f"/proc/self/fd/{inherited}", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        liveness.lock(fd, USERS)
        self.fd, self.fd_pid, self.owner = fd, os.getpid(), False
        os.close(inherited)

    def close(self, release: Any = None) -> None:
        """Unmap and close the descriptor (after ``release``, for an owner in its own process)."""
        if self.closed:
            return
        self.closed = True
        if release is not None and self.owner and self.fd_pid == os.getpid():
            with contextlib.suppress(Exception):
                release()
        self.views.clear()
        for view in self.memoryviews:
            view.release()
        self.memoryviews.clear()
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()  # a BufferError means someone still holds a view; the OS unmaps at exit
        if self.fd_pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self.fd)  # drops this description's liveness locks


def _after_fork_in_child() -> None:
    for handle in list(_handles):
        with contextlib.suppress(Exception):  # never fail a fork; lock_fd retries lazily
            handle.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def locked(handle: Handle) -> Iterator[None]:
    """Hold the file's protocol lock (``flock``) and this process's thread lock."""
    fd = handle.lock_fd()  # first: after a fork it also replaces the thread lock
    with handle.thread_lock:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def only_user(fd: int) -> bool:
    """Whether no other open file description uses the file (``fd`` keeps its users lock)."""
    if not liveness.try_lock(fd, USERS, exclusive=True):
        return False
    liveness.lock(fd, USERS)  # back to shared: an atomic conversion
    return True


def release(handle: Handle) -> None:
    """Deregister this owner; unlink a shared file when no other owner holds it."""
    with locked(handle):
        fd = handle.fd
        liveness.unlock(fd, OWNERS)
        if (
            handle.kind == "shared"
            and liveness.try_lock(fd, OWNERS, exclusive=True)
            and same_file(fd, handle.path)
        ):
            os.unlink(handle.path)


def read_words(fd: int) -> np.ndarray[Any, Any]:
    """The header words (zeros for a file too short to have one)."""
    raw = os.pread(fd, HEADER_WORDS * 8, 0)
    if len(raw) < HEADER_WORDS * 8:
        return np.zeros(HEADER_WORDS, dtype=np.int64)
    return np.frombuffer(raw, dtype=np.int64)


def usable(fd: int, fingerprint: bytes, n_slots: int, kind: str) -> bool:
    """Whether an existing file (lock held) has this format, data and size."""
    words = read_words(fd)
    return not (
        words[_MAGIC] != MAGIC
        or words[_VERSION] != VERSION
        or words[_NSLOTS] != n_slots
        or words[_KIND] != (kind == "disk")
        or words[_FINGERPRINT : _FINGERPRINT + 4].tobytes() != fingerprint
        or os.fstat(fd).st_size != words[_DATA_START] + words[_CAPACITY]
    )


def same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file ``fd`` has open."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (own.st_ino, own.st_dev) == (st.st_ino, st.st_dev)


def create(
    path: str, fingerprint: bytes, n_slots: int, capacity: int, kind: str, *, replace: bool
) -> int:
    """Write a complete new file next to ``path`` and move it into place; return its fd.

    The fd holds the users and owners locks from before the file is complete, so a reclaimer
    never removes it. With ``replace=False`` the move is ``link`` (fails if another process won
    the race: -1); with ``replace=True`` (lock on the old file held) it is an atomic ``rename``.
    """
    for _ in range(100):
        tmp = f"{path}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            liveness.lock(fd, USERS)
            liveness.lock(fd, OWNERS)
            if not same_file(fd, tmp):  # a reclaimer removed it before we held it
                os.close(fd)
                continue
            return _fill_and_place(fd, tmp, path, fingerprint, n_slots, capacity, kind, replace)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    raise RuntimeError(f"could not create the cache file {path}: its drafts keep vanishing")


def _fill_and_place(
    fd: int,
    tmp: str,
    path: str,
    fingerprint: bytes,
    n_slots: int,
    capacity: int,
    kind: str,
    replace: bool,
) -> int:
    data_start = layout(n_slots)[-1]
    os.ftruncate(fd, data_start + capacity)
    words = np.zeros(HEADER_WORDS, dtype=np.int64)
    words[_MAGIC], words[_VERSION], words[_DATA_START] = MAGIC, VERSION, data_start
    words[_NSLOTS], words[_CAPACITY], words[_KIND] = n_slots, capacity, kind == "disk"
    words[_NONCE] = int.from_bytes(os.urandom(8), "little", signed=True)
    words[_FINGERPRINT : _FINGERPRINT + 4] = np.frombuffer(fingerprint, dtype=np.int64)
    os.pwrite(fd, words.tobytes(), 0)
    if replace:
        os.rename(tmp, path)
        return fd
    try:
        os.link(tmp, path)
    except FileExistsError:
        os.close(fd)
        return -1
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return fd


def map_file(path: str, fd: int, *, owner: bool, kind: str) -> Handle:
    """Map the whole file ``fd`` shared and wrap it in this process's :class:`Handle`."""
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    return Handle(path, fd, mm, owner=owner, kind=kind)
