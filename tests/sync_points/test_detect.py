"""The sync detection engine without Lightning: kinds, lines, nesting, threads, exact restore."""

from __future__ import annotations

import inspect
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import pytorch_lightning
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_speedpack.sync_points.detect import (
    SWAP_INDEXING_AT,
    SyncDetector,
    SyncPointError,
    attribute_frame,
    framework_fix,
    matches_allow,
)
from tests.helpers import global_state

CUDA_MSG = "called a synchronizing CUDA operation"  # what set_sync_debug_mode warns


def marked_lines(fn: Callable[..., Any]) -> dict[str, int]:
    """``{marker: line}`` for every ``# sync: <marker>`` comment in ``fn``'s source."""
    lines, start = inspect.getsourcelines(fn)
    out: dict[str, int] = {}
    for offset, line in enumerate(lines):
        if "# sync: " in line:
            out[line.split("# sync: ")[1].split()[0]] = start + offset
    return out


def every_kind(t: torch.Tensor, m: torch.Tensor) -> None:
    t.sum().item()  # sync: item
    t.tolist()  # sync: tolist
    t.numpy()  # sync: numpy
    np.asarray(t)  # sync: asarray
    t.cpu()  # sync: cpu
    t.to("cpu")  # sync: to-cpu
    if m.any():  # sync: bool
        pass
    float(t.sum())  # sync: float
    int(t.sum())  # sync: int
    [1, 2, 3, 4, 5][t.argmax()]  # sync: index
    print(t)  # sync: print
    f"{t}"  # sync: format
    repr(t)  # sync: repr
    t.nonzero()  # sync: nonzero
    torch.nonzero(m)  # sync: torch.nonzero
    torch.where(m)  # sync: where
    t.masked_select(m)  # sync: masked_select
    torch.masked_select(t, m)  # sync: torch.masked_select
    torch.unique(t)  # sync: unique
    t.unique()  # sync: tensor.unique
    t[m]  # sync: getitem
    t[m] = 0.0  # sync: setitem
    torch.cuda.empty_cache()  # sync: empty_cache


EXPECTED_KIND = {
    "item": "item",
    "tolist": "tolist",
    "numpy": "numpy",
    "asarray": "numpy",
    "cpu": "cpu copy",
    "to-cpu": "cpu copy",
    "bool": "bool",
    "float": "float",
    "int": "int",
    "index": "index",
    "print": "repr",
    "format": "repr",
    "repr": "repr",
    "nonzero": "nonzero",
    "torch.nonzero": "nonzero",
    "where": "where",
    "masked_select": "masked select",
    "torch.masked_select": "masked select",
    "unique": "unique",
    "tensor.unique": "unique",
    "getitem": "masked index",
    "setitem": "masked index",
    "empty_cache": "empty cache",
}


def not_syncs(t: torch.Tensor, m: torch.Tensor, device: torch.device) -> None:
    t.to(device)  # a torch.device may be the module's own device: not counted on CPU
    t.to(torch.float64)
    torch.where(m, t, t)
    t[0]
    t[1:3] = 1.0
    t[torch.tensor([0, 1])]
    t.sum() * 2


@pytest.fixture
def clean_state() -> Iterator[None]:
    before = global_state.snapshot()
    yield
    assert global_state.diff(before, global_state.snapshot()) == {}


def _watch(fn: Callable[[], Any], **kwargs: Any) -> SyncDetector:
    det = SyncDetector(**kwargs)
    det.install()
    try:
        det.arm(step=0)
        fn()
    finally:
        det.uninstall()
    return det


def test_every_kind_is_reported_once_at_its_line(clean_state: None, capsys: Any) -> None:
    t, m = torch.arange(5.0), torch.arange(5) > 2
    det = _watch(lambda: every_kind(t.clone(), m), include_cpu=True)
    lines = marked_lines(every_kind)
    got = {(f.kind, f.lineno) for f in det.findings()}
    assert got == {(EXPECTED_KIND[k], line) for k, line in lines.items()}
    assert all(f.count == 1 and f.origin == "user" and f.steps_seen == 1 for f in det.findings())
    assert all(f.filename == __file__ and f.function == "every_kind" for f in det.findings())
    item = next(f for f in det.findings() if f.kind == "item")
    assert item.code == "t.sum().item()  # sync: item"


def test_cpu_tensors_do_not_count_by_default(clean_state: None, capsys: Any) -> None:
    t, m = torch.arange(5.0), torch.arange(5) > 2
    det = _watch(lambda: every_kind(t.clone(), m))
    assert {f.kind for f in det.findings()} == {"empty cache"}  # a CUDA call counts anyway


def test_non_syncs_are_not_reported(clean_state: None) -> None:
    t, m = torch.arange(5.0), torch.arange(5) > 2
    det = _watch(lambda: not_syncs(t, m, torch.device("cpu")), include_cpu=True)
    assert det.findings() == []


def adam_steps(p: torch.nn.Parameter, foreach: bool) -> None:
    opt = torch.optim.AdamW([p], lr=0.1, foreach=foreach)
    for _ in range(2):
        p.grad = torch.ones_like(p)
        opt.step()  # reads its CPU step counter with .item(): no sync on any device
    float(p.sum().item())  # sync: item


@pytest.mark.parametrize("foreach", [False, True], ids=["for-loop", "foreach"])
def test_an_optimizers_cpu_step_counter_is_not_a_sync(clean_state: None, foreach: bool) -> None:
    """Adam keeps ``step`` on the CPU on a GPU too: counting CPU tensors must not count it."""
    p = torch.nn.Parameter(torch.randn(4))
    det = _watch(lambda: adam_steps(p, foreach), include_cpu=True)
    assert [(f.kind, f.lineno) for f in det.findings()] == [
        ("item", marked_lines(adam_steps)["item"])
    ]


def test_nested_sync_counts_once_at_the_outermost_call(clean_state: None, capsys: Any) -> None:
    t = torch.tensor(1.5)
    det = _watch(lambda: print(t), include_cpu=True)  # __repr__ calls item() internally
    (finding,) = det.findings()
    assert (finding.kind, finding.count) == ("repr", 1)
    assert finding.code.startswith("det = _watch(lambda: print(t)")


def test_device_tensors_count_and_error_mode_raises_before_the_call(clean_state: None) -> None:
    meta = torch.empty(3, device="meta")  # a non-CPU device on a CPU-only machine
    det = SyncDetector(raise_on_user=True)
    det.install()
    try:
        det.arm(step=4)
        line = inspect.currentframe().f_lineno + 2  # type: ignore[union-attr]
        with pytest.raises(SyncPointError, match=rf"cpu copy at .*test_detect.py:{line}"):
            meta.to(torch.empty(1))
        with pytest.raises(SyncPointError, match="item at"):
            meta.sum().item()
        torch.ones(2).tolist()  # a CPU tensor: not a sync without include_cpu
    finally:
        det.uninstall()
    assert [(f.kind, f.first_step) for f in det.findings()] == [("cpu copy", 4), ("item", 4)]


def test_other_threads_are_not_watched(clean_state: None) -> None:
    t = torch.ones(())
    done = threading.Event()

    def other() -> None:
        t.item()
        done.set()

    def body() -> None:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()

    det = _watch(body, include_cpu=True, raise_on_user=True)
    assert done.is_set()
    assert det.findings() == []


def test_not_armed_means_not_watched(clean_state: None) -> None:
    det = SyncDetector(include_cpu=True, raise_on_user=True)
    det.install()
    try:
        torch.ones(()).item()
        det.arm(step=0)
        det.disarm()
        torch.ones(()).item()
    finally:
        det.uninstall()
    assert det.findings() == []


def test_masked_indexing_is_watched_in_the_step_only(clean_state: None) -> None:
    t, m = torch.arange(4.0), torch.arange(4) > 1

    def body() -> None:
        t[m]
        det.end_step()  # after on_train_batch_end: DataLoader code indexes per sample
        t[m]
        t.sum().item()

    det = SyncDetector(include_cpu=True)
    det.install()
    try:
        det.arm(step=0)
        body()
    finally:
        det.uninstall()
    assert sorted(f.kind for f in det.findings()) == ["item", "masked index"]


@pytest.mark.parametrize(
    ("tail_calls", "swapped"), [(10, False), (SWAP_INDEXING_AT + 50, True)], ids=["few", "many"]
)
def test_indexing_wrappers_leave_the_tail_only_when_it_indexes_a_lot(
    clean_state: None, tail_calls: int, swapped: bool
) -> None:
    # A swap of torch.Tensor's indexing slots costs more than a few early returns (issue 17:
    # the tiny MLP got slower when every batch swapped), so only heavy indexing is swapped out.
    t, m = torch.arange(4.0), torch.arange(4) > 1
    det = SyncDetector(include_cpu=True)
    det.install()
    wrapper = vars(torch.Tensor)["__getitem__"]
    in_tail = []
    try:
        for step in range(5):
            det.arm(step=step)
            t[m]  # in the step: watched
            det.end_step()
            in_tail.append(vars(torch.Tensor).get("__getitem__") is wrapper)
            for _ in range(tail_calls):  # DataLoader code, between batches
                t[0]
            t[m]  # between batches: never reported
    finally:
        det.uninstall()
    assert in_tail == [True, True, True, not swapped, not swapped]  # decided after 3 batches
    assert [(f.kind, f.count) for f in det.findings()] == [("masked index", 5)]


def test_indexing_wrappers_read_and_write_as_torch_and_count_setitem_in_the_tail(
    clean_state: None,
) -> None:
    # getitem and setitem have wrappers of their own (fixed signatures, no argument packing):
    # each must index exactly as torch does, armed or not, and count in the tail alike.
    t, m = torch.arange(6.0), torch.arange(6) > 3
    det = SyncDetector(include_cpu=True)
    det.install()
    try:
        assert t[m].tolist() == [4.0, 5.0]  # installed, not armed: passed through
        det.arm(step=0)
        t[m] = -1.0  # in the step: watched, and written
        part = t[1:3]  # not a mask: not watched
        det.end_step()
        before = det.tail_indexing
        t[0] = 7.0  # between batches: counted, never reported
        t[m] = -2.0
        assert det.tail_indexing == before + 2
    finally:
        det.uninstall()
    assert t.tolist() == [7.0, 1.0, 2.0, 3.0, -2.0, -2.0]
    assert part.tolist() == [1.0, 2.0]
    assert [(f.kind, f.count) for f in det.findings()] == [("masked index", 1)]


def test_per_step_counts(clean_state: None) -> None:
    t = torch.ones(())
    det = SyncDetector(include_cpu=True)
    det.install()
    try:
        for step in range(3):
            det.arm(step=step)
            for _ in range(2):
                t.item()
    finally:
        det.uninstall()
    (f,) = det.findings()
    assert (f.count, f.steps_seen, f.per_step, f.first_step) == (6, 3, 2.0, 0)


def test_restores_exactly_after_an_exception(clean_state: None) -> None:
    with pytest.raises(ZeroDivisionError):
        _watch(lambda: 1 / 0, include_cpu=True)
    assert torch.Tensor.__repr__ is torch.Tensor.__dict__["__repr__"]
    assert "item" not in vars(torch.Tensor)
    assert bool(torch.ones(()))


def test_only_one_detector_at_a_time(clean_state: None) -> None:
    first, second = SyncDetector(), SyncDetector()
    first.install()
    try:
        with pytest.raises(RuntimeError, match="already watching"):
            second.install()
    finally:
        first.uninstall()
    second.install()
    second.uninstall()


class _ItemDataset(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        torch.tensor(float(i)).item()  # dataset code run by a DataLoader: not the step's
        return torch.ones(2)


def test_dataset_code_run_by_a_dataloader_is_not_counted(clean_state: None) -> None:
    det = _watch(lambda: list(DataLoader(_ItemDataset(), batch_size=2)), include_cpu=True)
    assert det.findings() == []


def test_lightning_frames_are_framework_origin(clean_state: None) -> None:
    fake = os.path.join(os.path.dirname(pytorch_lightning.__file__), "speedpack_fake.py")
    code = compile("def read(t):\n    return t.item()\n", fake, "exec")
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    det = _watch(lambda: namespace["read"](torch.ones(())), include_cpu=True, raise_on_user=True)
    (f,) = det.findings()  # error mode does not raise for the framework's syncs
    assert (f.origin, f.filename, f.lineno, f.function) == ("framework", fake, 2, "read")


def test_attribute_frame_skips_torch_and_stdlib() -> None:
    import logging

    seen: list[Any] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found = attribute_frame(inspect.currentframe().f_back)  # type: ignore[union-attr]
            assert found is not None
            seen.append((found[0].f_code.co_filename, found[0].f_lineno, found[1]))

    log = logging.getLogger("speedpack-attr-test")
    log.addHandler(handler := Grab())
    try:
        log.warning("x")
        line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
    finally:
        log.removeHandler(handler)
    assert seen == [(__file__, line, "user")]


def test_allow_patterns() -> None:
    path = "/home/u/proj/train.py"
    assert matches_allow(path, 12, ["train.py:12"])
    assert matches_allow(path, 12, ["proj/train.py:12"])
    assert matches_allow(path, 99, ["train.py"])
    assert matches_allow(path, 12, ["*/proj/*.py:1?"])
    assert not matches_allow(path, 13, ["train.py:12"])
    assert not matches_allow(path, 12, ["other.py"])


def test_allowed_sites_are_ignored(clean_state: None) -> None:
    t = torch.ones(())
    det = _watch(
        lambda: t.item(),
        include_cpu=True,
        raise_on_user=True,
        allow=[f"{os.path.basename(__file__)}"],
    )
    assert det.findings() == []


def test_cuda_calls_count_without_tensors(
    clean_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: calls.append("event"))
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", lambda self: calls.append("stream"))
    before = global_state.snapshot()
    event, stream = object.__new__(torch.cuda.Event), object.__new__(torch.cuda.Stream)

    def body() -> None:
        torch.cuda.synchronize()
        torch.cuda.Event.synchronize(event)
        torch.cuda.Stream.synchronize(stream)

    det = _watch(body)
    assert calls == ["sync", "event", "stream"]
    assert sorted(f.kind for f in det.findings()) == [
        "cuda synchronize",
        "event synchronize",
        "stream synchronize",
    ]
    assert global_state.diff(before, global_state.snapshot()) == {}


def test_cuda_sync_debug_mode_injected(clean_state: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path (set_sync_debug_mode) on a CPU machine: fake mode API, injected warnings."""
    modes: list[Any] = [0]

    def warn_like_cuda() -> None:
        warnings.warn(CUDA_MSG, UserWarning, stacklevel=1)

    # A patched call whose original warns too (as CUDA ops do in debug mode) counts once.
    monkeypatch.setattr(torch.cuda, "empty_cache", warn_like_cuda)

    def emit() -> None:
        warnings.warn(CUDA_MSG, UserWarning, stacklevel=1)  # sync: debug
        torch.cuda.empty_cache()  # sync: patched

    det = SyncDetector(sync_debug=(lambda: modes[-1], modes.append))
    det.install()
    try:
        det.arm(step=0)
        assert modes[-1] == "warn"
        emit()
        det.disarm()
    finally:
        det.uninstall()
    assert modes == [0, "warn", 0]  # armed for the watched region, previous mode restored
    lines = marked_lines(emit)
    assert {(f.kind, f.lineno, f.count) for f in det.findings()} == {
        ("cuda sync (debug mode)", lines["debug"], 1),
        ("empty cache", lines["patched"], 1),
    }


def test_the_packs_other_callbacks_are_framework_with_their_own_fix(clean_state: None) -> None:
    import lightning_speedpack

    fake = os.path.join(os.path.dirname(lightning_speedpack.__file__), "callbacks", "fake_cb.py")
    namespace: dict[str, Any] = {}
    exec(compile("def read(t):\n    return t.item()\n", fake, "exec"), namespace)
    det = _watch(lambda: namespace["read"](torch.ones(())), include_cpu=True, raise_on_user=True)
    (finding,) = det.findings()  # recorded, labelled, and not raised in error mode
    assert (finding.origin, finding.filename, finding.lineno) == ("framework", fake, 2)
    assert "log_every_n_steps" in framework_fix(finding)


def test_non_blocking_copy_from_pageable_memory(clean_state: None) -> None:
    t = torch.ones(3)  # not pinned
    line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
    det = _watch(lambda: t.to("meta", non_blocking=True))
    assert [(f.kind, f.lineno) for f in det.findings()] == [("pageable copy", line)]
    assert (
        _watch(lambda: t.to("meta")).findings() == []
    )  # a blocking host-to-device copy: not counted


def test_docstring_examples_run(clean_state: None) -> None:
    import doctest

    from lightning_speedpack.sync_points import attribution, detect, findings, patching

    attempted = 0
    for module in (attribution, detect, findings, patching):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0
        attempted += result.attempted
    assert attempted >= 9


def test_setting_the_debug_mode_hides_torchs_prototype_warning(clean_state: None) -> None:
    """torch 2.11 warns each time the mode is set (seen on an H200); the pack's own use is quiet."""
    modes: list[Any] = [0]

    def set_mode(mode: Any) -> None:
        warnings.warn(
            "Synchronization debug mode is a prototype feature and does not yet detect all "
            "synchronizing operations",
            UserWarning,
            stacklevel=1,
        )
        modes.append(mode)

    det = SyncDetector(sync_debug=(lambda: modes[-1], set_mode))
    det.install()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a job run with -W error
            det.arm(step=0)
            det.disarm()
    finally:
        det.uninstall()
    assert modes == [0, "warn", 0]
