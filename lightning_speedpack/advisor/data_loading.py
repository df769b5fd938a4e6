"""The data-loading checks: worker processes, pinned memory, and time spent waiting for data.

``dataloader-workers`` (rule of thumb, or the worker count a measurement asked for through
:func:`with_measured_workers`; only ``info`` when the advisor's own measured data wait is under
:data:`WORKERS_WAIT_THRESHOLD`, through :func:`with_own_data_wait`), ``pin-memory`` (GPU only;
with the copy's measured share of the step through :func:`with_measured_copy`),
``persistent-workers`` and the measured ``data-wait``.
"""

from __future__ import annotations

from dataclasses import replace

from lightning_speedpack.advisor.vocabulary import AdvisorFinding, DeviceInfo, LoaderSettings
from lightning_speedpack.core.events import BatchTransfer, DataVerdict

__all__ = [
    "COPY_SHARE_THRESHOLD",
    "MIN_WAIT_STEPS",
    "WORKERS_WAIT_THRESHOLD",
    "check_data_wait",
    "check_dataloader_workers",
    "check_persistent_workers",
    "check_pin_memory",
    "with_measured_copy",
    "with_measured_wait",
    "with_measured_workers",
    "with_own_data_wait",
]

#: Below this share of the step, the copy of the batch to the device is not worth pinning for.
COPY_SHARE_THRESHOLD = 0.02

#: Below this share of the step spent waiting for data, workers for ``num_workers=0`` would not
#: pay: they can hide at most that wait, and each batch's handover between processes costs some.
WORKERS_WAIT_THRESHOLD = 0.05

#: Measured steps the advisor's own data wait needs before :func:`with_own_data_wait` trusts it.
MIN_WAIT_STEPS = 5


def check_dataloader_workers(
    loader: LoaderSettings, cpu_cores: int, local_processes: int = 1
) -> list[AdvisorFinding]:
    """``dataloader-workers``: no worker processes, or more than this process's share of the cores.

    Args:
        loader: the dataloader's settings.
        cpu_cores: CPU cores this machine gives the run (its affinity set).
        local_processes: training processes on this machine (one per device under DDP).
    """
    share = max(1, cpu_cores // max(1, local_processes))
    if loader.num_workers == 0:
        return [
            AdvisorFinding(
                "dataloader-workers",
                "warning",
                "batches are loaded in the training process, so the step waits for every batch",
                f"{loader.name}: num_workers=0",
                location=loader.name,
                fix=f"DataLoader(num_workers={min(share, 8)}, ...) loads the next batches in "
                "background processes while the step runs",
                figures={"num_workers": 0, "cpu_cores_per_process": share},
            )
        ]
    if loader.num_workers > share:
        return [
            AdvisorFinding(
                "dataloader-workers",
                "warning",
                "more dataloader workers than CPU cores per training process: they compete for "
                "the cores and each holds its own batches in shared memory (/dev/shm)",
                f"{loader.name}: num_workers={loader.num_workers}, {cpu_cores} cores / "
                f"{local_processes} process(es) = {share} per process",
                location=loader.name,
                fix=f"DataLoader(num_workers={share}, ...)",
                figures={"num_workers": loader.num_workers, "cpu_cores_per_process": share},
            )
        ]
    return []


def with_measured_workers(
    found: list[AdvisorFinding], measured: DataVerdict | None, where: str = "train_dataloader"
) -> list[AdvisorFinding]:
    """``dataloader-workers`` with the number of workers a measurement asked for.

    When the data profiler measured the run as data-bound (its loader and model ceilings),
    the rule-of-thumb worker count of the ``dataloader-workers`` finding gives way to the
    measured one; a data-bound run with no such finding gets one. A model-bound verdict
    (also one revised at fit end, after an earlier data-bound one) removes the measured
    finding, and the ``num_workers=0`` rule of thumb once the verdict was checked against the
    run; "fewer workers than now" stays. An unknown verdict changes nothing.

    Example:
        >>> v = DataVerdict("data", 300.0, 2400.0, workers_needed=6,
        ...                 per_worker_samples_per_sec=400.0, num_workers=0)
        >>> [f.fix for f in with_measured_workers([], v)]  # doctest: +NORMALIZE_WHITESPACE
        ['DataLoader(num_workers=6, persistent_workers=True): measured, one loading process
          delivers 400 samples/s and the model consumes 2,400']
    """
    if measured is None:
        return found
    if measured.bound == "model":
        # Measured: the loader keeps up. An earlier data-bound verdict the run then refuted
        # goes; so does "add workers" for num_workers=0 once the run itself was checked (its
        # data wait timed at the loader): a model-bound run waited under 20% of its time, less
        # than a worker's handover of each batch would cost on a machine this busy.
        checked = measured.data_wait_fraction is not None
        return [f for f in found if not (_measured_workers(f) or (checked and _adds_workers(f)))]
    enough = measured.workers_needed is not None and measured.workers_needed <= measured.num_workers
    if measured.bound == "data" and (not measured.workers_close_gap or enough):
        # Measured: workers on this rank's cores cannot feed the model, or the loader has the
        # workers it needs already. The data-bound finding says what can; "add workers" here
        # would promise what was measured not to be.
        return [f for f in found if not (_measured_workers(f) or _adds_workers(f))]
    if measured.bound != "data":
        return found
    if not measured.workers_needed:  # a worker count from an earlier verdict is stale now
        return [f for f in found if not _measured_workers(f)]
    per_worker = measured.per_worker_samples_per_sec or 0.0
    model = measured.model_samples_per_sec or 0.0
    fix = (
        f"DataLoader(num_workers={measured.workers_needed}, persistent_workers=True): measured, "
        f"one loading process delivers {per_worker:,.0f} samples/s and the model consumes "
        f"{model:,.0f}"
    )
    figures = {
        "num_workers": measured.num_workers,
        "workers_needed": measured.workers_needed,
        "per_worker_samples_per_sec": per_worker,
        "loader_ceiling_samples_per_sec": measured.loader_samples_per_sec,
        "model_ceiling_samples_per_sec": model,
    }
    kept = [f for f in found if f.id != "dataloader-workers"]
    old = next((f for f in found if f.id == "dataloader-workers"), None)
    measured_finding = AdvisorFinding(
        "dataloader-workers",
        "warning",
        "the loader cannot feed the model: more worker processes would close the gap",
        f"loader {measured.loader_samples_per_sec or 0.0:,.0f} samples/s with "
        f"num_workers={measured.num_workers}, model {model:,.0f} samples/s",
        fix,
        location=old.location if old is not None else where,
        figures={**(old.figures if old is not None else {}), **figures},
    )
    return [measured_finding, *kept]


def _measured_workers(finding: AdvisorFinding) -> bool:
    """The ``dataloader-workers`` finding a data-bound measurement made."""
    return finding.id == "dataloader-workers" and "workers_needed" in (finding.figures or {})


def _adds_workers(finding: AdvisorFinding) -> bool:
    """The rule-of-thumb ``dataloader-workers`` finding for ``num_workers=0``."""
    return finding.id == "dataloader-workers" and (finding.figures or {}).get("num_workers") == 0


def with_measured_wait(
    found: list[AdvisorFinding], measured: DataVerdict | None, threshold: float = 0.2
) -> list[AdvisorFinding]:
    """``data-wait`` as the data profiler measured it, when it did.

    The advisor's own wait is the interval between two batch hooks: what other callbacks do
    there (a checkpoint, a logger) looks like waiting for data. The profiler times the loader's
    ``next`` itself. With its figure: the finding goes when that wait is at most ``threshold``
    of the training time or under 1 ms a batch, and when the run is measured data-bound (the
    ``data-bound`` finding states the wait and the fix); otherwise it stays.

    Example:
        >>> wait = AdvisorFinding("data-wait", "error", "72% waits", "e", "fix")
        >>> v = DataVerdict("model", 4900.0, 2700.0, data_wait_fraction=0.03,
        ...                 data_wait_ms_per_batch=0.8)
        >>> with_measured_wait([wait], v)
        []
    """
    if measured is None or measured.confirms_data_wait(threshold) is not False:
        return found
    return [f for f in found if f.id != "data-wait"]


def with_own_data_wait(
    found: list[AdvisorFinding],
    data_wait_fraction: float | None,
    steps: int,
    threshold: float = WORKERS_WAIT_THRESHOLD,
    min_steps: int = MIN_WAIT_STEPS,
) -> list[AdvisorFinding]:
    """``dataloader-workers`` for ``num_workers=0`` against the advisor's own measured data wait.

    The advisor times the DataLoader's fetch in every measured step. When it measured at least
    ``min_steps`` steps and the fetch took under ``threshold`` (5%) of the time, workers can
    hide at most that much, less each batch's handover between processes: the ``num_workers=0``
    finding (the rule of thumb, or a worker count a data-bound verdict asked for) is no longer a
    warning. It stays, as ``info``, rather than going: a reader who knows the guides' "use
    workers" sees why it does not apply here (the measured figure, in ``evidence`` and in
    ``figures["data_wait_fraction"]``), the id stays for anyone who filters on it, and the fix
    says when the advice would come back. "More workers than cores" is about oversubscription,
    not the wait, and passes through; so does everything else, and everything when the wait
    was not measured or over too few steps.

    Args:
        found: the findings so far.
        data_wait_fraction: the measured wait over wait plus step (None: not measured).
        steps: how many steps that wait was measured over.
        threshold: the share of the step under which workers would not pay.
        min_steps: the fewest measured steps to trust the figure.

    Example:
        >>> rule = check_dataloader_workers(LoaderSettings("train_dataloader"), cpu_cores=2)
        >>> (f,) = with_own_data_wait(rule, 0.01, steps=20)
        >>> f.severity, f.evidence  # doctest: +NORMALIZE_WHITESPACE
        ('info', 'train_dataloader: num_workers=0; measured: the step waits 1% of its time for
          data; workers would not pay here')
        >>> with_own_data_wait(rule, 0.01, steps=3) == rule  # too few steps to say
        True
    """
    if data_wait_fraction is None or steps < min_steps or data_wait_fraction >= threshold:
        return found
    return [
        _workers_would_not_pay(f, data_wait_fraction, steps) if _adds_workers(f) else f
        for f in found
    ]


def _workers_would_not_pay(finding: AdvisorFinding, fraction: float, steps: int) -> AdvisorFinding:
    share = f"{fraction:.0%}" if fraction >= 0.01 else f"{fraction:.1%}"
    figures = finding.figures
    workers = figures.get("workers_needed") or min(figures.get("cpu_cores_per_process", 1), 8)
    return replace(
        finding,
        severity="info",
        message="batches are loaded in the training process, and the step hardly waits for them",
        evidence=f"{finding.evidence}; measured: the step waits {share} of its time for data; "
        "workers would not pay here",
        fix="none while loading stays this fast; if it gets slower (decoding, augmentation, "
        f"remote storage): DataLoader(num_workers={workers}, ...)",
        figures={**finding.figures, "data_wait_fraction": round(fraction, 4), "steps": steps},
    )


def check_pin_memory(loader: LoaderSettings, device: DeviceInfo) -> list[AdvisorFinding]:
    """``pin-memory``: ``pin_memory=False`` while training on a GPU (GPU-only)."""
    if not device.is_gpu or loader.pin_memory:
        return []
    return [
        AdvisorFinding(
            "pin-memory",
            "warning",
            "batches are copied to the GPU from pageable memory, which cannot overlap with compute",
            f"{loader.name}: pin_memory=False on {device.name or 'a CUDA GPU'}",
            location=loader.name,
            fix="DataLoader(pin_memory=True, ...) (Lightning then copies with non_blocking=True)",
        )
    ]


def with_measured_copy(
    found: list[AdvisorFinding],
    measured: BatchTransfer | None,
    threshold: float = COPY_SHARE_THRESHOLD,
) -> list[AdvisorFinding]:
    """``pin-memory`` with the share of the step the copy to the device was measured to take.

    The step timeline times Lightning's batch transfer; a copy under ``threshold`` of the step
    (2%) gains too little from pinned memory and ``non_blocking`` to be worth the advice, so the
    finding goes. Otherwise it stays and carries the measured share (and the copy's bytes and
    device rate when known); without a measurement it stays as the rule of thumb, and says the
    copy was not measured. Other findings pass through.

    Example:
        >>> pin = AdvisorFinding("pin-memory", "warning", "pageable", "pin_memory=False", "pin")
        >>> with_measured_copy([pin], BatchTransfer(1.0, 100.0, 20))
        []
        >>> (kept,) = with_measured_copy([pin], BatchTransfer(13.6, 186.0, 20))
        >>> print(kept.evidence)  # doctest: +NORMALIZE_WHITESPACE
        pin_memory=False; measured: the copy to the device takes 7.3% of the step
        (13.6 of 186.0 ms per batch)
    """
    if measured is None or measured.batches == 0:
        return [_copy_not_measured(f) if f.id == "pin-memory" else f for f in found]
    if measured.share < threshold:
        return [f for f in found if f.id != "pin-memory"]
    return [_with_copy(f, measured) if f.id == "pin-memory" else f for f in found]


def _copy_not_measured(finding: AdvisorFinding) -> AdvisorFinding:
    return replace(finding, evidence=f"{finding.evidence}; copy not measured")


def _with_copy(finding: AdvisorFinding, measured: BatchTransfer) -> AdvisorFinding:
    evidence = (
        f"{finding.evidence}; measured: the copy to the device takes {measured.share:.1%} of "
        f"the step ({measured.transfer_ms_per_batch:.1f} of {measured.step_ms_per_batch:.1f} ms "
        "per batch)"
    )
    figures: dict[str, float | int] = {
        "copy_share": round(measured.share, 4),
        "copy_ms_per_batch": round(measured.transfer_ms_per_batch, 3),
        "step_ms_per_batch": round(measured.step_ms_per_batch, 3),
    }
    if measured.bytes_per_batch is not None:
        figures["h2d_bytes_per_batch"] = measured.bytes_per_batch
    if measured.gb_per_sec is not None:
        figures["h2d_gb_per_sec"] = round(measured.gb_per_sec, 3)
    return replace(finding, evidence=evidence, figures={**finding.figures, **figures})


def check_persistent_workers(
    loader: LoaderSettings, planned_epochs: int | None
) -> list[AdvisorFinding]:
    """``persistent-workers``: worker processes restarted every epoch of a several-epoch run.

    Args:
        loader: the dataloader's settings.
        planned_epochs: epochs the run will train, None when unbounded.
    """
    several = planned_epochs is None or planned_epochs > 1
    if loader.num_workers == 0 or loader.persistent_workers or not several:
        return []
    epochs = "an unbounded number of" if planned_epochs is None else str(planned_epochs)
    return [
        AdvisorFinding(
            "persistent-workers",
            "warning",
            "the dataloader's worker processes are started again at every epoch, and the step "
            "waits while they assemble their first batches",
            f"{loader.name}: num_workers={loader.num_workers}, persistent_workers=False, "
            f"{epochs} epochs",
            location=loader.name,
            fix="DataLoader(persistent_workers=True, ...)",
            figures={"planned_epochs": planned_epochs},
        )
    ]


def check_data_wait(
    wait_s: float, step_s: float, steps: int, threshold: float = 0.2, min_wait_s: float = 1e-3
) -> list[AdvisorFinding]:
    """``data-wait``: more than ``threshold`` of the step time spent waiting for the next batch.

    Args:
        wait_s: seconds between the end of one training batch and the start of the next,
            summed over the measured steps (validation excluded).
        step_s: seconds inside the measured training batches, summed.
        steps: how many steps were measured.
        threshold: the fraction of ``wait_s + step_s`` above which the finding fires.
        min_wait_s: the finding also needs a mean wait of at least this many seconds per
            step: below a millisecond the "wait" is the training loop's own bookkeeping
            between steps (tiny models), which no data-loading fix removes.
    """
    total = wait_s + step_s
    if steps == 0 or total <= 0:
        return []
    fraction = wait_s / total
    if fraction <= threshold or wait_s / steps < min_wait_s:
        return []
    return [
        AdvisorFinding(
            "data-wait",
            "error" if fraction > 0.5 else "warning",
            f"{fraction:.0%} of the training time waits for the next batch",
            f"measured over {steps} steps: {wait_s * 1e3 / steps:.1f} ms waiting vs "
            f"{step_s * 1e3 / steps:.1f} ms in the step, per step",
            fix="cache the deterministic preprocessing with lightning_speedpack.CachedDataset, "
            "add dataloader workers, or move the data to local storage or RAM",
            figures={"data_wait_fraction": round(fraction, 4), "steps": steps},
        )
    ]
