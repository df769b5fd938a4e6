"""One preallocated, memory-mapped arena that many processes fill and read together.

The whole cache is a single file, in ``/dev/shm`` (``storage="shared"``) or anywhere on disk
(``storage="disk"``), mapped ``MAP_SHARED`` by every process that uses it. Everything the
processes need to agree on lives inside the file, never in per-process Python objects:

======================  =====================================================================
words 0-63              header: magic, version, sizes, bump pointer, budget flag, fingerprint
owners (64 x 2)         ``(pid, start time)`` of each process that opened the cache itself
counters (512 x 4)      ``(pid, start time, hits, misses)``: one row per process, so counting
                        a hit is a plain store with no lock; rows of dead processes are folded
                        into the header's retired totals before reuse
slots (n x 4)           ``(state, writer pid, offset, nbytes)`` for each dataset index
payload                 the encoded samples, each at a 64-byte boundary (see ``_codec``)
======================  =====================================================================

Protocol. Every state change happens while holding ``fcntl.flock`` on the file (each process
opens its own descriptor, so the lock also separates a parent from its forked children):
``EMPTY -> WRITING(pid)`` reserves payload space from the bump pointer, the payload is then
copied without the lock, and ``WRITING(pid) -> READY`` publishes it. A reader only decodes a
slot it sees ``READY``, and a ``READY`` slot never changes again, so a reader never sees a torn
sample; the lock's system calls order the writer's payload stores before its flag store. A
slot left ``WRITING`` by a dead process is reclaimed by the next writer (its space reused), so a
worker killed mid-write leaves the index unfilled, not corrupt. Two processes racing on one
index both compute the sample, one publishes it, neither waits.

Lifetime. A process that opens the cache itself registers as an owner; pickled copies in
DataLoader workers (and forked children) attach without registering. When the last live owner
closes (explicitly, at interpreter exit, or when the object is collected) a shared file is
unlinked; a disk file stays. A shared file whose owners are all dead (a killed run) is
replaced, never reused; a disk file is reused when its fingerprint matches and rebuilt
otherwise. Replacement writes a complete new file and ``rename``s it into place, so a process
still mapping the old one is unaffected.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import mmap
import os
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lightning_speedpack.data.codec import ALIGN, EncodedSample, decode

__all__ = ["MISSING", "Arena", "ArenaState", "StoreResult", "process_alive", "process_start"]

MAGIC = int.from_bytes(b"SPKCACHE", "little")
VERSION = 1
HEADER_WORDS = 64
MAX_OWNERS = 64
MAX_COUNTERS = 512
SLOT_WORDS = 4
RESERVE_CHUNK = 16 << 20

EMPTY, READY, WRITING = 0, 1, 2

# header word indices
_MAGIC, _VERSION, _DATA_START, _NSLOTS, _CAPACITY, _USED, _EXHAUSTED, _RESERVED = range(8)
_RETIRED_HITS, _RETIRED_MISSES, _KIND, _NONCE, _FINGERPRINT = 8, 9, 10, 11, 12  # fp: 12-15

StoreResult = Literal["stored", "skipped", "budget_exhausted_now", "budget_exhausted"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks, 0 when unknown, None when it is dead or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc: fall back to a signal-0 probe
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return 0
        return 0
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def process_alive(pid: int, start: int = 0) -> bool:
    """Whether ``pid`` is running (and, if ``start`` is known, is the same process)."""
    if pid <= 0:
        return False
    now = process_start(pid)
    return now is not None and (start == 0 or now == 0 or now == start)


def _layout(n_slots: int) -> tuple[int, int, int, int]:
    """Word offsets of the owners, counters and slots tables, and the payload start in bytes."""
    owners = HEADER_WORDS
    counters = owners + MAX_OWNERS * 2
    slots = counters + MAX_COUNTERS * 4
    end = (slots + n_slots * SLOT_WORDS) * 8
    return owners, counters, slots, (end + 4095) // 4096 * 4096


@dataclass(frozen=True)
class ArenaState:
    """What a pickled copy needs to re-attach: the file, and which file it must be."""

    path: str
    inode: int
    device: int
    nonce: int  # random per created file: inode numbers are reused on tmpfs


class _Handle:
    """The OS resources of one arena in one process; closed by ``Arena.close`` or a finalizer."""

    def __init__(self, path: str, fd: int, mm: mmap.mmap, owner_pid: int, kind: str) -> None:
        self.path = path
        self.fd = fd
        self.fd_pid = os.getpid()
        self.mm = mm
        self.owner_pid = owner_pid  # 0: this process attached without registering
        self.kind = kind
        self.views: list[np.ndarray[Any, Any]] = []
        self.memoryviews: list[memoryview] = []
        self.thread_lock = threading.Lock()  # flock does not separate threads sharing one fd
        self.closed = False

    def lock_fd(self) -> int:
        pid = os.getpid()
        if self.fd_pid != pid:  # forked child: flock must use its own open file description
            inherited = self.fd
            try:
                self.fd = os.open(f"/proc/self/fd/{inherited}", os.O_RDWR)
            except OSError:
                self.fd = os.open(self.path, os.O_RDWR)
            os.close(inherited)
            self.fd_pid = pid
            self.thread_lock = threading.Lock()  # another thread may have held it at the fork
        return self.fd

    def close(self, release: Any = None) -> None:
        if self.closed:
            return
        self.closed = True
        if release is not None and self.owner_pid == os.getpid():
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
                os.close(self.fd)


class Arena:
    """The shared cache file of one dataset: see the module docstring for the protocol.

    Use ``Arena.open`` in the process that owns the dataset and ``Arena.attach`` to re-open
    it from a pickled ``ArenaState``.
    """

    def __init__(self, handle: _Handle, *, created: bool) -> None:
        self._h = handle
        self.created = created
        mm = handle.mm
        words = np.frombuffer(mm, dtype=np.int64, count=HEADER_WORDS)
        n_slots = int(words[_NSLOTS])
        o, c, s, data_start = _layout(n_slots)
        table = np.frombuffer(mm, dtype=np.int64, count=data_start // 8)
        self._words = words
        self._owners = table[o:c].reshape(MAX_OWNERS, 2)
        self._counters = table[c:s].reshape(MAX_COUNTERS, 4)
        self._slots = table[s : s + n_slots * SLOT_WORDS].reshape(n_slots, SLOT_WORDS)
        self._bytes = np.frombuffer(mm, dtype=np.uint8)
        # Flat int64 memoryviews: reading one slot or bumping one counter through them costs
        # a fraction of a numpy scalar access, and the hit path does both once per sample.
        self._slot_words = memoryview(mm)[s * 8 : (s + n_slots * SLOT_WORDS) * 8].cast("q")
        self._counter_words = memoryview(mm)[c * 8 : s * 8].cast("q")
        handle.views.extend([words, table, self._bytes])
        handle.memoryviews.extend([self._slot_words, self._counter_words])
        self.n_slots = n_slots
        self.data_start = data_start
        self.capacity = int(words[_CAPACITY])
        self._row = -1
        self._row_pid = -1
        self._finalizer = weakref.finalize(self, handle.close, functools.partial(_release, handle))

    # ----------------------------------------------------------------- opening and closing
    @classmethod
    def open(
        cls,
        path: str,
        *,
        fingerprint: bytes,
        n_slots: int,
        capacity: int,
        kind: Literal["shared", "disk"],
    ) -> Arena:
        """Open the cache at ``path`` as an owner: attach, reuse, replace or create it."""
        if len(fingerprint) != 32:
            raise ValueError("fingerprint must be 32 bytes")
        for _ in range(1000):
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                fd = _create(path, fingerprint, n_slots, capacity, kind, replace=False)
                if fd < 0:
                    continue  # another process created it first: open theirs
                return cls(_map(path, fd, owner=True, kind=kind), created=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if not _same_file(fd, path):
                    os.close(fd)
                    continue  # replaced or unlinked while we waited for the lock
                if _usable(fd, fingerprint, n_slots, kind):
                    handle = _map(path, fd, owner=True, kind=kind)
                    arena = cls(handle, created=False)
                    if not arena._register_owner():
                        handle.owner_pid = 0
                    return arena
                new_fd = _create(path, fingerprint, n_slots, capacity, kind, replace=True)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            return cls(_map(path, new_fd, owner=True, kind=kind), created=True)
        raise RuntimeError(f"could not open the cache file {path}: it keeps being replaced")

    @classmethod
    def attach(cls, state: ArenaState) -> Arena:
        """Re-open the arena a pickled copy describes, without becoming an owner.

        Raises:
            FileNotFoundError: the file is gone or was replaced (its owners all exited).
        """
        fd = os.open(state.path, os.O_RDWR)
        st = os.fstat(fd)
        words = _read_words(fd)
        if (st.st_ino, st.st_dev, int(words[_NONCE])) != (state.inode, state.device, state.nonce):
            os.close(fd)
            raise FileNotFoundError(
                f"the cache file {state.path} was replaced since this dataset was pickled"
            )
        kind = "disk" if words[_KIND] else "shared"
        return cls(_map(state.path, fd, owner=False, kind=kind), created=False)

    def state(self) -> ArenaState:
        """What ``attach`` needs in another process."""
        st = os.fstat(self._h.fd)
        return ArenaState(self._h.path, st.st_ino, st.st_dev, int(self._words[_NONCE]))

    @property
    def path(self) -> str:
        """The file backing this arena."""
        return self._h.path

    @property
    def closed(self) -> bool:
        """Whether ``close`` ran in this process."""
        return self._h.closed

    def close(self) -> None:
        """Unmap; an owner also deregisters, and the last owner of a shared file unlinks it."""
        if self._finalizer.alive:
            # Drop this object's views first so the mapping can really be closed.
            del self._words, self._owners, self._counters, self._slots, self._bytes
            del self._slot_words, self._counter_words
            self._finalizer()

    def _register_owner(self) -> bool:
        """Add this process to the owners table (called with the lock held)."""
        me, start = os.getpid(), process_start(os.getpid()) or 0
        free = -1
        live = 0
        for i, row in enumerate(self._owners):
            if row[0] and process_alive(int(row[0]), int(row[1])):
                live += 1
                continue
            row[:] = 0
            if free < 0:
                free = i
        if live == 0:  # a fresh run reusing a disk cache: counting starts again
            self._counters[:] = 0
            self._words[_RETIRED_HITS] = self._words[_RETIRED_MISSES] = 0
        if free < 0:
            return False
        self._owners[free] = (me, start)
        return True

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return _locked(self._h)

    # ----------------------------------------------------------------------- the data path
    def get(self, index: int) -> Any:
        """The decoded sample at ``index``, or ``MISSING`` when it is not published yet."""
        words, at = self._slot_words, index * SLOT_WORDS
        if words[at] != READY:
            return MISSING
        return decode(self._bytes, self.data_start + words[at + 2])

    def is_ready(self, index: int) -> bool:
        """Whether ``index`` is published."""
        return bool(self._slots[index, 0] == READY)

    def put(self, index: int, encoded: EncodedSample) -> StoreResult:
        """Publish ``encoded`` at ``index`` unless another process did or does, or space ran out."""
        if self._words[_EXHAUSTED]:
            return "budget_exhausted"
        slot = self._slots[index]
        if slot[0] == READY:
            return "skipped"
        me = os.getpid()
        size = (encoded.nbytes + ALIGN - 1) // ALIGN * ALIGN
        with self._locked():
            state, writer = int(slot[0]), int(slot[1])
            if state == READY or (state == WRITING and process_alive(writer)):
                return "skipped"
            if state == WRITING and (int(slot[3]) + ALIGN - 1) // ALIGN * ALIGN >= size:
                offset = int(slot[2])  # reuse the space a dead writer reserved
            else:
                offset = self._allocate(size)
                if offset < 0:
                    first = not self._words[_EXHAUSTED]
                    self._words[_EXHAUSTED] = 1
                    return "budget_exhausted_now" if first else "budget_exhausted"
            slot[1], slot[2], slot[3] = me, offset, encoded.nbytes
            slot[0] = WRITING
        start = self.data_start + offset
        encoded.write_into(self._bytes[start : start + encoded.nbytes])
        with self._locked():
            if slot[0] == WRITING and slot[1] == me:
                slot[0] = READY
                return "stored"
        return "skipped"

    def _allocate(self, size: int) -> int:
        """Bump-allocate ``size`` payload bytes (lock held); -1 when the budget is spent."""
        used, capacity = int(self._words[_USED]), self.capacity
        if used + size > capacity:
            return -1
        reserved = int(self._words[_RESERVED])
        if used + size > reserved:
            # Reserve real pages ahead of use, so a full /dev/shm means "budget exhausted"
            # here instead of SIGBUS on a write into a sparse page later.
            grow = min(max(size, RESERVE_CHUNK), capacity - reserved)
            try:
                os.posix_fallocate(self._h.lock_fd(), self.data_start + reserved, grow)
            except OSError as err:
                if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    return -1
            self._words[_RESERVED] = reserved + grow
        self._words[_USED] = used + size
        return used

    # -------------------------------------------------------------------------- counting
    def count(self, *, hit: bool, n: int = 1) -> None:
        """Count ``n`` hits or misses in this process's own row (a plain store, no lock)."""
        if self._row_pid != os.getpid():
            self._claim_row()
        if self._row >= 0:
            self._counter_words[self._row * 4 + (2 if hit else 3)] += n

    def _claim_row(self) -> None:
        me = os.getpid()
        self._row_pid, self._row = me, -1
        with self._locked():
            rows = self._counters
            for i in range(MAX_COUNTERS):
                pid = int(rows[i, 0])
                if pid == me:
                    self._row = i
                    return
                if pid == 0 or not process_alive(pid, int(rows[i, 1])):
                    self._words[_RETIRED_HITS] += rows[i, 2]
                    self._words[_RETIRED_MISSES] += rows[i, 3]
                    rows[i] = (me, process_start(me) or 0, 0, 0)
                    self._row = i
                    return
        # More than MAX_COUNTERS live processes: this one's counts go uncounted.

    def stats(self) -> dict[str, int]:
        """Node-wide counts: hits, misses, items, bytes used, capacity, exhausted flag."""
        hits = int(self._words[_RETIRED_HITS] + self._counters[:, 2].sum())
        misses = int(self._words[_RETIRED_MISSES] + self._counters[:, 3].sum())
        return {
            "hits": hits,
            "misses": misses,
            "items": int(np.count_nonzero(self._slots[:, 0] == READY)),
            "bytes_used": int(self._words[_USED]),
            "capacity_bytes": self.capacity,
            "budget_exhausted": int(self._words[_EXHAUSTED]),
        }


# ---------------------------------------------------------------------------- file helpers
@contextlib.contextmanager
def _locked(handle: _Handle) -> Iterator[None]:
    fd = handle.lock_fd()  # first: after a fork it also replaces the thread lock
    with handle.thread_lock:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _release(handle: _Handle) -> None:
    """Deregister this owner; unlink a shared file when no live owner is left."""
    words = np.frombuffer(handle.mm, dtype=np.int64, count=HEADER_WORDS)
    o, c, _, _ = _layout(int(words[_NSLOTS]))
    owners = np.frombuffer(handle.mm, dtype=np.int64, count=c).reshape(-1, 2)[o // 2 :]
    try:
        with _locked(handle):
            me = os.getpid()
            live = 0
            mine = True
            for row in owners:
                if row[0] == me and mine:
                    row[:] = 0  # one registration per open: this process may hold several
                    mine = False
                elif row[0] and process_alive(int(row[0]), int(row[1])):
                    live += 1
            if live == 0 and handle.kind == "shared" and _same_file(handle.fd, handle.path):
                os.unlink(handle.path)
    finally:
        del words, owners


def _read_words(fd: int) -> np.ndarray[Any, Any]:
    raw = os.pread(fd, HEADER_WORDS * 8, 0)
    if len(raw) < HEADER_WORDS * 8:
        return np.zeros(HEADER_WORDS, dtype=np.int64)
    return np.frombuffer(raw, dtype=np.int64)


def _usable(fd: int, fingerprint: bytes, n_slots: int, kind: str) -> bool:
    """Whether an existing file (lock held) may be used: same format, data, and not stale."""
    words = _read_words(fd)
    if (
        words[_MAGIC] != MAGIC
        or words[_VERSION] != VERSION
        or words[_NSLOTS] != n_slots
        or words[_KIND] != (kind == "disk")
        or words[_FINGERPRINT : _FINGERPRINT + 4].tobytes() != fingerprint
        or os.fstat(fd).st_size != words[_DATA_START] + words[_CAPACITY]
    ):
        return False
    if kind == "disk":
        return True
    o, c, _, _ = _layout(n_slots)
    owners = np.frombuffer(os.pread(fd, (c - o) * 8, o * 8), dtype=np.int64).reshape(-1, 2)
    return any(pid and process_alive(int(pid), int(start)) for pid, start in owners)


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (own.st_ino, own.st_dev) == (st.st_ino, st.st_dev)


def _create(
    path: str, fingerprint: bytes, n_slots: int, capacity: int, kind: str, *, replace: bool
) -> int:
    """Write a complete new file next to ``path`` and move it into place; return its fd.

    With ``replace=False`` the move is ``link`` (fails if another process won the race: -1);
    with ``replace=True`` (lock on the old file held) it is an atomic ``rename``.
    """
    _, _, _, data_start = _layout(n_slots)
    tmp = f"{path}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, data_start + capacity)
        words = np.zeros(HEADER_WORDS + MAX_OWNERS * 2, dtype=np.int64)
        words[_MAGIC], words[_VERSION], words[_DATA_START] = MAGIC, VERSION, data_start
        words[_NSLOTS], words[_CAPACITY], words[_KIND] = n_slots, capacity, kind == "disk"
        words[_NONCE] = int.from_bytes(os.urandom(8), "little", signed=True)
        words[_FINGERPRINT : _FINGERPRINT + 4] = np.frombuffer(fingerprint, dtype=np.int64)
        words[HEADER_WORDS] = os.getpid()
        words[HEADER_WORDS + 1] = process_start(os.getpid()) or 0
        os.pwrite(fd, words.tobytes(), 0)
        if replace:
            os.rename(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                os.close(fd)
                return -1
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return fd


def _map(path: str, fd: int, *, owner: bool, kind: str) -> _Handle:
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    return _Handle(path, fd, mm, os.getpid() if owner else 0, kind)
