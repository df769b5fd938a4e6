"""Find tensors kept alive with their autograd graph from an earlier step; name who holds them."""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.hook_hub import HookHub, callbacks_of, hub_of
from lightning_speedpack.core.lightning import Callback, rank_zero_warn
from lightning_speedpack.core.tables import TABLES, log_fit_end, log_summary, log_table
from lightning_speedpack.retention import holders as retention
from lightning_speedpack.retention import schedule
from lightning_speedpack.retention.report import (
    EXTRA_PATH,
    TABLE,
    RetainedGraph,
    RetainedGraphError,
    RetainedGraphWarning,
    doctor_finding,
    table_rows,
)
from lightning_speedpack.retention.roots import WalkRoots

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "LossRetentionDetector",
    "RetainedGraph",
    "RetainedGraphError",
    "RetainedGraphWarning",
]

_SAMPLED_GRAPHS = 8  # graphs per holder whose saved tensors are weighed
_NAMED_PER_SCAN = 4  # referrer searches per heap scan (each is one gc pass per level)
_ONE_GRAPH_BYTES = 1 << 20  # a single retained graph is reported at once from this size on
_TRIGGER_GAP = 10  # batches between heap scans that a trigger (not the schedule) asks for
_GLOBALS_REFRESH = 32  # batches between re-reading which globals and attributes to look at
#: Module prefix of the pack's own callbacks, which the walk leaves out.
_PACK = __name__.split(".", 1)[0] + "."


class LossRetentionDetector(Callback):
    """Find tensors kept alive with their autograd graph across steps, and name who holds them.

    ``losses.append(loss)`` instead of ``losses.append(loss.item())`` keeps each step's graph
    alive; a tensor that was never back-propagated (an auxiliary loss, a metric computed with
    grad enabled, an extra key returned from ``training_step``) keeps every saved activation
    too. Use it when memory grows during training, or always: the per-step check is cheap.

    How: graphs are tagged with the batch they were created in (``grad_fn.metadata``, from
    ``on_before_backward`` and the returned outputs). Every ``check_every_n_steps`` batches
    the attributes of the LightningModule, the datamodule and the other callbacks, and the
    module-level containers of ``__main__`` (the training script) and of the modules that
    define the LightningModule, the datamodule and the callbacks, are walked (lists, dicts,
    tuples, deques, closures, up to ``max_depth`` levels; long containers sampled at both
    ends, a bounded number of objects per root) for graph-carrying tensors from earlier
    batches, so such holders are found one batch after the first leaked tensor and reported
    the next. Every ``deep_scan_every_n_steps`` batches, at the end of training, and when a
    returned tensor outlives its step or CUDA memory grows, the whole heap is scanned and each
    unexplained tensor is named by a referrer search (``other_module.STORE[0]``, a closure,
    ...); the named root is walked every step from then on. Graphs made before training
    starts are not this fit's (told apart by the autograd engine's node numbers, created per
    thread: a graph made during the fit on another thread counts as earlier). Only weak
    references are kept: the detector never extends a tensor's life.

    Findings (``findings``, and the doctor's report): one :class:`RetainedGraph` per holder.
    Never back-propagated graphs are error-level (activations retained, with an estimate of
    their bytes from the saved tensors); back-propagated ones are warnings about growth. A
    holder is reported once it keeps graphs from two earlier steps, or one graph keeping at
    least 1 MiB of activations; so a "last loss" attribute or a small constant computed once
    is not, and neither are graphs kept within the step they were made in.

    At the end of fit (once, rank 0, through the Trainer's loggers; see
    :mod:`lightning_speedpack.core.tables` for what W&B, CSV and TensorBoard get):

    ===================================  ==================================================
    key                                  what
    ===================================  ==================================================
    ``speedpack/retained_graphs``        table, one row per holder in :attr:`findings`:
                                         ``path``, ``step_first_seen``, ``count``,
                                         ``backpropagated``, ``est_bytes``,
                                         ``example_grad_fn`` (no rows in a clean run)
    ``speedpack/retained_graphs/count``  summary: distinct retained graph tensors found at
                                         the last check
    ===================================  ==================================================

    When it is the last of the pack's callbacks on the Trainer it also logs
    ``speedpack/findings`` (every pack callback's findings) and their counts.

    Rank policy: runs on every rank; warnings print and the table and summary field are
    logged on rank 0 only; in ``mode="error"`` each rank raises on its own (leaks come from
    code, so all ranks find the same one).

    GPU: the CUDA memory-growth trigger (``torch.cuda.memory_allocated``, no synchronisation)
    was only exercised on the CPU through injection.

    Args:
        mode: ``"warn"`` (one :class:`RetainedGraphWarning` per holder) or ``"error"`` (raise
            :class:`RetainedGraphError` naming the holder).
        check_every_n_steps: run the cheap forward walk every this many training batches (and
            on the first epoch's last batch, where a list emptied at each epoch's end is full).
        deep_scan_every_n_steps: scan the heap every this many batches (``0``: only at the end
            of training and on triggers). Scheduled and triggered scans are postponed while
            they would take more than 1% of the wall time since the previous one (a scan
            costs ~30-70 ns per allocated memory block, ~0.1 s per million Python objects).
        max_depth: container levels the forward walk descends.
        final_scan_budget: the heap scan at the end of training runs only if it would take at
            most this fraction of the training time so far (short fits on large heaps skip
            it; ``0``: never, ``None``: always). Without it, holders the walk does not reach
            (a helper module's global, a closure) are named only by the scans during training.

    Raises:
        ValueError: an argument is out of range.
        TypeError: an argument has the wrong type.

    Example:
        >>> import warnings
        >>> from pytorch_lightning import Trainer
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> class Leaky(BoringModel):
        ...     def on_train_start(self):
        ...         self.losses = []
        ...     def training_step(self, batch, batch_idx):
        ...         out = super().training_step(batch, batch_idx)
        ...         self.losses.append(out["loss"])  # forgot .detach()
        ...         return out
        >>> detector = LossRetentionDetector(mode="warn")
        >>> trainer = Trainer(max_steps=4, callbacks=[detector], logger=False,
        ...                   enable_checkpointing=False, enable_progress_bar=False,
        ...                   enable_model_summary=False)
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     trainer.fit(Leaky())
        >>> [(f.path, f.count, f.backpropagated) for f in detector.findings]
        [('model.losses', 3, True)]
    """

    _scan_budget: float | None = 0.01
    """Largest fraction of wall time the scheduled and triggered heap scans may take."""

    def __init__(
        self,
        mode: Literal["warn", "error"] = "warn",
        check_every_n_steps: int = 1,
        deep_scan_every_n_steps: int = 100,
        max_depth: int = 4,
        final_scan_budget: float | None = 0.05,
    ) -> None:
        if mode not in ("warn", "error"):
            raise ValueError(f"`mode` must be 'warn' or 'error', got {mode!r}")
        _check_budget(final_scan_budget)
        for name, value, low in (
            ("check_every_n_steps", check_every_n_steps, 1),
            ("deep_scan_every_n_steps", deep_scan_every_n_steps, 0),
            ("max_depth", max_depth, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"`{name}` must be an int, got {type(value).__name__}")
            if value < low:
                kind = "a positive int" if low else "a non-negative int"
                raise ValueError(f"`{name}` must be {kind}, got {value}")
        self.mode = mode
        self.check_every_n_steps = check_every_n_steps
        self.deep_scan_every_n_steps = deep_scan_every_n_steps
        self.max_depth = max_depth
        self.final_scan_budget = None if final_scan_budget is None else float(final_scan_budget)
        self._reset()

    def _reset(self) -> None:
        self._batch = -1
        self._run = retention.new_run_token()
        self._holders: dict[str, RetainedGraph] = {}
        self._reported: set[str] = set()
        self._retained_graphs = 0
        self._extra_refs: list[weakref.ref[Tensor]] = []
        self._walk_roots = WalkRoots(_GLOBALS_REFRESH)
        self._memory_baseline: int | None = None
        self._last_deep_scan = 0
        self._scans = 0
        self._scan_seconds = 0.0  # the last heap scan's duration (an estimate before the first)
        self._end_scan = False  # whether the end-of-training heap scan ran
        self._scan_done_at = 0.0
        self._train_started = 0.0
        self._first_seq: int | None = None
        self._cache_refresh = 0
        self._module_cache: retention.ModuleCache = {}
        self._epoch_end_walked = False  # the first epoch's last batch was walked
        self._tagging = True  # whether this batch's loss graph is tagged (see `schedule.tag_due`)
        self._idle: tuple[str, ...] = ()  # the per-batch hooks a HookHub does not call now
        self._extras = False  # whether training_step returned more than the loss
        self._on_cuda = False
        self._hub: HookHub | None = None
        self._slept_at: int | None = None  # the global step it went to sleep at (under a hub)

    @property
    def findings(self) -> list[RetainedGraph]:
        """The holders reported so far in the current (or last) fit, in the order found."""
        return [self._holders[path] for path in self._holders if path in self._reported]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_extra_refs"], state["_hub"] = [], None  # weak references, closures: no pickling
        return state

    # ------------------------------------------------------------------ hooks

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Graphs made before training are not this fit's leaks: nodes are numbered in order.
        self._first_seq = retention.next_sequence_nr()
        if self._first_seq is None:  # pragma: no cover - a torch without node numbers
            retention.mark_foreign(retention.heap_graph_tensors())
        self._train_started = self._scan_done_at = time.perf_counter()
        self._on_cuda = pl_module.device.type == "cuda"
        self._hub = hub_of(self)  # the doctor's, which calls this fit's per-batch hooks
        self._scan_seconds = retention.estimated_scan_seconds()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch += 1 + self._batches_slept(trainer)
        if self.check_every_n_steps == 1:  # every batch is tagged and walked (the default)
            return
        now = self._schedule(trainer, batch_idx)
        self._tagging = schedule.tag_due(now)
        hub = self._hub
        if hub is None:
            return
        # Under a HookHub (the doctor's) a hook left to no one is not called at all.
        idle: tuple[str, ...] = () if self._tagging else ("on_before_backward",)
        if not schedule.end_due(now, follows_outputs=self._extras or self._on_cuda):
            idle += ("on_train_batch_end",)
        if idle != self._idle:
            self._idle = idle
            hub.quiet(self, idle)
        if len(idle) == 2 and self._steps_are_batches(trainer, pl_module):
            asleep = schedule.batches_asleep(now)
            if asleep > 0:  # nothing to do until then: not even this hook is called
                self._slept_at = trainer.global_step
                hub.sleep(self, ("on_train_batch_start",), self._slept_at + asleep + 1)

    def _batches_slept(self, trainer: pl.Trainer) -> int:
        """The batches the hub did not call this detector for (it slept through them)."""
        if self._slept_at is None:
            return 0
        slept, self._slept_at = trainer.global_step - self._slept_at - 1, None
        return max(slept, 0)

    def _schedule(self, trainer: pl.Trainer, batch_idx: int) -> schedule.Schedule:
        max_steps = trainer.max_steps
        return schedule.Schedule(
            batch=self._batch,
            batch_idx=batch_idx,
            last=trainer.num_training_batches,  # an int, or inf for a loader without a length
            every=self.check_every_n_steps,
            deep_every=self.deep_scan_every_n_steps,
            last_deep_scan=self._last_deep_scan,
            epoch_end_walked=self._epoch_end_walked,
            steps_left=max_steps - trainer.global_step if max_steps > 0 else math.inf,
        )

    @staticmethod
    def _steps_are_batches(trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        # The hub wakes a sleeper at a global step: one a batch only with one optimizer step a
        # batch (automatic optimization, no accumulation). Otherwise it checks every batch.
        return bool(pl_module.automatic_optimization) and trainer.accumulate_grad_batches == 1

    @override
    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor
    ) -> None:
        if self._tagging:
            retention.tag_graph(loss, self._batch, self._run, backward=True)

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = self._batch
        # a returned tensor that outlived its step is held somewhere: look (rate-limited)
        outlived = any(ref() is not None for ref in self._extra_refs) and (
            self._scans == 0 or step - self._last_deep_scan >= _TRIGGER_GAP
        )
        self._extra_refs = []
        if isinstance(outputs, Mapping) and len(outputs) > ("loss" in outputs):
            self._extras = True  # from now on, every batch's outputs are followed
            self._check_outputs(outputs, step)
        scheduled = (
            self.deep_scan_every_n_steps > 0
            and step - self._last_deep_scan >= self.deep_scan_every_n_steps
        )
        deep = (outlived or self._memory_grew(pl_module) or scheduled) and self._affordable()
        if (
            deep
            or step % self.check_every_n_steps == 0
            or self._first_epoch_ends(trainer, batch_idx)
        ):
            self._check(trainer, pl_module, step, deep=deep)

    def _first_epoch_ends(self, trainer: pl.Trainer, batch_idx: int) -> bool:
        # A list the model empties at each epoch's end (`self.outputs.clear()` in
        # `on_train_epoch_end`) is full on the epoch's last batch: with a sparse walk, a fit
        # shorter than `check_every_n_steps` batches would otherwise never see it.
        if self._epoch_end_walked or batch_idx + 1 != trainer.num_training_batches:
            return False
        self._epoch_end_walked = True
        return True

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._batch < 0:
            return
        if self._scans and self._last_deep_scan == self._batch:
            self._end_scan = True  # a scan of this very batch already ran
            return
        self._end_scan = self._final_affordable()
        self._check(trainer, pl_module, self._batch, deep=self._end_scan, fresh=True)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        log_fit_end(trainer, self)

    # ------------------------------------------------------------------ checks

    def _check_outputs(self, outputs: Mapping[Any, Any], step: int) -> None:
        # Lightning detaches "loss" but passes the other keys as training_step returned them.
        extras = {k: v for k, v in outputs.items() if k != "loss"}
        if not extras:
            return
        for path, tensor in retention.walk_containers(
            [(EXTRA_PATH, extras)], max_depth=self.max_depth + 1
        ):
            retention.tag_graph(tensor, step, self._run)
            self._extra_refs.append(weakref.ref(tensor))
            if path in self._holders:
                continue
            info = retention.inspect_graphs([tensor])
            self._report(
                RetainedGraph(
                    path=path,
                    step_first_seen=step,
                    count=1,
                    backpropagated=info.backpropagated,
                    est_bytes=info.est_bytes,
                    example_grad_fn=info.example_grad_fn,
                    example_path=path,
                ),
                raise_error=False,
            )

    def _roots(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[tuple[str, Any]]:
        roots: list[tuple[str, Any]] = [("model", pl_module)]
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None:
            roots.append(("datamodule", datamodule))
        # The pack's own callbacks hold no user graphs; walking them (and their modules' globals)
        # every step would cost more than all the user's roots under `speedpack doctor`.
        callbacks = [
            c
            for c in callbacks_of(trainer)
            if c is not self and not type(c).__module__.startswith(_PACK)
        ]
        roots.extend((type(callback).__name__, callback) for callback in callbacks)
        if self._batch >= self._cache_refresh:
            self._cache_refresh = self._batch + _GLOBALS_REFRESH
            self._module_cache.clear()  # see attributes added since
        owners = [pl_module, *([datamodule] if datamodule is not None else []), *callbacks]
        roots.extend(self._walk_roots.roots(self._batch, lambda: owners))
        return roots

    def _check(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        step: int,
        deep: bool,
        fresh: bool = False,
    ) -> None:
        groups = self._walk(trainer, pl_module, step, fresh=deep or fresh)
        if deep:
            started = time.perf_counter()
            self._last_deep_scan = step
            self._scans += 1
            named = self._name_unexplained(trainer, pl_module, step, groups)
            self._scan_done_at = time.perf_counter()
            self._scan_seconds = self._scan_done_at - started
            if named is not None:
                groups = self._walk(trainer, pl_module, step, fresh=True)  # new roots, counted
                for path, ref in named:  # named from the model or a callback, past max_depth
                    refs = groups.setdefault(retention.holder_of(path), [])
                    if all(r is not ref and r() is not ref() for _, r in refs):
                        refs.append((path, ref))
        retained: set[int] = set()
        for holder, refs in groups.items():
            retained.update(id(t) for _, ref in refs if (t := ref()) is not None)
            self._update(holder, refs, step)
        self._retained_graphs = len(retained)

    def _walk(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, step: int, fresh: bool = False
    ) -> dict[str, list[tuple[str, weakref.ref[Tensor]]]]:
        groups: dict[str, list[tuple[str, weakref.ref[Tensor]]]] = {}
        for path, tensor in retention.walk_containers(
            self._roots(trainer, pl_module),
            self.max_depth,
            skip=(trainer, self),
            module_cache=None if fresh else self._module_cache,
            sample_long=not fresh,  # deep checks (rare) count every item exactly
        ):
            if retention.is_retained(tensor, step, self._run, self._first_seq):
                groups.setdefault(retention.holder_of(path), []).append((path, weakref.ref(tensor)))
        return groups

    def _name_unexplained(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        step: int,
        groups: Mapping[str, list[tuple[str, weakref.ref[Tensor]]]],
    ) -> list[tuple[str, weakref.ref[Tensor]]] | None:
        """Heap-scan for retained graphs the walk did not explain; name a few by referrers.

        Returns the tensors named under the model or a callback (the walk did not reach them),
        or ``None`` when nothing was named. Roots learned (a module's globals, a closure) are
        walked from then on, so each holder costs one referrer search per fit.
        """
        explained = {
            id(t) for refs in groups.values() for _, ref in refs if (t := ref()) is not None
        }
        remaining = [
            weakref.ref(t)
            for t in retention.heap_graph_tensors()
            if id(t) not in explained
            and retention.is_retained(t, step, self._run, self._first_seq)
            and not retention.is_unnameable(t)
        ]
        if not remaining:
            return None
        names = {id(pl_module): "model", id(trainer): "trainer"}
        names.update((id(cb), type(cb).__name__) for cb in callbacks_of(trainer))
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None:
            names[id(datamodule)] = "datamodule"
        named: list[tuple[str, weakref.ref[Tensor]]] = []
        searches = 0
        while remaining and searches < _NAMED_PER_SCAN:
            ref = remaining.pop(0)
            tensor = ref()
            if tensor is None:
                continue
            searches += 1
            found = retention.referrer_path(tensor, names, ignore=(remaining,))
            if found is None:
                retention.mark_unnameable(tensor)  # never searched again
                del tensor
                continue
            del tensor
            named.append((found.path, ref))
            root = self._walk_roots.learn(found.root)
            if root is not None:  # drop what the new root explains: one search per holder
                held = {id(t) for _, t in retention.walk_containers([root], self.max_depth)}
                remaining = [r for r in remaining if id(r()) not in held]
        return named or None

    def _update(self, holder: str, refs: list[tuple[str, weakref.ref[Tensor]]], step: int) -> None:
        tensors = {id(t): t for _, ref in refs if (t := ref()) is not None}
        if not tensors:
            return
        sample = list(tensors.values())[:_SAMPLED_GRAPHS]
        info = retention.inspect_graphs(sample)
        est = info.est_bytes * len(tensors) // len(sample)
        del sample
        finding = self._holders.get(holder)
        if finding is None:
            finding = RetainedGraph(
                path=holder,
                step_first_seen=step,
                count=len(tensors),
                backpropagated=info.backpropagated,
                est_bytes=est,
                example_grad_fn=info.example_grad_fn,
                example_path=refs[-1][0],
            )
            self._holders[holder] = finding
        else:
            finding.count = len(tensors)
            finding.backpropagated = info.backpropagated
            finding.est_bytes = est
            finding.example_path = refs[-1][0]
        grows = finding.count >= 2
        keeps_activations = not finding.backpropagated and finding.est_bytes >= _ONE_GRAPH_BYTES
        if holder not in self._reported and (grows or keeps_activations):
            self._report(finding, raise_error=True)

    def _report(self, finding: RetainedGraph, raise_error: bool) -> None:
        self._holders[finding.path] = finding
        self._reported.add(finding.path)
        message = finding.describe()
        if self.mode == "error" and raise_error:
            raise RetainedGraphError(message)
        rank_zero_warn(message, category=RetainedGraphWarning)

    def _affordable(self) -> bool:
        # Heap scans cost ~0.1 s per 10^6 live objects; keep them under `_scan_budget` of the
        # wall time since the last one (measured on the host: no device synchronisation).
        if self._scan_budget is None:
            return True
        since = time.perf_counter() - self._scan_done_at
        return since * self._scan_budget >= self._scan_seconds

    def _final_affordable(self) -> bool:
        # The end-of-training scan: within its own share of the whole training time.
        if self.final_scan_budget is None:
            return True
        if self.final_scan_budget <= 0:
            return False
        since = time.perf_counter() - self._train_started
        return since * self.final_scan_budget >= self._scan_seconds

    def _memory_grew(self, pl_module: pl.LightningModule) -> bool:
        if pl_module.device.type != "cuda":
            return False
        allocated = self._memory_allocated(pl_module.device)
        if self._memory_baseline is None or allocated < self._memory_baseline:
            self._memory_baseline = allocated
            return False
        grew = allocated > self._memory_baseline * 1.25 + (64 << 20)
        if grew and self._batch - self._last_deep_scan >= _TRIGGER_GAP:
            self._memory_baseline = allocated
            return True
        return False

    @staticmethod
    def _memory_allocated(device: torch.device) -> int:
        return int(torch.cuda.memory_allocated(device))  # a host-side counter: no sync

    # ------------------------------------------------------------------ doctor

    def doctor_findings(self) -> list[Finding]:
        """One finding per holder: location is the holder's path."""
        return [doctor_finding(f) for f in self.findings]

    def doctor_figures(self) -> dict[str, Any]:
        """What the last fit measured, for the doctor's report.

        ``retained_graphs``: distinct retained graph tensors found at the last check;
        ``end_heap_scan``: whether the heap scan at the end of training ran (see
        ``final_scan_budget``; without it, holders the walk does not reach are not named).
        """
        return {"retained_graphs": self._retained_graphs, "end_heap_scan": self._end_scan}

    def log_tables(self, trainer: pl.Trainer) -> None:
        """Log ``speedpack/retained_graphs`` and ``speedpack/retained_graphs/count`` (rank 0).

        Called once at the end of fit (see :func:`~lightning_speedpack.core.tables.log_fit_end`);
        every value was counted on the host during the checks, so nothing touches a device.
        """
        log_table(trainer, TABLE, TABLES[TABLE], table_rows(self.findings))
        # "/count": in W&B the table's name is its summary key, which a number must not replace
        log_summary(trainer, {f"{TABLE}/count": self._retained_graphs})

    def as_dicts(self) -> list[dict[str, Any]]:
        """The findings as plain dicts (for logging or JSON)."""
        return [asdict(f) for f in self.findings]


def _check_budget(value: object) -> None:
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"`final_scan_budget` must be a float or None, got {type(value).__name__}")
    if not value >= 0:  # also refuses NaN
        raise ValueError(
            f"`final_scan_budget` must be a non-negative fraction of the training time (0.05 "
            f"is 5%), got {value}"
        )
