"""LossRetentionDetector on real Trainers: each leak is found and named, clean runs find nothing."""

from __future__ import annotations

import csv
import doctest
import gc
import importlib
import json
import pickle
import sys
import textwrap
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torchmetrics
from pytorch_lightning import Callback, LightningModule, Trainer
from pytorch_lightning.demos.boring_classes import BoringModel
from pytorch_lightning.loggers import CSVLogger

from lightning_speedpack import LossRetentionDetector, RetainedGraphError
from lightning_speedpack.core.hook_hub import HookHub
from lightning_speedpack.core.registry import DoctorContext, registered_diagnostics
from lightning_speedpack.core.tables import SUMMARY_FILE, TABLES, csv_file_name
from lightning_speedpack.doctor.runner import TOOLS, run_script
from lightning_speedpack.retention import callback as loss_retention
from lightning_speedpack.retention import doctor as retention_doctor
from lightning_speedpack.retention.callback import RetainedGraphWarning
from lightning_speedpack.retention.tags import STEP_KEY
from tests.helpers import global_state
from tests.helpers.ddp import run_ddp
from tests.helpers.models import quiet_trainer_kwargs

GLOBAL_LOSSES: list[torch.Tensor] = []


def _fit(
    model: LightningModule,
    tmp_path: Any,
    detector: LossRetentionDetector | None = None,
    callbacks: tuple[Callback, ...] = (),
    max_steps: int = 6,
    **kwargs: Any,
) -> LossRetentionDetector:
    detector = detector or LossRetentionDetector(deep_scan_every_n_steps=2)
    trainer = Trainer(
        callbacks=[detector, *callbacks],
        **quiet_trainer_kwargs(tmp_path, max_steps=max_steps, **kwargs),
    )
    trainer.fit(model)
    return detector


def _fit_warns(model: LightningModule, tmp_path: Any, **kwargs: Any) -> LossRetentionDetector:
    with pytest.warns(RetainedGraphWarning) as record:
        detector = _fit(model, tmp_path, **kwargs)
    # one warning per holder, never one per step
    assert _ours(record) == len(detector.findings)
    return detector


def _ours(record: Any) -> int:
    return sum(issubclass(w.category, RetainedGraphWarning) for w in record)


def _summary(detector: LossRetentionDetector) -> list[tuple[str, bool]]:
    return [(f.path, f.backpropagated) for f in detector.findings]


@pytest.fixture(autouse=True)
def _scan_as_scheduled(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests ask for heap scans at exact batches; the wall-time budgets have their own tests.
    monkeypatch.setattr(LossRetentionDetector, "_scan_budget", None)
    monkeypatch.setattr(LossRetentionDetector, "_final_affordable", lambda self: True)


@pytest.fixture
def tmp_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Write ``source`` as ``<name>.py`` under tmp_path and import it (removed afterwards)."""
    names: list[str] = []

    def make(name: str, source: str) -> Any:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        names.append(name)
        return importlib.import_module(name)

    yield make
    for name in names:
        sys.modules.pop(name, None)


# ---------------------------------------------------------------- leaks


class ListLeak(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.losses.append(out["loss"])
        return out


class EpochListLeak(ListLeak):
    """``self.losses`` emptied at each epoch's end: full only during the epoch."""

    def on_train_epoch_end(self) -> None:
        self.losses.clear()


@pytest.mark.parametrize("epochs", [1, 3])
def test_sparse_walk_still_sees_a_list_emptied_at_each_epoch_end(
    tmp_path: Path, epochs: int
) -> None:
    # A walk every 1,000 batches never runs in a 4-batch-epoch fit, and the end of training
    # walks after the list was emptied: the first epoch's last batch is walked for it.
    detector = _fit_warns(
        EpochListLeak(),
        tmp_path,
        detector=LossRetentionDetector(check_every_n_steps=1000, deep_scan_every_n_steps=0),
        max_steps=-1,
        max_epochs=epochs,
        limit_train_batches=4,
    )
    assert _summary(detector) == [("model.losses", True)]
    assert detector.findings[0].step_first_seen == 3  # batches are counted from 0
    assert detector.findings[0].count == 3  # the three earlier batches' graphs


class DictOfListsLeak(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.hist: dict[str, list[torch.Tensor]] = {"aux": [], "ok": []}

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.hist["aux"].append(out["loss"] * 1.0)
        self.hist["ok"].append(out["loss"].detach())
        return out


class DequeLeak(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.recent: deque[torch.Tensor] = deque(maxlen=100)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.recent.append(out["loss"])
        return out


class NestedLeak(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.state_cache: dict[str, Any] = {"train": {"losses": []}}

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.state_cache["train"]["losses"].append(out["loss"])
        return out


class GlobalLeak(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        GLOBAL_LOSSES.append(out["loss"])
        return out


class OutputsLeak(BoringModel):
    """The pattern from Lightning's own docstrings, without ``.detach()``."""

    def __init__(self) -> None:
        super().__init__()
        self.training_step_outputs: list[dict[str, torch.Tensor]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        self.training_step_outputs.append(out)
        return out

    def on_train_epoch_end(self) -> None:
        self.training_step_outputs.clear()


class AuxLeak(BoringModel):
    """An auxiliary loss computed with grad enabled and never back-propagated."""

    def __init__(self) -> None:
        super().__init__()
        self.aux_losses: list[torch.Tensor] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        hidden = torch.relu(self.layer(batch))  # the saved activations of this graph stay alive
        self.aux_losses.append(hidden.pow(2).mean())
        return super().training_step(batch, batch_idx)


class ExtraKey(BoringModel):
    def __init__(self, in_loss: bool) -> None:
        super().__init__()
        self.in_loss = in_loss

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = self.layer(batch)
        aux = torch.relu(out).mean()
        loss = out.sum() + (aux if self.in_loss else 0)
        return {"loss": loss, "aux": aux, "fine": aux.detach()}


def test_a_long_leak_is_counted_exactly_after_the_run(tmp_path: Path) -> None:
    # The per-step walk samples both ends of long containers; the final check counts all.
    detector = LossRetentionDetector(deep_scan_every_n_steps=1000)
    with pytest.warns(RetainedGraphWarning):
        _fit(ListLeak(), tmp_path, detector=detector, max_steps=150, max_epochs=3)
    (finding,) = detector.findings
    assert finding.path == "model.losses"
    assert finding.count == 149  # every loss but the last step's own
    assert detector.doctor_figures() == {"retained_graphs": 149, "end_heap_scan": True}


def test_list_attribute_leak_is_named(tmp_path: Path) -> None:
    detector = _fit_warns(ListLeak(), tmp_path)
    assert _summary(detector) == [("model.losses", True)]
    (finding,) = detector.findings
    assert finding.count == 5  # batches 0..4 are older than the last check at batch 5
    assert finding.step_first_seen == 1  # found one batch after the first leaked loss
    assert finding.example_path.startswith("model.losses[")
    assert finding.severity == "warning"
    assert detector.doctor_figures() == {"retained_graphs": 5, "end_heap_scan": True}


def test_dict_of_lists_leak_is_named(tmp_path: Path) -> None:
    detector = _fit_warns(DictOfListsLeak(), tmp_path)
    assert _summary(detector) == [('model.hist["aux"]', True)]


def test_deque_leak_is_named(tmp_path: Path) -> None:
    detector = _fit_warns(DequeLeak(), tmp_path)
    assert _summary(detector) == [("model.recent", True)]


def test_nested_container_leak_is_named(tmp_path: Path) -> None:
    detector = _fit_warns(NestedLeak(), tmp_path)
    assert _summary(detector) == [('model.state_cache["train"]["losses"]', True)]


def test_module_global_of_the_models_module_is_named(tmp_path: Path) -> None:
    GLOBAL_LOSSES.clear()
    try:
        detector = _fit_warns(GlobalLeak(), tmp_path)
    finally:
        GLOBAL_LOSSES.clear()
    assert _summary(detector) == [(f"{__name__}.GLOBAL_LOSSES", True)]


def test_global_of_another_module_is_found_by_the_heap_scan(
    tmp_path: Path, tmp_module: Callable[..., Any]
) -> None:
    store = tmp_module("leak_store", "STORE = []\n")

    class Leaky(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            store.STORE.append(out["loss"])
            return out

    detector = _fit_warns(
        Leaky(), tmp_path, detector=LossRetentionDetector(deep_scan_every_n_steps=3)
    )
    assert _summary(detector) == [("leak_store.STORE", True)]
    (finding,) = detector.findings
    assert finding.step_first_seen == 3  # the first heap scan
    assert finding.count == 5  # counted by walking the learned root afterwards


def test_closure_is_named(tmp_path: Path, tmp_module: Callable[..., Any]) -> None:
    recorder = tmp_module(
        "leak_closure",
        """
        def make_recorder():
            history = []
            def record(loss):
                history.append(loss)
            return record

        record = make_recorder()
    """,
    )

    class Leaky(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            recorder.record(out["loss"])
            return out

    detector = _fit_warns(Leaky(), tmp_path)
    assert _summary(detector) == [
        ("leak_closure.make_recorder.<locals>.record.<closure>.history", True)
    ]


def test_closure_held_by_the_model_is_named_by_the_walk(tmp_path: Path) -> None:
    def make_recorder() -> Callable[[torch.Tensor], None]:
        history: list[torch.Tensor] = []
        return history.append

    class Leaky(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            seen: list[torch.Tensor] = []

            def record(loss: torch.Tensor) -> None:
                seen.append(loss)

            self.record = record

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.record(out["loss"])
            return out

    detector = _fit_warns(
        Leaky(), tmp_path, detector=LossRetentionDetector(deep_scan_every_n_steps=0)
    )
    assert _summary(detector) == [("model.record.<closure>.seen", True)]


def test_training_step_outputs_pattern_is_named(tmp_path: Path) -> None:
    detector = _fit_warns(OutputsLeak(), tmp_path)
    assert _summary(detector) == [("model.training_step_outputs", True)]
    assert detector.findings[0].example_path.endswith('["loss"]')


def test_aux_loss_never_backpropagated_is_an_error_with_bytes(tmp_path: Path) -> None:
    detector = _fit_warns(AuxLeak(), tmp_path)
    assert _summary(detector) == [("model.aux_losses", False)]
    (finding,) = detector.findings
    assert finding.severity == "error"
    assert finding.step_first_seen == 1
    # each retained graph keeps the 2x2 relu output (and pow's input): >= 16 bytes per step
    assert finding.est_bytes >= 16 * finding.count
    assert finding.example_grad_fn == "MeanBackward0"


def test_graph_kept_by_another_callback_is_named(tmp_path: Path) -> None:
    class Keeper(Callback):
        def __init__(self) -> None:
            self.seen: list[torch.Tensor] = []

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            self.seen.append(outputs["aux"])

    with pytest.warns(RetainedGraphWarning) as record:
        detector = _fit(ExtraKey(in_loss=False), tmp_path, callbacks=(Keeper(),))
    assert _summary(detector) == [('training_step()["aux"]', False), ("Keeper.seen", False)]
    assert _ours(record) == 2


def test_the_packs_own_callbacks_are_not_walked(tmp_path: Path) -> None:
    # Under `speedpack doctor` seven of the pack's callbacks sit on the Trainer; walking their
    # buffers and their modules' globals every step cost more than all the user's roots.
    from lightning_speedpack import StepTimeline, ThroughputLogger

    class Keeper(Callback):
        def __init__(self) -> None:
            self.seen: list[torch.Tensor] = []

    detector = LossRetentionDetector()
    callbacks = [ThroughputLogger(), StepTimeline(), Keeper(), detector]
    trainer = Trainer(callbacks=callbacks, **quiet_trainer_kwargs(tmp_path, max_steps=1))
    trainer.fit(BoringModel())
    names = [name for name, _ in detector._roots(trainer, trainer.lightning_module)]
    assert "Keeper" in names
    assert not {"ThroughputLogger", "StepTimeline"} & set(names)
    assert not [n for n in names if "lightning_speedpack" in n]  # nor their modules' globals


@pytest.mark.parametrize("in_loss", [False, True])
def test_extra_returned_key_with_a_graph_warns_once(tmp_path: Path, in_loss: bool) -> None:
    with pytest.warns(RetainedGraphWarning, match=r'training_step\(\)\["aux"\]') as record:
        detector = _fit(ExtraKey(in_loss=in_loss), tmp_path)
    assert _ours(record) == 1
    assert _summary(detector) == [('training_step()["aux"]', in_loss)]
    assert detector.findings[0].est_bytes > 0 or in_loss


# ---------------------------------------------------------------- no false positives


class Clean(BoringModel):
    """Everything that is fine: detached copies, numbers, self.log, metrics, a same-step graph."""

    def __init__(self) -> None:
        super().__init__()
        self.detached: list[torch.Tensor] = []
        self.numbers: list[float] = []
        self.mean = torchmetrics.MeanMetric()
        self.last: torch.Tensor | None = None

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        out = super().training_step(batch, batch_idx)
        loss = out["loss"]
        self.detached.append(loss.detach())
        self.numbers.append(float(loss.detach()))
        self.mean.update(loss.detach())
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.log("mean", self.mean, on_step=True, on_epoch=True)
        self.last = loss  # a graph kept within its own step (overwritten every step)
        self.same_step = [loss * 2, loss * 3]
        return out


class Manual(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        opt = self.optimizers()
        opt.zero_grad()  # type: ignore[union-attr]
        loss = self(batch).sum()
        self.manual_backward(loss)
        opt.step()  # type: ignore[union-attr]
        self.log("loss", loss)
        return {"loss": loss}


@pytest.mark.parametrize(
    ("factory", "kwargs"),
    [
        (BoringModel, {}),
        (Clean, {}),
        (Clean, {"logger": True}),
        (Manual, {}),
        (BoringModel, {"accumulate_grad_batches": 2}),
        (Clean, {"accumulate_grad_batches": 2}),
    ],
    ids=["boring", "clean", "clean-logger", "manual", "accumulate", "clean-accumulate"],
)
@pytest.mark.slow
def test_no_false_positives(
    tmp_path: Path, factory: Callable[[], LightningModule], kwargs: dict[str, Any]
) -> None:
    if kwargs.get("logger"):
        kwargs = {**kwargs, "logger": CSVLogger(str(tmp_path))}
    detector = LossRetentionDetector(mode="error", deep_scan_every_n_steps=1)
    _fit(factory(), tmp_path, detector=detector, max_steps=6, **kwargs)
    assert detector.findings == []
    assert detector.doctor_figures() == {"retained_graphs": 0, "end_heap_scan": True}


# ---------------------------------------------------------------- modes, lifetime, contract


def test_error_mode_raises_naming_the_holder(tmp_path: Path) -> None:
    before = global_state.snapshot()
    with pytest.raises(RetainedGraphError, match=r"model\.losses holds 2 tensor"):
        _fit(ListLeak(), tmp_path, detector=LossRetentionDetector(mode="error"))
    assert global_state.diff(before, global_state.snapshot()) == {}


def test_error_mode_raises_at_once_for_retained_activations(tmp_path: Path) -> None:
    with pytest.raises(RetainedGraphError, match=r"model\.aux_losses .*never back-propagated"):
        _fit(AuxLeak(), tmp_path, detector=LossRetentionDetector(mode="error"))


@pytest.mark.slow
def test_detector_never_extends_a_tensors_lifetime(tmp_path: Path) -> None:
    class Watched(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.loss_refs: list[weakref.ref[torch.Tensor]] = []
            self.aux_refs: list[weakref.ref[torch.Tensor]] = []
            self.alive_at_end: list[int] = []

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = self.layer(batch)
            aux = out.mean()  # returned with its graph: the detector tags and weakly refers to it
            loss = out.sum()
            self.loss_refs.append(weakref.ref(loss))
            self.aux_refs.append(weakref.ref(aux))
            return {"loss": loss, "aux": aux}

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            gc.collect()
            # everything but this step's tensors is gone, with the detector attached
            self.alive_at_end.append(
                sum(r() is not None for r in self.loss_refs[:-1] + self.aux_refs[:-1])
            )

    model = Watched()
    with pytest.warns(RetainedGraphWarning, match="aux"):
        detector = _fit(model, tmp_path, detector=LossRetentionDetector(deep_scan_every_n_steps=1))
    gc.collect()
    assert model.alive_at_end == [0] * 6
    assert all(r() is None for r in model.loss_refs + model.aux_refs)
    assert [f.path for f in detector.findings] == ['training_step()["aux"]']


def test_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="`mode` must be 'warn' or 'error', got 'loud'"):
        LossRetentionDetector(mode="loud")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`check_every_n_steps` must be a positive int, got 0"):
        LossRetentionDetector(check_every_n_steps=0)
    with pytest.raises(ValueError, match="`deep_scan_every_n_steps` must be a non-negative"):
        LossRetentionDetector(deep_scan_every_n_steps=-1)
    with pytest.raises(TypeError, match="`max_depth` must be an int, got float"):
        LossRetentionDetector(max_depth=2.0)  # type: ignore[arg-type]


def test_check_every_n_steps_still_finds_the_leak(tmp_path: Path) -> None:
    detector = _fit_warns(
        ListLeak(),
        tmp_path,
        detector=LossRetentionDetector(check_every_n_steps=3, deep_scan_every_n_steps=0),
    )
    assert _summary(detector) == [("model.losses", True)]
    assert detector.findings[0].step_first_seen == 3


class TaggedListLeak(ListLeak):
    """``ListLeak`` that notes, after each backward, whether its loss graph carries a tag."""

    def __init__(self) -> None:
        super().__init__()
        self.tagged: list[bool] = []

    def on_after_backward(self) -> None:
        node = self.losses[-1].grad_fn
        self.tagged.append(node is not None and STEP_KEY in node.metadata)


def test_a_sparse_walk_tags_only_the_batches_it_needs_and_still_finds_the_leak(
    tmp_path: Path,
) -> None:
    # Walks at batches 20 and 40 and at the end (44): the tags that matter are the first
    # batches', the batch before each walk's and the last ones'. The others cost ~35 us a
    # batch for nothing, which is what the doctor's one walk in 64 batches saves.
    model = TaggedListLeak()
    detector = _fit_warns(
        model,
        tmp_path,
        detector=LossRetentionDetector(check_every_n_steps=20, deep_scan_every_n_steps=0),
        max_steps=45,
        limit_train_batches=100,
    )
    untagged = [batch for batch, tagged in enumerate(model.tagged) if not tagged]
    assert untagged == [16, 17, 18, *range(20, 39), 40, 41, 42]  # 20, 40: tagged by the walk
    assert _summary(detector) == [("model.losses", True)]
    assert detector.findings[0].step_first_seen == 20  # the first walk, not the second
    assert detector.findings[0].count == 45 - 3  # batches 41, 42 and 44: first seen at the end


class CountingEnds(LossRetentionDetector):
    """Notes the batches whose ``on_train_batch_start`` and ``on_train_batch_end`` were called."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ends: list[int] = []
        self.starts: list[int] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, i: int) -> None:
        self.starts.append(trainer.fit_loop.epoch_loop.batch_progress.total.ready - 1)
        super().on_train_batch_start(trainer, pl_module, batch, i)

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(self._batch)
        super().on_train_batch_end(*args)


def test_under_a_hook_hub_the_batches_with_nothing_to_do_are_not_called(tmp_path: Path) -> None:
    # The doctor's hub calls the detector's per-batch hooks: on a CPU run whose steps return
    # the loss alone, `on_train_batch_end` runs on the first batches and where it walks only,
    # and the leak is found as without the hub.
    detector = CountingEnds(check_every_n_steps=20, deep_scan_every_n_steps=0)
    model = TaggedListLeak()
    trainer = Trainer(
        callbacks=[HookHub([detector], owns=True)],
        **quiet_trainer_kwargs(tmp_path, max_steps=45, limit_train_batches=100),
    )
    with pytest.warns(RetainedGraphWarning):
        trainer.fit(model)
    assert detector.ends == [*range(16), 20, 40]
    # Between two batches with something to do it sleeps: the hub does not call it at all
    # (16 to 19: the tag before the walk at 20; 21 to 39; 41 to 43: the last two batches).
    assert detector.starts == [*range(17), 19, 20, 21, 39, 40, 41, 43, 44]
    assert _summary(detector) == [("model.losses", True)]
    assert detector.findings[0].step_first_seen == 20
    assert detector.findings[0].count == 45 - 3
    assert [b for b, tagged in enumerate(model.tagged) if tagged] == [*range(16), 19, 39, 43, 44]


def test_under_a_hook_hub_it_stays_awake_when_steps_are_not_batches(tmp_path: Path) -> None:
    # The hub wakes a sleeper at a global step: with two batches a step it would wake late.
    detector = CountingEnds(check_every_n_steps=20, deep_scan_every_n_steps=0)
    model = TaggedListLeak()
    trainer = Trainer(
        callbacks=[HookHub([detector], owns=True)],
        accumulate_grad_batches=2,
        **quiet_trainer_kwargs(tmp_path, max_steps=20, limit_train_batches=100),
    )
    with pytest.warns(RetainedGraphWarning):
        trainer.fit(model)
    assert detector.starts == list(range(40))
    assert detector.ends == [*range(16), 20]
    assert _summary(detector) == [("model.losses", True)]


def test_every_batch_is_tagged_when_every_batch_walks(tmp_path: Path) -> None:
    model = TaggedListLeak()
    _fit_warns(
        model,
        tmp_path,
        detector=LossRetentionDetector(deep_scan_every_n_steps=0),
        max_steps=20,
    )
    assert model.tagged == [True] * 20


def test_heap_scans_keep_to_their_time_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(LossRetentionDetector, "_scan_budget", 1e-6)
    detector = _fit(
        BoringModel(),
        tmp_path,
        detector=LossRetentionDetector(deep_scan_every_n_steps=1),
        max_steps=6,
    )
    assert detector._scans == 1  # none scheduled (their estimated cost is over budget), the end
    monkeypatch.setattr(LossRetentionDetector, "_scan_budget", None)
    detector = _fit(
        BoringModel(),
        tmp_path,
        detector=LossRetentionDetector(deep_scan_every_n_steps=1),
        max_steps=6,
    )
    assert detector._scans == 5  # batches 1..5 (the end adds none: batch 5 was scanned)


def test_memory_growth_triggers_a_heap_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CUDA path, injected: allocated memory that keeps growing asks for a heap scan.
    detector = LossRetentionDetector()
    model = BoringModel()
    monkeypatch.setattr(type(model), "device", property(lambda self: torch.device("cuda", 0)))
    allocated = iter([100 << 20, 120 << 20, 400 << 20])
    monkeypatch.setattr(detector, "_memory_allocated", lambda device: next(allocated))
    detector._batch = 20
    assert detector._memory_grew(model) is False  # baseline
    assert detector._memory_grew(model) is False  # within noise
    assert detector._memory_grew(model) is True


def test_pickles_after_a_leaky_fit(tmp_path: Path) -> None:
    detector = _fit_warns(ExtraKey(in_loss=False), tmp_path)
    clone = pickle.loads(pickle.dumps(detector))
    assert _summary(clone) == _summary(detector)


def test_docstring_example_runs() -> None:
    finder = doctest.DocTestFinder()
    tests = finder.find(
        loss_retention.LossRetentionDetector,
        "LossRetentionDetector",
        globs={"LossRetentionDetector": LossRetentionDetector},
    )
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for test in tests:
            runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


# ---------------------------------------------------------------- tables in the run


def _csv_table(log_dir: Path, name: str) -> list[dict[str, str]]:
    """A table as the CSV logger wrote it beside ``metrics.csv``; the header must be its columns."""
    with (log_dir / csv_file_name(name)).open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == TABLES[name]
        return list(reader)


def _csv_fit(
    model: LightningModule, tmp_path: Path, detector: LossRetentionDetector
) -> tuple[Path, dict[str, Any]]:
    logger = CSVLogger(str(tmp_path / "csv"))
    _fit(model, tmp_path, detector=detector, logger=logger, log_every_n_steps=1)
    log_dir = Path(logger.log_dir)  # where metrics.csv goes (BoringModel logs no metrics)
    return log_dir, json.loads((log_dir / SUMMARY_FILE).read_text())


def test_csv_logger_gets_one_row_per_holder_and_the_count(tmp_path: Path) -> None:
    detector = LossRetentionDetector(deep_scan_every_n_steps=2)
    with pytest.warns(RetainedGraphWarning, match=r"model\.losses"):
        log_dir, summary = _csv_fit(ListLeak(), tmp_path, detector)
    (finding,) = detector.findings
    assert _csv_table(log_dir, "speedpack/retained_graphs") == [
        {
            "path": "model.losses",
            "step_first_seen": "1",
            "count": "5",
            "backpropagated": "True",
            "est_bytes": str(finding.est_bytes),
            "example_grad_fn": finding.example_grad_fn,
        }
    ]
    assert finding.example_grad_fn.endswith("Backward0")
    assert summary["speedpack/retained_graphs/count"] == 5
    # the only pack callback on the Trainer: it also logs every callback's findings
    (row,) = _csv_table(log_dir, "speedpack/findings")
    assert (row["component"], row["id"], row["location"]) == (
        "loss_retention",
        "retained-graph",
        "model.losses",
    )
    assert summary["speedpack/findings/warning"] == 1


def test_csv_logger_gets_an_empty_table_without_a_leak(tmp_path: Path) -> None:
    # Like SyncPointWarnings: a clean run still logs the table (header only) and a zero count.
    detector = LossRetentionDetector(mode="error", deep_scan_every_n_steps=2)
    log_dir, summary = _csv_fit(Clean(), tmp_path, detector)
    assert _csv_table(log_dir, "speedpack/retained_graphs") == []
    assert summary["speedpack/retained_graphs/count"] == 0
    assert _csv_table(log_dir, "speedpack/findings") == []


def test_without_a_logger_nothing_is_written(tmp_path: Path) -> None:
    _fit_warns(ListLeak(), tmp_path)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith("speedpack")]


# ---------------------------------------------------------------- DDP and doctor


def _ddp_leak(tmp: str) -> list[tuple[str, int, bool]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detector = LossRetentionDetector(deep_scan_every_n_steps=2)
        trainer = Trainer(
            callbacks=[detector],
            **quiet_trainer_kwargs(tmp, devices=2, strategy="ddp", max_steps=4),
        )
        trainer.fit(ListLeak())
    return [(f.path, f.count, f.backpropagated) for f in detector.findings]


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_real_two_rank_ddp(tmp_path: Path) -> None:
    results = run_ddp(_ddp_leak, str(tmp_path), timeout=200)
    assert results == [[("model.losses", 3, True)]] * 2


def test_registered_with_the_doctor() -> None:
    assert retention_doctor.__name__ in TOOLS  # the doctor imports it, and so registers it
    (diagnostic,) = [d for d in registered_diagnostics() if d.name == "loss_retention"]
    assert diagnostic.callback_type is LossRetentionDetector
    assert diagnostic.order == 30
    built = diagnostic.factory(DoctorContext())
    assert isinstance(built, LossRetentionDetector)
    assert built.mode == "warn"
    assert built.check_every_n_steps == 128  # the doctor's default: every 128th step
    assert built.final_scan_budget == 0.01  # the end-of-fit heap scan within 1% of training
    assert built.deep_scan_every_n_steps == 0  # and no scheduled heap scans
    deep = diagnostic.factory(DoctorContext(deep=True))
    assert isinstance(deep, LossRetentionDetector)
    assert deep.check_every_n_steps == 1  # --deep: every step, as the callback's own default
    assert deep.final_scan_budget == 0.05
    assert deep.deep_scan_every_n_steps == 100
    assert "every step" in diagnostic.deep_adds
    assert "end of training" in diagnostic.deep_adds


@pytest.mark.parametrize(("deep", "first_seen"), [(True, 1), (False, 4)])
def test_doctor_report_has_a_retention_section(tmp_path: Path, deep: bool, first_seen: int) -> None:
    script = tmp_path / "my_script.py"
    script.write_text(
        textwrap.dedent(
            f"""
        import torch
        from pytorch_lightning import Trainer
        from pytorch_lightning.demos.boring_classes import BoringModel

        GLOBAL_LOSSES = []

        class Model(BoringModel):
            def training_step(self, batch, batch_idx):
                out = super().training_step(batch, batch_idx)
                GLOBAL_LOSSES.append(out["loss"])
                return out

        if __name__ == "__main__":
            trainer = Trainer(accelerator="cpu", devices=1, max_steps=5, logger=False,
                              enable_checkpointing=False, enable_progress_bar=False,
                              enable_model_summary=False, default_root_dir={str(tmp_path)!r})
            trainer.fit(Model())
    """
        )
    )
    with pytest.warns(RetainedGraphWarning, match="my_script.GLOBAL_LOSSES"):
        result = run_script(script, deep=deep)
    assert result.exit_code == 0
    ours = [f for f in result.report.findings if f.component == "loss_retention"]
    assert len(ours) == 1
    (finding,) = ours
    assert finding.location == "my_script.GLOBAL_LOSSES"
    assert finding.id == "retained-graph"
    assert finding.severity == "warning"
    assert finding.figures == {
        "count": 4,
        "est_bytes": finding.figures["est_bytes"],
        "backpropagated": True,
        "step_first_seen": first_seen,  # the default walks every 128th step: found at the end
    }
    assert ".detach()" in (finding.fix or "")
    assert result.report.runs[0].figures["retained_graphs"] == 4


@pytest.mark.slow
def test_holder_past_max_depth_is_named_by_the_heap_scan(tmp_path: Path) -> None:
    detector = _fit_warns(
        ListLeak(), tmp_path, detector=LossRetentionDetector(max_depth=1, deep_scan_every_n_steps=2)
    )
    assert _summary(detector) == [("model.losses", True)]
    assert detector.findings[0].count >= 2


def test_returned_tensor_that_outlives_its_step_triggers_a_heap_scan(
    tmp_path: Path, tmp_module: Callable[..., Any]
) -> None:
    store = tmp_module("leak_outputs", "KEPT = []\n")

    class Keeper(Callback):
        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            store.KEPT.append(outputs["aux"])

    detector = LossRetentionDetector(deep_scan_every_n_steps=0)  # only the trigger scans
    with pytest.warns(RetainedGraphWarning) as record:
        _fit(ExtraKey(in_loss=False), tmp_path, detector=detector, callbacks=(Keeper(),))
    assert _summary(detector) == [('training_step()["aux"]', False), ("leak_outputs.KEPT", False)]
    assert detector.findings[1].step_first_seen == 1
    assert _ours(record) == 2


def test_datamodule_attribute_is_named(tmp_path: Path) -> None:
    from pytorch_lightning import LightningDataModule
    from pytorch_lightning.demos.boring_classes import RandomDataset
    from torch.utils.data import DataLoader

    class Data(LightningDataModule):
        def __init__(self) -> None:
            super().__init__()
            self.kept: list[torch.Tensor] = []

        def train_dataloader(self) -> DataLoader[Any]:
            return DataLoader(RandomDataset(32, 64), batch_size=2)

        def val_dataloader(self) -> DataLoader[Any]:
            return DataLoader(RandomDataset(32, 8), batch_size=2)

    class Leaky(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.trainer.datamodule.kept.append(out["loss"])  # type: ignore[attr-defined]
            return out

    detector = LossRetentionDetector(deep_scan_every_n_steps=0)
    trainer = Trainer(callbacks=[detector], **quiet_trainer_kwargs(tmp_path, max_steps=4))
    with pytest.warns(RetainedGraphWarning, match="datamodule.kept"):
        trainer.fit(Leaky(), datamodule=Data())
    assert _summary(detector) == [("datamodule.kept", True)]


def test_graphs_alive_before_the_fit_are_not_its_leaks(tmp_path: Path) -> None:
    leftover = (torch.randn(4, requires_grad=True) * 2).relu().sum()  # e.g. from another fit
    GLOBAL_LOSSES.append(leftover)
    try:
        detector = LossRetentionDetector(mode="error", deep_scan_every_n_steps=1)
        _fit(BoringModel(), tmp_path, detector=detector)
    finally:
        GLOBAL_LOSSES.clear()
    assert detector.findings == []


def test_one_graph_keeping_a_mebibyte_of_activations_is_reported_at_once(tmp_path: Path) -> None:
    class BigAux(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.aux: list[torch.Tensor] = []

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            wide = torch.relu(self.layer(batch).repeat(1, 2**18))  # 2 MiB saved by relu
            self.aux.append(wide.mean())
            return super().training_step(batch, batch_idx)

    with pytest.raises(RetainedGraphError, match=r"model\.aux holds 1 tensor.*~[0-9.]+ MiB"):
        _fit(BigAux(), tmp_path, detector=LossRetentionDetector(mode="error"))
