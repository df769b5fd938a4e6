"""What the X-ray reports after a fit: the doctor's figures and findings, the verdict's fix.

:class:`XrayReport` is read off a :class:`~lightning_speedpack.data_xray.profiler.
DataPipelineProfiler` when the doctor asks (``doctor_figures``/``doctor_findings``): the stage
table, the notes on what was not measured and why, the trial steps the model ceiling ran, and
the verdict as a finding whose severity and fix follow what was measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.data_xray.ceilings import Verdict
from lightning_speedpack.data_xray.pipeline import PipelineTotals, format_stage_table
from lightning_speedpack.data_xray.run_check import EpochFigures, RunVerdict

__all__ = ["XrayReport", "epoch_row"]


def epoch_row(e: EpochFigures) -> dict[str, Any]:
    """One epoch of the run's evidence, for the JSON report."""
    reads = e.hits + e.misses
    return {
        "epoch": e.epoch,
        "seconds": round(e.seconds, 4),
        "samples": e.samples,
        "samples_per_sec": round(e.rate, 2),
        "data_wait_fraction": round(e.wait_fraction, 4),
        "model_samples_per_sec": round(e.model_rate, 2),
        "loader_samples_per_sec": None if e.loader_rate is None else round(e.loader_rate, 2),
        "cache_hit_rate": None if reads == 0 else round(e.hits / reads, 4),
        "start_seconds": round(e.start_seconds, 4),
    }


@dataclass
class XrayReport:
    """The profiler's state after a fit, as the report states it.

    Example:
        >>> report = XrayReport(PipelineTotals(), verdict=Verdict("model", 900.0, 400.0),
        ...                     not_timed="not a torch DataLoader: generator")
        >>> [f.id for f in report.findings()]
        ['stages-not-timed', 'model-bound']
        >>> report.figures()["not_timed"]
        'not a torch DataLoader: generator'
    """

    totals: PipelineTotals
    prefix: str = "data/"
    batches: int = 0
    loader_ceiling: float | None = None
    model_ceiling: float | None = None
    trial_steps: int = 0
    not_measured: str | None = None  # why a stream's loader was not read aside from the fit
    not_timed: str | None = None  # why the stages were not timed (not a torch DataLoader)
    verdict: Verdict | None = None
    run_check: RunVerdict | None = None
    epochs: list[EpochFigures] = field(default_factory=list)
    location: str | None = None  # the user's code behind the loader
    ours_cached: bool = False  # the training data is a CachedDataset (fill() can help)
    loader_fix: str | None = None  # the data-bound fix for a loader that is not a DataLoader

    def message(self) -> str | None:
        """The verdict as the report states it: checked against the run when it could be."""
        if self.run_check is not None:
            return self.run_check.message
        return None if self.verdict is None else self.verdict.message

    def figures(self) -> dict[str, Any]:
        """Whole-run figures: per-stage ms, busy fraction, ceilings, verdict, workers needed."""
        figures: dict[str, Any] = {
            k.removeprefix(self.prefix).replace("/", "_"): v
            for k, v in self.totals.metrics(self.prefix).items()
        }
        figures["batches"] = self.batches
        figures["loader_ceiling_samples_per_sec"] = self.loader_ceiling
        figures["model_ceiling_samples_per_sec"] = self.model_ceiling
        figures["trial_steps"] = self.trial_steps
        if self.not_measured is not None:
            figures["not_measured"] = self.not_measured
        if self.not_timed is not None:
            figures["not_timed"] = self.not_timed
        if self.run_check is not None:
            figures["verdict_revisions"] = list(self.run_check.revisions)
        figures["run_epochs"] = [epoch_row(e) for e in self.epochs]
        if self.verdict is not None:
            figures["verdict"] = self.message()
            figures["bound"] = self.verdict.bound
            figures["workers_needed"] = self.verdict.workers_needed
            figures["per_worker_samples_per_sec"] = self.verdict.per_worker_samples_per_sec
        return figures

    def findings(self) -> list[Finding]:
        """The stage table, what was not measured, and the verdict (``data-bound``/...)."""
        found: list[Finding] = []
        if self.totals.samples > 0 or self.totals.batches > 0:
            found.append(
                Finding(
                    component="data",
                    id="data-pipeline",
                    message="where a training sample's loading time goes:\n"
                    + format_stage_table(self.totals),
                    location=self.location,
                    figures=self.totals.metrics(self.prefix),
                    severity="info",
                )
            )
        if self.not_timed is not None:
            found.append(
                Finding(
                    component="data",
                    id="stages-not-timed",
                    message=f"not timed: {self.not_timed} (its fetch, collate and queue stages "
                    "are read inside torch DataLoaders only; the verdict comes from the time "
                    "each training step waited at the fetch)",
                    figures={"not_timed": self.not_timed},
                    severity="info",
                )
            )
        if self.not_measured is not None:
            found.append(
                Finding(
                    component="data",
                    id="loader-ceiling-from-the-fit",
                    message=f"not measured aside from the fit: {self.not_measured}",
                    severity="info",
                )
            )
        if self.trial_steps:
            found.append(
                Finding(
                    component="data",
                    id="trial-steps",
                    message=f"the model-ceiling probe ran {self.trial_steps} of your training "
                    "steps before the fit went on (parameters, optimizer, RNG and metric states "
                    "put back; self.log muted; anything else your training_step touches, it "
                    "touched)",
                    figures={"trial_steps": self.trial_steps},
                    severity="info",
                )
            )
        v = self.verdict
        if v is not None and v.bound == "unknown":
            found.append(
                Finding(component="data", id="bound-unknown", message=v.message, severity="info")
            )
        if v is not None and v.bound != "unknown":
            figures: dict[str, Any] = {
                "loader_ceiling_samples_per_sec": v.loader_samples_per_sec,
                "model_ceiling_samples_per_sec": v.model_samples_per_sec,
                "workers_needed": v.workers_needed,
            }
            if v.wait_fraction is not None:
                figures["data_wait_fraction"] = round(v.wait_fraction, 4)
            found.append(
                Finding(
                    component="data",
                    id=f"{v.bound}-bound",
                    message=self.message() or v.message,
                    location=self.location if v.bound == "data" else None,
                    figures=figures,
                    severity=self.severity(v),
                    fix=self.fix(v),
                )
            )
        return found

    def severity(self, v: Verdict) -> Literal["info", "warning", "error"]:
        """Data-bound is a warning; an error when the run waited more than it computed."""
        if v.bound != "data":
            return "info"
        steady = self.run_check.steady if self.run_check is not None else None
        return "error" if steady is not None and steady.wait_fraction > 0.5 else "warning"

    def fix(self, v: Verdict) -> str | None:
        """What to change, for the kind of loader and what bounds it."""
        if v.bound == "data":
            if self.loader_fix is not None:  # not a DataLoader: its own knobs
                return self.loader_fix
            if v.transfer_note is not None:
                return (
                    "larger batches, or DataLoader(num_workers=0) when a sample is cheap to "
                    "read (a cache): fewer handovers from worker processes per sample"
                )
            if v.instead is not None:
                more = f"DataLoader(num_workers={v.workers_needed}); " if v.workers_needed else ""
                return more + v.instead
            if v.workers_needed:
                return (
                    f"raise DataLoader(num_workers=...) to about {v.workers_needed} "
                    "(persistent_workers=True) and/or cache the deterministic preprocessing "
                    "with lightning_speedpack.CachedDataset"
                )
            return "cache the deterministic preprocessing with CachedDataset"
        check = self.run_check
        if check is not None and check.filling_bound == "data" and self.ours_cached:
            return (
                "once per run the first epoch decodes while training; CachedDataset.fill() "
                "before fit decodes in processes of its own instead"
            )
        return None
