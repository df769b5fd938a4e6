"""Pure helpers for finding tensors that keep their autograd graph alive, and who holds them.

Used by :class:`lightning_speedpack.retention.callback.LossRetentionDetector`; nothing
here knows about Lightning hooks.

* :func:`tag_graph` writes the step a graph was created in into ``grad_fn.metadata`` (a dict
  that survives ``backward``), so a graph met again later is known to be from an earlier step.
* :func:`walk_containers` walks forward from named roots (the LightningModule, callbacks, a
  module's globals) through lists, dicts, tuples, deques, closures and plain objects, yielding
  every tensor that still has a ``grad_fn`` with a readable path such as ``model.hist["aux"][3]``.
* :func:`heap_graph_tensors` scans the garbage collector's heap for such tensors, and
  :func:`referrer_path` names who holds one by searching referrers upwards, only to confirm and
  name a finding.
* :func:`inspect_graphs` tells whether graphs were back-propagated (their saved tensors freed)
  and estimates the bytes their saved tensors keep alive.

Nothing here keeps a strong reference to a tensor after it returns.
"""

from __future__ import annotations

import gc
import itertools
import re
import sys
import types
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn

__all__ = [
    "STEP_KEY",
    "UNNAMED_KEY",
    "AttrRoot",
    "GraphInfo",
    "HolderPath",
    "ModuleCache",
    "container_globals",
    "graph_step",
    "heap_graph_tensors",
    "holder_of",
    "inspect_graphs",
    "is_retained",
    "is_unnameable",
    "mark_foreign",
    "mark_unnameable",
    "module_display_name",
    "module_globals_root",
    "new_run_token",
    "referrer_path",
    "tag_graph",
    "walk_containers",
]

STEP_KEY = "speedpack_step"
"""``grad_fn.metadata`` key: ``(run token, batch made or first seen in, back-propagated)``."""
UNNAMED_KEY = "speedpack_unnamed"
"""``grad_fn.metadata`` key: ``True`` once a referrer search failed to name the holder."""

_HEAD = 8  # items looked at from the start of a long container
_TAIL = 56  # ... and from its end, where a leak appends
_SKIP_PREFIXES = (
    "torch.",
    "pytorch_lightning.",
    "lightning.",
    "lightning_fabric.",
    "numpy.",
    "pandas.",
    "PIL.",
    "matplotlib.",
    "wandb.",
    "logging",
    "threading",
    "multiprocessing",
    "concurrent.",
)
_SKIP_TYPES: tuple[type, ...] = (
    type,
    types.ModuleType,
    types.BuiltinFunctionType,
    types.MethodType,
    str,
    bytes,
    bytearray,
    int,
    float,
    complex,
    bool,
    range,
    memoryview,
    torch.optim.Optimizer,
    torch.device,
    torch.dtype,
)


# --------------------------------------------------------------------------- tagging


def _metadata(node: Any) -> dict[str, Any]:
    # ``Node.metadata`` is a property returning a dict that lives as long as the node.
    return cast(dict[str, Any], node.metadata)


def new_run_token() -> int:
    """A token unique in this process (from 1), stamped into tags so fits ignore each other."""
    return next(_RUN_TOKENS)


_RUN_TOKENS = itertools.count(1)


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


def graph_step(tensor: Tensor, step: int, run: int = 0) -> int | None:
    """The step ``tensor``'s graph was created in during fit ``run``.

    An untagged graph is tagged ``step`` now (first seen); a graph tagged by another fit
    returns ``None`` (not this fit's business).
    """
    grad_fn = tensor.grad_fn
    if grad_fn is None:
        return step
    meta = _metadata(grad_fn)
    tag = meta.get(STEP_KEY)
    if tag is None:
        meta[STEP_KEY] = (run, step, False)
        return step
    if tag[0] != run:
        return None
    return int(tag[1])


def mark_foreign(tensors: Iterable[Tensor]) -> None:
    """Tag untagged graphs as belonging to no fit (run ``0``), so no fit ever reports them.

    Call before a fit on what :func:`heap_graph_tensors` finds: graphs that were alive before
    the fit started are not its leaks.
    """
    for tensor in tensors:
        grad_fn = _grad_fn(tensor)
        if grad_fn is not None:
            _metadata(grad_fn).setdefault(STEP_KEY, (0, -1, False))


def mark_unnameable(tensor: Tensor) -> None:
    """Remember (on the graph itself) that no referrer search could name its holder."""
    if tensor.grad_fn is not None:
        _metadata(tensor.grad_fn)[UNNAMED_KEY] = True


def is_unnameable(tensor: Tensor) -> bool:
    """Whether :func:`mark_unnameable` was called for this graph."""
    return tensor.grad_fn is not None and bool(_metadata(tensor.grad_fn).get(UNNAMED_KEY))


def is_retained(tensor: Tensor, step: int, run: int = 0) -> bool:
    """Whether ``tensor``'s graph was made in an earlier step of fit ``run``."""
    made = graph_step(tensor, step, run)
    return made is not None and made < step


# --------------------------------------------------------------------------- forward walk


def _isa(obj: object, kinds: type | tuple[type, ...]) -> bool:
    # type() and not isinstance(): isinstance reads __class__, which some deprecated module
    # attributes (e.g. torch.distributed.reduce_op) turn into a FutureWarning.
    return issubclass(type(obj), kinds)


def _grad_fn(tensor: Tensor) -> Any:
    # Exotic tensor subclasses (fake, functional, distributed) may refuse the attribute.
    try:
        return tensor.grad_fn
    except Exception:
        return None


def _is_tensor(obj: object) -> bool:
    return issubclass(type(obj), Tensor)


def _capped_items(seq: Any, n: int) -> Iterator[tuple[int, Any]]:
    if n <= _HEAD + _TAIL:
        yield from enumerate(seq)
        return
    yield from enumerate(islice(seq, _HEAD))
    tail = list(islice(reversed(seq), _TAIL))
    for offset, item in enumerate(reversed(tail)):
        yield n - len(tail) + offset, item


def _dict_items(d: Mapping[Any, Any]) -> Iterator[tuple[Any, Any]]:
    n = len(d)
    if n <= _HEAD + _TAIL:
        yield from list(d.items())
        return
    keys = list(islice(d, _HEAD)) + list(reversed(list(islice(reversed(d), _TAIL))))  # type: ignore[call-overload]
    for key in keys:
        if key in d:
            yield key, d[key]


class AttrRoot(dict):  # type: ignore[type-arg]
    """A namespace root for :func:`walk_containers` whose entries read as ``.name``."""


def _subscript(key: object) -> str:
    if type(key) is str:
        return '["' + key.replace('"', '\\"') + '"]'
    return f"[{key!r}]"


_SKIP, _TENSOR, _SEQ, _ATTRS, _MAP, _USER_MODULE, _TORCH_MODULE, _FUNC, _SET, _PLAIN = range(10)
_KINDS: dict[type, int] = {}


def _kind(cls: type) -> int:
    # Classify each type once: the walk runs every step and must stay cheap.
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _classify(cls)
        _KINDS[cls] = kind
    return kind


def _classify(cls: type) -> int:
    module = getattr(cls, "__module__", "") or ""
    if issubclass(cls, Tensor):
        return _TENSOR
    if cls is type(None) or issubclass(cls, _SKIP_TYPES):
        return _SKIP
    if issubclass(cls, (list, tuple, deque)):
        return _SEQ
    if issubclass(cls, AttrRoot):
        return _ATTRS
    if issubclass(cls, Mapping):
        return _MAP
    if issubclass(cls, nn.Module):
        return _TORCH_MODULE if module.startswith("torch.") else _USER_MODULE
    if issubclass(cls, types.FunctionType):
        return _FUNC
    if issubclass(cls, (set, frozenset)):
        return _SET
    if module.startswith(_SKIP_PREFIXES) or module == "builtins":
        return _SKIP
    return _PLAIN


ModuleCache = dict[int, tuple[tuple[str, ...], tuple[str, ...]]]
"""``id(module) -> (attribute names to read, submodule names to enter)``; names, never objects."""


def _module_children(
    module: nn.Module, user_defined: bool, cache: ModuleCache | None
) -> Iterator[tuple[str, Any]]:
    names = None if cache is None else cache.get(id(module))
    if names is None:
        attrs = tuple(k for k in vars(module) if not k.startswith("_")) if user_defined else ()
        # a torch layer without submodules holds nothing but parameters and buffers
        subs = tuple(
            k
            for k, child in module._modules.items()
            if child is not None and (child._modules or _kind(type(child)) == _USER_MODULE)
        )
        names = (attrs, subs)
        if cache is not None:
            cache[id(module)] = names
    space = vars(module)
    for key in names[0]:
        if key in space:
            yield f".{key}", space[key]
    submodules = module._modules
    for key in names[1]:
        child = submodules.get(key)
        if child is not None:
            yield f".{key}", child


def _function_cells(fn: types.FunctionType) -> Iterator[tuple[str, Any]]:
    closure = fn.__closure__ or ()
    for name, cell in zip(fn.__code__.co_freevars, closure, strict=False):
        try:
            yield f".<closure>.{name}", cell.cell_contents
        except ValueError:  # an empty cell
            continue


def _children(
    obj: Any, kind: int, cache: ModuleCache | None, sample_long: bool = True
) -> Iterator[tuple[str, Any]]:
    if kind == _SEQ:
        items = _capped_items(obj, len(obj)) if sample_long else enumerate(list(obj))
        yield from ((f"[{i}]", v) for i, v in items)
    elif kind == _ATTRS:
        yield from (
            (f".{k}", v) for k, v in (_dict_items(obj) if sample_long else list(obj.items()))
        )
    elif kind == _MAP:
        pairs = _dict_items(obj) if sample_long else list(obj.items())
        yield from ((_subscript(k), v) for k, v in pairs)
    elif kind in (_USER_MODULE, _TORCH_MODULE):
        yield from _module_children(obj, kind == _USER_MODULE, cache)
    elif kind == _FUNC:
        yield from _function_cells(obj)
    elif kind == _SET:
        yield from ((f"{{#{i}}}", v) for i, v in enumerate(islice(obj, _HEAD + _TAIL)))
    elif kind == _PLAIN:
        try:
            attrs = vars(obj)
        except TypeError:  # no __dict__ (slots, C types)
            return
        yield from ((f".{k}", v) for k, v in list(attrs.items()))


def walk_containers(
    roots: Iterable[tuple[str, Any]],
    max_depth: int = 4,
    skip: Iterable[object] = (),
    module_cache: ModuleCache | None = None,
    max_objects: int = 5000,
    sample_long: bool = True,
) -> Iterator[tuple[str, Tensor]]:
    """Yield ``(path, tensor)`` for every tensor with a ``grad_fn`` reachable from ``roots``.

    Each root is ``(path, object)``; the object itself is depth 1. The walk descends lists,
    tuples, deques, sets, mappings, user-defined ``nn.Module`` attributes and submodules,
    closures of plain functions, and plain Python objects (not torch, Lightning or numpy
    objects, not classes or modules), up to ``max_depth`` levels. Long containers are sampled
    at both ends (where a leak appends) so the cost per step stays bounded. Parameters and
    buffers are never yielded (they have no ``grad_fn``).

    Args:
        roots: named starting objects.
        max_depth: how many container levels to descend.
        skip: objects never entered (the trainer, the detector itself).
        module_cache: remembers, per module, which attributes and submodules to look at, so
            that a walk every step does not re-read every module's ``__dict__``; the caller
            clears it now and then to see new attributes.
        max_objects: stop after entering this many objects (bounds the cost of a walk that
            meets a large user object graph; the heap scan still sees everything).
        sample_long: look at only both ends of long containers (the cheap per-step walk);
            False walks every item, so that counts reported after a deep check are exact.
    """
    seen: set[int] = {id(o) for o in skip}
    stack: list[tuple[str, Any, int]] = [(p, o, 1) for p, o in reversed(list(roots))]
    while stack:
        path, obj, depth = stack.pop()
        kind = _kind(type(obj))
        if kind == _TENSOR:
            if _grad_fn(obj) is not None:
                yield path, obj
            continue
        if kind == _SKIP or depth > max_depth or id(obj) in seen:
            continue
        if len(seen) >= max_objects:
            return
        seen.add(id(obj))
        try:
            children = [
                (path + label, child, depth + 1)
                for label, child in _children(obj, kind, module_cache, sample_long)
                if _kind(type(child)) != _SKIP
            ]
        except Exception:  # a container that cannot be iterated safely is skipped
            continue
        children.reverse()
        stack.extend(children)


def module_display_name(module: types.ModuleType | None) -> str:
    """A module's name for a path: its file stem when it runs as ``__main__``."""
    if module is None:
        return "<module>"
    name = module.__name__
    if name == "__main__":
        file = getattr(module, "__file__", None)
        if file:
            return Path(file).stem
    return name


def container_globals(module: types.ModuleType) -> tuple[str, ...]:
    """Names of ``module``'s globals that can hold graphs: containers, tensors, closures."""
    names = []
    for key, value in list(vars(module).items()):
        kind = _kind(type(value))
        if not key.startswith("__") and (
            kind in (_SEQ, _MAP, _SET, _TENSOR) or (kind == _FUNC and value.__closure__)
        ):
            names.append(key)
    return tuple(names)


def module_globals_root(
    module: types.ModuleType | None, names: Iterable[str] | None = None
) -> tuple[str, AttrRoot] | None:
    """``(display name, containers among its globals)`` of ``module``, as a walk root.

    Args:
        module: the module.
        names: the globals to include (default :func:`container_globals`); a caller may
            cache the names (never the values, which would keep them alive).
    """
    if module is None:
        return None
    space = vars(module)
    values = AttrRoot(
        (k, space[k]) for k in (container_globals(module) if names is None else names) if k in space
    )
    return module_display_name(module), values


_INT_SUBSCRIPT = re.compile(r"\[-?\d+\]")


def holder_of(path: str) -> str:
    """The holder of an element path: everything before the first integer subscript.

    ``model.losses[17]`` -> ``model.losses``; ``model.hist["aux"][3]`` -> ``model.hist["aux"]``;
    ``model.outs[2]["loss"]`` -> ``model.outs``.
    """
    match = _INT_SUBSCRIPT.search(path)
    return path if match is None else path[: match.start()]


# --------------------------------------------------------------------------- heap scan


def heap_graph_tensors(exclude: Iterable[object] = ()) -> list[Tensor]:
    """Every live tensor that has a ``grad_fn`` (one ``gc.get_objects()`` pass: costly).

    Args:
        exclude: tensors to leave out (e.g. the ones a forward walk already explained).
    """
    excluded = {id(t) for t in exclude}
    found = []
    for obj in gc.get_objects():
        if issubclass(type(obj), Tensor) and id(obj) not in excluded and _grad_fn(obj) is not None:
            found.append(obj)
    return found


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


# --------------------------------------------------------------------------- graph weight

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
                for saved in value if _isa(value, (tuple, list)) else (value,):
                    if not _is_tensor(saved) or saved.numel() <= 1:
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
