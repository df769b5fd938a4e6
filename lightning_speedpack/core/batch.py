"""Read a batch's size and bytes without touching its values, for the batch types people use.

Reading ``tensor.shape`` is metadata only, so nothing here synchronises with a device.

What a batch's size is, by type (the first that applies):

==========================================  ==========================================
batch                                       size (unit)
==========================================  ==========================================
PyTorch Geometric ``Batch`` (``DataBatch``)  ``num_graphs`` (graphs)
an object with an int ``batch_size``        that value (samples; PyG's ``NeighborLoader``
                                            gives seed nodes)
``TensorDict`` (``batch_size`` a Size)      its first batch dimension (samples)
mappings, sequences, named tuples,          the first dimension of the first tensor
dataclasses                                 found depth-first (samples)
==========================================  ==========================================

When none applies, :class:`BatchSizer` (what the tools use during a fit) falls back on the
``batch_size=`` the LightningModule gave ``self.log`` in the step
(:mod:`lightning_speedpack.core.logged_batch_size`), and else reports the size as not measured,
once, with the argument that supplies it; it raises only when asked to be strict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "BatchSize",
    "BatchSizeError",
    "BatchSizer",
    "batch_bytes",
    "batch_tensors",
    "find_first_tensor",
    "infer_batch_size",
    "read_batch_size",
    "unsized_reason",
]

#: The unit of a batch whose size could not be read: the run's rates count batches.
BATCHES = "batches"


class BatchSizeError(TypeError):
    """Raised when a batch's size cannot be inferred from its structure."""


@dataclass(frozen=True)
class BatchSize:
    """A batch's size, what it counts and where it was read.

    Attributes:
        n: the size.
        unit: what ``n`` counts: ``"samples"``, ``"graphs"``, ``"nodes"``.
        source: where it was read, for the report (``"Batch.num_graphs"``).
    """

    n: int
    unit: str = "samples"
    source: str = "the first dimension of the first tensor"


def _is_pyg(batch: Any) -> bool:
    # PyG's BaseData (Data, HeteroData, Batch) without importing torch_geometric.
    return type(batch).__module__.startswith("torch_geometric.") or any(
        c.__module__.startswith("torch_geometric.") for c in type(batch).__mro__[1:]
    )


def _fields(batch: Any) -> Sequence[Any] | None:
    """The values a batch holds, in order, or None for a leaf."""
    if isinstance(batch, Mapping):
        return list(batch.values())
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        return batch
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    if _is_pyg(batch) and callable(getattr(batch, "to_dict", None)):
        return list(batch.to_dict().values())  # PyG keeps its tensors as attributes
    return None


def find_first_tensor(batch: Any) -> torch.Tensor | None:
    """The first tensor found depth-first in ``batch``, or None.

    Mappings, sequences (named tuples too), dataclasses and PyG ``Data``/``Batch`` are walked.

    Example:
        >>> find_first_tensor({"meta": "id", "x": [torch.zeros(3, 2)]}).shape
        torch.Size([3, 2])
    """
    if isinstance(batch, torch.Tensor):
        return batch
    values = _fields(batch)
    for value in values or ():
        found = find_first_tensor(value)
        if found is not None:
            return found
    return None


def batch_tensors(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``batch``: nested mappings, sequences, dataclasses, PyG ``Data``/``Batch``.

    Example:
        >>> [t.shape[0] for t in batch_tensors({"x": torch.zeros(4), "y": (torch.zeros(2),)})]
        [4, 2]
    """
    if isinstance(batch, torch.Tensor):
        yield batch
        return
    for value in _fields(batch) or ():
        yield from batch_tensors(value)


def batch_bytes(batch: Any) -> int:
    """Bytes of every tensor in ``batch`` (what a copy to the device moves).

    Shapes and dtypes only: reading them never synchronises with the device.

    Example:
        >>> batch_bytes({"x": torch.zeros(4, 3), "meta": [torch.zeros(2, dtype=torch.int64), "id"]})
        64
    """
    return sum(t.nelement() * t.element_size() for t in batch_tensors(batch))


def _size_attribute(batch: Any) -> BatchSize | None:
    """The size an object says itself: PyG's ``num_graphs``, a ``batch_size`` attribute."""
    if isinstance(batch, (torch.Tensor, str, bytes, Sequence)):
        return None
    if _is_pyg(batch):
        graphs = getattr(batch, "num_graphs", None)
        if isinstance(graphs, int):
            return BatchSize(graphs, "graphs", f"{type(batch).__name__}.num_graphs")
        seeds = getattr(batch, "batch_size", None)  # NeighborLoader: the seed nodes
        if isinstance(seeds, int):
            return BatchSize(seeds, "nodes", f"{type(batch).__name__}.batch_size (seed nodes)")
        return None
    size = getattr(batch, "batch_size", None)
    if isinstance(size, bool):
        return None
    if isinstance(size, int):
        return BatchSize(size, "samples", f"{type(batch).__name__}.batch_size")
    if isinstance(size, torch.Size) and len(size) > 0:  # TensorDict
        return BatchSize(int(size[0]), "samples", f"{type(batch).__name__}.batch_size[0]")
    return None


def read_batch_size(batch: Any) -> BatchSize:
    """The size of ``batch``, its unit and where it was read.

    Raises:
        BatchSizeError: nothing in the batch says its size; the message says which argument
            supplies it.

    Example:
        >>> read_batch_size((torch.zeros(8, 3), torch.zeros(8)))
        BatchSize(n=8, unit='samples', source='the first dimension of the first tensor')
    """
    size = _first_size(batch)
    if size is None:
        raise BatchSizeError(unsized_reason(batch))
    return size


def _first_size(batch: Any) -> BatchSize | None:
    """Depth-first: the first object that says its size, or the first tensor with a dimension."""
    if isinstance(batch, torch.Tensor):
        return BatchSize(int(batch.shape[0])) if batch.ndim else None
    said = _size_attribute(batch)
    if said is not None:
        return said
    for value in _fields(batch) or ():
        found = _first_size(value)
        if found is not None:
            return found
    return None


def infer_batch_size(batch: Any) -> int:
    """The size of ``batch`` (see :func:`read_batch_size`).

    Raises:
        BatchSizeError: the batch says no size and holds no tensor with a first dimension.

    Example:
        >>> infer_batch_size({"x": torch.zeros(5, 2)})
        5
    """
    return read_batch_size(batch).n


def unsized_reason(batch: Any) -> str:
    """Why a batch's size cannot be read, and the arguments that supply it."""
    kind = type(batch)
    return (
        f"cannot infer the batch size of a {kind.__name__} ({kind.__module__}): it has no "
        "`batch_size`/`num_graphs` and no tensor with a first dimension; log it with "
        "`self.log(..., batch_size=n)` in training_step, or pass "
        "`ThroughputLogger(batch_size_fn=lambda batch: ...)`"
    )


class BatchSizer:
    """Reads the size of each batch of one fit, the same way each time; never raises by default.

    The common ``(inputs, targets)`` tuple of tensors is sized in one C call. A batch whose
    size no rule reads falls back on ``logged()`` (the ``batch_size=`` the step gave
    ``self.log``); when that is None too, the batch counts as one, :attr:`unit` becomes
    ``"batches"`` and :attr:`not_measured` says why, once, with the argument that supplies the
    size.

    Args:
        strict: raise :class:`BatchSizeError` at the first batch whose size cannot be read.
        logged: returns the ``batch_size`` the LightningModule last logged, or None.

    Example:
        >>> sizer = BatchSizer()
        >>> sizer((torch.zeros(8, 3), torch.zeros(8))), sizer.unit
        (8, 'samples')
        >>> sizer(object()), sizer.unit, sizer.not_measured is not None
        (1, 'batches', True)
    """

    def __init__(self, *, strict: bool = False, logged: Callable[[], int | None] | None = None):
        self.strict = strict
        self._logged = logged
        self.unit = "samples"
        self.source = "the first dimension of the first tensor"
        #: why some batch's size was not measured (None: every batch was sized)
        self.not_measured: str | None = None
        self.unsized_batches = 0

    def __call__(self, batch: Any) -> int:
        """The size of ``batch``; 1 when it cannot be read (unless strict)."""
        # Fast path: `size(0)` is one C call (`ndim` + `shape[0]` + `int()` are three).
        first = batch[0] if type(batch) in (tuple, list) and batch else batch
        if type(first) is torch.Tensor and first.ndim:
            return first.size(0)
        return self._slow(batch)

    def _slow(self, batch: Any) -> int:
        try:
            size = read_batch_size(batch)
        except BatchSizeError:
            logged = self._logged() if self._logged is not None else None
            if logged is not None:
                size = BatchSize(int(logged), "samples", "self.log(..., batch_size=...)")
            elif self.strict:
                raise
            else:
                return self._unsized(batch)
        if self.unsized_batches == 0:
            self.unit, self.source = size.unit, size.source
        return size.n

    def _unsized(self, batch: Any) -> int:
        # A batch that cannot be sized counts as one: the run's rates then count batches.
        self.unsized_batches += 1
        if self.not_measured is None:
            self.not_measured = unsized_reason(batch)
        self.unit, self.source = BATCHES, "not measured"
        return 1
