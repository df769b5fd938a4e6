"""StepTimeline: a training step's phases as profiler and NVTX ranges, a live breakdown, a trace."""

from lightning_speedpack.timeline.callback import StepTimeline
from lightning_speedpack.timeline.nvtx import NvtxApi, RecordingNvtx
from lightning_speedpack.timeline.phases import PHASES
from lightning_speedpack.timeline.trace import parse_trace_steps

__all__ = ["PHASES", "NvtxApi", "RecordingNvtx", "StepTimeline", "parse_trace_steps"]
