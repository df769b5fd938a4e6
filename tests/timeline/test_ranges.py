"""Ranges: profiler ranges only while a profiler records, NVTX through an injected table."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from lightning_speedpack.timeline.nvtx import NvtxApi, RecordingNvtx, resolve_nvtx
from lightning_speedpack.timeline.ranges import RangeStack


def _names(prof: profile) -> list[str]:
    return [e.name for e in prof.events() if e.name.startswith("speedpack/")]


def test_nvtx_balanced_and_named_like_the_profiler_ranges() -> None:
    rec = RecordingNvtx()
    ranges = RangeStack(rec.api)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ranges.push("speedpack/step_3", "speedpack/step")
        ranges.push("speedpack/backward")
        ranges.instant("speedpack/sync/item@x.py:1")
        ranges.pop_to(1)
        ranges.close_all()
    assert rec.calls == [
        ("push", "speedpack/step"),
        ("push", "speedpack/backward"),
        ("mark", "speedpack/sync/item@x.py:1"),
        ("pop", None),
        ("pop", None),
    ]
    assert rec.depth == 0
    assert sorted(_names(prof)) == [
        "speedpack/backward",
        "speedpack/step_3",
        "speedpack/sync/item@x.py:1",
    ]


def test_no_profiler_range_is_opened_while_no_profiler_records() -> None:
    ranges = RangeStack(None)
    ranges.push("speedpack/data_wait")  # before the profiler: not recorded
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ranges.pop()
        ranges.push("speedpack/training_step")
        ranges.pop()
    assert _names(prof) == ["speedpack/training_step"]
    assert ranges.depth == 0
    ranges.pop()  # popping an empty stack is a no-op


def test_profiler_false_keeps_only_nvtx() -> None:
    rec = RecordingNvtx()
    ranges = RangeStack(rec.api, profiler=False)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ranges.push("speedpack/backward")
        ranges.close_all()
    assert _names(prof) == []
    assert rec.pushed() == ["speedpack/backward"]
    assert rec.depth == 0


def test_recording_nvtx_refuses_an_unmatched_pop() -> None:
    with pytest.raises(RuntimeError, match="without a matching"):
        RecordingNvtx().api.pop()


def test_resolve_nvtx_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_nvtx("auto") is None
    assert resolve_nvtx(False) is None
    table = NvtxApi(push=print, pop=print, mark=print)
    assert resolve_nvtx(table) is table


def test_resolve_nvtx_with_cuda_uses_torch_cuda_nvtx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    table = resolve_nvtx("auto")
    assert table is not None
    assert table.push is torch.cuda.nvtx.range_push
    assert table.pop is torch.cuda.nvtx.range_pop
    assert table.mark is torch.cuda.nvtx.mark
