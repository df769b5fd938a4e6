"""The NVTX functions the timeline calls, as a small table that tests can replace.

NVTX ranges are what Nsight Systems (``nsys profile -t cuda,nvtx``) draws above the CUDA
kernels. ``torch.cuda.nvtx`` provides them on a CUDA build; a CPU build has none. The timeline
calls them only through an :class:`NvtxApi`, so a test on a CPU-only machine injects a
recording table and checks every push has its pop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["NvtxApi", "RecordingNvtx", "cuda_nvtx", "resolve_nvtx"]


@dataclass(frozen=True)
class NvtxApi:
    """``push(name)``/``pop()`` a nested range and ``mark(name)`` an instant, on this thread."""

    push: Callable[[str], Any]
    pop: Callable[[], Any]
    mark: Callable[[str], Any]


def cuda_nvtx() -> NvtxApi | None:
    """``torch.cuda.nvtx``'s functions when CUDA is available, else None."""
    if not torch.cuda.is_available():
        return None
    nvtx = torch.cuda.nvtx
    return NvtxApi(push=nvtx.range_push, pop=nvtx.range_pop, mark=nvtx.mark)


def resolve_nvtx(setting: bool | str | NvtxApi) -> NvtxApi | None:
    """The table for ``StepTimeline(nvtx=setting)``: ``"auto"``/True use CUDA's when available.

    Example:
        >>> resolve_nvtx(False) is None
        True
    """
    if isinstance(setting, NvtxApi):
        return setting
    if setting is False:
        return None
    return cuda_nvtx()


class RecordingNvtx:
    """An :class:`NvtxApi` that records calls instead of emitting them (tests, debugging).

    Example:
        >>> rec = RecordingNvtx()
        >>> rec.api.push("a"); rec.api.mark("m"); rec.api.pop()
        >>> rec.calls, rec.depth
        ([('push', 'a'), ('mark', 'm'), ('pop', None)], 0)
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.depth = 0
        self.max_depth = 0
        self.api = NvtxApi(push=self._push, pop=self._pop, mark=self._mark)

    def _push(self, name: str) -> None:
        self.calls.append(("push", name))
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)

    def _pop(self) -> None:
        if self.depth == 0:
            raise RuntimeError("NVTX range_pop without a matching range_push")
        self.calls.append(("pop", None))
        self.depth -= 1

    def _mark(self, name: str) -> None:
        self.calls.append(("mark", name))

    def pushed(self) -> list[str]:
        """The names pushed, in order."""
        return [name for op, name in self.calls if op == "push" and name is not None]
