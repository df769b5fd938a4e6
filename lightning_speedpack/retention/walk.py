"""The cheap forward walk: from named roots to the graph-carrying tensors they hold.

:func:`walk_containers` walks forward from named roots (the LightningModule, callbacks, a
module's globals) through lists, dicts, tuples, deques, closures and plain objects, yielding
every tensor that still has a ``grad_fn`` with a readable path such as ``model.hist["aux"][3]``;
:func:`holder_of` names the container that holds such a tensor. It runs every step, so it is
bounded: long containers are sampled at both ends, each root enters a bounded number of
objects, and each type is classified once.

:func:`module_globals_root` turns a module's globals into a root, and
:func:`defining_modules` finds the modules whose globals are worth walking: those that define
the classes of the given objects (the LightningModule, the datamodule, the callbacks).
"""

from __future__ import annotations

import re
import sys
import types
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lightning_speedpack.retention.tags import _grad_fn

__all__ = [
    "AttrRoot",
    "ModuleCache",
    "container_globals",
    "defining_modules",
    "holder_of",
    "module_display_name",
    "module_globals_root",
    "walk_containers",
]

# Items looked at from the start of a long container, and from its end, where a leak appends
# (one a step: the newest few are enough to see it grow). 8 + 56 made the walk of a datamodule
# holding 500k small records 390 us a step, 1.024x a 16 ms step; 4 + 28: 290 us, 1.018x.
_HEAD = 4
_TAIL = 28
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
    # The pack's own objects (its wrapper of the module's ``log``, a callback's state) hold no
    # graph of the user's; its walk roots (``AttrRoot``) are classified before this.
    __name__.split(".", 1)[0] + ".",
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


def _isa(obj: object, kinds: type | tuple[type, ...]) -> bool:
    # type() and not isinstance(): isinstance reads __class__, which some deprecated module
    # attributes (e.g. torch.distributed.reduce_op) turn into a FutureWarning.
    return issubclass(type(obj), kinds)


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
    # typing: annotations (a wrapped function's ``__annotations__``), never a tensor
    if module.startswith(_SKIP_PREFIXES) or module in ("builtins", "typing"):
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
        max_objects: enter at most this many objects from each root (bounds the cost of a
            walk that meets a large user object graph, and keeps one large root from hiding
            the others; the heap scan still sees everything).
        sample_long: look at only both ends of long containers (the cheap per-step walk);
            False walks every item, so that counts reported after a deep check are exact.
    """
    seen: set[int] = {id(o) for o in skip}
    for root in list(roots):
        yield from _walk_root(root, max_depth, seen, module_cache, max_objects, sample_long)


def _walk_root(
    root: tuple[str, Any],
    max_depth: int,
    seen: set[int],
    module_cache: ModuleCache | None,
    max_objects: int,
    sample_long: bool,
) -> Iterator[tuple[str, Tensor]]:
    entered = 0
    stack: list[tuple[str, Any, int]] = [(root[0], root[1], 1)]
    while stack:
        path, obj, depth = stack.pop()
        kind = _kind(type(obj))
        if kind == _TENSOR:
            if _grad_fn(obj) is not None:
                yield path, obj
            continue
        if kind == _SKIP or depth > max_depth or id(obj) in seen:
            continue
        if entered >= max_objects:
            return
        entered += 1
        seen.add(id(obj))
        try:
            children = _listed_children(
                obj, kind, path, depth, module_cache, sample_long, max_objects - entered
            )
        except Exception:  # a container that cannot be iterated safely is skipped
            continue
        children.reverse()
        stack.extend(children)


def _listed_children(
    obj: Any,
    kind: int,
    path: str,
    depth: int,
    module_cache: ModuleCache | None,
    sample_long: bool,
    budget: int,
) -> list[tuple[str, Any, int]]:
    """The children to visit, tensors all, containers no more than can still be entered.

    An exact walk (``sample_long=False``) of a datamodule holding a million records would
    otherwise list every record only to enter ``budget`` of them: listing stops there.
    """
    children: list[tuple[str, Any, int]] = []
    containers = 0
    for label, child in _children(obj, kind, module_cache, sample_long):
        child_kind = _kind(type(child))
        if child_kind == _SKIP:
            continue
        if child_kind != _TENSOR:
            containers += 1
            if containers > budget:
                break
        children.append((path + label, child, depth + 1))
    return children


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


_OWN_PREFIX = __name__.split(".", 1)[0] + "."


def defining_modules(objects: Iterable[object]) -> list[str]:
    """Names of the modules that define the classes of ``objects`` (their whole MRO).

    Torch's, Lightning's, numpy's, the standard library's and this pack's modules are left
    out: their globals hold no user's graphs. ``__main__`` is not added here.

    Example:
        >>> from collections import OrderedDict
        >>> Mine = type("Mine", (OrderedDict,), {"__module__": "my_script"})
        >>> defining_modules([Mine(), 3])
        ['my_script']
    """
    names: list[str] = []
    for obj in objects:
        for cls in type(obj).__mro__:
            name = getattr(cls, "__module__", None)
            if (
                not isinstance(name, str)
                or name in names
                or name == "builtins"
                or name.startswith(_SKIP_PREFIXES)
                or name.split(".", 1)[0] in _STDLIB_TOP
                or name.startswith(_OWN_PREFIX)
            ):
                continue
            names.append(name)
    return names


_STDLIB_TOP = frozenset(getattr(sys, "stdlib_module_names", ())) | {"torch", "numpy"}
