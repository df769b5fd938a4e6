"""One preallocated, memory-mapped arena that many processes fill and read together.

The whole cache is a single file, in ``/dev/shm`` (``storage="shared"``) or anywhere on disk
(``storage="disk"``), mapped ``MAP_SHARED`` by every process that uses it. Everything the
processes need to agree on lives inside the file, never in per-process Python objects (the
layout, creation and each process's handle are in :mod:`~lightning_speedpack.cache.arena_file`).

Protocol. Every state change happens while holding ``fcntl.flock`` on the file (each process
opens its own descriptor, so the lock also separates a parent from its forked children):
``EMPTY -> WRITING(writer)`` reserves payload space from the bump pointer, the payload is then
copied without the lock, and ``WRITING(writer) -> READY`` publishes it. A reader only decodes a
slot it sees ``READY``, and a ``READY`` slot never changes again, so a reader never sees a torn
sample; the lock's system calls order the writer's payload stores before its flag store. A
map-style cache has one slot per dataset index (:meth:`Arena.put`); a stream cache appends to
the next free slot (:meth:`Arena.append`) and keeps, per shard of the stream, how far it is
stored and whether it is done, so the cache knows when the first pass is complete. A sample's
structure text is published once per arena, under the same lock, before the first slot naming
it (:mod:`~lightning_speedpack.cache.structures`); the slot then holds its array bytes only.

Liveness (see :mod:`~lightning_speedpack.cache.liveness`) never trusts a pid: every process
that maps the file holds a shared lock on its "users" byte, owners one on its "owners" byte,
and the process that claimed counter row ``r`` an exclusive lock on that row's byte. A slot's
writer is ``(r, generation of r at the claim)``; the writer is alive exactly while row ``r``
still has that generation and its lock is held. So a slot left ``WRITING`` by a dead process
-- killed mid-write, or whose copy raised -- is reclaimed by the next writer (its space
reused), a worker killed mid-write leaves the index unfilled, not corrupt, and a reused pid
can never make a dead writer look alive. Two processes racing on one index both compute the
sample, one publishes it, neither waits.

Lifetime. A process that opens the cache itself is an owner; pickled copies in DataLoader
workers attach as users only, and a forked child gets its own descriptor at the fork (users
lock, no owner lock, a fresh counter row when it first counts). When the last owner closes
(explicitly, at interpreter exit, or when the object is collected) a shared file is unlinked; a
disk file stays. A shared file nobody holds (a killed run) is removed by the next
``CachedDataset`` built on the node (:mod:`~lightning_speedpack.cache.reclaim`), or replaced
when opened, never reused; a disk file is reused when its fingerprint matches and rebuilt
otherwise. Replacement writes a complete new file and ``rename``s it into place, so a process
still mapping the old one is unaffected.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import operator
import os
import weakref
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from lightning_speedpack.cache import liveness
from lightning_speedpack.cache.arena_file import (
    _CAPACITY,
    _EXHAUSTED,
    _KIND,
    _NEXT,
    _NONCE,
    _NSLOTS,
    _RESERVED,
    _RETIRED_HITS,
    _RETIRED_MISSES,
    _USED,
    EMPTY,
    HEADER_WORDS,
    MAX_COUNTERS,
    MAX_FILLERS,
    MAX_STRUCTURES,
    NBYTES_MASK,
    READY,
    SLOT_WORDS,
    STRUCTURE_SHIFT,
    WRITING,
    ArenaState,
    Handle,
    create,
    layout,
    locked,
    map_file,
    only_user,
    read_words,
    release,
    same_file,
    usable,
)
from lightning_speedpack.cache.codec import (
    _LEN,
    ALIGN,
    Decoder,
    EncodedSample,
    decode,
    decode_leaf,
    plan_of,
)
from lightning_speedpack.cache.codec import _PARSED as _PLANS
from lightning_speedpack.cache.liveness import OWNERS, ROWS, USERS
from lightning_speedpack.cache.stream_fill import StreamFill
from lightning_speedpack.cache.structures import Structures

__all__ = [
    "EMPTY",
    "HEADER_WORDS",
    "MISSING",
    "READY",
    "WRITING",
    "Arena",
    "ArenaState",
    "StoreResult",
]

RESERVE_CHUNK = 16 << 20
_ROW_BITS = 16  # writer word: (generation << 16) | (row + 1); 0 means "no live writer"

StoreResult = Literal["stored", "skipped", "budget_exhausted_now", "budget_exhausted"]
GetMany = Literal["each", "together", "views"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Arena(StreamFill, Structures):
    """The shared cache file of one dataset: see the module docstring for the protocol.

    Use ``Arena.open`` in the process that owns the dataset and ``Arena.attach`` to re-open
    it from a pickled ``ArenaState``.
    """

    def __init__(self, handle: Handle, *, created: bool) -> None:
        self._h = handle
        self.created = created
        mm = handle.mm
        words = np.frombuffer(mm, dtype=np.int64, count=HEADER_WORDS)
        n_slots = int(words[_NSLOTS])
        c, f, st, s, data_start = layout(n_slots)
        table = np.frombuffer(mm, dtype=np.int64, count=data_start // 8)
        self._words = words
        self._counters = table[c:f].reshape(MAX_COUNTERS, 4)
        self._fillers = table[f:st].reshape(MAX_FILLERS, 4)
        self._slots = table[s : s + n_slots * SLOT_WORDS].reshape(n_slots, SLOT_WORDS)
        self._bytes = np.frombuffer(mm, dtype=np.uint8)
        # Flat int64 memoryviews: reading one slot or bumping one counter through them costs
        # a fraction of a numpy scalar access, and the hit path does both once per sample.
        self._slot_words = memoryview(mm)[s * 8 : (s + n_slots * SLOT_WORDS) * 8].cast("q")
        self._counter_words = memoryview(mm)[c * 8 : f * 8].cast("q")
        handle.views.extend([words, table, self._bytes])
        handle.memoryviews.extend([self._slot_words, self._counter_words])
        self.n_slots = n_slots
        self.data_start = data_start
        self.capacity = int(words[_CAPACITY])
        self._row = -1
        self._row_pid = -1
        self._writer = 0
        self._init_structures(table[st:s].reshape(MAX_STRUCTURES, 2))
        self._finalizer = weakref.finalize(self, handle.close, functools.partial(release, handle))

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
                fd = create(path, fingerprint, n_slots, capacity, kind, replace=False)
                if fd < 0:
                    continue  # another process created it first: open theirs
                return cls(map_file(path, fd, owner=True, kind=kind), created=True)
            try:
                liveness.lock(fd, USERS)  # from here on a reclaimer leaves this file alone
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            new_fd = -1
            try:
                if not same_file(fd, path):
                    continue  # reclaimed or replaced before we held it: look again
                others = not only_user(fd)
                if usable(fd, fingerprint, n_slots, kind) and (kind == "disk" or others):
                    liveness.lock(fd, OWNERS)
                    arena = cls(map_file(path, fd, owner=True, kind=kind), created=False)
                    if not others:  # a fresh run reusing a disk cache: counting starts again
                        arena._reset_counts()
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    fd = -1  # now the arena's
                    return arena
                new_fd = create(path, fingerprint, n_slots, capacity, kind, replace=True)
            finally:
                if fd >= 0:
                    os.close(fd)  # also drops the flock and this description's locks
            return cls(map_file(path, new_fd, owner=True, kind=kind), created=True)
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
            words = read_words(fd)
            same = (st.st_ino, st.st_dev, int(words[_NONCE])) == (
                state.inode,
                state.device,
                state.nonce,
            )
            if not (same and same_file(fd, state.path)):
                raise FileNotFoundError(
                    f"the cache file {state.path} was replaced since this dataset was pickled"
                )
        except BaseException:
            os.close(fd)
            raise
        kind = "disk" if words[_KIND] else "shared"
        return cls(map_file(state.path, fd, owner=False, kind=kind), created=False)

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
            self._flats = None
            del self._words, self._counters, self._fillers, self._slots, self._bytes
            del self._structures
            del self._slot_words, self._counter_words
            self._finalizer()

    def _reset_counts(self) -> None:
        """Zero every process's counts (called with the lock held, nobody else attached)."""
        self._counters[:, 0] = 0
        self._counters[:, 2:] = 0  # generations stay: a stale slot must never match a new row
        self._words[_RETIRED_HITS] = self._words[_RETIRED_MISSES] = 0

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return locked(self._h)

    # ----------------------------------------------------------------------- the data path
    def get(self, index: int) -> Any:
        """The decoded sample at ``index``, or ``MISSING`` when it is not published yet."""
        words, at = self._slot_words, index * SLOT_WORDS
        if words[at] != READY:
            return MISSING
        start = self.data_start + words[at + 2]
        sid = (words[at + 3] >> STRUCTURE_SHIFT) - 1
        if sid < 0:  # a whole blob, its structure text inside
            return decode(self._bytes, start)
        return self._decoders[self._data_decoder(sid)].one(self._bytes, start)

    def get_many(self, indices: Sequence[Any], n: int, *, how: GetMany = "together") -> list[Any]:
        """The decoded samples at ``indices``, ``MISSING`` where not published or not in [0, n).

        For a whole batch (the DataLoader's batched fetch). ``how``:

        - ``"each"``: each sample decoded on its own (its own fresh tensors).
        - ``"together"``: samples whose tensors lie alike are decoded together, each tensor
          leaf copied into one fresh tensor for the batch whose rows the samples get (see
          :class:`~lightning_speedpack.cache.codec.Decoder`).
        - ``"views"``: as ``"together"``, but each tensor is a view into the arena itself,
          nothing copied -- only for a caller that copies them before anyone can see them
          (a write into a view would change the cache for every process).

        ``"together"`` and ``"views"`` keep a 2-byte decoder number per slot in this process
        for the slots whose blob carries its own structure text (past ``MAX_STRUCTURES``).
        """
        if how == "each":
            return self._get_each(indices, n)
        out: list[Any] = [MISSING] * len(indices)
        blob = self._bytes
        for shape_id, (positions, bases, decoders) in self._by_layout(indices, n, out).items():
            leaves = decoders[0].leaves
            columns = None
            if shape_id >= 0 and leaves is not None:
                if how == "views":
                    columns = self._leaf_views(bases, leaves)
                elif len(bases) > 1:
                    columns = [decode_leaf(blob, bases, leaf) for leaf in leaves]
            if columns is None:
                samples = [d.one(blob, base) for d, base in zip(decoders, bases, strict=True)]
            else:
                values = zip(*columns, strict=True) if columns else [()] * len(bases)
                samples = [d.build(v) for d, v in zip(decoders, values, strict=True)]
            if len(samples) == len(out):
                return samples  # one layout, every sample published: already in order
            for pos, sample in zip(positions, samples, strict=True):
                out[pos] = sample
        return out

    def _by_layout(
        self, indices: Sequence[Any], n: int, out: list[Any]
    ) -> dict[int, tuple[list[int], list[int], list[Decoder]]]:
        """The published ``indices`` by layout: their positions, blob bases and decoders.

        Layout -1 gathers the samples to decode one at a time; a sample beyond the decoders
        this process keeps is decoded into ``out`` at once.
        """
        words, data_start, blob = self._slot_words, self.data_start, self._bytes
        ids = None  # whole blobs' decoder numbers, made when the first one is read
        decoders, layouts, by_sid = self._decoders, self._layout_of, self._sid_decoder
        groups: dict[int, tuple[list[int], list[int], list[Decoder]]] = {}
        for pos, index in enumerate(indices):
            i = index if type(index) is int else operator.index(index)
            at = i * SLOT_WORDS
            if not 0 <= i < n or words[at] != READY:
                continue
            start = data_start + words[at + 2]
            sid = (words[at + 3] >> STRUCTURE_SHIFT) - 1
            if sid >= 0:
                d = by_sid[sid] if sid < len(by_sid) else -1
                if d < 0:
                    d = self._data_decoder(sid)
            else:
                if ids is None:
                    ids = self._whole_blob_ids(n)  # sized to the slots read (a stream's few)
                d = ids[i]
                if d < 0:
                    d = self._learn_decoder(i, start)
                    if d < 0:
                        out[pos] = decode(blob, start)
                        continue
            decoder = decoders[d]
            group = groups.get(layouts[d])
            if group is None:
                groups[layouts[d]] = ([pos], [start + decoder.head], [decoder])
            else:
                group[0].append(pos)
                group[1].append(start + decoder.head)
                group[2].append(decoder)
        return groups

    def _get_each(self, indices: Sequence[Any], n: int) -> list[Any]:
        """:meth:`get_many` one sample at a time: one loop with the decoding inlined."""
        words, blob, data_start, mm = self._slot_words, self._bytes, self.data_start, self._h.mm
        unpack, plans, head = _LEN.unpack_from, _PLANS, _LEN.size
        decoders, by_sid = self._decoders, self._sid_decoder
        out: list[Any] = []
        for index in indices:
            i = index if type(index) is int else operator.index(index)
            at = i * SLOT_WORDS
            if not 0 <= i < n or words[at] != READY:
                out.append(MISSING)
                continue
            start = data_start + words[at + 2]
            sid = (words[at + 3] >> STRUCTURE_SHIFT) - 1
            if sid >= 0:
                d = by_sid[sid] if sid < len(by_sid) else -1
                out.append(decoders[d if d >= 0 else self._data_decoder(sid)].one(blob, start))
                continue
            (length,) = unpack(mm, start)
            text = mm[start + head : start + head + length]
            plan = plans.get(text)
            if plan is None:
                plan = plan_of(text)
            out.append(plan(blob, start + (head + length + ALIGN - 1) // ALIGN * ALIGN))
        return out

    def stored_nbytes(self, index: int) -> int:
        """The bytes of the blob published at ``index``; 0 when none is (or out of range)."""
        if not 0 <= index < self.n_slots:
            return 0
        words, at = self._slot_words, index * SLOT_WORDS
        return int(words[at + 3] & NBYTES_MASK) if words[at] == READY else 0

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
        with self._locked():
            state, writer = int(slot[0]), int(slot[1])
            if state == READY or (state == WRITING and self._writer_alive(writer)):
                return "skipped"
            sid = self._structure_id(encoded.text)
            nbytes = encoded.data_nbytes if sid >= 0 else encoded.nbytes
            size = _align(nbytes)
            if state == WRITING and _align(int(slot[3]) & NBYTES_MASK) >= size:
                offset = int(slot[2])  # reuse the space a dead writer reserved
            else:
                offset = self._allocate(size)
                if offset < 0:
                    first = not self._words[_EXHAUSTED]
                    self._words[_EXHAUSTED] = 1
                    return "budget_exhausted_now" if first else "budget_exhausted"
            slot[1], slot[2], slot[3] = me, offset, nbytes | (sid + 1) << STRUCTURE_SHIFT
            slot[0] = WRITING
        start = self.data_start + offset
        try:
            encoded.write_into(self._bytes[start : start + nbytes], data_only=sid >= 0)
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

    # ----------------------------------------------------------------- stream caches
    def append(self, encoded: EncodedSample) -> tuple[StoreResult, int]:
        """Store ``encoded`` in the next free slot (a stream cache); say how, and which slot.

        Returns ``("stored", index)``, ``("skipped", -1)`` when this process cannot write (more
        than ``MAX_COUNTERS`` live processes), or a budget result and -1 when the slots
        (``max_items``) or the bytes (``max_bytes``) are spent.
        """
        if self._words[_EXHAUSTED]:
            return "budget_exhausted", -1
        self._ensure_row()
        me = self._writer
        if me == 0:
            return "skipped", -1
        with self._locked():
            index = int(self._words[_NEXT])
            sid = self._structure_id(encoded.text) if index < self.n_slots else -1
            nbytes = encoded.data_nbytes if sid >= 0 else encoded.nbytes
            offset = self._allocate(_align(nbytes)) if index < self.n_slots else -1
            if offset < 0:
                first = not self._words[_EXHAUSTED]
                self._words[_EXHAUSTED] = 1
                return ("budget_exhausted_now" if first else "budget_exhausted"), -1
            self._words[_NEXT] = index + 1
            slot = self._slots[index]
            slot[1], slot[2], slot[3] = me, offset, nbytes | (sid + 1) << STRUCTURE_SHIFT
            slot[0] = WRITING
        start = self.data_start + offset
        try:
            encoded.write_into(self._bytes[start : start + nbytes], data_only=sid >= 0)
        except BaseException:
            with self._locked():
                slot[1] = 0  # left WRITING: never served (a stream slot is never reused)
            raise
        with self._locked():
            slot[0] = READY
        return "stored", index

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
        appended = int(self._words[_NEXT]) or self.n_slots  # a stream cache: slots in use
        with self._locked():
            hits = int(self._words[_RETIRED_HITS] + self._counters[:, 2].sum())
            misses = int(self._words[_RETIRED_MISSES] + self._counters[:, 3].sum())
            return {
                "hits": hits,
                "misses": misses,
                "items": int(np.count_nonzero(self._slots[:appended, 0] == READY)),
                "bytes_used": int(self._words[_USED]),
                "capacity_bytes": self.capacity,
                "budget_exhausted": int(self._words[_EXHAUSTED]),
            }
