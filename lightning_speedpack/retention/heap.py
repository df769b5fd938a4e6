"""The costly, complete search: scan the heap for graph-carrying tensors, name who holds one.

:func:`heap_graph_tensors` finds every live tensor with a ``grad_fn`` (one pass over the
garbage collector's heap), and :func:`referrer_path` names who holds one by searching
referrers upwards, only to confirm and name a finding; the caller then walks the named root
forward every step (:mod:`~lightning_speedpack.retention.walk`).

Nothing here keeps a strong reference to a tensor after it returns.
"""

from __future__ import annotations

import gc
import sys
import time
import types
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from typing import Any

from torch import Tensor

from lightning_speedpack.retention.tags import _grad_fn
from lightning_speedpack.retention.walk import _isa, _subscript, module_display_name

__all__ = ["HolderPath", "estimated_scan_seconds", "heap_graph_tensors", "referrer_path"]


def heap_graph_tensors(exclude: Iterable[object] = ()) -> list[Tensor]:
    """Every live tensor that has a ``grad_fn`` (one ``gc.get_objects()`` pass: costly).

    The pass over the heap runs at C speed (types are mapped and filtered with ``map`` and
    ``itertools.compress``); its duration per allocated block is remembered for
    :func:`estimated_scan_seconds`.

    Args:
        exclude: tensors to leave out (e.g. the ones a forward walk already explained).
    """
    global _SECONDS_PER_BLOCK
    started = time.perf_counter()
    blocks = sys.getallocatedblocks()
    excluded = {id(t) for t in exclude}
    objects = gc.get_objects()
    kinds = list(map(type, objects))
    tensor_types = {cls for cls in set(kinds) if issubclass(cls, Tensor)}
    found = [
        t
        for t in compress(objects, map(tensor_types.__contains__, kinds))
        if id(t) not in excluded and _grad_fn(t) is not None
    ]
    del objects, kinds
    if blocks:
        _SECONDS_PER_BLOCK = (time.perf_counter() - started) / blocks
    return found


# The guess errs high, so that a budgeted first scan keeps to its budget: on this project's
# 2-core machine a scan took 149-185 ns a block (1.6-1.7M blocks with torch and Lightning
# loaded, idle; 2026-11-28). The former 60 ns let the doctor's end-of-fit scan, allowed 1% of
# the training time, take 4% of a loaded fit (0.74 s of 18.6 s).
_SECONDS_PER_BLOCK = 200e-9
"""Seconds a heap scan took per allocated block, last measured (an initial guess till then)."""


def estimated_scan_seconds() -> float:
    """What :func:`heap_graph_tensors` would cost now, in seconds, from the heap size.

    The heap's size is ``sys.getallocatedblocks()``; the rate is the last scan's in this
    process (a conservative guess before the first).
    """
    return sys.getallocatedblocks() * _SECONDS_PER_BLOCK


@dataclass
class _Edge:
    parent: Any
    label: str
    kind: str  # "item", "key", "attr", "dict", "cell", "closure"
    attr: str | None = None  # for "key": the key when it can be written as an attribute


_PACKAGE_DIR = str(Path(__file__).parents[1])  # the whole pack: its own frames are not holders


def _label_in(parent: Any, child: Any) -> _Edge | None:
    if _isa(parent, types.FunctionType):
        if parent.__closure__ is child:
            return _Edge(parent, ".<closure>", "closure")
        return None
    if _isa(parent, (list, tuple, deque)):
        for i, value in enumerate(parent):
            if value is child:
                return _Edge(parent, f"[{i}]", "item")
        return None
    if _isa(parent, dict):
        for key, value in list(parent.items()):
            if value is child:
                attr = key if _isa(key, str) and key.isidentifier() else None
                return _Edge(parent, _subscript(key), "key", attr)
        return None
    if _isa(parent, types.CellType):
        return _Edge(parent, "", "cell")
    if _isa(parent, (set, frozenset)):
        return _Edge(parent, "{...}", "item")
    if hasattr(parent, "__dict__"):
        try:
            attrs = vars(parent)
        except TypeError:
            return None
        if attrs is child:
            return _Edge(parent, "", "dict")
        for key, value in list(attrs.items()):
            if value is child:
                return _Edge(parent, f".{key}", "attr")
    return None


def _root_name(
    parent: Any, edge: _Edge, roots: Mapping[int, str], module_dicts: Mapping[int, types.ModuleType]
) -> tuple[str, Any] | None:
    if id(parent) in roots:
        return roots[id(parent)], parent
    if id(parent) in module_dicts and edge.kind == "key":
        edge.kind, edge.label = "attr", f".{edge.attr}" if edge.attr else edge.label
        module = module_dicts[id(parent)]
        return module_display_name(module), module
    if _isa(parent, types.FunctionType):
        owner = sys.modules.get(parent.__module__ or "")
        return f"{module_display_name(owner)}.{parent.__qualname__}", parent
    return None


@dataclass
class HolderPath:
    """Where :func:`referrer_path` found a tensor: the path and the root it starts from.

    ``root`` is the named root object, a module (for its globals) or a function (for its
    closure), so that a caller can walk it forward next time instead of searching again.
    """

    path: str
    root: Any


def referrer_path(
    target: Tensor,
    roots: Mapping[int, str],
    max_levels: int = 8,
    max_objects: int = 400,
    ignore: Iterable[object] = (),
) -> HolderPath | None:
    """Name who holds ``target`` by searching ``gc`` referrers upwards (costly; confirm only).

    One ``gc.get_referrers`` pass per level. A path ends at a named root (``roots`` maps
    ``id(obj)`` to a name: the LightningModule, callbacks), at a module's globals
    (``my_script.GLOBAL_LOSSES[0]``), at a function's closure
    (``my_script.make.<locals>.record.<closure>.history[0]``) or at a running frame's local.

    Args:
        target: the tensor to name.
        roots: ``id(obj) -> name`` of objects that end a path.
        max_levels: how many referrer levels to search.
        max_objects: how many objects to visit in all.
        ignore: objects that are not holders (the caller's own lists).

    Returns:
        The path from a root down to ``target`` and that root, or ``None`` when none was
        found within budget.
    """
    module_dicts = {id(m.__dict__): m for m in list(sys.modules.values()) if m is not None}
    ignored = {id(o) for o in ignore}
    down: dict[int, tuple[int, _Edge]] = {}  # id(parent) -> (id(child), edge), one per parent
    visited = {id(target)}
    frontier: list[Any] = [target]
    for _ in range(max_levels):
        if not frontier or len(visited) > max_objects:
            return None
        referrers = gc.get_referrers(*frontier)
        ignored.update((id(referrers), id(frontier), id(down), id(visited)))
        following: list[Any] = []
        for parent in referrers:
            if id(parent) in ignored or id(parent) in visited:
                continue
            if _isa(parent, types.FrameType):
                name = _frame_local(parent, frontier)
                if name is not None:
                    return HolderPath(_compose(name[0], name[1], down), None)
                continue
            for child in frontier:
                if not _refers(parent, child):
                    continue
                edge = _label_in(parent, child)
                if edge is None:
                    continue
                down[id(parent)] = (id(child), edge)
                ignored.add(id(edge))  # our own bookkeeping refers to ``parent`` too
                root = _root_name(parent, edge, roots, module_dicts)
                if root is not None:
                    return HolderPath(_compose(root[0], parent, down), root[1])
                visited.add(id(parent))
                following.append(parent)
                break
        del referrers
        frontier = following
    return None


def _frame_local(frame: types.FrameType, frontier: list[Any]) -> tuple[str, Any] | None:
    if frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        return None
    for child in frontier:
        for name, value in list(frame.f_locals.items()):
            if value is child:
                return f"<local {name!r} in {frame.f_code.co_name}()>", child
    return None


def _refers(parent: Any, child: Any) -> bool:
    try:
        return any(r is child for r in gc.get_referents(parent))
    except Exception:  # pragma: no cover - defensive
        return False


def _compose(root_name: str, start: Any, down: Mapping[int, tuple[int, _Edge]]) -> str:
    # ``down`` maps each visited parent to the child it was reached from; walk from ``start``.
    parts = [root_name]
    current = id(start)
    after_dict = False
    closure_fn: Any = None
    for _ in range(len(down) + 1):
        step = down.get(current)
        if step is None:
            break
        child_id, edge = step
        if edge.kind == "dict":
            after_dict = True
        elif edge.kind == "closure":
            parts.append(edge.label)
            closure_fn = edge.parent
        elif closure_fn is not None and edge.kind == "item":
            index = int(edge.label[1:-1])
            parts.append(f".{closure_fn.__code__.co_freevars[index]}")
            closure_fn = None
        elif edge.kind == "key" and after_dict and edge.attr:
            parts.append(f".{edge.attr}")
        elif edge.kind != "cell":
            parts.append(edge.label)
        if edge.kind != "dict":
            after_dict = False
        current = child_id
    return "".join(parts)
