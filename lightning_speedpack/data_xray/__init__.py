"""The data X-ray: DataPipelineProfiler and :func:`stage` for named stages in user code.

The profiler times each loading stage inside the workers, measures the loader and model
ceilings and states the verdict.

:func:`stage` lives in :mod:`lightning_speedpack.core.stages` (the cache records its own stages
through it) and imports no Lightning; only :class:`DataPipelineProfiler`, a callback, does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_speedpack.core.stages import stage
    from lightning_speedpack.data_xray.profiler import DataPipelineProfiler

__all__ = ["DataPipelineProfiler", "stage"]

_WHERE = {
    "DataPipelineProfiler": "lightning_speedpack.data_xray.profiler",
    "stage": "lightning_speedpack.core.stages",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
