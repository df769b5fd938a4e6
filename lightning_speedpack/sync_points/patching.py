"""The wrappers that watch the calls that can sync, and how they are put in place and back.

A ``TorchFunctionMode`` sees every op but costs ~1.5x on a tiny step (measured in
``benchmarks/sync_points.py``), so instead the handful of ``torch.Tensor`` methods and
``torch`` / ``torch.cuda`` functions that can sync are replaced with thin wrappers. A wrapper
does one global read, one thread-id compare and one depth check before it calls the original,
so it costs close to nothing when no detector is *armed* (:func:`set_armed`) or on another
thread. A sync made inside another watched call (``print(t)`` -> ``__repr__`` -> ``item``)
counts once, for the outermost call. Everything replaced is put back exactly (the same
function objects; attributes that were inherited are deleted again) by :func:`restore`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from threading import get_ident
from types import FrameType
from typing import Any, Protocol

import torch
from torch.optim import optimizer as _torch_optimizer

from lightning_speedpack.sync_points.findings import CPU_TO_CPU

__all__ = [
    "Saved",
    "Test",
    "Watcher",
    "apply",
    "armed",
    "patch_specs",
    "restore",
    "set_armed",
    "set_indexing",
]


class Watcher(Protocol):
    """What the wrappers read and call on the detector that is armed."""

    include_cpu: bool
    thread: int
    depth: int
    in_tail: bool
    tail_indexing: int  # indexing calls seen between batches (to decide whether to swap)

    def hit(self, kind: str, frame: FrameType | None) -> None:
        """Record one sync of ``kind`` made at ``frame``."""


_ARMED: Watcher | None = None  # the detector watching right now (read by every wrapper)


def set_armed(watcher: Watcher | None) -> None:
    """Make ``watcher`` the one every wrapper reports to (``None``: nobody watches)."""
    global _ARMED
    _ARMED = watcher


def armed() -> Watcher | None:
    """The watcher the wrappers report to right now."""
    return _ARMED


def _reset_in_child() -> None:  # a forked DataLoader worker must not report into the parent
    set_armed(None)


os.register_at_fork(after_in_child=_reset_in_child)

Test = Callable[[Watcher, tuple[Any, ...], dict[str, Any]], "str | None"]


def _counted(st: Watcher, t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (st.include_cpu or not t.is_cpu)


def _self_test(kind: str) -> Test:
    def test(st: Watcher, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return kind if args and _counted(st, args[0]) else None

    return test


def _item_test(st: Watcher, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """``.item()``, less an optimizer's step counter read on the CPU.

    torch's optimizers (Adam, AdamW, ...) keep their ``step`` counters on the CPU whatever the
    device (unless ``capturable`` or ``fused``) and read them with ``.item()`` in
    ``torch.optim.optimizer._get_value``: on a GPU that is no sync, so a CPU run that counts
    CPU tensors as device tensors (``include_cpu``) leaves those reads out too.
    """
    t = args[0] if args else None
    if t is None or not _counted(st, t):
        return None
    if t.is_cpu and sys._getframe(2).f_code is _OPTIMIZER_GET_VALUE:  # 1: the wrapper
        return None
    return "item"


def _first_arg_test(kind: str) -> Test:
    def test(st: Watcher, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        t = args[0] if args else kwargs.get("input")
        return kind if _counted(st, t) else None

    return test


def _always(kind: str) -> Test:
    def test(st: Watcher, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return kind

    return test


def _where_test(st: Watcher, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    if len(args) + len(kwargs) != 1:
        return None
    cond = args[0] if args else kwargs.get("condition")
    return "where" if _counted(st, cond) else None


def _is_mask(st: Watcher, idx: Any) -> bool:
    if isinstance(idx, torch.Tensor):
        return idx.dtype is torch.bool and (st.include_cpu or not idx.is_cpu)
    if type(idx) is tuple:
        return any(_is_mask(st, i) for i in idx)
    return False


def _mask_test(st: Watcher, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    return "masked index" if len(args) > 1 and _is_mask(st, args[1]) else None


def _cpu_test(st: Watcher, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    src = args[0]
    if not isinstance(src, torch.Tensor):
        return None
    if not src.is_cpu:
        return "cpu copy"
    return CPU_TO_CPU if st.include_cpu else None


def _to_test(st: Watcher, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    src = args[0]
    if not isinstance(src, torch.Tensor):
        return None
    target: Any = kwargs.get("device")
    if target is None and len(args) > 1:
        first = args[1]
        if isinstance(first, (str, torch.device)):
            target = first
        elif isinstance(first, torch.Tensor):
            target = first.device
        elif isinstance(first, int) and not isinstance(first, bool):
            target = "cuda"
    if target is None:
        return None
    target_type = target.split(":")[0] if isinstance(target, str) else getattr(target, "type", "")
    if target_type != "cpu":
        if src.is_cpu and kwargs.get("non_blocking") and not src.is_pinned():
            return "pageable copy"
        return None
    if not src.is_cpu:
        return "cpu copy"
    # CPU -> CPU under include_cpu: only an explicit "cpu" string (a torch.device may be the
    # module's own device, which would not be a copy on a GPU run).
    return CPU_TO_CPU if st.include_cpu and isinstance(target, str) else None


def _wrap(orig: Callable[..., Any], test: Test) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        st = _ARMED
        if st is None or st.depth or get_ident() != st.thread:
            return orig(*args, **kwargs)
        kind = test(st, args, kwargs)
        if kind is None:
            return orig(*args, **kwargs)
        st.depth += 1
        try:
            st.hit(kind, sys._getframe(1))
            return orig(*args, **kwargs)
        finally:
            st.depth -= 1

    for attr in ("__name__", "__qualname__", "__doc__"):
        with contextlib.suppress(AttributeError, TypeError):  # exotic callables
            setattr(wrapper, attr, getattr(orig, attr))
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _wrap_indexing(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``__getitem__``/``__setitem__``, which are hot in DataLoader code.

    A fixed signature for each (no argument packing: a ``*value`` tuple and its unpacking call
    were more than half of a wrapper's early return, 306-400 ns a call against 139-165 ns
    without) and an early return between batches (:func:`set_indexing`) keep the per-sample
    indexing of a dataset cheap. Hence two wrappers alike but for their arguments.
    """
    if orig.__name__ == "__setitem__":
        return _named(_wrap_setitem(orig), orig)

    def wrapper(self: torch.Tensor, idx: Any) -> Any:
        st = _ARMED
        if st is None or st.depth:
            return orig(self, idx)
        if st.in_tail:  # DataLoader code between batches: counted, never watched
            st.tail_indexing += 1
            return orig(self, idx)
        if get_ident() != st.thread or not _is_mask(st, idx):
            return orig(self, idx)
        st.depth += 1
        try:
            st.hit("masked index", sys._getframe(1))
            return orig(self, idx)
        finally:
            st.depth -= 1

    return _named(wrapper, orig)


def _wrap_setitem(orig: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: torch.Tensor, idx: Any, value: Any) -> None:
        st = _ARMED
        if st is None or st.depth:
            orig(self, idx, value)
        elif st.in_tail:
            st.tail_indexing += 1
            orig(self, idx, value)
        elif get_ident() != st.thread or not _is_mask(st, idx):
            orig(self, idx, value)
        else:
            st.depth += 1
            try:
                st.hit("masked index", sys._getframe(1))
                orig(self, idx, value)
            finally:
                st.depth -= 1

    return wrapper


def _named(wrapper: Callable[..., Any], orig: Callable[..., Any]) -> Callable[..., Any]:
    wrapper.__name__ = wrapper.__qualname__ = orig.__name__
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def patch_specs() -> list[tuple[Any, str, Test]]:
    """(owner, attribute, test) for everything the detector replaces."""
    t = torch.Tensor
    specs: list[tuple[Any, str, Test]] = [
        (t, "item", _item_test),
        (t, "tolist", _self_test("tolist")),
        (t, "numpy", _self_test("numpy")),
        (t, "__array__", _self_test("numpy")),
        (t, "cpu", _cpu_test),
        (t, "to", _to_test),
        (t, "__bool__", _self_test("bool")),
        (t, "__float__", _self_test("float")),
        (t, "__int__", _self_test("int")),
        (t, "__index__", _self_test("index")),
        (t, "__repr__", _self_test("repr")),
        (t, "__format__", _self_test("repr")),
        (t, "nonzero", _self_test("nonzero")),
        (t, "masked_select", _self_test("masked select")),
        (t, "unique", _self_test("unique")),
        (t, "__getitem__", _mask_test),
        (t, "__setitem__", _mask_test),
        (torch, "nonzero", _first_arg_test("nonzero")),
        (torch, "where", _where_test),
        (torch, "masked_select", _first_arg_test("masked select")),
        (torch, "unique", _first_arg_test("unique")),
        (torch.cuda, "synchronize", _always("cuda synchronize")),
        (torch.cuda, "empty_cache", _always("empty cache")),
        (torch.cuda.Event, "synchronize", _always("event synchronize")),
        (torch.cuda.Stream, "synchronize", _always("stream synchronize")),
    ]
    return [(owner, name, test) for owner, name, test in specs if hasattr(owner, name)]


Saved = list[tuple[Any, str, Any, Any]]
"""``(owner, attribute, what was there, its wrapper)`` per replaced attribute."""


def apply(specs: list[tuple[Any, str, Test]], saved: Saved) -> None:
    """Replace each spec's attribute with its wrapper, recording what to put back."""
    for owner, name, test in specs:
        raw = vars(owner).get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name)
        orig = getattr(owner, name)
        wrapper = _wrap_indexing(orig) if name in _INDEXING else _wrap(orig, test)
        saved.append((owner, name, raw, wrapper))
        setattr(owner, name, wrapper)


def _put_back(owner: Any, name: str, raw: Any) -> None:
    if raw is not _MISSING:
        setattr(owner, name, raw)
    elif name in vars(owner):  # it was inherited: delete ours (if still there)
        delattr(owner, name)


def restore(saved: Saved) -> None:
    """Put back everything :func:`apply` replaced, last first (empties ``saved``)."""
    while saved:
        owner, name, raw, _wrapper = saved.pop()
        _put_back(owner, name, raw)


def set_indexing(saved: Saved, watched: bool) -> None:
    """Put the indexing wrappers in place (``watched``) or take them out until the next batch.

    Tensor indexing is the call DataLoader code makes per sample (``TensorDataset`` indexes
    each tensor once per sample: 64 calls per batch of 32 image/label pairs); between the end
    of one batch and the start of the next only dataset code runs it. Taking the wrappers out
    for that stretch and back costs ~15 us per batch, plus the method-cache misses that
    changing ``torch.Tensor`` causes afterwards, against ~0.2 us per call through a wrapper's
    early return: the detector swaps only for loaders that index a lot in the main process.
    """
    for owner, name, raw, wrapper in saved:
        if name in _INDEXING:
            if watched:
                setattr(owner, name, wrapper)
            else:
                _put_back(owner, name, raw)


_MISSING = object()
# The helper through which torch's optimizers read their CPU step counters (None if renamed).
_OPTIMIZER_GET_VALUE = getattr(getattr(_torch_optimizer, "_get_value", None), "__code__", None)
# DataLoader code indexes tensors once per sample: outside the step proper (between the end
# of one batch and the start of the next) these wrappers return at once.
_INDEXING = frozenset({"__getitem__", "__setitem__"})
