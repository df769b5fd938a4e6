"""Ranges: profiler ranges only while a profiler records, NVTX through an injected table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def test_training_step_range_is_innermost_inside_the_optimizer_step(tmp_path: Path) -> None:
    """Lightning runs ``training_step`` as ``optimizer.step``'s closure, inside torch's
    ``Optimizer.step#SGD.step`` range: the forward's ops must fall in a ``training_step`` range
    opened inside that one, or a GPU timeline (innermost range per kernel) draws them as the
    optimizer's."""
    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel

    from lightning_speedpack.timeline import StepTimeline
    from tests.helpers.models import quiet_trainer_kwargs

    trainer = Trainer(callbacks=[StepTimeline()], **quiet_trainer_kwargs(tmp_path, max_steps=3))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.fit(BoringModel())
    events = list(prof.events())
    steps = [e for e in events if e.name.startswith("Optimizer.step#SGD.step")]
    ranges = [e for e in events if e.name == "speedpack/training_step"]
    forward = [e for e in events if e.name in ("aten::linear", "aten::addmm")]
    assert len(steps) == 3, [e.name for e in steps]

    def inside(inner: Any, outer: Any) -> bool:
        return outer.time_range.start <= inner.time_range.start <= outer.time_range.end

    for step in steps:
        in_step = [r for r in ranges if inside(r, step)]
        assert len(in_step) == 1, (step.time_range, [r.time_range for r in ranges])
        ops = [op for op in forward if inside(op, step)]
        assert ops
        assert all(inside(op, in_step[0]) for op in ops)
