"""One preallocated, memory-mapped arena that many processes fill and read together.

The whole cache is a single file, in ``/dev/shm`` (``storage="shared"``) or anywhere on disk
(``storage="disk"``), mapped ``MAP_SHARED`` by every process that uses it. Everything the
processes need to agree on lives inside the file, never in per-process Python objects:

======================  =====================================================================
words 0-63              header: magic, version, sizes, bump pointer, budget flag, fingerprint
counters (512 x 4)      ``(pid, generation, hits, misses)``: one row per process, so counting
                        a hit is a plain store with no lock; rows of dead processes are folded
                        into the header's retired totals before reuse
slots (n x 4)           ``(state, writer, offset, nbytes)`` for each dataset index
payload                 the encoded samples, each at a 64-byte boundary (see ``_codec``)
======================  =====================================================================

Protocol. Every state change happens while holding ``fcntl.flock`` on the file (each process
opens its own descriptor, so the lock also separates a parent from its forked children):
``EMPTY -> WRITING(writer)`` reserves payload space from the bump pointer, the payload is then
copied without the lock, and ``WRITING(writer) -> READY`` publishes it. A reader only decodes a
slot it sees ``READY``, and a ``READY`` slot never changes again, so a reader never sees a torn
sample; the lock's system calls order the writer's payload stores before its flag store.

Liveness (see :mod:`~lightning_speedpack.data.liveness`) never trusts a pid: every process
that maps the file holds a shared lock on its "users" byte, owners one on its "owners" byte,
and the process that claimed counter row ``r`` an exclusive lock on that row's byte. A slot's
writer is ``(r, generation of r at the claim)``; the writer is alive exactly while row ``r``
still has that generation and its lock is held. So a slot left ``WRITING`` by a dead process
-- killed mid-write, or whose copy raised -- is reclaimed by the next writer (its space
reused), a worker killed mid-write leaves the index unfilled, not corrupt, and a reused pid
can never make a dead writer look alive (which left such an index uncached for the rest of
the run). Two processes racing on one index both compute the sample, one publishes it,
neither waits.

Lifetime. A process that opens the cache itself is an owner; pickled copies in DataLoader
workers attach as users only, and a forked child gets its own descriptor at the fork (users
lock, no owner lock, a fresh counter row when it first counts). When the last owner closes
(explicitly, at interpreter exit, or when the object is collected) a shared file is unlinked; a
disk file stays. A shared file nobody holds (a killed run) is removed by the next
``CachedDataset`` built on the node (:mod:`~lightning_speedpack.data.reclaim`), or replaced
when opened, never reused; a disk file is reused when its fingerprint matches and rebuilt
otherwise. Replacement writes a complete new file and ``rename``s it into place, so a process
still mapping the old one is unaffected.

Fork safety. Each process's handle owns one descriptor and two ``threading.Lock``s; an
``os.register_at_fork`` hook gives a forked child a new descriptor (its own users lock, not
the parent's owner or row locks) and new thread locks, so a lock another thread held at the
fork cannot deadlock the child. No thread is ever started here.
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

from lightning_speedpack.data import liveness
from lightning_speedpack.data.codec import ALIGN, EncodedSample, decode
from lightning_speedpack.data.liveness import MAGIC, OWNERS, ROWS, USERS, VERSION

__all__ = ["MISSING", "Arena", "ArenaState", "StoreResult"]

HEADER_WORDS = 64
MAX_COUNTERS = 512
SLOT_WORDS = 4
RESERVE_CHUNK = 16 << 20
_ROW_BITS = 16  # writer word: (generation << 16) | (row + 1); 0 means "no live writer"

EMPTY, READY, WRITING = 0, 1, 2

# header word indices
_MAGIC, _VERSION, _DATA_START, _NSLOTS, _CAPACITY, _USED, _EXHAUSTED, _RESERVED = range(8)
_RETIRED_HITS, _RETIRED_MISSES, _KIND, _NONCE, _FINGERPRINT = 8, 9, 10, 11, 12  # fp: 12-15

StoreResult = Literal["stored", "skipped", "budget_exhausted_now", "budget_exhausted"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def _layout(n_slots: int) -> tuple[int, int, int]:
    """Word offsets of the counters and slots tables, and the payload start in bytes."""
    counters = HEADER_WORDS
    slots = counters + MAX_COUNTERS * 4
    end = (slots + n_slots * SLOT_WORDS) * 8
    return counters, slots, (end + 4095) // 4096 * 4096


@dataclass(frozen=True)
class ArenaState:
    """What a pickled copy needs to re-attach: the file, and which file it must be."""

    path: str
    inode: int
    device: int
    nonce: int  # random per created file: inode numbers are reused on tmpfs


_handles: weakref.WeakSet[_Handle] = weakref.WeakSet()


class _Handle:
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
        c, s, data_start = _layout(n_slots)
        table = np.frombuffer(mm, dtype=np.int64, count=data_start // 8)
        self._words = words
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
        self._writer = 0
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
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                fd = _create(path, fingerprint, n_slots, capacity, kind, replace=False)
                if fd < 0:
                    continue  # another process created it first: open theirs
                return cls(_map(path, fd, owner=True, kind=kind), created=True)
            try:
                liveness.lock(fd, USERS)  # from here on a reclaimer leaves this file alone
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            new_fd = -1
            try:
                if not _same_file(fd, path):
                    continue  # reclaimed or replaced before we held it: look again
                others = not _only_user(fd)
                if _usable(fd, fingerprint, n_slots, kind) and (kind == "disk" or others):
                    liveness.lock(fd, OWNERS)
                    arena = cls(_map(path, fd, owner=True, kind=kind), created=False)
                    if not others:  # a fresh run reusing a disk cache: counting starts again
                        arena._reset_counts()
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    fd = -1  # now the arena's
                    return arena
                new_fd = _create(path, fingerprint, n_slots, capacity, kind, replace=True)
            finally:
                if fd >= 0:
                    os.close(fd)  # also drops the flock and this description's locks
            return cls(_map(path, new_fd, owner=True, kind=kind), created=True)
        raise RuntimeError(f"could not open the cache file {path}: it keeps being replaced")

    @classmethod
    def attach(cls, state: ArenaState) -> Arena:
        """Re-open the arena a pickled copy describes, without becoming an owner.

        Raises:
            FileNotFoundError: the file is gone or was replaced (its owners all exited).
        """
        fd = os.open(state.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            liveness.lock(fd, USERS)
            st = os.fstat(fd)
            words = _read_words(fd)
            same = (st.st_ino, st.st_dev, int(words[_NONCE])) == (
                state.inode,
                state.device,
                state.nonce,
            )
            if not (same and _same_file(fd, state.path)):
                raise FileNotFoundError(
                    f"the cache file {state.path} was replaced since this dataset was pickled"
                )
        except BaseException:
            os.close(fd)
            raise
        kind = "disk" if words[_KIND] else "shared"
        return cls(_map(state.path, fd, owner=False, kind=kind), created=False)

    def state(self) -> ArenaState:
        """What ``attach`` needs in another process."""
        st = os.fstat(self._h.lock_fd())
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
            del self._words, self._counters, self._slots, self._bytes
            del self._slot_words, self._counter_words
            self._finalizer()

    def _reset_counts(self) -> None:
        """Zero every process's counts (called with the lock held, nobody else attached)."""
        self._counters[:, 0] = 0
        self._counters[:, 2:] = 0  # generations stay: a stale slot must never match a new row
        self._words[_RETIRED_HITS] = self._words[_RETIRED_MISSES] = 0

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
        self._ensure_row()
        me = self._writer
        if me == 0:
            return "skipped"  # more than MAX_COUNTERS live processes: this one only reads
        size = (encoded.nbytes + ALIGN - 1) // ALIGN * ALIGN
        with self._locked():
            state, writer = int(slot[0]), int(slot[1])
            if state == READY or (state == WRITING and self._writer_alive(writer)):
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
        try:
            encoded.write_into(self._bytes[start : start + encoded.nbytes])
        except BaseException:
            # Hand the slot back (space kept for the next writer): a claim this live process
            # abandoned would otherwise look "being written" to everyone until it exits.
            with self._locked():
                if slot[0] == WRITING and slot[1] == me:
                    slot[1] = 0
            raise
        with self._locked():
            if slot[0] == WRITING and slot[1] == me:
                slot[0] = READY
                return "stored"
        return "skipped"

    def _writer_alive(self, writer: int) -> bool:
        """Whether the claim ``writer`` (lock held) belongs to a process that still runs."""
        row = (writer & ((1 << _ROW_BITS) - 1)) - 1
        if not 0 <= row < MAX_COUNTERS or self._counters[row, 1] != writer >> _ROW_BITS:
            return False  # no writer, or its row was claimed again since: the writer is gone
        if row == self._row and self._row_pid == os.getpid():
            return True  # another thread of this process
        return liveness.held_by_other(self._h.lock_fd(), ROWS + row)

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
        """Count ``n`` hits or misses in this process's own row (no file lock)."""
        if self._row_pid != os.getpid():
            self._ensure_row()
        if self._row >= 0:
            with self._h.count_lock:
                self._counter_words[self._row * 4 + (2 if hit else 3)] += n

    def _ensure_row(self) -> None:
        """Claim a counter row for this process: the first free one (its holder is gone)."""
        me = os.getpid()
        if self._row_pid == me:
            return
        with self._locked():
            if self._row_pid == me:
                return  # another thread claimed it meanwhile
            fd, rows = self._h.lock_fd(), self._counters
            for i in range(MAX_COUNTERS):
                if liveness.try_lock(fd, ROWS + i, exclusive=True):
                    self._words[_RETIRED_HITS] += rows[i, 2]
                    self._words[_RETIRED_MISSES] += rows[i, 3]
                    gen = int(rows[i, 1]) + 1
                    rows[i] = (me, gen, 0, 0)
                    self._row, self._writer = i, (gen << _ROW_BITS) | (i + 1)
                    break
            else:  # More than MAX_COUNTERS live processes: this one's counts go uncounted.
                self._row, self._writer = -1, 0
            self._row_pid = me

    def stats(self) -> dict[str, int]:
        """Node-wide counts: hits, misses, items, bytes used, capacity, exhausted flag.

        Read under the file lock, so a row being folded into the retired totals is never
        counted twice or not at all.
        """
        with self._locked():
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


def _only_user(fd: int) -> bool:
    """Whether no other open file description uses the file (``fd`` keeps its users lock)."""
    if not liveness.try_lock(fd, USERS, exclusive=True):
        return False
    liveness.lock(fd, USERS)  # back to shared: an atomic conversion
    return True


def _release(handle: _Handle) -> None:
    """Deregister this owner; unlink a shared file when no other owner holds it."""
    with _locked(handle):
        fd = handle.fd
        liveness.unlock(fd, OWNERS)
        if (
            handle.kind == "shared"
            and liveness.try_lock(fd, OWNERS, exclusive=True)
            and _same_file(fd, handle.path)
        ):
            os.unlink(handle.path)


def _read_words(fd: int) -> np.ndarray[Any, Any]:
    raw = os.pread(fd, HEADER_WORDS * 8, 0)
    if len(raw) < HEADER_WORDS * 8:
        return np.zeros(HEADER_WORDS, dtype=np.int64)
    return np.frombuffer(raw, dtype=np.int64)


def _usable(fd: int, fingerprint: bytes, n_slots: int, kind: str) -> bool:
    """Whether an existing file (lock held) has this format, data and size."""
    words = _read_words(fd)
    return not (
        words[_MAGIC] != MAGIC
        or words[_VERSION] != VERSION
        or words[_NSLOTS] != n_slots
        or words[_KIND] != (kind == "disk")
        or words[_FINGERPRINT : _FINGERPRINT + 4].tobytes() != fingerprint
        or os.fstat(fd).st_size != words[_DATA_START] + words[_CAPACITY]
    )


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
            if not _same_file(fd, tmp):  # a reclaimer removed it before we held it
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
    _, _, data_start = _layout(n_slots)
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


def _map(path: str, fd: int, *, owner: bool, kind: str) -> _Handle:
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    return _Handle(path, fd, mm, owner=owner, kind=kind)
