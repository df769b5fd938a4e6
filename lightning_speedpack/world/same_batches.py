"""Batches that repeat: the same batches on several ranks, or the same batch twice in an epoch.

``world/same-batches``. Lightning splits a map-style dataset between the ranks with a
``DistributedSampler``. An ``IterableDataset`` it leaves alone, and so it does a loader given
``use_distributed_sampler=False`` and a sampler of the user's: then every rank reads the same
samples in the same order. Nothing fails and Lightning does not warn (2.6.6), but N ranks do the
work of one: each epoch takes as long as on one rank, and the gradient all-reduce averages N
copies of one gradient. The same happens across nodes to a stream sharded by ``LOCAL_RANK``
instead of the global rank.

``data/repeated-batches``. Each DataLoader worker runs its own copy of an ``IterableDataset``:
a stream that does not shard itself by ``get_worker_info()`` yields every sample once per
worker, so the batches come in runs of equal ones (0 and 1, 2 and 3 with two workers) and an
epoch holds each sample ``num_workers`` times. PyTorch documents it; nothing warns.

Each rank keeps a print of its first :data:`BATCHES` training batches in each of its first
:data:`EPOCHS` epochs, and of the batches at :data:`LATER` (:class:`BatchPrints`): up to
:data:`TENSORS` tensors a batch, each its shape, dtype and :data:`SAMPLED` elements spread over
it, cloned where the batch is (no host-device sync during the fit). The prints are read once, at
the end of the fit, into short digests (the only copies to the host). A rank looks for equal
prints inside an epoch (:func:`repeated_in_epoch`); under DDP the digests travel in the rank's
payload and rank 0 groups the ranks whose digests agree on every batch both kept
(:func:`find_same_batches`). Prints that are all alike (constant data, or more workers reading
the whole stream than the last print's index) tell nothing and are passed over. The later prints
are for the many workers: with 8 of them each reading the whole stream, the first 8 batches are
all one batch, and batch 16 is another (32 differs beyond 16 workers, 64 beyond 32).

The prints of CUDA batches (kept on the GPU, copied at fit end) were exercised on the CPU only.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping
from typing import Any

import torch

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.nested import leaves

__all__ = [
    "BATCHES",
    "EPOCHS",
    "LATER",
    "BatchPrints",
    "data_parallel",
    "find_same_batches",
    "repeated_batches_finding",
    "repeated_in_epoch",
    "same_batches_finding",
]

#: The batches printed at the start of each epoch, and the epochs printed.
BATCHES = 8
EPOCHS = 4
#: Batches further into an epoch printed too (see the module's docstring).
LATER = (16, 32, 64)
#: The tensors printed in a batch, and the elements kept of each (spread over it).
TENSORS = 4
SAMPLED = 64

_FIX = (
    "split the data by the global rank: a map-style Dataset gets Lightning's DistributedSampler "
    "(use_distributed_sampler=True, the default, with no sampler of your own); an "
    "IterableDataset must shard itself in __iter__ by the global rank (trainer.global_rank, or "
    "torch.distributed.get_rank() and get_world_size(); with workers, get_worker_info() too), "
    "not by LOCAL_RANK; with use_distributed_sampler=False give each rank "
    "DistributedSampler(dataset, num_replicas=world_size, rank=global_rank)"
)


def data_parallel(strategy: Any) -> bool:
    """Whether each rank of ``strategy`` should see its own data (not a tensor-parallel mesh).

    Lightning's ``ModelParallelStrategy`` gives the ranks of one tensor-parallel group the same
    batches on purpose; every other multi-process strategy (DDP, FSDP, DeepSpeed) splits them.

    Example:
        >>> class ModelParallelStrategy: ...
        >>> data_parallel(ModelParallelStrategy()), data_parallel(object())
        (False, True)
    """
    return not any(c.__name__ == "ModelParallelStrategy" for c in type(strategy).__mro__)


def _sample(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach()
    flat = flat.view(-1) if flat.is_contiguous() else flat[:1].contiguous().view(-1)
    step = max(1, flat.numel() // SAMPLED)
    return flat[::step][:SAMPLED].clone()  # where the batch is: no copy to the host yet


class BatchPrints:
    """A print of the first batches of each epoch, digested at the end of the fit.

    Example:
        >>> prints = BatchPrints()
        >>> for epoch in range(2):
        ...     for i in range(10):
        ...         if prints.wants(epoch, i):
        ...             prints.take(epoch, i, {"x": torch.full((4, 2), float(i))})
        >>> digests = prints.digests()
        >>> len(digests), digests["0:0"] == digests["1:0"] != digests["0:1"]
        (16, True)
        >>> prints.wants(0, 16), prints.wants(0, 17), prints.wants(EPOCHS, 16)
        (True, False, False)
    """

    def __init__(self) -> None:
        self._kept: dict[str, list[tuple[str, torch.Tensor]]] = {}

    def wants(self, epoch: int, batch_idx: int) -> bool:
        """Whether the batch ``batch_idx`` of ``epoch`` is one to print."""
        return epoch < EPOCHS and (batch_idx < BATCHES or batch_idx in LATER)

    def next_wanted(self, epoch: int, batch_idx: int) -> int:
        """The first batch of ``epoch`` from ``batch_idx`` on to print (-1: none left).

        Example:
            >>> prints = BatchPrints()
            >>> prints.next_wanted(0, 0), prints.next_wanted(0, 8), prints.next_wanted(0, 65)
            (0, 16, -1)
            >>> prints.next_wanted(EPOCHS, 0)
            -1
        """
        if epoch >= EPOCHS:
            return -1
        if batch_idx < BATCHES:
            return batch_idx
        return next((b for b in LATER if b >= batch_idx), -1)

    def take(self, epoch: int, batch_idx: int, batch: Any) -> None:
        """Keep the print of ``batch`` (its tensors' shapes, dtypes and sampled elements)."""
        tensors = [
            t
            for t in leaves(batch, torch.Tensor)
            if t.layout == torch.strided and not t.is_meta and t.numel()
        ]
        parts = []
        for t in tensors[:TENSORS]:
            try:  # a tensor it cannot sample (a nested or a subclass's) is left out, never fatal
                parts.append((f"{tuple(t.shape)}{t.dtype}", _sample(t)))
            except Exception:  # the job must not fail for its print
                continue
        self._kept[f"{epoch}:{batch_idx}"] = parts

    def digests(self) -> dict[str, str]:
        """``{"epoch:batch": digest}``: the prints read to the host (once, at the end of fit)."""
        out = {}
        for key, parts in self._kept.items():
            digest = hashlib.blake2b(digest_size=8)
            for meta, sample in parts:
                digest.update(meta.encode())
                with contextlib.suppress(Exception):  # a dtype without a byte view: its meta
                    digest.update(sample.contiguous().view(torch.uint8).cpu().numpy().tobytes())
            out[key] = digest.hexdigest()
        return out


def _order(key: str) -> tuple[int, ...]:
    return tuple(int(part) for part in key.split(":"))


def find_same_batches(prints: Mapping[int, Mapping[str, str]]) -> dict[str, Any] | None:
    """The groups of ranks that trained on the same batches (None: every rank its own).

    ``prints``: each rank's :meth:`BatchPrints.digests`. Only the batches every rank printed
    are compared, at least two of them; a group whose batches were all alike is passed over.

    Example:
        >>> a, b = {"0:0": "x", "0:1": "y"}, {"0:0": "z", "0:1": "w"}
        >>> find_same_batches({0: a, 1: a, 2: b, 3: b})
        {'groups': [[0, 1], [2, 3]], 'world': 4, 'batches': 2, 'distinct': 2}
        >>> find_same_batches({0: a, 1: b}) is None
        True
    """
    ranks = sorted(prints)
    if len(ranks) < 2:
        return None
    common = sorted(set.intersection(*(set(prints[r]) for r in ranks)), key=_order)
    if len(common) < 2:
        return None
    by_print: dict[tuple[str, ...], list[int]] = {}
    for rank in ranks:
        by_print.setdefault(tuple(prints[rank][k] for k in common), []).append(rank)
    groups = [g for p, g in by_print.items() if len(g) > 1 and len(set(p)) > 1]
    if not groups:
        return None
    distinct = len(by_print)
    later = sorted({b for key in common if (b := _order(key)[1]) >= BATCHES})
    found = {"groups": groups, "world": len(ranks), "batches": len(common), "distinct": distinct}
    return {**found, "later": later} if later else found


def _ranks(group: list[int]) -> str:
    return ", ".join(str(r) for r in group[:-1]) + f" and {group[-1]}"


def same_batches_finding(same: Mapping[str, Any]) -> Finding:
    """The ``world/same-batches`` warning, its share the work the repeated ranks did again.

    Example:
        >>> f = same_batches_finding({"groups": [[0, 1]], "world": 2, "batches": 32,
        ...                           "distinct": 1})
        >>> print(f.message)
        every rank trained on the same batches (the first 8 of each epoch compared, 32 in all: the \
same on ranks 0 and 1): the data was not split between the ranks, so each one repeated the \
others' work: 2 ranks trained on the samples of 1
        >>> f.figures["wall_fraction"]
        0.5
    """
    groups = [list(g) for g in same["groups"]]
    world, distinct = int(same["world"]), int(same["distinct"])
    listed = "; ".join(f"ranks {_ranks(g)}" for g in groups)
    later = list(same.get("later") or [])
    also = (
        f" and {'batches ' + _ranks(later) if len(later) > 1 else f'batch {later[0]}'}"
        if later
        else ""
    )
    compared = (
        f"the first {BATCHES} of each epoch{also} compared, {same['batches']} in all: "
        f"the same on {listed}"
    )
    who = "every rank" if len(groups) == 1 and len(groups[0]) == world else "some ranks"
    message = (
        f"{who} trained on the same batches ({compared}): the data was not split between the "
        f"ranks, so each one repeated the others' work: {world} ranks trained on the samples "
        f"of {distinct}"
    )
    return Finding(
        "world",
        "same-batches",
        message,
        location="train_dataloader",
        figures={"wall_fraction": round(1.0 - distinct / world, 4), "groups": groups},
        severity="warning",
        fix=_FIX,
    )


_REPEATED_FIX = (
    "shard the stream by worker in its __iter__: info = torch.utils.data.get_worker_info(), "
    "then keep every info.num_workers-th item from info.id (under DDP, by the global rank too); "
    "a map-style Dataset needs none of this (the sampler deals each index once)"
)


def repeated_in_epoch(digests: Mapping[str, str]) -> dict[str, Any] | None:
    """The first epoch whose printed batches repeat, not all alike (None: none repeats).

    ``digests``: :meth:`BatchPrints.digests`. ``groups`` lists the batch indices with one print,
    ``printed`` the batches compared; ``head`` and ``head_distinct`` count the first
    consecutive ones and their distinct prints (what the repeated share is read from).

    Example:
        >>> two_workers = {"0:0": "a", "0:1": "a", "0:2": "b", "0:3": "b", "0:4": "c"}
        >>> r = repeated_in_epoch(two_workers)
        >>> r["groups"], r["head"], r["head_distinct"]
        ([[0, 1], [2, 3]], 5, 3)
        >>> repeated_in_epoch({"0:0": "a", "0:1": "a", "0:2": "a"}) is None  # all alike
        True
        >>> many = {**{f"0:{i}": "a" for i in range(8)}, "0:16": "b"}  # 8 workers or more
        >>> repeated_in_epoch(many)["groups"]
        [[0, 1, 2, 3, 4, 5, 6, 7]]
    """
    epochs: dict[int, dict[int, str]] = {}
    for key, digest in digests.items():
        epoch, batch = _order(key)
        epochs.setdefault(epoch, {})[batch] = digest
    for epoch in sorted(epochs):
        prints = epochs[epoch]
        by_print: dict[str, list[int]] = {}
        for batch in sorted(prints):
            by_print.setdefault(prints[batch], []).append(batch)
        groups = [g for g in by_print.values() if len(g) > 1]
        if groups and len(by_print) > 1:
            head = [prints[b] for b in sorted(prints) if b < BATCHES]
            return {
                "epoch": epoch,
                "groups": groups,
                "printed": sorted(prints),
                "distinct": len(by_print),
                "head": len(head),
                "head_distinct": len(set(head)),
            }
    return None


def _batches(group: list[int]) -> str:
    """Batch indices for a message: a run of three or more as a span."""
    if len(group) > 2 and group == list(range(group[0], group[-1] + 1)):
        return f"{group[0]} to {group[-1]}"
    return _ranks(group)


def _printed(printed: list[int]) -> str:
    head = [b for b in printed if b < BATCHES]
    later = [b for b in printed if b >= BATCHES]
    first = f"its first {len(head)} batches"
    return (
        first
        if not later
        else f"{first} and batches {_ranks(later) if len(later) > 1 else later[0]}"
    )


def repeated_batches_finding(repeated: Mapping[str, Any]) -> Finding:
    """The ``data/repeated-batches`` warning: an epoch that holds its batches more than once.

    The share of repeated work is read from the first batches (``1 - distinct/compared``
    there): with as many workers as those or more it is a floor (7/8 for 8 and beyond).

    Example:
        >>> f = repeated_batches_finding({"epoch": 0, "groups": [[0, 1], [2, 3]],
        ...                               "printed": [0, 1, 2, 3], "distinct": 2,
        ...                               "head": 4, "head_distinct": 2})
        >>> print(f.message)
        the same batch came more than once in epoch 0 (of its first 4 batches, only 2 \
differ: batches 0 and 1 are one; 2 and 3 too): a stream (IterableDataset) that every \
DataLoader worker reads whole yields each sample once per worker
        >>> f.figures["wall_fraction"]
        0.5
    """
    groups = [list(g) for g in repeated["groups"]]
    shown = "; ".join(
        _batches(g) + (" are one" if k == 0 else " too") for k, g in enumerate(groups[:4])
    )
    printed, distinct = list(repeated["printed"]), int(repeated["distinct"])
    message = (
        f"the same batch came more than once in epoch {repeated['epoch']} (of "
        f"{_printed(printed)}, only {distinct} differ: batches {shown}): a stream "
        "(IterableDataset) that every DataLoader worker reads whole yields each sample once per "
        "worker"
    )
    head, head_distinct = int(repeated["head"]), int(repeated["head_distinct"])
    return Finding(
        "data",
        "repeated-batches",
        message,
        location="train_dataloader",
        figures={"wall_fraction": round(1.0 - head_distinct / head, 4), "groups": groups},
        severity="warning",
        fix=_REPEATED_FIX,
    )
