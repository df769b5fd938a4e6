"""Findings for the causes outside the training step, each with its measured share of the wall.

Thresholds (share of the fit's wall time, from the issue that asked for them): validation over
25%, checkpointing over 10%, logging and progress bars over 5%, repeated epoch starts over 10%,
one callback's hooks over 5%, Python's own garbage collections over 5%. Settings that slow every
step whatever they cost here (more CPU threads than cores, anomaly detection, a profiler, a batch
of a few samples) are read from the run and carry the training steps' measured share.

:func:`wall_findings` reads a :class:`LedgerReadings`: what
:class:`~lightning_speedpack.wall_time.callback.WallTimeLedger` measured, described here so that
this module need not import the callback that imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from lightning_speedpack.core.findings import Finding, Severity
from lightning_speedpack.core.locations import is_library_file
from lightning_speedpack.wall_time.collector import COLLECTION, CollectorClock
from lightning_speedpack.wall_time.ledger import Ledger
from lightning_speedpack.wall_time.settings import RunSettings, ValidationRun

__all__ = [
    "CALLBACK_SHARE",
    "CHECKPOINT_SHARE",
    "EPOCH_START_SHARE",
    "GC_SHARE",
    "LOGGING_SHARE",
    "SMALL_BATCH",
    "VALIDATION_SHARE",
    "LedgerReadings",
    "RunSettings",
    "ValidationRun",
    "wall_findings",
]

VALIDATION_SHARE = 0.25
CHECKPOINT_SHARE = 0.10
LOGGING_SHARE = 0.05
EPOCH_START_SHARE = 0.10
CALLBACK_SHARE = 0.05
GC_SHARE = 0.05
#: batches of fewer samples are "too small to use the device" (by rule: not measured)
SMALL_BATCH = 8
_COMPONENT = "wall_time"
_HEAVY_PROFILERS = ("AdvancedProfiler", "PyTorchProfiler", "XLAProfiler")


class LedgerReadings(Protocol):
    """What :func:`wall_findings` reads of a fit: a ``WallTimeLedger`` after (or during) it."""

    ledger: Ledger
    collector: CollectorClock
    validation_runs: list[ValidationRun]
    epoch_starts: list[float]
    settings: RunSettings | None
    saves: int
    train_batches: int

    @property
    def total_s(self) -> float:
        """Seconds from the first event to the last."""
        ...

    def seconds(self) -> dict[str, float]:
        """Seconds per part of the ledger."""
        ...

    def callback_seconds(self) -> dict[str, float]:
        """Seconds per callback's hooks."""
        ...

    @property
    def doctor_callbacks(self) -> frozenset[str]:
        """The class names of the callbacks the doctor attached (not the user's own)."""
        ...

    def details(self) -> dict[tuple[str, str], float]:
        """Seconds per ``(ledger key, detail)``."""
        ...

    def fractions(self) -> dict[str, float]:
        """Each part's share of :attr:`total_s`."""
        ...


def wall_findings(ledger: LedgerReadings) -> list[Finding]:
    """Every finding the ledger's figures and the run's settings support, largest share first."""
    shares = ledger.fractions()
    settings = ledger.settings or RunSettings()
    found = [
        *_validation(ledger, shares["validation"], settings),
        *_checkpoint(ledger, shares["checkpoint"], settings),
        *_logging(ledger, shares["logging"], settings),
        *_epoch_starts(ledger, shares["epoch_start"], settings),
        *_callbacks(ledger, settings),
        *_collections(ledger, shares.get(COLLECTION, 0.0)),
        *_collect_calls(ledger),
        *_settings(ledger, shares["training_step"], settings),
    ]
    return sorted(found, key=lambda f: -float(f.figures.get("wall_fraction", 0.0)))


def _finding(
    id_: str,
    message: str,
    share: float,
    seconds: float,
    fix: str,
    severity: Severity = "warning",
    **figures: Any,
) -> Finding:
    return Finding(
        _COMPONENT,
        id_,
        message,
        figures={"wall_fraction": round(share, 4), "seconds": round(seconds, 3), **figures},
        severity=severity,
        fix=fix,
    )


def _validation(ledger: LedgerReadings, share: float, s: RunSettings) -> list[Finding]:
    if share <= VALIDATION_SHARE:
        return []
    runs = ledger.validation_runs
    seconds = ledger.seconds()["validation"]
    batches = sum(r.batches for r in runs)
    samples = sum(r.samples for r in runs)
    each = seconds / len(runs) if runs else 0.0
    return [
        _finding(
            "validation-time",
            f"validation took {share:.0%} of the wall time ({_secs(seconds)}): {len(runs)} runs "
            f"of the validation loop, {batches} batches, {samples} samples, {_each(each)} each",
            share,
            seconds,
            "validate less often or on fewer batches: `Trainer(val_check_interval=...)` (now "
            f"{s.val_check_interval!r}), `check_val_every_n_epoch` (now "
            f"{s.check_val_every_n_epoch!r}), `limit_val_batches` (now {s.limit_val_batches!r})",
            runs=len(runs),
            batches=batches,
            samples=samples,
        )
    ]


def _checkpoint(ledger: LedgerReadings, share: float, s: RunSettings) -> list[Finding]:
    if share <= CHECKPOINT_SHARE:
        return []
    seconds = ledger.seconds()["checkpoint"]
    saves = ledger.saves
    each = f", {_each(seconds / saves)} each" if saves else ""
    now = "; ".join(
        ", ".join(f"{k}={v!r}" for k, v in cfg.items() if v is not None) for cfg in s.checkpoints
    )
    return [
        _finding(
            "checkpoint-time",
            f"saving checkpoints took {share:.0%} of the wall time ({_secs(seconds)}, "
            f"{saves} saves{each})",
            share,
            seconds,
            "save less often or less: `ModelCheckpoint(every_n_train_steps=...)` or "
            "`every_n_epochs`, a smaller `save_top_k`, `save_weights_only=True`"
            + (f" (now {now})" if now else ""),
            saves=saves,
        )
    ]


def _logging(ledger: LedgerReadings, share: float, s: RunSettings) -> list[Finding]:
    if share <= LOGGING_SHARE:
        return []
    seconds = ledger.seconds()["logging"]
    loggers = sum(
        v
        for (k, d), v in ledger.details().items()
        if k == "logging" and (d == "log_metrics" or d.startswith("logger."))
    )
    bars = max(0.0, seconds - loggers)
    refresh = f" (now {s.progress_refresh})" if s.progress_refresh is not None else ""
    return [
        _finding(
            "logging-time",
            f"logging took {share:.0%} of the wall time ({_secs(seconds)}): the loggers' writes "
            f"{_secs(loggers)}, the progress bar {_secs(bars)}",
            share,
            seconds,
            f"log less often: `Trainer(log_every_n_steps=...)` (now {s.log_every_n_steps}); "
            "`self.log(..., sync_dist=False)` for per-step values; a slower progress bar "
            f"refresh: `TQDMProgressBar(refresh_rate=...)`{refresh}",
            loggers_s=round(loggers, 3),
            progress_bar_s=round(bars, 3),
        )
    ]


def _epoch_starts(ledger: LedgerReadings, share: float, s: RunSettings) -> list[Finding]:
    starts = ledger.epoch_starts
    if share <= EPOCH_START_SHARE or not starts:
        return []
    seconds = ledger.seconds()["epoch_start"]
    repeated = len(starts) > 1 and s.workers > 0 and not s.persistent_workers
    mean = seconds / len(starts)
    if repeated:
        return [
            _finding(
                "epoch-start-time",
                f"starting epochs took {share:.0%} of the wall time ({_secs(seconds)} over "
                f"{len(starts)} epochs, {_each(mean)} each): the DataLoader starts its "
                f"{s.workers} workers again at every epoch",
                share,
                seconds,
                "keep the workers between epochs: `DataLoader(..., persistent_workers=True)`",
                epochs=len(starts),
            )
        ]
    if len(starts) > 1 and starts[0] < 0.8 * seconds:  # paid again at every epoch
        what, fix = "the loader's first batch, paid once per epoch", _FIRST_ITEM_FIX
    else:
        what, fix = _paid_once(starts, s)
    return [
        _finding(
            "epoch-start-time",
            f"starting epochs took {share:.0%} of the wall time ({_secs(seconds)} over "
            f"{len(starts)} epochs): {what}",
            share,
            seconds,
            fix,
            severity="info",
            epochs=len(starts),
        )
    ]


_FIRST_ITEM_FIX = (
    "make the dataset's first item cheap (open files lazily in each worker) or train longer per "
    "epoch"
)


def _paid_once(starts: list[float], s: RunSettings) -> tuple[str, str]:
    """What the first epoch's start was, when it held (nearly) all of it, and what to change."""
    rest = starts[1:]
    if len(rest) == 1:
        others = f" (the second {_secs(rest[0])})"
    elif rest:
        others = f" (the others {_each(sum(rest) / len(rest))} each)"
    else:
        others = ""
    what = f"the first epoch's first batch took {_secs(starts[0])}{others}, once per fit"
    if s.workers and s.worker_start in ("spawn", "forkserver"):
        # Each worker process started so imports torch and the script anew: seconds apiece.
        return (
            f"{what}: its {s.workers} DataLoader workers start with {s.worker_start!r}, each "
            "importing torch and the script anew",
            "`DataLoader(multiprocessing_context='fork')` (Linux's default) starts workers in "
            "milliseconds, where the dataset is safe to fork; fewer workers start sooner; a "
            "longer fit pays it once all the same",
        )
    return what, _FIRST_ITEM_FIX


#: Callbacks whose time is trials run once per fit at its start, asked for by the user (the
#: pack's measured remedies and batch-size tuner): reported as info, not as a slow callback.
TRIAL_CALLBACKS = frozenset({"WhatIf", "BatchSizeTuner"})
#: Callbacks that probe once per fit in one hook when asked to (the X-ray's ceilings probe,
#: `probe="start"`, which `--deep` turns on): that hook's time is reported as info, the same
#: kind of cost as the trials; the rest of its hooks are judged as any callback's.
PROBE_HOOKS = {"DataPipelineProfiler": "on_train_start"}


def _callbacks(ledger: LedgerReadings, s: RunSettings) -> list[Finding]:
    total = ledger.total_s
    own = ledger.doctor_callbacks
    out = []
    for name, seconds in ledger.callback_seconds().items():
        share = seconds / total if total > 0 else 0.0
        if share <= CALLBACK_SHARE:
            continue
        hooks = sorted(
            ((d, v) for (k, d), v in ledger.details().items() if k == f"callback:{name}"),
            key=lambda kv: -kv[1],
        )
        top = ", ".join(f"{hook} {_secs(v)}" for hook, v in hooks[:3])
        probe = dict(hooks).get(PROBE_HOOKS.get(name, ""), 0.0)
        if probe > 0.0:  # the probe apart; the other hooks judged on their own
            if probe / total > CALLBACK_SHARE / 2:
                out.append(_probe_finding(name, probe, total))
            seconds -= probe
            share = seconds / total if total > 0 else 0.0
            hooks = [(hook, v) for hook, v in hooks if hook != PROBE_HOOKS[name]]
            top = ", ".join(f"{hook} {_secs(v)}" for hook, v in hooks[:3])
            if share <= CALLBACK_SHARE:
                continue
        if name in own and name not in TRIAL_CALLBACKS:
            out.append(_doctor_cost_finding(name, share, seconds, top))
            continue
        if name in s.searches:  # Lightning's search: trial steps, not a per-step cost
            out.append(_search_finding(name, s.searches[name], share, seconds, top))
            continue
        if name in TRIAL_CALLBACKS:  # asked for: trials once per fit, not a per-step cost
            out.append(
                _finding(
                    "callback-time",
                    f"{name}'s trials took {share:.0%} of the wall time ({_secs(seconds)}, once "
                    "per fit, before the first step)",
                    share,
                    seconds,
                    f"bound them with {name}'s budget (`budget_s`, `max_val`), or drop it "
                    "once its choice is in your code",
                    severity="info",
                    callback=name,
                )
            )
            continue
        out.append(
            _finding(
                "callback-time",
                f"the hooks of callback {name} took {share:.0%} of the wall time "
                f"({_secs(seconds)}: {top})",
                share,
                seconds,
                f"make {name}'s hooks cheaper (run its work every N steps, or off the training "
                "thread), or remove it from `Trainer(callbacks=...)`",
                callback=name,
            )
        )
    return out


def _search_finding(name: str, found: str, share: float, seconds: float, top: str) -> Finding:
    """Lightning's ``BatchSizeFinder``/``LearningRateFinder``: a search of trial steps."""
    setting = found.rsplit(" ", 1)[0] if found else "setting"
    return _finding(
        "callback-time",
        f"{name}'s search took {share:.0%} of the wall time ({_secs(seconds)}: {top}): trial "
        f"steps at each candidate, run when the fit starts (and where a subclass runs it again)"
        + (f"; it found {found}" if found else ""),
        share,
        seconds,
        f"once the search has found the {setting}, put it in your code and leave {name} out of "
        "the runs that follow",
        severity="info",
        callback=name,
    )


_COLLECTION_FIX = (
    "call `gc.collect(); gc.freeze()` just before `trainer.fit(...)`: what exists then (torch, "
    "Lightning, the model, the dataset) leaves the collector's scans; if full collections "
    "recur, keep fewer Python objects per sample (arrays or tensors, not lists of dicts)"
)
_FROZEN_FIX = (
    "`gc.freeze()` was already on ({:,} objects frozen before the fit): these collections "
    "scanned what was built after it; keep fewer Python objects alive (arrays or tensors, not "
    "lists of dicts), or freeze again once the dataset and model exist"
)


def _collections(ledger: LedgerReadings, share: float) -> list[Finding]:
    if share <= GC_SHARE:
        return []
    clock = ledger.collector
    seconds = ledger.seconds()[COLLECTION]
    count, full = sum(clock.collections), clock.collections[2]
    # One long pause is paid once (a full collection soon after the imports); on a short run it
    # is a large share, on a long one nothing. A warning only when the pauses recur: what is
    # left without the longest still over the threshold.
    total = ledger.total_s
    recurring = total > 0 and (seconds - clock.longest_s) / total > GC_SHARE
    once = "" if recurring else "; paid once, not every step"
    return [
        _finding(
            "garbage-collection",
            f"Python's garbage collector paused the run for {share:.0%} of the wall time "
            f"({_secs(seconds)} in {count} collections, {full} of them full, the longest "
            f"{_each(clock.longest_s)}{once}): each full collection scans every Python object "
            "alive",
            share,
            seconds,
            _COLLECTION_FIX if not clock.frozen else _FROZEN_FIX.format(clock.frozen),
            severity="warning" if recurring else "info",
            collections=count,
            full_collections=full,
            longest_s=round(clock.longest_s, 3),
            frozen_objects=clock.frozen,
        )
    ]


def _collect_calls(ledger: LedgerReadings) -> list[Finding]:
    # The job's own `gc.collect()` lines only: a library's call, or the pack's own after an
    # OOM, is charged where it ran but is not the job's line to change.
    total = ledger.total_s
    calls = {site: c for site, c in ledger.collector.calls.items() if _users(site[0])}
    seconds = sum(spent for _, spent in calls.values())
    share = seconds / total if total > 0 else 0.0
    if share <= GC_SHARE or not calls:
        return []
    (path, line), (count, spent) = max(calls.items(), key=lambda kv: kv[1][1])
    where = f"{Path(path).name}:{line}"
    steps = ledger.train_batches
    often = f", {count / steps:.2g} per training step" if steps else ""
    finding = _finding(
        "gc-collect-calls",
        f"`gc.collect()` called by the job took {share:.0%} of the wall time ({_secs(seconds)} "
        f"in {sum(c for c, _ in calls.values())} calls); the most at {where}: {count} calls"
        f"{often}, {spent:.1f} s. Each call scans every live Python object",
        share,
        seconds,
        f"remove the call at {where} (Python collects by itself), or make it rare: every few "
        "hundred steps, or at an epoch's end (`on_train_epoch_end`)",
        calls=count,
        sites=len(calls),
    )
    finding.location = where
    return [finding]


_PACK_DIR = str(Path(__file__).resolve().parents[1])


def _users(path: str) -> bool:
    return not (is_library_file(path) or path.startswith(_PACK_DIR))


def _doctor_cost_finding(name: str, share: float, seconds: float, top: str) -> Finding:
    """What a callback the doctor attached cost: its measuring, not the job's (info).

    Mostly fixed costs (its start and end of training), which a short fit weighs more; the job
    run without the doctor does not pay them, so this is not the job's slow callback.
    """
    return _finding(
        "callback-time",
        f"the doctor's own {name} took {share:.0%} of the wall time ({_secs(seconds)}: {top}): "
        "the cost of measuring, which the job run without the doctor does not pay",
        share,
        seconds,
        "nothing to change in the job; a longer fit makes it a smaller share, and "
        "`speedpack doctor --only` leaves a diagnostic out",
        severity="info",
        callback=name,
    )


def _secs(seconds: float) -> str:
    """A finding's seconds: tenths of a second, or milliseconds under 0.1 s (not "0.0 s")."""
    return f"{seconds:.1f} s" if seconds >= 0.1 else f"{seconds * 1e3:.0f} ms"


def _each(seconds: float) -> str:
    """One occurrence's seconds: hundredths of a second, or milliseconds under 0.1 s.

    Example:
        >>> _each(0.35), _each(0.0213), _secs(0.04)
        ('0.35 s', '21.3 ms', '40 ms')
    """
    return f"{seconds:.2f} s" if seconds >= 0.1 else f"{seconds * 1e3:.1f} ms"


def _probe_finding(name: str, seconds: float, total: float) -> Finding:
    """The once-per-fit probe a callback was asked for, as info (not a slow callback)."""
    share = seconds / total if total > 0 else 0.0
    return _finding(
        "callback-time",
        f"{name}'s probe took {share:.0%} of the wall time ({_secs(seconds)} in "
        f'{PROBE_HOOKS[name]}, once per fit, asked for with `probe="start"` or `--deep`)',
        share,
        seconds,
        f"leave the probe off (`{name}()`, or the doctor without `--deep`): the verdict then "
        "comes from the run's own epochs",
        severity="info",
        callback=name,
    )


def _settings(ledger: LedgerReadings, step_share: float, s: RunSettings) -> list[Finding]:
    seconds = ledger.seconds()["training_step"]
    steps = f"training steps took {step_share:.0%} of the wall time"
    out = []
    if s.threads * s.local_processes > s.cores:
        per_rank = max(1, s.cores // s.local_processes)
        out.append(
            _finding(
                "cpu-threads",
                f"torch runs {s.threads} CPU threads x {s.local_processes} process(es) on "
                f"{s.cores} cores: the threads take turns on the cores ({steps})",
                step_share,
                seconds,
                f"`torch.set_num_threads({per_rank})` (or `OMP_NUM_THREADS={per_rank}`): at most "
                "this process's share of the cores",
                threads=s.threads,
                cores=s.cores,
            )
        )
    if s.anomaly:
        out.append(
            _finding(
                "anomaly-detection",
                f"autograd anomaly detection is on: every backward op keeps a traceback and "
                f"is checked for NaN ({steps})",
                step_share,
                seconds,
                "`Trainer(detect_anomaly=False)`: turn it on only to find where a NaN appears",
            )
        )
    if s.profiler is not None:
        heavy = s.profiler in _HEAVY_PROFILERS
        out.append(
            _finding(
                "profiler-on",
                f"{s.profiler} is on for the whole fit"
                + (": it traces every call of every step" if heavy else "")
                + f" ({steps})",
                step_share,
                seconds,
                "`Trainer(profiler=None)` once you have the profile, or profile a few steps "
                "(`speedpack doctor` and StepTimeline's trace window)",
                severity="warning" if heavy else "info",
                profiler=s.profiler,
            )
        )
    if s.deterministic:
        out.append(
            _finding(
                "deterministic",
                "deterministic algorithms are on: on a GPU some ops (scatter, index_add, "
                f"cuDNN convolutions) run slower kernels ({steps})",
                step_share,
                seconds,
                "`Trainer(deterministic=False)` unless bit-exact reruns are required",
                severity="info",
            )
        )
    if s.batch_size is not None and s.batch_size < SMALL_BATCH:
        per_step = seconds / ledger.train_batches * 1000 if ledger.train_batches else 0.0
        out.append(
            _finding(
                "small-batch",
                f"batches of {s.batch_size} samples: the per-step cost (Python, the optimizer, "
                f"kernel launches) is paid for every {s.batch_size} samples ({steps}, "
                f"{per_step:.1f} ms per step; by rule, not measured: how the step time "
                "changes with the batch was not tried)",
                step_share,
                seconds,
                "a larger `DataLoader(batch_size=...)` (e.g. 32, or the largest that fits: "
                "`BatchSizeTuner`), scaling the learning rate with it",
                batch_size=s.batch_size,
                measured=False,
            )
        )
    return out
