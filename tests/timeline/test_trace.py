"""The trace window: parsing START:COUNT, which steps it covers, the file it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.profiler import record_function

from lightning_speedpack.timeline.trace import TraceWindow, check_trace_steps, parse_trace_steps


@pytest.mark.parametrize(("text", "expected"), [("5:3", (5, 3)), (" 0 : 1 ", (0, 1))])
def test_parse_trace_steps(text: str, expected: tuple[int, int]) -> None:
    assert parse_trace_steps(text) == expected


@pytest.mark.parametrize("text", ["5", "5:0", "-1:2", "a:b", "1:2:3", ""])
def test_parse_trace_steps_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="START:COUNT"):
        parse_trace_steps(text)


def test_check_trace_steps() -> None:
    assert check_trace_steps(None) is None
    assert check_trace_steps([2, 4]) == (2, 4)
    with pytest.raises(TypeError, match="pair"):
        check_trace_steps((1.0, 2))
    with pytest.raises(TypeError, match="pair"):
        check_trace_steps((True, 2))
    with pytest.raises(ValueError, match="count >= 1"):
        check_trace_steps((3, 0))


def test_window_bounds() -> None:
    window = TraceWindow(5, 3, Path("unused"))
    assert [s for s in range(10) if window.should_start(s)] == [5, 6, 7]
    assert not window.should_stop(8)  # not running
    assert window.end_step == 8


def test_window_writes_one_trace_with_sync_instants(tmp_path: Path) -> None:
    window = TraceWindow(2, 2, tmp_path / "traces", rank=3)
    window.start(2)
    assert window.running
    for step in (2, 3):
        window.saw_step(step)
        with record_function(f"speedpack/step_{step}"):
            _ = torch.ones(16, 16) @ torch.ones(16, 16)
            with record_function("speedpack/sync/item@train.py:42"):
                pass
    assert window.should_stop(4)
    window.stop()
    assert not window.running
    assert window.done
    assert window.path == tmp_path / "traces" / "speedpack-steps2-3-rank3.pt.trace.json"
    assert list((tmp_path / "traces").iterdir()) == [window.path]
    events = json.loads(window.path.read_text())["traceEvents"]
    instants = [e for e in events if e.get("name") == "speedpack/sync/item@train.py:42"]
    assert len(instants) == 2
    assert all(e["ph"] == "i" and e["s"] == "t" and "dur" not in e for e in instants)
    assert {e["name"] for e in events if e.get("ph") == "X"} >= {
        "speedpack/step_2",
        "speedpack/step_3",
    }
    assert "aten::mm" in [op.name for op in window.top_ops]
    assert all(not op.name.startswith("speedpack/") for op in window.top_ops)
    assert not torch.autograd._profiler_enabled()


def test_abort_stops_without_a_file(tmp_path: Path) -> None:
    window = TraceWindow(0, 1, tmp_path)
    window.start(0)
    window.abort()
    window.abort()  # idempotent
    assert window.done
    assert window.path is None
    assert list(tmp_path.iterdir()) == []
    assert not torch.autograd._profiler_enabled()
