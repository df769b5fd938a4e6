"""GPU check ``nvtx``: StepTimeline's ranges in a real CUDA profiler trace, and its NVTX calls.

One fit of 9 steps of a small MLP under ``StepTimeline(trace_steps=(6, 2))``, with
``torch.cuda.nvtx.range_push``/``range_pop``/``mark`` wrapped by counters that call the real
functions (the timeline binds them at ``setup``), and a ``torch.profiler.profile`` of this check's
own (CPU and CUDA activities) started by a callback placed before the timeline after step 2's
batch and stopped by one placed after it after step 4's: the ranges ``speedpack/step_2`` and
``speedpack/step_3`` are complete inside it. The trace is exported to ``<out>/nvtx/profile.json``
and read back as JSON.

- ``nvtx/profiler-ranges``: both step ranges and the seven phases (``data_wait``,
  ``batch_transfer``, ``training_step``, ``zero_grad``, ``backward``, ``optimizer_step``,
  ``other``) are ``user_annotation`` events of the trace, and each step range encloses CUDA
  launches whose kernels are in the trace (matched by their ``correlation`` id).
- ``nvtx/gpu-timeline``: ``training_step`` and ``optimizer_step`` are also
  ``gpu_user_annotation`` events (Kineto draws a range over the kernels launched inside it; the
  backward's kernels are launched from autograd's own thread, so ``backward`` is not required).
- ``nvtx/nvtx-calls``: every ``range_push`` has its ``range_pop`` by the end of the fit, and
  ``speedpack/step`` and each phase were pushed (what ``nsys profile -t cuda,nvtx`` would draw).
- ``nvtx/trace-window``: the timeline's own window wrote its trace file with
  ``speedpack/step_6`` and ``speedpack/step_7`` in it, and CUDA kernels.

Dry (CPU, what ran before the first GPU): a CPU-only profiler; ``nvtx/profiler-ranges`` (names
only: no launches on a CPU) and ``nvtx/trace-window`` (no kernels) as on a GPU;
``nvtx/gpu-timeline`` and ``nvtx/nvtx-calls`` SKIP (no CUDA: no NVTX, no kernels).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu.context import Context, result
from benchmarks.gpu.helpers import loader, trainer

__all__ = ["NAME", "TIMEOUT_S", "run"]

NAME = "nvtx"
TIMEOUT_S = {"gpu": 35.0, "dry": 60.0}

PHASES = (
    "data_wait",
    "batch_transfer",
    "training_step",
    "zero_grad",
    "backward",
    "optimizer_step",
    "other",
)
PROFILED = (2, 3)  # the step ranges this check's own profiler holds whole
WINDOW = (6, 2)  # the timeline's own trace window
STEPS = 9


class Net(pl.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.net(x).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class NvtxCounter:
    """Wraps ``torch.cuda.nvtx``'s push, pop and mark with counters that call the real ones."""

    def __init__(self) -> None:
        self.pushes: Counter[str] = Counter()
        self.pops = 0
        self.marks = 0
        self.depth = 0
        self.max_depth = 0
        self._saved: tuple[Any, Any, Any] | None = None

    def install(self) -> None:
        nvtx = torch.cuda.nvtx
        push, pop, mark = self._saved = (nvtx.range_push, nvtx.range_pop, nvtx.mark)

        def counted_push(msg: str) -> Any:
            self.pushes[msg] += 1
            self.depth += 1
            self.max_depth = max(self.max_depth, self.depth)
            return push(msg)

        def counted_pop() -> Any:
            self.pops += 1
            self.depth -= 1
            return pop()

        def counted_mark(msg: str) -> Any:
            self.marks += 1
            return mark(msg)

        nvtx.range_push, nvtx.range_pop, nvtx.mark = counted_push, counted_pop, counted_mark

    def uninstall(self) -> None:
        if self._saved is not None:
            nvtx = torch.cuda.nvtx
            nvtx.range_push, nvtx.range_pop, nvtx.mark = self._saved
            self._saved = None


class _Profiler:
    """This check's own ``torch.profiler`` session, exported to ``path`` when stopped."""

    def __init__(self, cuda: bool, path: Path) -> None:
        self.cuda = cuda
        self.path = path
        self.prof: profile | None = None

    def start(self) -> None:
        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        self.prof = profile(activities=activities)
        self.prof.start()

    def stop(self) -> None:
        prof, self.prof = self.prof, None
        if prof is None:
            return
        if self.cuda:
            torch.cuda.synchronize()  # every kernel of the window done before the trace is cut
        prof.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.path))


class _StartAfter(pl.Callback):
    """Placed before the timeline: starts the profiler once ``global_step`` reaches ``step``."""

    def __init__(self, profiler: _Profiler, step: int) -> None:
        self.profiler, self.step = profiler, step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.global_step == self.step:
            self.profiler.start()


class _StopAfter(pl.Callback):
    """Placed after the timeline: stops it once ``global_step`` reaches ``step``."""

    def __init__(self, profiler: _Profiler, step: int) -> None:
        self.profiler, self.step = profiler, step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.global_step == self.step:
            self.profiler.stop()

    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        self.profiler.stop()


def read_trace(path: Path) -> dict[str, Any]:
    """The speedpack ranges of a chrome trace, its kernels, and the launches in each step range."""
    events = json.loads(path.read_text()).get("traceEvents", [])
    cpu = [e for e in events if e.get("cat") == "user_annotation"]
    gpu = [e for e in events if e.get("cat") == "gpu_user_annotation"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    kernel_ids = {e.get("args", {}).get("correlation") for e in kernels}
    launches = [
        e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
        and e.get("args", {}).get("correlation") in kernel_ids
    ]
    steps: dict[str, int] = {}
    for e in cpu:
        name = str(e.get("name", ""))
        if name.startswith("speedpack/step_") and "dur" in e:
            begin, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            # any thread: the backward's kernels are launched from autograd's device thread
            steps[name] = sum(1 for k in launches if begin <= float(k["ts"]) <= end)
    return {
        "cpu": sorted(
            {str(e.get("name")) for e in cpu if str(e.get("name")).startswith("speedpack/")}
        ),
        "gpu": sorted(
            {str(e.get("name")) for e in gpu if str(e.get("name")).startswith("speedpack/")}
        ),
        "kernels": len(kernels),
        "launches_in_steps": steps,
    }


def run(ctx: Context) -> list[dict[str, Any]]:
    from lightning_speedpack import StepTimeline

    cuda = not ctx.dry
    width = 1024 if cuda else 32
    g = torch.Generator().manual_seed(0)
    batches = [[torch.randn(256, width, generator=g)] for _ in range(2)]
    own = _Profiler(cuda, ctx.out_dir / "nvtx" / "profile.json")
    counter = NvtxCounter()
    timeline = StepTimeline(trace_steps=WINDOW, trace_dir=ctx.out_dir / "window")
    callbacks = [
        _StartAfter(own, PROFILED[0]),
        timeline,
        _StopAfter(own, PROFILED[-1] + 1),
    ]
    if cuda:
        counter.install()
    try:
        trainer(ctx, max_steps=STEPS, callbacks=callbacks).fit(Net(width), loader(batches, STEPS))
    finally:
        counter.uninstall()
        own.stop()
    lines: list[dict[str, Any]] = []

    # -- this check's own profiler
    wanted = [f"speedpack/step_{s}" for s in PROFILED] + [f"speedpack/{p}" for p in PHASES]
    if own.path.exists():
        mine = read_trace(own.path)
        missing = [n for n in wanted if n not in mine["cpu"]]
        empty = [
            n for n in wanted[: len(PROFILED)] if cuda and not mine["launches_in_steps"].get(n)
        ]
        launches = ", ".join(f"{n[10:]} {k}" for n, k in mine["launches_in_steps"].items())
        figure = (
            f"{len(wanted) - len(missing)} of {len(wanted)} ranges in the trace"
            + (f"; CUDA launches with their kernels: {launches}" if cuda else " (CPU trace)")
            + (f"; missing {missing}" if missing else "")
            + (f"; no kernel launched inside {empty}" if empty else "")
        )
        lines.append(
            result(
                "nvtx/profiler-ranges",
                "FAIL" if missing or empty else "PASS",
                figure,
                "every step and phase range; kernels inside each step" if cuda else "every range",
                trace=str(own.path),
                **mine,
            )
        )
        if cuda:
            needed = ["speedpack/training_step", "speedpack/optimizer_step"]
            absent = [n for n in needed if n not in mine["gpu"]]
            lines.append(
                result(
                    "nvtx/gpu-timeline",
                    "FAIL" if absent else "PASS",
                    f"gpu_user_annotation ranges: {[n[10:] for n in mine['gpu']]}"
                    + (f"; missing {absent}" if absent else ""),
                    "training_step and optimizer_step over their kernels",
                    gpu=mine["gpu"],
                )
            )
    else:
        lines.append(
            result("nvtx/profiler-ranges", "FAIL", f"no trace at {own.path}", "every range")
        )
    if not cuda:
        lines.append(
            result("nvtx/gpu-timeline", "SKIP", "no CUDA: no kernels to draw ranges over", "GPU")
        )

    # -- the NVTX calls
    if cuda:
        names = ["speedpack/step"] + [f"speedpack/{p}" for p in PHASES]
        unpushed = [n for n in names if not counter.pushes.get(n)]
        pushes = sum(counter.pushes.values())
        ok = pushes == counter.pops and counter.depth == 0 and not unpushed
        lines.append(
            result(
                "nvtx/nvtx-calls",
                "PASS" if ok else "FAIL",
                f"{pushes} range_push, {counter.pops} range_pop, {counter.marks} marks, depth at "
                f"most {counter.max_depth}; {len(names) - len(unpushed)} of {len(names)} names"
                + (f"; never pushed {unpushed}" if unpushed else ""),
                "balanced; every name pushed",
                pushes=dict(counter.pushes),
                pops=counter.pops,
            )
        )
    else:
        lines.append(
            result("nvtx/nvtx-calls", "SKIP", "no CUDA: the timeline opens no NVTX range", "GPU")
        )

    # -- the timeline's own window
    path = timeline.trace_path
    window = [f"speedpack/step_{s}" for s in range(WINDOW[0], WINDOW[0] + WINDOW[1])]
    if path is None or not Path(path).exists():
        lines.append(
            result("nvtx/trace-window", "FAIL", f"no trace file written ({path})", "written")
        )
    else:
        got = read_trace(Path(path))
        missing = [n for n in window if n not in got["cpu"]]
        no_kernels = cuda and not got["kernels"]
        lines.append(
            result(
                "nvtx/trace-window",
                "FAIL" if missing or no_kernels else "PASS",
                f"{Path(path).name}: {len(window) - len(missing)} of {len(window)} step ranges, "
                f"{got['kernels']} kernels" + (f"; missing {missing}" if missing else ""),
                "both steps" + (", CUDA kernels" if cuda else ""),
                trace=str(path),
                **got,
            )
        )
    return lines
