"""The data X-ray: DataPipelineProfiler and :func:`stage` for named stages in user code.

The profiler times each loading stage inside the workers, measures the loader and model
ceilings and states the verdict.

:func:`stage` lives in :mod:`lightning_speedpack.core.stages` (the cache records its own stages
through it) and imports no Lightning; only :class:`DataPipelineProfiler`, a callback, does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_speedpack.core.lazy import lazy_names

if TYPE_CHECKING:
    from lightning_speedpack.core.stages import stage
    from lightning_speedpack.data_xray.profiler import DataPipelineProfiler

__all__ = ["DataPipelineProfiler", "stage"]

_WHERE = {
    "DataPipelineProfiler": "lightning_speedpack.data_xray.profiler",
    "stage": "lightning_speedpack.core.stages",
}


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())
