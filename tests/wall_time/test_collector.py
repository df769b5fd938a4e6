"""Python's garbage collections: charged to ``garbage_collection``, not to the hook they fell in.

The bug this guards: a 1.2 s full collection that began inside SyncPointWarnings' end-of-fit
table made the doctor say "the hooks of callback SyncPointWarnings took 43% of the wall time"
(CI, stop 50). A collection the job did not ask for is planted here by a ``collect`` bound
before the fit (the clock sees only calls through ``gc.collect``, as its docstring says), over
a heap of ~600,000 live objects so that it lasts long enough to be the largest part.
"""

from __future__ import annotations

import gc
import inspect
import threading
import time
from gc import collect as unseen_collect  # bound before any fit: counts as the collector's own
from pathlib import Path
from typing import Any

import pytest

from lightning_speedpack import WallTimeLedger
from lightning_speedpack.wall_time.collector import COLLECTION, CollectorClock, carve_collections
from lightning_speedpack.wall_time.ledger import Ledger
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import NAMESPACES, Namespace


@pytest.fixture
def big_heap() -> Any:
    """Enough live container objects that a full collection takes a while to scan."""
    heap = [[i] for i in range(600_000)]
    yield heap
    del heap


def _callback(ns: Namespace, name: str, collect: Any) -> Any:
    def on_train_end(self: Any, trainer: Any, pl_module: Any) -> None:
        started = time.perf_counter()
        collect()
        self.spent = time.perf_counter() - started

    return type(name, (ns.Callback,), {"on_train_end": on_train_end, "spent": 0.0})()


def _fit(tmp_path: Path, *callbacks: Any, max_steps: int = 2) -> WallTimeLedger:
    ns = NAMESPACES[0]
    ledger = WallTimeLedger()
    trainer = ns.Trainer(
        callbacks=[ledger, *callbacks],
        **quiet_trainer_kwargs(tmp_path, max_steps=max_steps, limit_val_batches=0),
    )
    trainer.fit(ns.BoringModel())
    return ledger


def test_a_collection_inside_a_hook_is_the_collectors_not_the_callbacks(
    tmp_path: Path, big_heap: Any
) -> None:
    hit = _callback(NAMESPACES[0], "Innocent", unseen_collect)
    ledger = _fit(tmp_path, hit)
    seconds = ledger.seconds()
    assert abs(sum(seconds.values()) - ledger.total_s) < 1e-9  # moved, not added
    assert ledger.collector.collections[2] >= 1
    # the pause left the hook: what stays is the hook's own few microseconds
    assert seconds[COLLECTION] >= 0.9 * ledger.collector.longest_s > 0
    assert ledger.callback_seconds().get("Innocent", 0.0) < seconds[COLLECTION] / 10
    findings = {f.id: f for f in ledger.doctor_findings()}
    blamed = [f for f in ledger.doctor_findings() if f.figures.get("callback") == "Innocent"]
    assert blamed == []
    gc_finding = findings["garbage-collection"]  # the pause is most of this tiny fit
    assert gc_finding.figures["full_collections"] >= 1
    assert "gc.freeze()" in (gc_finding.fix or "")
    # but one pause is paid once: an info, not a warning (a clean run gets no warning)
    assert gc_finding.severity == "info"
    assert "paid once" in gc_finding.message


def test_collections_that_recur_every_step_are_a_warning(tmp_path: Path, big_heap: Any) -> None:
    ns = NAMESPACES[0]

    class EveryBatch(ns.Callback):  # type: ignore[misc, name-defined]
        def on_train_batch_end(self, *args: Any) -> None:
            unseen_collect()  # stands for the collector's own, every batch

    ledger = _fit(tmp_path, EveryBatch(), max_steps=4)
    assert ledger.collector.collections[2] >= 4
    (finding,) = [f for f in ledger.doctor_findings() if f.id == "garbage-collection"]
    assert finding.severity == "warning"
    assert "paid once" not in finding.message


def test_the_fix_knows_the_job_had_already_frozen_its_objects(tmp_path: Path) -> None:
    gc.freeze()
    try:
        heap = [[i] for i in range(600_000)]  # built after the freeze: still scanned
        ledger = _fit(tmp_path, _callback(NAMESPACES[0], "Innocent", unseen_collect))
        del heap
    finally:
        gc.unfreeze()
    (finding,) = [f for f in ledger.doctor_findings() if f.id == "garbage-collection"]
    assert finding.figures["frozen_objects"] > 0
    assert "already on" in (finding.fix or "")


def test_a_gc_collect_call_stays_with_the_code_that_made_it(tmp_path: Path, big_heap: Any) -> None:
    caller = _callback(NAMESPACES[0], "Collects", lambda: gc.collect())
    line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
    ledger = _fit(tmp_path, caller)
    assert ledger.collector.explicit == 1
    # the call's full collection is the callback's time: its true cause
    assert ledger.callback_seconds()["Collects"] >= 0.9 * caller.spent
    assert ledger.seconds()[COLLECTION] < caller.spent / 10
    findings = {f.id: f for f in ledger.doctor_findings()}
    assert findings["callback-time"].figures["callback"] == "Collects"
    named = findings["gc-collect-calls"]  # and the line that called it, with its count
    assert named.location == f"test_collector.py:{line}"
    assert named.figures["calls"] == 1


def test_gc_is_left_as_found_after_fit_and_after_an_exception(tmp_path: Path) -> None:
    collect, callbacks = gc.collect, list(gc.callbacks)
    _fit(tmp_path)
    assert gc.collect is collect
    assert gc.callbacks == callbacks

    ns = NAMESPACES[0]

    class Boom(ns.BoringModel):  # type: ignore[misc, name-defined]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            assert gc.collect is not collect  # wrapped while the fit runs
            raise RuntimeError("planted")

    trainer = ns.Trainer(callbacks=[WallTimeLedger()], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(RuntimeError, match="planted"):
        trainer.fit(Boom())
    assert gc.collect is collect
    assert gc.callbacks == callbacks


def test_another_threads_collections_are_not_charged() -> None:
    ledger = Ledger()
    ledger.open(time.perf_counter(), "training_step")
    clock = CollectorClock(ledger)
    clock.start()
    try:
        thread = threading.Thread(target=lambda: [[] for _ in range(50_000)])
        thread.start()
        thread.join()
    finally:
        clock.stop()
    # the thread ran ~70 collections; the fit's thread (idle in `join`) one at most
    assert sum(clock.collections) <= 1


def test_carving_never_takes_more_than_the_bracket_was_charged() -> None:
    seconds, details = {"training_step": 0.5}, {("training_step", ""): 0.5}
    carve_collections({("training_step", ""): 2.0, ("setup", ""): 1.0}, seconds, details)
    assert seconds == {"training_step": 0.0, COLLECTION: 0.5}


def test_the_packs_own_collect_after_an_oom_is_not_the_jobs_line(
    tmp_path: Path, big_heap: Any
) -> None:
    from lightning_speedpack.core.memory import free_memory  # what the trials call after an OOM

    ledger = _fit(tmp_path, _callback(NAMESPACES[0], "Trials", free_memory))
    assert ledger.collector.explicit == 1  # seen, and left with the callback that ran it
    assert "gc-collect-calls" not in {f.id for f in ledger.doctor_findings()}
