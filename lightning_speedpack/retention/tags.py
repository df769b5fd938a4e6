"""Tagging autograd graphs with the step (and fit) they were made in.

A graph met again in a later step is a graph something kept alive. :func:`tag_graph` writes
``(run token, step, back-propagated)`` into ``grad_fn.metadata`` (a dict that lives as long
as the node and survives ``backward``); :func:`graph_step` reads it back, tagging a graph
seen for the first time. A graph made before the fit started belongs to no fit: the autograd
engine numbers the nodes it creates (per thread), so :func:`next_sequence_nr` at train start
and ``first_seq`` later tell such graphs apart without scanning the heap.

Nothing here keeps a reference to a tensor after it returns.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any, cast

import torch
from torch import Tensor

__all__ = [
    "STEP_KEY",
    "UNNAMED_KEY",
    "graph_step",
    "is_retained",
    "is_unnameable",
    "mark_foreign",
    "mark_unnameable",
    "new_run_token",
    "next_sequence_nr",
    "tag_graph",
]

STEP_KEY = "speedpack_step"
"""``grad_fn.metadata`` key: ``(run token, batch made or first seen in, back-propagated)``."""
UNNAMED_KEY = "speedpack_unnamed"
"""``grad_fn.metadata`` key: ``True`` once a referrer search failed to name the holder."""
_FOREIGN = (0, -1, False)  # the tag of a graph that belongs to no fit


def _metadata(node: Any) -> dict[str, Any]:
    # ``Node.metadata`` is a property returning a dict that lives as long as the node.
    return cast(dict[str, Any], node.metadata)


def _grad_fn(tensor: Tensor) -> Any:
    # Exotic tensor subclasses (fake, functional, distributed) may refuse the attribute.
    try:
        return tensor.grad_fn
    except Exception:
        return None


def new_run_token() -> int:
    """A token unique in this process (from 1), stamped into tags so fits ignore each other."""
    return next(_RUN_TOKENS)


_RUN_TOKENS = itertools.count(1)


def _sequence_nr(node: Any) -> int | None:
    try:
        return int(node._sequence_nr())
    except Exception:  # pragma: no cover - a node type without a sequence number
        return None


def next_sequence_nr() -> int | None:
    """The sequence number the autograd engine gives the next node made on this thread.

    Nodes are numbered in creation order per thread, so a graph whose root has a smaller
    number was made before this call. ``None`` when this torch does not expose the numbers.

    Example:
        >>> start = next_sequence_nr()
        >>> x = torch.ones(2, requires_grad=True)
        >>> (x * 2).grad_fn._sequence_nr() >= start
        True
    """
    probe = torch.zeros((), requires_grad=True)
    with torch.enable_grad():
        node = (probe * 1).grad_fn
    return None if node is None else _sequence_nr(node)


def tag_graph(
    tensor: Tensor,
    step: int,
    run: int = 0,
    *,
    backward: bool = False,
    depth: int = 1,
    max_nodes: int = 4,
) -> None:
    """Tag ``tensor``'s graph root and its nearest nodes with ``(run, step)`` (earliest wins).

    Args:
        tensor: a tensor, possibly without ``grad_fn`` (then nothing happens).
        step: the training batch the graph belongs to.
        run: the fit's token (see :func:`new_run_token`).
        backward: also mark the nodes as back-propagated (from ``on_before_backward``).
        depth: how many edges below the root to tag (Lightning divides the user's loss by the
            accumulation factor, so the user's own loss node is one edge below the root).
        max_nodes: at most this many nodes are tagged.
    """
    root = tensor.grad_fn
    if root is None:
        return
    frontier = [root]
    seen = 0
    for level in range(depth + 1):
        following: list[Any] = []
        for node in frontier:
            if seen >= max_nodes:
                return
            seen += 1
            meta = _metadata(node)
            tag = meta.get(STEP_KEY)
            # one write per node (a metadata write costs ~2 us): (run, step, back-propagated)
            if tag is None or tag[0] != run:
                meta[STEP_KEY] = (run, step, backward)
            elif backward and not tag[2]:
                meta[STEP_KEY] = (run, tag[1], True)
            if level < depth:
                following.extend(
                    n
                    for n, _ in node.next_functions
                    if n is not None and type(n).__name__ != "AccumulateGrad"
                )
        frontier = following


def graph_step(tensor: Tensor, step: int, run: int = 0, first_seq: int | None = None) -> int | None:
    """The step ``tensor``'s graph was created in during fit ``run``.

    An untagged graph is tagged ``step`` now (first seen); a graph tagged by another fit, or an
    untagged one whose root was made before ``first_seq`` (see :func:`next_sequence_nr`),
    returns ``None`` (not this fit's business).
    """
    grad_fn = tensor.grad_fn
    if grad_fn is None:
        return step
    meta = _metadata(grad_fn)
    tag = meta.get(STEP_KEY)
    if tag is None:
        if first_seq is not None:
            made = _sequence_nr(grad_fn)
            if made is not None and made < first_seq:
                meta[STEP_KEY] = _FOREIGN
                return None
        meta[STEP_KEY] = (run, step, False)
        return step
    if tag[0] != run:
        return None
    return int(tag[1])


def mark_foreign(tensors: Iterable[Tensor]) -> None:
    """Tag untagged graphs as belonging to no fit (run ``0``), so no fit ever reports them."""
    for tensor in tensors:
        grad_fn = _grad_fn(tensor)
        if grad_fn is not None:
            _metadata(grad_fn).setdefault(STEP_KEY, _FOREIGN)


def mark_unnameable(tensor: Tensor) -> None:
    """Remember (on the graph itself) that no referrer search could name its holder."""
    if tensor.grad_fn is not None:
        _metadata(tensor.grad_fn)[UNNAMED_KEY] = True


def is_unnameable(tensor: Tensor) -> bool:
    """Whether :func:`mark_unnameable` was called for this graph."""
    return tensor.grad_fn is not None and bool(_metadata(tensor.grad_fn).get(UNNAMED_KEY))


def is_retained(tensor: Tensor, step: int, run: int = 0, first_seq: int | None = None) -> bool:
    """Whether ``tensor``'s graph was made in an earlier step of fit ``run``."""
    made = graph_step(tensor, step, run, first_seq)
    return made is not None and made < step
