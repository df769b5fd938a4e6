"""How heavy retained graphs are: back-propagated or not, and the bytes they keep alive."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lightning_speedpack.retention.tags import STEP_KEY, _metadata

__all__ = ["GraphInfo", "inspect_graphs"]

_SAVED_ATTRS: dict[type, tuple[str, ...]] = {}


def _saved_attrs(node: Any) -> tuple[str, ...]:
    kind = type(node)
    names = _SAVED_ATTRS.get(kind)
    if names is None:
        names = tuple(a for a in dir(node) if a.startswith("_saved_"))
        _SAVED_ATTRS[kind] = names
    return names


@dataclass
class GraphInfo:
    """What :func:`inspect_graphs` found about a set of graphs."""

    backpropagated: bool
    est_bytes: int
    example_grad_fn: str


def inspect_graphs(tensors: Iterable[Tensor], max_nodes: int = 256) -> GraphInfo:
    """Whether the graphs were back-propagated, and the bytes their saved tensors keep alive.

    A graph counts as back-propagated when its root's tag says so (:func:`tag_graph` from
    ``on_before_backward``) or when the
    saved tensor nearest its root was freed by ``backward`` (reading it raises); an auxiliary
    head on a back-propagated trunk therefore counts as not back-propagated, since its own
    activations are kept. Scalars, and parameters (leaves requiring grad), are not
    counted as activations; storages are counted once.

    Args:
        tensors: graph-carrying tensors (they should share a holder).
        max_nodes: nodes visited per graph, to bound the cost.
    """
    storages: dict[int, int] = {}
    all_backpropagated = True
    example = ""
    any_graph = False
    for tensor in tensors:
        root = tensor.grad_fn
        if root is None:
            continue
        any_graph = True
        example = example or type(root).__name__
        # The node nearest the root that saved a tensor decides: freed means backward ran.
        tag = _metadata(root).get(STEP_KEY)
        freed: bool | None = True if tag is not None and tag[2] else None
        seen = {id(root)}
        queue = deque([root])
        visited = 0
        while queue and visited < max_nodes:
            node = queue.popleft()
            visited += 1
            for name in _saved_attrs(node):
                try:
                    value = getattr(node, name)
                except RuntimeError:
                    freed = True if freed is None else freed
                    continue
                except Exception:  # pragma: no cover - exotic nodes
                    continue
                for saved in value if issubclass(type(value), (tuple, list)) else (value,):
                    if not issubclass(type(saved), Tensor) or saved.numel() <= 1:
                        continue  # a wrapped scalar (``loss * 0.5``) is no activation
                    freed = False if freed is None else freed
                    if saved.is_leaf and saved.requires_grad:
                        continue  # a parameter: alive anyway
                    try:
                        storage = saved.untyped_storage()
                        storages[storage.data_ptr()] = storage.nbytes()
                    except Exception:  # pragma: no cover - tensors without storage
                        continue
            for child, _ in node.next_functions:
                if child is not None and id(child) not in seen:
                    seen.add(id(child))
                    queue.append(child)
        all_backpropagated = all_backpropagated and bool(freed)
    return GraphInfo(
        backpropagated=all_backpropagated and any_graph,
        est_bytes=sum(storages.values()),
        example_grad_fn=example,
    )
