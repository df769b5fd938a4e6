"""Where the X-ray's figures go: the Trainer's loggers, the W&B run summary, the advisor.

Rank 0 logs and writes the summary; the verdict is published on every rank to the tools of the
same process (:data:`~lightning_speedpack.core.events.DATA_VERDICT`: the advisor and the
throughput logger follow it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_speedpack.core import events
from lightning_speedpack.core.lightning import classes
from lightning_speedpack.data_xray.ceilings import Verdict
from lightning_speedpack.data_xray.pipeline import PipelineTotals

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = ["log_ceilings", "log_metrics", "publish_verdict", "write_wandb_summary"]


def log_metrics(trainer: pl.Trainer, metrics: dict[str, float]) -> None:
    """``metrics`` through every logger at ``trainer.global_step`` (rank 0 only)."""
    if not metrics or not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)


def log_ceilings(
    trainer: pl.Trainer, prefix: str, loader: float | None, model: float | None
) -> None:
    """Both ceilings through every logger, once (rank 0); an unmeasured one is left out."""
    metrics = {
        f"{prefix}loader_ceiling_samples_per_sec": loader,
        f"{prefix}model_ceiling_samples_per_sec": model,
    }
    log_metrics(trainer, {k: float(v) for k, v in metrics.items() if v is not None})


def publish_verdict(
    v: Verdict, workers: int, wait: float | None = None, wait_ms: float | None = None
) -> None:
    """Tell the advisor (its ``dataloader-workers`` finding follows the measured verdict)."""
    events.publish(
        events.DATA_VERDICT,
        events.DataVerdict(
            v.bound,
            v.loader_samples_per_sec,
            v.model_samples_per_sec,
            v.workers_needed,
            v.per_worker_samples_per_sec,
            workers,
            wait,
            wait_ms,
            v.cores is None and v.transfer_note is None,
        ),
    )


def write_wandb_summary(
    trainer: pl.Trainer,
    prefix: str,
    totals: PipelineTotals,
    verdict: Verdict | None,
    loader: float | None,
    model: float | None,
) -> None:
    """The run summary of every ``WandbLogger``: totals, verdict, ceilings, workers needed."""
    runs = [
        lg.experiment for lg in trainer.loggers if isinstance(lg, classes("loggers.WandbLogger"))
    ]
    if not runs:
        return
    summary: dict[str, Any] = {f"{prefix}{k}": v for k, v in totals.metrics("").items()}
    if verdict is not None:
        summary[f"{prefix}verdict"] = verdict.message
        summary[f"{prefix}workers_needed"] = verdict.workers_needed
    summary[f"{prefix}loader_ceiling_samples_per_sec"] = loader
    summary[f"{prefix}model_ceiling_samples_per_sec"] = model
    summary = {k: v for k, v in summary.items() if v is not None}
    for run in runs:
        run.summary.update(summary)
