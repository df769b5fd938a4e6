"""The training loaders as the report names them: whose code they run, what speeds them up.

For a torch DataLoader: where its dataset's fetch is (:func:`dataset_location`) and whether it
is a CachedDataset (:func:`fillable`). For a loader the X-ray cannot see into, below.

The X-ray times a torch DataLoader stage by stage through the seams torch gives every
DataLoader (:mod:`~lightning_speedpack.data_xray.instrument`). Any other iterable Lightning
draws batches from -- a ``torchdata.nodes.Loader``, DALI, FFCV, a generator, a class with an
``__iter__`` -- shows one figure only: the time the training process waits at each fetch,
timed for every iterable alike through ``trainer.profiler``'s ``train_dataloader_next`` action
(:class:`~lightning_speedpack.core.profiler_tap.FetchTimer`). That wait decides the verdict
(:func:`~lightning_speedpack.data_xray.run_check.check_verdict`); no loader ceiling is made up
from the run's own pace. This module names such a loader for the report ("not a torch
DataLoader: torchdata.nodes.Loader"), finds the user's code behind it (the finding's location)
and phrases the fix for its kind.

torchdata.nodes (0.11) keeps no timings to report as stages: ``Loader.state_dict()`` and each
node's ``get_state()`` hold positions for resuming (items yielded, the sampler's state, a
``ParallelMapper``'s snapshot), and a ``ParallelMapper``'s threads, processes and queues are
private (``_ParallelMapperIter``). There is no cheap public per-node figure, so the nodes are not
timed; only their public constructor settings (``num_workers``, ``method``,
``prefetch_factor``) are read, to state the pipeline in the fix.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from lightning_speedpack.core.locations import user_code_location

__all__ = [
    "dataset_location",
    "fillable",
    "flat_loaders",
    "loader_fix",
    "loader_location",
    "loader_name",
    "nodes_pipeline",
    "not_timed_reason",
    "opaque_loaders",
]

#: Nodes of a torchdata.nodes graph followed from the root (a guard against a cyclic graph).
_MAX_NODES = 64


def dataset_location(dataset: Any) -> str | None:
    """``file.py:LINE`` of the dataset's fetch (``__getitems__``/``__getitem__``/``__iter__``)."""
    cls = type(dataset)
    for name in ("__getitems__", "__getitem__", "__iter__"):
        location = user_code_location(getattr(cls, name, None))
        if location is not None:
            return location
    return None


def fillable(dataset: Any) -> bool:
    """A CachedDataset (known by its methods: the X-ray does not import the cache's room)."""
    return callable(getattr(dataset, "fill", None)) and callable(
        getattr(dataset, "cache_info", None)
    )


def flat_loaders(iterables: Any) -> list[Any]:
    """The loaders inside what ``trainer.train_dataloader`` returns (dicts, lists, tuples).

    Example:
        >>> flat_loaders({"a": [1, 2], "b": (3,)}), flat_loaders("one")
        ([1, 2, 3], ['one'])
    """
    if isinstance(iterables, dict):
        return [x for value in iterables.values() for x in flat_loaders(value)]
    if isinstance(iterables, (list, tuple)):
        return [x for value in iterables for x in flat_loaders(value)]
    return [] if iterables is None else [iterables]


def opaque_loaders(iterables: Any) -> list[Any]:
    """The training loaders that are not torch DataLoaders (their stages cannot be timed).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> [type(x).__name__ for x in opaque_loaders([DataLoader(range(4)), iter(range(4))])]
        ['range_iterator']
    """
    return [x for x in flat_loaders(iterables) if not isinstance(x, torch.utils.data.DataLoader)]


def loader_name(loader: Any) -> str:
    """The loader's class by its public name: ``torchdata.nodes.Loader``, ``generator``.

    The shortest module path that exports the class (among modules already imported) is used,
    so ``torchdata.nodes.loader.Loader`` reads ``torchdata.nodes.Loader``.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> loader_name(x for x in ()), loader_name(DataLoader(range(2)))
        ('generator', 'torch.utils.data.DataLoader')
    """
    cls = type(loader)
    module, name = cls.__module__, cls.__qualname__
    if module in ("builtins", "__main__"):
        return name
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if getattr(sys.modules.get(prefix), cls.__name__, None) is cls:
            return f"{prefix}.{name}"
    return f"{module}.{name}"


def not_timed_reason(loaders: list[Any]) -> str | None:
    """Why the stages were not timed, in one line (None: every loader is a DataLoader).

    Example:
        >>> not_timed_reason([iter([1]), (x for x in ()), (x for x in ())])
        'not a torch DataLoader: list_iterator, generator'
        >>> not_timed_reason([]) is None
        True
    """
    names = list(dict.fromkeys(loader_name(x) for x in loaders))
    return f"not a torch DataLoader: {', '.join(names)}" if names else None


def _nodes(loader: Any) -> list[Any]:
    """The torchdata.nodes graph from ``Loader.root`` along each node's ``source`` (root first)."""
    node = getattr(loader, "root", None)
    found: list[Any] = []
    while node is not None and len(found) < _MAX_NODES and all(n is not node for n in found):
        if not type(node).__module__.startswith("torchdata.nodes"):
            break
        found.append(node)
        node = getattr(node, "source", None)
    return found


def _is_nodes(loader: Any) -> bool:
    return type(loader).__module__.startswith("torchdata.nodes")


def _node_label(node: Any) -> str:
    name = type(node).__name__
    workers = getattr(node, "num_workers", None)
    if name == "ParallelMapper" and workers == 0:
        return "Mapper"  # torchdata's Mapper() is a ParallelMapper that maps inline
    if name == "ParallelMapper":
        return f"ParallelMapper(num_workers={workers}, method={getattr(node, 'method', None)!r})"
    if name == "Prefetcher":
        return f"Prefetcher(prefetch_factor={getattr(node, 'prefetch_factor', None)})"
    return name


def nodes_pipeline(loader: Any) -> str | None:
    """A torchdata.nodes pipeline as its nodes read from source to loader (None: not one).

    E.g. ``SamplerWrapper -> ParallelMapper(num_workers=2, method='thread') -> Batcher ->
    Prefetcher(prefetch_factor=2)``.

    Example:
        >>> nodes_pipeline(iter([])) is None
        True
    """
    nodes = _nodes(loader)
    return " -> ".join(_node_label(n) for n in reversed(nodes)) if nodes else None


def _callable_location(fn: Any) -> str | None:
    """``file.py:LINE`` of a function, bound method or callable object the user wrote."""
    fn = getattr(fn, "map_fn", fn)  # torchdata's MapOverBatch (prebatch) holds the user's
    target = getattr(fn, "__func__", fn)
    location = user_code_location(target)
    if location is None and callable(fn) and not isinstance(fn, type):
        location = user_code_location(type(fn).__call__)
    return location


def loader_location(loader: Any) -> str | None:
    """Where the user's code behind the loader is: the map function, ``__iter__``, a generator.

    For a torchdata.nodes pipeline: the ``map_fn`` of its first ``ParallelMapper`` that runs in
    workers (else of any mapper). For a generator: its function. Else the class's ``__iter__``
    or ``__next__`` when the user wrote it.
    """
    if _is_nodes(loader):
        mappers = [n for n in reversed(_nodes(loader)) if hasattr(n, "map_fn")]
        mappers.sort(key=lambda n: not getattr(n, "num_workers", 0))  # stable: source first
        for node in mappers:
            location = _callable_location(node.map_fn)
            if location is not None:
                return location
        return None
    code = getattr(loader, "gi_code", None)
    if code is not None:
        parts = Path(code.co_filename).parts
        if "site-packages" in parts or "torch" in parts:
            return None
        return f"{Path(code.co_filename).name}:{code.co_firstlineno}"
    for name in ("__iter__", "__next__"):
        location = user_code_location(getattr(type(loader), name, None))
        if location is not None:
            return location
    return None


def loader_fix(loader: Any) -> str:
    """How to make this kind of loader deliver batches faster (for a data-bound verdict).

    Example:
        >>> loader_fix(x for x in ())  # doctest: +ELLIPSIS
        'make the generator produce batches faster or ahead of the step: ...'
    """
    name = loader_name(loader)
    if _is_nodes(loader):
        pipeline = nodes_pipeline(loader)
        where = f" ({pipeline})" if pipeline else ""
        return (
            f"feed the torchdata.nodes pipeline faster{where}: more num_workers in the "
            "ParallelMapper that does the per-sample work, method='process' when its map_fn "
            "computes in Python (threads share the GIL), a larger Prefetcher(prefetch_factor=...) "
            "to hide uneven batches; or do the deterministic preprocessing once, before training"
        )
    if name.startswith("nvidia.dali"):
        return (
            "give the DALI pipeline more CPU threads (num_threads=...) and a deeper "
            "prefetch_queue_depth, or decode on the GPU (device='mixed')"
        )
    if name.startswith("ffcv"):
        return "raise the FFCV Loader's num_workers, and os_cache=True when the dataset fits in RAM"
    return (
        f"make the {name} produce batches faster or ahead of the step: in background workers "
        "(e.g. a torch DataLoader with num_workers, whose stages the X-ray times one by one), "
        "or with the deterministic preprocessing done once, before training"
    )
