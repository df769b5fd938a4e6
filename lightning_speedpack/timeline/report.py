"""What a fit's timeline tells people: the doctor's figures and findings, a window's trace.

The phase times come from a :class:`~lightning_speedpack.timeline.phases.PhaseTotals` and the
measured copy from a :class:`~lightning_speedpack.core.events.BatchTransfer`; a finished
:class:`~lightning_speedpack.timeline.trace.TraceWindow` is printed as a table of its top
operators and uploaded to W&B as a ``profile`` artifact. Nothing here measures anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.lightning import classes
from lightning_speedpack.core.sampling import cadence
from lightning_speedpack.timeline.phases import PhaseTotals, shares
from lightning_speedpack.timeline.trace import TopOp, TraceWindow

if TYPE_CHECKING:
    from lightning_speedpack.core.events import BatchTransfer

__all__ = ["doctor_figures", "doctor_findings", "log_wandb_artifact", "print_top_ops"]


def doctor_figures(
    run: PhaseTotals,
    copy: BatchTransfer | None,
    over_steps: Sequence[Sequence[Any]] = (),
    sample_every: int = 1,
) -> dict[str, Any]:
    """``phase_share``, ``phase_ms`` and ``phase_ms_over_steps``; the copy's ``h2d_*`` if measured.

    ``phase_ms_over_steps`` is ``over_steps`` as lists: one ``[step, {phase: mean ms per
    batch}]`` per logging window, in the order logged (left out when no window was logged).
    Timed on one step in ``sample_every`` (above 1): also ``phase_sample_every`` and
    ``phase_batches_timed``.

    Example:
        >>> run = PhaseTotals()
        >>> run.add({"data_wait": 0.001, "training_step": 0.003})
        >>> doctor_figures(run, None)["phase_share"]["training_step"]
        0.75
        >>> doctor_figures(run, None, [[5, {"data_wait": 1.0}]])["phase_ms_over_steps"]
        [[5, {'data_wait': 1.0}]]
    """
    if not run.batches:
        return {}
    figures: dict[str, Any] = {
        "phase_share": {k: round(v, 4) for k, v in shares(run.seconds).items()},
        "phase_ms": {k: round(v, 3) for k, v in run.mean_ms().items()},
    }
    if over_steps:
        figures["phase_ms_over_steps"] = [[step, dict(ms)] for step, ms in over_steps]
    if sample_every > 1:
        figures.update(phase_sample_every=sample_every, phase_batches_timed=run.batches)
    if copy is not None and copy.bytes_per_batch is not None:
        figures["h2d_bytes_per_batch"] = copy.bytes_per_batch
        figures["h2d_pinned"] = int(copy.pinned)
    if copy is not None and copy.gb_per_sec is not None:
        figures["h2d_gb_per_sec"] = round(copy.gb_per_sec, 3)
    return figures


def doctor_findings(
    run: PhaseTotals, trace_path: Path | None, top_ops: list[TopOp], sample_every: int = 1
) -> list[Finding]:
    """The share of a training batch each phase takes, and the trace file (both info).

    ``sample_every`` above 1: the phases were timed on the steps that
    :mod:`~lightning_speedpack.core.sampling` picks with it (said so).
    """
    out: list[Finding] = []
    if run.batches:
        sampled = (
            f" (timed on {cadence(sample_every, run.batches)}: {run.batches} batches)"
            if sample_every > 1
            else ""
        )
        out.append(_phases_finding(shares(run.seconds), sampled))
    if trace_path is not None:
        out.append(_trace_finding(trace_path, top_ops))
    return out


def _phases_finding(phase_shares: dict[str, float], sampled: str = "") -> Finding:
    ranked = sorted(phase_shares.items(), key=lambda kv: -kv[1])
    breakdown = ", ".join(f"{name} {share:.0%}" for name, share in ranked if share > 0)
    return Finding(
        "timeline",
        "step-phases",
        f"Where a training batch's host time goes: {breakdown}{sampled}",
        figures={k: round(v, 4) for k, v in ranked},
        severity="info",
        fix=(
            "profile a few steps with StepTimeline(trace_steps=(START, COUNT)) or "
            "`speedpack doctor --trace START:COUNT` to see the operators of the "
            "largest phase"
        ),
    )


def _trace_finding(trace_path: Path, top_ops: list[TopOp]) -> Finding:
    top = ", ".join(f"{op.name} {op.self_ms:.1f} ms" for op in top_ops[:3])
    return Finding(
        "timeline",
        "trace",
        f"Trace of the profiled steps written; top operators by self time: {top}",
        location=str(trace_path),
        figures={op.name: round(op.self_ms, 3) for op in top_ops},
        severity="info",
        fix="open the file in https://ui.perfetto.dev",
    )


def print_top_ops(window: TraceWindow) -> None:
    """Print the window's top operators by self time, and where its trace is, to stderr.

    Through :mod:`lightning_speedpack.core.console`: a rich table in a terminal, and in a log
    file (SLURM, CI) a table that fits or ``column: value`` records, never cut.
    """
    from lightning_speedpack.core.console import make_console, print_lines, print_table

    console = make_console()
    title = f"Top operators by self time, steps {window.first_step}-{window.last_step}"
    rows = [[op.name, f"{op.self_ms:.3f}", str(op.calls)] for op in window.top_ops]
    print_table(console, title, ["operator", "self ms", "calls"], rows)
    print_lines(console, [f"trace: {window.path} (open in https://ui.perfetto.dev)"])


def log_wandb_artifact(loggers: list[Any], path: Path) -> None:
    """Log the trace at ``path`` as a ``profile`` artifact to the run of each ``WandbLogger``."""
    wandb_loggers = [lg for lg in loggers if isinstance(lg, classes("loggers.WandbLogger"))]
    if not wandb_loggers:
        return
    # a WandbLogger is attached, so wandb is installed; the import stays lazy for everyone else
    import wandb

    for logger in wandb_loggers:
        run = logger.experiment
        artifact = wandb.Artifact(name=f"speedpack-trace-{run.id}", type="profile")
        artifact.add_file(str(path))
        run.log_artifact(artifact)
