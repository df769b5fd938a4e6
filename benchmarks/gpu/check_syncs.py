"""GPU check ``syncs``: SyncPointWarnings against CUDA's sync debug mode, and a clean step.

``syncs/planted-lines``: :class:`Planted`'s ``training_step`` makes five host-device syncs on
device tensors, one per line, each marked ``# planted: <kind>`` in this file: ``.item()``,
``.cpu()``, ``torch.nonzero``, a bool-mask index and ``print(loss)``. A 4-step fit with
``SyncPointWarnings(mode="warn")`` passes when the pack reports exactly those lines (line
numbers read from the markers), with their kinds, once per step each (5.00 syncs per step), its
warnings point at them, and nothing else of this file is reported.

``syncs/vs-debug-mode``: the yardstick is CUDA's own: the same ``training_step`` (plus backward
and the optimizer step) run by hand outside Lightning under
``torch.cuda.set_sync_debug_mode("warn")``, every warning's Python stack recorded. Passes when it
flags the same lines of ``training_step`` as the pack, in each of two steps: as many sync sites
per step as the pack counts. ``print(t)`` syncs several times inside torch's formatting: the
debug mode warns for each, the pack counts the ``print``, so the comparison is per line (the raw
warning count is in the figure and the JSON).

``syncs/pack-adds-none``: a clean model (no sync of its own) fitted 24 steps three times, with
``set_sync_debug_mode("warn")`` armed from the second batch's ``on_train_batch_start`` (a
callback placed first; the first batch is left out, for what a callback does once per fit) to the
last ``on_train_batch_end`` (one placed last), so every hook of every callback and Lightning's
work between the steps (fetch, copy, logging to a ``CSVLogger``) is inside: alone
(the baseline), with ThroughputLogger, StepTimeline, WallTimeLedger, DataPipelineProfiler,
LossRetentionDetector and SpeedAdvisor, and with the doctor's default set (the Trainer built
inside a ``DoctorSession``, which attaches every default diagnostic and its run recorder, as
``speedpack doctor`` does). Passes when no sync is the pack's (walking out from the sync past
torch, the standard library and SyncPointWarnings' pass-through wrappers, the first frame is in
``lightning_speedpack``) and each fit's syncs per step equal the baseline's (a tensor handed to
Lightning's logging would sync in Lightning's own frames); otherwise names the callback and
method that synced. Warn mode with recorded stacks rather than ``"error"``: it finds every sync,
not the first, and never breaks the fit.

Dry (CPU, what ran before the first GPU): the planted fit through the pack's CPU option
(``include_cpu=True``: CPU tensors count as device tensors), PASS or FAIL as on a GPU; the two
other lines are SKIP (no CUDA), though their fits run, so the code behind them is exercised.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import warnings
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger
from torch import nn

from benchmarks.gpu.context import Context, result
from benchmarks.gpu.helpers import loader, trainer

__all__ = ["NAME", "TIMEOUT_S", "run"]

NAME = "syncs"
TIMEOUT_S = {"gpu": 45.0, "dry": 100.0}

THIS_FILE = str(Path(__file__).resolve())
SYNC_MESSAGE = "called a synchronizing CUDA operation"  # what set_sync_debug_mode("warn") says
EXPECTED_KINDS = {
    "item": "item",
    "cpu copy": "cpu copy",
    "nonzero": "nonzero",
    "masked index": "masked index",
    "repr": "repr",
}
PACK_DIR = "lightning_speedpack"
FIRST_WATCHED = 1  # batch index the clean fits are watched from (0-based)
WRAPPERS = str(Path("lightning_speedpack", "sync_points", "patching.py"))
STDLIB = os.path.join(sysconfig.get_paths()["stdlib"], "")


def planted_lines() -> dict[int, str]:
    """``{line: kind}`` of the ``# planted: <kind>`` markers in this file."""
    found: dict[int, str] = {}
    for number, text in enumerate(Path(THIS_FILE).read_text().splitlines(), start=1):
        match = re.match(r"\s*[^#\s].*#\s*planted:\s*([a-z ]+?)\s*$", text)
        if match and match.group(1) in EXPECTED_KINDS:
            found[number] = match.group(1)
    return found


class Planted(pl.LightningModule):
    """Five syncs in the step, one per line."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 2)
        self.seen: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        out = self.layer(x)
        loss = out.square().mean()
        value = loss.item()  # planted: item
        host = out.detach().cpu()  # planted: cpu copy
        rows = torch.nonzero(out[:, 0] > 0)  # planted: nonzero
        picked = out[out[:, 1] > 0]  # planted: masked index
        print(loss)  # planted: repr
        self.seen.append((value, tuple(host.shape), tuple(rows.shape)))
        return loss + 0.0 * picked.sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Clean(pl.LightningModule):
    """A step with no sync of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.layer(x).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@dataclass(frozen=True)
class Frame:
    """One frame of a recorded stack (``owner``: ``type(self).__name__`` in the pack's frames)."""

    filename: str
    lineno: int
    function: str
    owner: str = ""


def _stack(frame: FrameType | None, limit: int = 80) -> list[Frame]:
    while frame is not None and Path(frame.f_code.co_filename).name.endswith("warnings.py"):
        frame = frame.f_back  # the warnings module's own frames
    frames: list[Frame] = []
    while frame is not None and len(frames) < limit:
        code = frame.f_code
        owner = ""
        if PACK_DIR in code.co_filename:
            this = frame.f_locals.get("self")
            owner = type(this).__name__ if this is not None else ""
        frames.append(Frame(code.co_filename, frame.f_lineno, code.co_name, owner))
        frame = frame.f_back
    return frames


class DebugModeRecorder:
    """``torch.cuda.set_sync_debug_mode("warn")`` while armed; each warning's Python stack.

    The warning filters and ``showwarning`` are saved on :meth:`arm` and put back on
    :meth:`disarm` (``warnings.catch_warnings``), as is the debug mode. Other warnings pass on
    to whatever handled them before.
    """

    def __init__(self) -> None:
        self.stacks: list[list[Frame]] = []
        self._ctx: Any = None
        self._mode: int = 0

    @property
    def armed(self) -> bool:
        return self._ctx is not None

    def arm(self) -> None:
        if self._ctx is not None:
            return
        ctx = warnings.catch_warnings()
        ctx.__enter__()
        self._ctx = ctx
        warnings.filterwarnings("always", message=f".*{SYNC_MESSAGE}")
        previous = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: Any = None,
            line: str | None = None,
        ) -> None:
            if SYNC_MESSAGE in str(message):
                self.stacks.append(_stack(sys._getframe(1)))
                return
            previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        self._mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")

    def disarm(self) -> None:
        if self._ctx is None:
            return
        torch.cuda.set_sync_debug_mode(self._mode)
        ctx, self._ctx = self._ctx, None
        ctx.__exit__(None, None, None)


def _passes_through(frame: Frame) -> bool:
    """torch, the standard library and SyncPointWarnings' wrappers: never whose sync it is."""
    name = frame.filename
    return (
        f"{os.sep}torch{os.sep}" in name
        or name.endswith(WRAPPERS)
        or name.startswith("<")
        or (name.startswith(STDLIB) and "-packages" not in name)
    )


def whose(stack: list[Frame]) -> tuple[Frame, bool]:
    """The frame a recorded sync belongs to, and whether it is the pack's.

    Walking out from the sync past torch, the standard library and SyncPointWarnings' wrappers,
    the first frame decides: a pack frame makes it the pack's, reported at the outermost pack
    frame of that run (the callback's hook); anything else (Lightning, this file) is not. A pack
    frame further out (the doctor's ``Trainer.fit`` wrapper holds every sync of a fit) does not
    count.
    """
    frames = [f for f in stack if not _passes_through(f)] or stack
    first = frames[0]
    if PACK_DIR not in first.filename:
        return first, False
    run = first
    for frame in frames[1:]:
        if PACK_DIR not in frame.filename:
            break
        run = frame
    return run, True


def _step_line(stack: list[Frame]) -> int | None:
    """The line of :meth:`Planted.training_step` a recorded sync was made at, if any."""
    for frame in stack:  # innermost first
        if frame.filename == THIS_FILE and frame.function == "training_step":
            return frame.lineno
    return None


# ------------------------------------------------------------------ planted syncs


def _planted_batches(ctx: Context, n: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [[torch.randn(64, 16, generator=g)] for _ in range(n)]


def planted_fit(ctx: Context) -> dict[str, Any]:
    """Fit :class:`Planted` under SyncPointWarnings: its findings and warnings."""
    from lightning_speedpack import SyncPointWarnings
    from lightning_speedpack.sync_points.callback import SyncWarning

    steps = 4
    callback = SyncPointWarnings(mode="warn", include_cpu=ctx.dry)
    model = Planted()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(ctx, max_steps=steps, callbacks=[callback]).fit(
            model, loader(_planted_batches(ctx, 2), steps)
        )
    mine = [f for f in callback.user_findings if f.filename == THIS_FILE]
    return {
        "steps": steps,
        "findings": {
            f.lineno: {"kind": f.kind, "per_step": f.per_step, "steps_seen": f.steps_seen}
            for f in mine
        },
        "other_user_findings": [
            f"{f.location} {f.kind}" for f in callback.user_findings if f.filename != THIS_FILE
        ],
        "syncs_per_step": callback.syncs_per_step,
        "warned_lines": sorted(
            w.lineno
            for w in caught
            if issubclass(w.category, SyncWarning) and str(Path(w.filename).resolve()) == THIS_FILE
        ),
        "framework_findings": [
            f"{f.location} {f.kind}" for f in callback.report if f.origin == "framework"
        ],
    }


def planted_line_result(ctx: Context, fit: dict[str, Any], planted: dict[int, str]) -> Any:
    findings: dict[int, dict[str, Any]] = fit["findings"]
    problems: list[str] = []
    for line, kind in sorted(planted.items()):
        found = findings.get(line)
        if found is None:
            problems.append(f"line {line} ({kind}) not reported")
        elif found["kind"] != EXPECTED_KINDS[kind] or found["per_step"] != 1.0:
            problems.append(f"line {line}: {found['kind']} x{found['per_step']:g}/step")
        elif found["steps_seen"] != fit["steps"]:
            problems.append(f"line {line}: seen in {found['steps_seen']} of {fit['steps']} steps")
    extra = sorted(set(findings) - set(planted))
    if extra:
        problems.append(f"unplanted lines reported: {extra}")
    if fit["other_user_findings"]:
        problems.append(f"reported elsewhere: {fit['other_user_findings']}")
    if fit["warned_lines"] != sorted(planted):
        problems.append(f"warnings at lines {fit['warned_lines']}")
    if fit["syncs_per_step"] != float(len(planted)):
        problems.append(f"{fit['syncs_per_step']:g} syncs/step")
    hits = sum(1 for line in planted if line in findings)
    figure = (
        f"{hits} of {len(planted)} planted lines at their exact line numbers, "
        f"{fit['syncs_per_step']:.2f} syncs/step, {len(fit['warned_lines'])} warnings there"
        + (" (include_cpu=True on the CPU)" if ctx.dry else "")
    )
    if problems:
        figure += "; " + "; ".join(problems)
    return result(
        "syncs/planted-lines",
        "FAIL" if problems else "PASS",
        figure,
        "every planted line once per step, nothing else",
        planted={str(k): v for k, v in planted.items()},
        **{k: v for k, v in fit.items() if k != "findings"},
        findings={str(k): v for k, v in findings.items()},
    )


def debug_mode_steps(ctx: Context, steps: int = 2) -> list[dict[str, Any]]:
    """The planted step by hand under ``set_sync_debug_mode("warn")``: flagged lines per step."""
    model = Planted().to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = [t.to(ctx.device) for t in _planted_batches(ctx, 1)[0]]
    recorder = DebugModeRecorder()
    torch.cuda.synchronize()
    out: list[dict[str, Any]] = []
    for step in range(steps):
        recorder.stacks = []
        recorder.arm()
        try:
            loss = model.training_step(batch, step)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        finally:
            recorder.disarm()
        lines = Counter(_step_line(stack) for stack in recorder.stacks)
        outside = lines.pop(None, 0)
        out.append({"lines": dict(lines), "raw": len(recorder.stacks), "outside_step": outside})
    return out


def debug_mode_result(fit: dict[str, Any], planted: dict[int, str], steps: list[Any]) -> Any:
    pack_lines = sorted(fit["findings"])
    problems = []
    for i, step in enumerate(steps):
        flagged = sorted(step["lines"])
        if flagged != pack_lines:
            problems.append(f"step {i}: debug mode flagged lines {flagged}, pack {pack_lines}")
    sites = [len(step["lines"]) for step in steps]
    raw = [step["raw"] for step in steps]
    figure = (
        f"{fit['syncs_per_step']:.2f} sync sites/step by the pack vs {sites[-1]} lines flagged "
        f"by set_sync_debug_mode in each of {len(steps)} steps ({raw[-1]} raw warnings/step: "
        f"print(t) warns several times)"
    )
    if problems:
        figure += "; " + "; ".join(problems)
    return result(
        "syncs/vs-debug-mode",
        "FAIL" if problems else "PASS",
        figure,
        "same lines, equal count per step",
        debug_mode_steps=[
            {**s, "lines": {str(k): v for k, v in s["lines"].items()}} for s in steps
        ],
        pack_lines=pack_lines,
    )


# ------------------------------------------------------------------ the pack adds none


class _Arm(pl.Callback):
    """Placed first: arms the recorder at the start of the second training batch.

    The first batch is left out: what a callback does once per fit on it (the data profiler
    times the model on the fit's first batch when it cannot probe the loader aside) is not a
    per-step cost.
    """

    def __init__(self, recorder: DebugModeRecorder | None) -> None:
        self.recorder = recorder

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.recorder is not None and batch_idx >= FIRST_WATCHED:
            self.recorder.arm()


class _Disarm(pl.Callback):
    """Placed last: disarms it at the last training batch's end."""

    def __init__(self, recorder: DebugModeRecorder | None, steps: int) -> None:
        self.recorder = recorder
        self.steps = steps
        self.batches = 0

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.batches += 1
        if self.batches >= self.steps and self.recorder is not None:
            self.recorder.disarm()

    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        if self.recorder is not None:
            self.recorder.disarm()


def six_callbacks() -> list[pl.Callback]:
    from lightning_speedpack import (
        DataPipelineProfiler,
        LossRetentionDetector,
        SpeedAdvisor,
        StepTimeline,
        ThroughputLogger,
        WallTimeLedger,
    )

    return [
        ThroughputLogger(),
        StepTimeline(),
        WallTimeLedger(),
        DataPipelineProfiler(),
        LossRetentionDetector(),
        SpeedAdvisor(),
    ]


def clean_fit(
    ctx: Context, callbacks: list[pl.Callback], steps: int, tag: str, doctor: bool = False
) -> dict[str, Any]:
    """Fit :class:`Clean` with ``callbacks``; the syncs recorded between the armers (on CUDA).

    ``doctor``: the Trainer is built inside a ``DoctorSession``, which attaches the doctor's
    default set (and its run recorder) as ``speedpack doctor`` does; the disarming callback is
    then moved back to the end of the list.
    """
    from lightning_speedpack.core.hook_hub import callbacks_of
    from lightning_speedpack.doctor.runner import DoctorSession

    recorder = DebugModeRecorder() if not ctx.dry else None
    g = torch.Generator().manual_seed(1)
    data = loader([[torch.randn(64, 32, generator=g)] for _ in range(4)], steps)
    kwargs: dict[str, Any] = {"max_steps": steps, "log_every_n_steps": 5}
    kwargs["logger"] = CSVLogger(str(ctx.out_dir / "csv"), name=tag)
    arm, disarm = _Arm(recorder), _Disarm(recorder, steps)
    session: AbstractContextManager[Any] = DoctorSession().installed() if doctor else nullcontext()
    try:
        with session:
            fit = trainer(ctx, callbacks=[arm, *callbacks, disarm], **kwargs)
            fit.callbacks.remove(disarm)
            fit.callbacks.append(disarm)
            # the doctor's own callbacks sit behind its HookHub: list them, not the hub
            attached = [c for c in callbacks_of(fit) if c is not arm and c is not disarm]
            fit.fit(Clean(), data)
    finally:
        if recorder is not None:
            recorder.disarm()
            torch.cuda.set_sync_debug_mode(0)  # a SyncPointWarnings restores what it saw: ours
    stacks = recorder.stacks if recorder is not None else []
    pack: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for stack in stacks:
        frame, ours = whose(stack)
        if ours:
            where = f"{frame.owner + '.' if frame.owner else ''}{frame.function}"
            pack[f"{where} ({Path(frame.filename).name}:{frame.lineno})"] += 1
        else:
            other[f"{Path(frame.filename).name}:{frame.lineno} {frame.function}"] += 1
    watched = steps - FIRST_WATCHED
    return {
        "tag": tag,
        "callbacks": [type(c).__name__ for c in attached],
        "steps": watched,
        "syncs": len(stacks),
        "per_step": len(stacks) / watched,
        "pack": dict(pack),
        "other": dict(other),
    }


def adds_none_result(ctx: Context, fits: list[dict[str, Any]]) -> Any:
    base, *rest = fits
    if ctx.dry:
        return result(
            "syncs/pack-adds-none",
            "SKIP",
            "no CUDA: set_sync_debug_mode needs a device (the fits ran on the CPU: "
            + ", ".join(f"{f['tag']} ({len(f['callbacks'])} callbacks)" for f in fits)
            + ")",
            "0 syncs in the pack's frames, syncs/step = the baseline's",
            fits=fits,
        )
    problems = []
    for fit in rest:
        if fit["pack"]:
            problems.append(
                f"{fit['tag']}: "
                + ", ".join(f"{w} x{n / fit['steps']:.2g}/step" for w, n in fit["pack"].items())
            )
        elif fit["syncs"] != base["syncs"]:
            problems.append(
                f"{fit['tag']}: {fit['per_step']:.2f} syncs/step vs {base['per_step']:.2f} "
                f"without the pack, at {fit['other']}"
            )
    figure = "; ".join(
        f"{f['tag']} ({len(f['callbacks'])} callbacks) {f['per_step']:.2f} syncs/step" for f in fits
    )
    if problems:
        figure = "synced: " + " | ".join(problems) + f" [{figure}]"
    return result(
        "syncs/pack-adds-none",
        "FAIL" if problems else "PASS",
        figure,
        "0 syncs in the pack's frames, syncs/step = the baseline's",
        fits=fits,
    )


def run(ctx: Context) -> list[dict[str, Any]]:
    planted = planted_lines()
    fit = planted_fit(ctx)
    lines = [planted_line_result(ctx, fit, planted)]
    if ctx.dry:
        lines.append(
            result(
                "syncs/vs-debug-mode",
                "SKIP",
                "no CUDA: torch.cuda.set_sync_debug_mode needs a device",
                "same lines, equal count per step",
            )
        )
    else:
        lines.append(debug_mode_result(fit, planted, debug_mode_steps(ctx)))
    steps = 8 if ctx.dry else 24
    fits = [
        clean_fit(ctx, [], steps, "baseline"),
        clean_fit(ctx, six_callbacks(), steps, "six-callbacks"),
        clean_fit(ctx, [], steps, "doctor-default", doctor=True),
    ]
    lines.append(adds_none_result(ctx, fits))
    return lines
