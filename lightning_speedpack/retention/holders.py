"""Finding tensors that keep their autograd graph alive, and who holds them (one import).

The engine of :class:`~lightning_speedpack.retention.callback.LossRetentionDetector`, split by
concept; nothing here knows about Lightning hooks. This module gathers their public names:

* :mod:`~lightning_speedpack.retention.tags`: which step (and fit) a graph was made in.
* :mod:`~lightning_speedpack.retention.walk`: the cheap, bounded forward walk from named roots.
* :mod:`~lightning_speedpack.retention.heap`: the heap scan and the referrer search that names
  a holder the walk did not reach.
* :mod:`~lightning_speedpack.retention.weight`: whether graphs were back-propagated, and the
  bytes they keep alive.
"""

from __future__ import annotations

from lightning_speedpack.retention.heap import (
    HolderPath,
    estimated_scan_seconds,
    heap_graph_tensors,
    referrer_path,
)
from lightning_speedpack.retention.tags import (
    STEP_KEY,
    UNNAMED_KEY,
    graph_step,
    is_retained,
    is_unnameable,
    mark_foreign,
    mark_unnameable,
    new_run_token,
    next_sequence_nr,
    tag_graph,
)
from lightning_speedpack.retention.walk import (
    AttrRoot,
    ModuleCache,
    container_globals,
    defining_modules,
    holder_of,
    module_display_name,
    module_globals_root,
    walk_containers,
)
from lightning_speedpack.retention.weight import GraphInfo, inspect_graphs

__all__ = [
    "STEP_KEY",
    "UNNAMED_KEY",
    "AttrRoot",
    "GraphInfo",
    "HolderPath",
    "ModuleCache",
    "container_globals",
    "defining_modules",
    "estimated_scan_seconds",
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
    "next_sequence_nr",
    "referrer_path",
    "tag_graph",
    "walk_containers",
]
