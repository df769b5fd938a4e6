"""The engine behind :class:`~lightning_speedpack.SyncPointWarnings`: find host-device syncs.

A *sync* is a call that makes the CPU wait until the device has finished its queued work:
reading a value (``.item()``, ``float(t)``, ``if t:``), copying to the host (``.cpu()``,
``.numpy()``, ``print(t)``), ops whose output size depends on the data (``nonzero``,
boolean-mask indexing, ``unique``) and explicit waits (``torch.cuda.synchronize``).

Design (measured in ``benchmarks/sync_points.py``): a ``TorchFunctionMode`` sees every op but
costs ~1.5x on a tiny step, so instead :class:`SyncDetector` replaces the handful of
``torch.Tensor`` methods and ``torch`` / ``torch.cuda`` functions that can sync with thin
wrappers. A wrapper does one global read, one thread-id compare and one depth check before it
calls the original, so it costs close to nothing when the detector is not *armed* (outside
the watched region, or on another thread). Everything replaced is put back exactly (the same
function objects; attributes that were inherited are deleted again) by :meth:`uninstall`.

Attribution walks the Python stack from the call: frames inside torch, numpy, the standard
library and this detector are skipped; if the first remaining frame belongs to Lightning
(``pytorch_lightning/``, ``lightning_fabric/``, ``lightning_utilities/``, or the ``lightning``
package's ``lightning/pytorch/`` and ``lightning/fabric/``: both namespaces), the sync is the
framework's (``origin="framework"``), otherwise it is the user's and is reported at that
frame, so ``print(t)`` points at the ``print`` line. A sync made inside another watched call
(``print(t)`` -> ``__repr__`` -> ``item``) counts once, for the outermost call. Calls made while
a ``torch.utils.data`` loader is on the stack (dataset code run by the loader) are not counted.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import linecache
import os
import re
import sys
import sysconfig
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from threading import get_ident
from types import FrameType
from typing import Any, Literal

import torch

__all__ = [
    "FIXES",
    "SyncDetector",
    "SyncFinding",
    "SyncPointError",
    "SyncWarning",
    "attribute_frame",
    "framework_fix",
    "matches_allow",
]

Origin = Literal["user", "framework"]
SyncDebugApi = tuple[Callable[[], Any], Callable[[Any], None]]

#: How to avoid each kind of sync (used in warnings, errors and doctor findings).
FIXES: dict[str, str] = {
    "item": ".item() -> log the tensor with self.log(...) (Lightning reduces it without a sync) "
    "or accumulate on the device and read it once per epoch",
    "float": "float(tensor) -> log the tensor with self.log(...) or keep the value on the device",
    "int": "int(tensor) -> keep the value on the device, or compute it from shapes (metadata)",
    "bool": "`if tensor:` -> keep the decision on the device (torch.where, masking) or check it "
    "every N steps",
    "index": "a tensor used as a Python index -> use a Python int, or index with the tensor",
    "tolist": ".tolist() -> keep it a tensor; convert once per epoch",
    "numpy": ".numpy()/np.asarray(t) -> keep it a tensor; convert once per epoch",
    "cpu copy": ".cpu()/.to('cpu') -> keep it on the device; if the host needs it, copy with "
    "non_blocking=True into pinned memory and read it steps later",
    "pageable copy": "non_blocking copy from pageable memory -> pin the source (DataLoader "
    "pin_memory=True or tensor.pin_memory())",
    "repr": "print(t)/f'{t}' -> print every N steps, or log the tensor with self.log(...)",
    "nonzero": "nonzero() -> data-dependent output size; use a fixed-size alternative "
    "(torch.where(mask, x, 0), multiply by the mask, torch.nonzero_static)",
    "where": "torch.where(cond) with one argument is nonzero(); use the three-argument form",
    "masked select": "masked_select -> data-dependent size; multiply by the mask instead",
    "masked index": "x[mask] -> data-dependent size; use torch.where(mask, x, 0) or x * mask",
    "unique": "torch.unique -> data-dependent size; avoid it in the step or move it to the "
    "data pipeline",
    "cuda synchronize": "torch.cuda.synchronize() -> remove it; synchronise only to time "
    "something, and then every N steps",
    "empty cache": "torch.cuda.empty_cache() -> remove it from the loop",
    "event synchronize": "Event.synchronize() -> use event.query() or stream.wait_event(event)",
    "stream synchronize": "Stream.synchronize() -> use stream.wait_stream(other) instead",
    "cuda sync (debug mode)": "torch.cuda.set_sync_debug_mode flagged this op; see the kinds "
    "above for a device-side alternative",
}

_SYNC_DEBUG_MESSAGE = "called a synchronizing CUDA operation"
_SYNC_DEBUG_KIND = "cuda sync (debug mode)"
_CPU_TO_CPU = "~cpu copy"  # a CPU->CPU copy under include_cpu: counted only when it is the user's


class SyncPointError(RuntimeError):
    """Raised by ``SyncPointWarnings(mode="error")`` at the first host-device sync in user code."""


class SyncWarning(UserWarning):
    """Emitted once per call site by ``SyncPointWarnings(mode="warn")``, at the user's line."""


@dataclass
class SyncFinding:
    """One call site that synchronises the host with the device.

    Attributes:
        kind: what syncs: ``"item"``, ``"cpu copy"``, ``"masked index"``, ... (keys of ``FIXES``).
        filename: the file of the attributed frame (the user's, or Lightning's for framework).
        lineno: the line in ``filename``.
        code: the source line, stripped.
        function: the function the line is in.
        count: how many syncs this site made.
        first_step: ``trainer.global_step`` when it was first seen.
        steps_seen: in how many watched batches it synced; ``count / steps_seen`` is per step.
        origin: ``"user"`` or ``"framework"`` (Lightning's or this pack's own code).

    Example:
        >>> f = SyncFinding("item", "train.py", 12, "loss.item()", "training_step", count=6,
        ...                 steps_seen=3)
        >>> f.per_step, f.location
        (2.0, 'train.py:12')
    """

    kind: str
    filename: str
    lineno: int
    code: str
    function: str
    count: int = 0
    first_step: int = 0
    steps_seen: int = 0
    origin: Origin = "user"

    @property
    def location(self) -> str:
        """``"path/file.py:LINE"``, relative to the working directory when below it."""
        return f"{_display_path(self.filename)}:{self.lineno}"

    @property
    def per_step(self) -> float:
        """Syncs per batch in which this site synced."""
        return self.count / self.steps_seen if self.steps_seen else 0.0


def _display_path(filename: str) -> str:
    for marker in ("site-packages", "dist-packages"):
        _head, sep, tail = filename.partition(f"{os.sep}{marker}{os.sep}")
        if sep:
            return tail
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if rel.startswith("..") else rel


# ----------------------------------------------------------------------------- attribution


def _module_dir(name: str) -> str | None:
    """The folder of top-level package ``name`` (found without importing it), None if absent."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # absent, hidden by a meta-path finder, or half-imported
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(next(iter(spec.submodule_search_locations)), "")


def _dirs(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(d for n in names if (d := _module_dir(n)) is not None)


_SKIP_DIRS = _dirs(["torch", "numpy"])
# The pack's own callbacks count as framework too: under DDP ThroughputLogger deliberately
# reads one small all-reduced tensor on logging steps, and a user should see that labelled as
# the pack's, with the setting that spaces it out, not mixed with their own syncs.
# Lightning's own files under either namespace: `pytorch_lightning/`, `lightning_fabric/` (the
# pytorch-lightning install) and `lightning/` (holding `lightning/pytorch/`, `lightning/fabric/`).
# Found by path without importing anything; a package that is not installed is left out.
_FRAMEWORK_DIRS = _dirs(
    [
        "pytorch_lightning",
        "lightning_fabric",
        "lightning_utilities",
        "lightning",
        "lightning_speedpack",
    ]
)
_DATA_DIR = os.path.join(os.path.dirname(torch.__file__), "utils", "data", "")
_STDLIB_DIR = os.path.join(sysconfig.get_paths()["stdlib"], "")
_OWN_FILES = {
    os.path.normcase(os.path.abspath(__file__)),
    os.path.normcase(os.path.join(os.path.dirname(os.path.abspath(__file__)), "callback.py")),
}
_GENERIC_FRAMEWORK = ("apply_func.py", "lightning_utilities")

_SKIP, _FRAMEWORK, _USER, _DATA = 0, 1, 2, 3
_CATEGORY: dict[str, int] = {}


def _category(filename: str) -> int:
    cat = _CATEGORY.get(filename)
    if cat is not None:
        return cat
    if filename.startswith(_DATA_DIR):
        cat = _DATA
    elif filename.startswith(_SKIP_DIRS) or os.path.normcase(filename) in _OWN_FILES:
        cat = _SKIP
    elif filename.startswith(_FRAMEWORK_DIRS):
        cat = _FRAMEWORK
    elif filename.startswith("<frozen") or (
        filename.startswith(_STDLIB_DIR)
        and "site-packages" not in filename
        and "dist-packages" not in filename
    ):
        cat = _SKIP
    else:
        cat = _USER
    _CATEGORY[filename] = cat
    return cat


def attribute_frame(frame: FrameType | None) -> tuple[FrameType, Origin] | None:
    """Return the frame a sync made at ``frame`` is reported at, and whose it is.

    Frames of torch, numpy, the standard library and this detector are skipped. If the first
    other frame is Lightning's, the origin is ``"framework"`` and the frame is the first
    Lightning frame that is not a generic helper (``apply_func``, ``lightning_utilities``).
    Otherwise it is ``"user"`` at that frame. Returns None when a ``torch.utils.data`` loader
    is on the stack (dataset code), or for a stack with no frame left.
    """
    f = frame
    while f is not None:
        cat = _category(f.f_code.co_filename)
        if cat == _DATA:
            return None
        if cat != _SKIP:
            break
        f = f.f_back
    if f is None:
        return None
    found: FrameType = f
    origin: Origin = "user"
    if cat == _FRAMEWORK:
        origin = "framework"
        g: FrameType | None = f
        while g is not None and _category(g.f_code.co_filename) in (_FRAMEWORK, _SKIP):
            name = g.f_code.co_filename
            if _category(name) == _FRAMEWORK and not any(x in name for x in _GENERIC_FRAMEWORK):
                found = g
                break
            g = g.f_back
    up = found.f_back
    while up is not None:  # dataset code called by a DataLoader is not the training step's
        if _category(up.f_code.co_filename) == _DATA:
            return None
        up = up.f_back
    return found, origin


def matches_allow(filename: str, lineno: int, patterns: Sequence[str]) -> bool:
    """Whether ``filename:lineno`` matches one of ``patterns`` (``"dir/file.py:12"`` or a glob).

    A pattern without a line number matches every line of the file; a relative pattern
    matches any absolute path that ends with it.
    """
    loc = f"{filename}:{lineno}".replace(os.sep, "/")
    for pattern in patterns:
        pat = pattern.replace(os.sep, "/")
        candidates = [pat] if re.search(r":[\d*?\[\]]+$", pat) else [pat, f"{pat}:*"]
        for cand in candidates:
            if fnmatch.fnmatchcase(loc, cand) or fnmatch.fnmatchcase(loc, f"*/{cand}"):
                return True
    return False


def framework_fix(finding: SyncFinding) -> str:
    """The Trainer setting (or upgrade) that avoids a framework sync."""
    where = f"{finding.filename} {finding.function}"
    if "lightning_speedpack" in finding.filename:
        return (
            "lightning-speedpack combines the ranks' counts once per logging step (one small "
            "all-reduce): raise log_every_n_steps to do it less often"
        )
    if "sigterm" in where:
        return (
            "Lightning broadcasts a SIGTERM flag and reads it with .item() every DDP step "
            "(Lightning issues 21487/21640); one small sync per step, fixed upstream"
        )
    if "progress" in where or "pbar" in finding.code:
        return (
            "the progress bar reads logged values every refresh: enable_progress_bar=False, "
            "fewer prog_bar=True values, or a larger refresh_rate"
        )
    if "logger_connector" in where or "result" in where:
        return "logged values are read when written: raise Trainer(log_every_n_steps=...)"
    if finding.kind == "pageable copy":
        return FIXES["pageable copy"]
    return "a Lightning internal; check its settings for this hook, or ignore it"


# ----------------------------------------------------------------------------- patching

_ARMED: SyncDetector | None = None  # the detector watching right now (read by every wrapper)
_INSTALLED: SyncDetector | None = None


def _reset_in_child() -> None:  # a forked DataLoader worker must not report into the parent
    global _ARMED
    _ARMED = None


os.register_at_fork(after_in_child=_reset_in_child)

Test = Callable[["SyncDetector", tuple[Any, ...], dict[str, Any]], "str | None"]


def _counted(st: SyncDetector, t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (st.include_cpu or not t.is_cpu)


def _self_test(kind: str) -> Test:
    def test(st: SyncDetector, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return kind if args and _counted(st, args[0]) else None

    return test


def _first_arg_test(kind: str) -> Test:
    def test(st: SyncDetector, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        t = args[0] if args else kwargs.get("input")
        return kind if _counted(st, t) else None

    return test


def _always(kind: str) -> Test:
    def test(st: SyncDetector, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        return kind

    return test


def _where_test(st: SyncDetector, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    if len(args) + len(kwargs) != 1:
        return None
    cond = args[0] if args else kwargs.get("condition")
    return "where" if _counted(st, cond) else None


def _is_mask(st: SyncDetector, idx: Any) -> bool:
    if isinstance(idx, torch.Tensor):
        return idx.dtype is torch.bool and (st.include_cpu or not idx.is_cpu)
    if type(idx) is tuple:
        return any(_is_mask(st, i) for i in idx)
    return False


def _mask_test(st: SyncDetector, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    return "masked index" if len(args) > 1 and _is_mask(st, args[1]) else None


def _cpu_test(st: SyncDetector, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    src = args[0]
    if not isinstance(src, torch.Tensor):
        return None
    if not src.is_cpu:
        return "cpu copy"
    return _CPU_TO_CPU if st.include_cpu else None


def _to_test(st: SyncDetector, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
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
    return _CPU_TO_CPU if st.include_cpu and isinstance(target, str) else None


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

    A fixed signature (no keyword packing) and an early return between batches
    (:meth:`SyncDetector.end_step`) keep the per-sample indexing of a dataset cheap.
    """

    def wrapper(self: torch.Tensor, idx: Any, *value: Any) -> Any:
        st = _ARMED
        if (
            st is None
            or st.in_tail
            or st.depth
            or get_ident() != st.thread
            or not _is_mask(st, idx)
        ):
            return orig(self, idx, *value)
        st.depth += 1
        try:
            st.hit("masked index", sys._getframe(1))
            return orig(self, idx, *value)
        finally:
            st.depth -= 1

    wrapper.__name__ = wrapper.__qualname__ = orig.__name__
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    return wrapper


def _patch_specs() -> list[tuple[Any, str, Test]]:
    """(owner, attribute, test) for everything the detector replaces."""
    t = torch.Tensor
    specs: list[tuple[Any, str, Test]] = [
        (t, "item", _self_test("item")),
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


def _apply(specs: list[tuple[Any, str, Test]], saved: list[tuple[Any, str, Any]]) -> None:
    for owner, name, test in specs:
        raw = vars(owner).get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name)
        saved.append((owner, name, raw))
        orig = getattr(owner, name)
        setattr(owner, name, _wrap_indexing(orig) if name in _INDEXING else _wrap(orig, test))


def _restore(saved: list[tuple[Any, str, Any]]) -> None:
    while saved:
        owner, name, raw = saved.pop()
        if raw is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, raw)


_MISSING = object()
# DataLoader code indexes tensors once per sample: outside the step proper (between the end
# of one batch and the start of the next) these wrappers return at once.
_INDEXING = frozenset({"__getitem__", "__setitem__"})


class SyncDetector:
    """Patches the sync points, records hits per call site, and restores everything exactly.

    Args:
        include_cpu: count CPU tensors as device tensors (what *would* sync on a GPU).
        raise_on_user: raise :class:`SyncPointError` at the first user sync.
        allow: call sites to ignore (see :func:`matches_allow`).
        on_new_site: called once with each new call site's finding (after it is recorded).
        sync_debug: ``(get_mode, set_mode)`` of ``torch.cuda``'s sync debug mode to arm as
            ``"warn"`` in the watched region (CUDA runs only), or None.

    Example:
        >>> det = SyncDetector(include_cpu=True)
        >>> det.install()
        >>> det.arm(step=0)
        >>> _ = torch.ones(()).item()
        >>> det.disarm(); det.uninstall()
        >>> [(f.kind, f.count) for f in det.findings()]
        [('item', 1)]
    """

    def __init__(
        self,
        include_cpu: bool = False,
        raise_on_user: bool = False,
        allow: Sequence[str] = (),
        on_new_site: Callable[[SyncFinding], None] | None = None,
        sync_debug: SyncDebugApi | None = None,
    ) -> None:
        self.include_cpu = include_cpu
        self.raise_on_user = raise_on_user
        self.allow = tuple(allow)
        self.on_new_site = on_new_site
        self.sync_debug = sync_debug
        self.thread = 0
        self.depth = 0
        self.step = 0
        self.batches = 0
        self._records: dict[tuple[str, int, str], SyncFinding] = {}
        self._last_batch: dict[tuple[str, int, str], int] = {}
        self._allowed: dict[tuple[str, int], bool] = {}
        self._saved: list[tuple[Any, str, Any]] = []
        self.in_tail = False
        self._warn_ctx: warnings.catch_warnings | None = None  # type: ignore[type-arg]
        self._debug_prev: Any = None
        self._armed_debug = False

    @property
    def installed(self) -> bool:
        """Whether the patches are in place."""
        return bool(self._saved)

    def install(self) -> None:
        """Replace the sync points with watching wrappers (idempotent).

        Raises:
            RuntimeError: another detector is installed (only one can watch at a time).
        """
        global _INSTALLED
        if self._saved:
            return
        if _INSTALLED is not None and _INSTALLED is not self:
            raise RuntimeError(
                "another SyncPointWarnings is already watching this process; use one at a time"
            )
        try:
            _apply(_patch_specs(), self._saved)
            if self.sync_debug is not None:
                self._install_debug_handler()
        except BaseException:
            self.uninstall()
            raise
        _INSTALLED = self

    def uninstall(self) -> None:
        """Put back exactly what :meth:`install` replaced (idempotent)."""
        global _INSTALLED
        self.disarm()
        _restore(self._saved)
        if self._warn_ctx is not None:
            ctx, self._warn_ctx = self._warn_ctx, None
            ctx.__exit__(None, None, None)
        if _INSTALLED is self:
            _INSTALLED = None

    def arm(self, step: int, new_batch: bool = True) -> None:
        """Start watching the calling thread; ``new_batch`` starts a new per-step count."""
        global _ARMED
        if not self._saved:
            return
        self.step = step
        if new_batch:
            self.batches += 1
        self.thread = get_ident()
        self.depth = 0
        self.in_tail = False
        if self.sync_debug is not None and not self._armed_debug:
            get_mode, set_mode = self.sync_debug
            self._debug_prev = get_mode()
            set_mode("warn")
            self._armed_debug = True
        _ARMED = self

    def end_step(self) -> None:
        """Stay armed, except for masked indexing (watched in the step proper only)."""
        self.in_tail = True

    def disarm(self) -> None:
        """Stop watching (idempotent); restores the previous CUDA sync debug mode."""
        global _ARMED
        if _ARMED is self:
            _ARMED = None
        if self._armed_debug and self.sync_debug is not None:
            self._armed_debug = False
            self.sync_debug[1](self._debug_prev)

    def _install_debug_handler(self) -> None:
        ctx = warnings.catch_warnings()
        ctx.__enter__()
        self._warn_ctx = ctx
        warnings.filterwarnings("always", message=f".*{_SYNC_DEBUG_MESSAGE}")
        previous = warnings.showwarning
        detector = self

        def showwarning(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: Any = None,
            line: str | None = None,
        ) -> None:
            if _SYNC_DEBUG_MESSAGE not in str(message):
                previous(message, category, filename, lineno, file, line)
                return
            # Ours to handle: count it unless a patched call already counted this sync.
            if _ARMED is detector and not detector.depth and get_ident() == detector.thread:
                detector.depth += 1
                try:
                    detector.hit(_SYNC_DEBUG_KIND, sys._getframe(1))
                finally:
                    detector.depth -= 1

        warnings.showwarning = showwarning

    def hit(self, kind: str, frame: FrameType | None) -> None:
        """Record one sync of ``kind`` made at ``frame`` (called by the wrappers).

        Raises:
            SyncPointError: ``raise_on_user`` and the sync is the user's.
        """
        found = attribute_frame(frame)
        if found is None:
            return
        f, origin = found
        if kind == _CPU_TO_CPU:
            if origin == "framework":
                return  # Lightning moving a CPU tensor to its own (CPU) device
            kind = "cpu copy"
        filename, lineno = f.f_code.co_filename, f.f_lineno
        if self.allow:
            allowed = self._allowed.get((filename, lineno))
            if allowed is None:
                allowed = self._allowed[(filename, lineno)] = matches_allow(
                    filename, lineno, self.allow
                )
            if allowed:
                return
        key = (filename, lineno, kind)
        rec = self._records.get(key)
        new = rec is None
        if rec is None:
            rec = self._records[key] = SyncFinding(
                kind=kind,
                filename=filename,
                lineno=lineno,
                code=linecache.getline(filename, lineno).strip(),
                function=f.f_code.co_name,
                first_step=self.step,
                origin=origin,
            )
        rec.count += 1
        if self._last_batch.get(key) != self.batches:
            self._last_batch[key] = self.batches
            rec.steps_seen += 1
        if origin == "user" and self.raise_on_user:
            raise SyncPointError(
                f"{kind} at {rec.location} synchronises the host with the device: "
                f"`{rec.code}`. Fix: {FIXES.get(kind, '')}"
            )
        if new and self.on_new_site is not None:
            self.on_new_site(rec)

    def findings(self) -> list[SyncFinding]:
        """Every call site so far: the user's first, then the most syncs first."""
        return sorted(
            self._records.values(),
            key=lambda r: (r.origin != "user", -r.count, r.filename, r.lineno),
        )
