"""The objects of one type inside nested collections.

A batch, ``training_step``'s outputs, the loaders ``train_dataloader()`` returns.
"""

from __future__ import annotations

from typing import Any, TypeVar

from lightning_utilities.core.apply_func import apply_to_collection

__all__ = ["leaves"]

T = TypeVar("T")


def leaves(obj: Any, kind: type[T]) -> list[T]:
    """Every ``kind`` in ``obj``, in order: ``obj`` itself, or inside its collections.

    Mappings, lists, tuples (named ones too) and dataclasses are walked, with Lightning's own
    ``apply_to_collection``.

    Example:
        >>> import torch
        >>> [t.tolist() for t in leaves({"x": [torch.ones(1), (torch.zeros(2),)], "n": 3},
        ...                              torch.Tensor)]
        [[1.0], [0.0, 0.0]]
        >>> leaves("not a collection", int)
        []
    """
    found: list[T] = []
    apply_to_collection(obj, kind, found.append)
    return found
