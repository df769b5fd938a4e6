"""Structure texts kept once per arena, and each process's decoders for the arena's blobs.

A sample's structure text (see :mod:`~lightning_speedpack.cache.codec`) is the same for every
sample of one shape, so the arena keeps each distinct text once, in a table in the file, and a
slot names its structure: the blob is then the array bytes alone. Issue 38: with the text in
every blob, 40,000 samples of 96 int64 tokens took 832 bytes each for 768 of data.

Up to ``MAX_STRUCTURES`` texts are kept per arena (samples differing in a scalar -- a class
label -- have one text per value); a sample with yet another text is stored whole, text
included, as before. A text is published under the file lock before the first slot that names
it, and never changes, so a reader that sees a slot ``READY`` can read its text without a lock.

The read side, per process: each text gets a :class:`~lightning_speedpack.cache.codec.Decoder`
(compiled once), and decoders whose tensor leaves lie alike share a *layout*, decoded together
in a batch. A slot naming a structure finds its decoder through a list indexed by structure; a
whole blob's decoder is looked up by its text once and remembered per slot (2 bytes), a list
made only when a whole blob is first read.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import torch

from lightning_speedpack.cache.arena_file import _NSTRUCT, MAX_STRUCTURES, Handle
from lightning_speedpack.cache.codec import _LEN, ALIGN, Decoder, Leaf, decoder_of, leaf_views

__all__ = ["Structures"]

# Decoders of whole blobs kept per arena and process: past this many, the rest are decoded
# one at a time (each structure the table names gets one besides, at most MAX_STRUCTURES).
_MAX_DECODERS = 4096  # + MAX_STRUCTURES < 2**15: a decoder number fits the per-slot int16
# Structures published per arena: MAX_STRUCTURES, lowered by tests to reach the fallback.
_MAX_PUBLISHED = MAX_STRUCTURES


class Structures:
    """The arena's structure table and this process's decoders (a part of the arena)."""

    _h: Handle
    _words: np.ndarray[Any, Any]
    _bytes: np.ndarray[Any, Any]
    data_start: int
    n_slots: int

    def _allocate(self, size: int) -> int:
        raise NotImplementedError

    def _init_structures(self, table: np.ndarray[Any, Any]) -> None:
        """Start with ``table``, the file's ``(MAX_STRUCTURES, 2)`` words, and no decoders."""
        self._structures = table
        # Write side: the texts this process knows the number of (at most MAX_STRUCTURES).
        self._sid_of: dict[bytes, int] = {}
        self._sids_seen = 0
        # Read side: structure -> decoder number (-1: not built yet).
        self._sid_decoder: list[int] = []
        # Whole blobs: which decoder each published slot needs (-1: not looked up yet). A
        # slot's bytes never change once READY, so neither does its entry.
        self._decoder_ids: array[int] | None = None
        self._decoders: list[Decoder] = []
        self._decoder_index: dict[bytes, int] = {}
        self._layout_of: list[int] = []  # decoder -> layout (-1: decoded one at a time)
        self._layout_index: dict[tuple[Any, ...], int] = {}
        # The whole mapping as a tensor per dtype, for views (made on first use, with the
        # array they were made from: a re-mapped arena gets new ones).
        self._flats: tuple[np.ndarray[Any, Any], dict[torch.dtype, torch.Tensor]] | None = None

    # ------------------------------------------------------------------------- write side
    def _structure_id(self, text: bytes) -> int:
        """The number of structure ``text``, published if new (file lock held).

        -1 when the table is full or the budget cannot hold the text: the blob then carries
        its text itself.
        """
        sid = self._sid_of.get(text)
        if sid is not None:
            return sid
        count = int(self._words[_NSTRUCT])
        for k in range(self._sids_seen, count):  # published by other processes meanwhile
            self._sid_of.setdefault(self._structure_text(k), k)
        self._sids_seen = count
        sid = self._sid_of.get(text)
        if sid is not None:
            return sid
        if count >= _MAX_PUBLISHED:
            return -1
        offset = self._allocate((len(text) + ALIGN - 1) // ALIGN * ALIGN)
        if offset < 0:
            return -1
        start = self.data_start + offset
        self._bytes[start : start + len(text)] = np.frombuffer(text, dtype=np.uint8)
        self._structures[count] = (offset, len(text))
        self._words[_NSTRUCT] = count + 1  # published last: the text is complete by then
        self._sid_of[text] = count
        self._sids_seen = count + 1
        return count

    def _structure_text(self, sid: int) -> bytes:
        """The text of published structure ``sid``."""
        offset, length = (int(w) for w in self._structures[sid])
        start = self.data_start + offset
        return self._h.mm[start : start + length]

    # -------------------------------------------------------------------------- read side
    def _data_decoder(self, sid: int) -> int:
        """The decoder number for blobs of structure ``sid`` (data only), built on first use."""
        known = self._sid_decoder
        if sid < len(known) and known[sid] >= 0:
            return known[sid]
        decoder = decoder_of(self._structure_text(sid), data_only=True)  # outside the lock
        # Numbering must not race between threads reading at once (a thread-pool loader): two
        # texts given one number would decode each other's samples. The handle's count lock is
        # short-held and replaced in a forked child.
        with self._h.count_lock:
            if sid >= len(known):
                known.extend([-1] * (sid + 1 - len(known)))
            if known[sid] < 0:
                known[sid] = self._add_decoder(decoder)
            return known[sid]

    def _add_decoder(self, decoder: Decoder) -> int:
        """Number ``decoder`` and file it under its layout (count lock held)."""
        self._decoders.append(decoder)
        self._layout_of.append(
            -1
            if decoder.leaves is None
            else self._layout_index.setdefault(decoder.leaves, len(self._layout_index))
        )
        return len(self._decoders) - 1

    def _whole_blob_ids(self, n: int) -> array[int]:
        """The per-slot decoder numbers of whole blobs, sized to the ``n`` slots read so far."""
        ids = self._decoder_ids
        if ids is None or len(ids) < n:
            known = ids if ids is not None else array("h")
            known.extend(array("h", [-1]) * (min(n, self.n_slots) - len(known)))
            ids = self._decoder_ids = known
        return ids

    def _learn_decoder(self, index: int, start: int) -> int:
        """Find (or build) the decoder of the whole blob at ``index``; -1 past the cap."""
        (length,) = _LEN.unpack_from(self._h.mm, start)
        text = self._h.mm[start + _LEN.size : start + _LEN.size + length]
        d = self._decoder_index.get(text)
        if d is None and len(self._decoder_index) >= _MAX_DECODERS:
            return -1  # checked before compiling: past the cap every new text would pay for it
        decoder = decoder_of(text) if d is None else None  # compiled outside the lock
        with self._h.count_lock:
            d = self._decoder_index.get(text)
            if d is None:
                if decoder is None or len(self._decoder_index) >= _MAX_DECODERS:
                    return -1  # another thread filled the last places meanwhile
                d = self._decoder_index[text] = self._add_decoder(decoder)
            assert self._decoder_ids is not None
            self._decoder_ids[index] = d
        return d

    def _leaf_views(
        self, bases: list[int], leaves: tuple[Leaf, ...]
    ) -> list[list[torch.Tensor]] | None:
        """Each leaf of the blobs at ``bases`` as views into the arena; None if one can't be.

        The views are inference tensors: made outside inference mode, each view would carry
        autograd's view record (a few heap allocations a sample). Without them each forked
        worker copies ~0.7 MiB less of its parent's heap (issue 38's 4-worker figure 1.28x ->
        1.18x); a batch is read and stacked 1.04x faster. Only ``default_collate`` sees them,
        and the batch it stacks from them is an ordinary tensor (``tests/cache``).
        """
        with torch.inference_mode():
            flats = self._flats
            if flats is None or flats[0] is not self._bytes:  # first use, or a new mapping
                whole = torch.from_numpy(self._bytes)
                flats = self._flats = (self._bytes, {torch.uint8: whole})
            columns = []
            for leaf in leaves:
                dtype = leaf[2]
                flat = flats[1].get(dtype)
                if flat is None:
                    usable_bytes = len(self._bytes) // dtype.itemsize * dtype.itemsize
                    flat = flats[1][dtype] = flats[1][torch.uint8][:usable_bytes].view(dtype)
                column = leaf_views(flat, bases, leaf)
                if column is None:
                    return None
                columns.append(column)
            return columns
