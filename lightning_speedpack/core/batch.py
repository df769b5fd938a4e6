"""Pure helpers that read a batch's size without touching its values.

Reading ``tensor.shape`` is metadata only, so these never synchronise with a device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["BatchSizeError", "find_first_tensor", "infer_batch_size"]


class BatchSizeError(TypeError):
    """Raised when a batch's size cannot be inferred from its structure."""


def find_first_tensor(batch: Any) -> torch.Tensor | None:
    """Return the first tensor found depth-first in ``batch`` (mapping or sequence), or None."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Mapping):
        values: Sequence[Any] = list(batch.values())
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        values = batch
    else:
        return None
    for value in values:
        found = find_first_tensor(value)
        if found is not None:
            return found
    return None


def infer_batch_size(batch: Any) -> int:
    """Return the first dimension of the first tensor in ``batch``.

    Raises:
        BatchSizeError: the batch holds no tensor with at least one dimension; pass a
            ``batch_size_fn`` that knows your batch's layout instead.
    """
    tensor = find_first_tensor(batch)
    if tensor is None or tensor.ndim == 0:
        raise BatchSizeError(
            f"cannot infer the batch size of a {type(batch).__name__}: no tensor with a first "
            "dimension was found in it; pass `batch_size_fn=lambda batch: ...` that returns it"
        )
    return int(tensor.shape[0])
