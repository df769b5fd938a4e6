"""The lines that log with ``sync_dist=True`` in every training step, and what those calls cost.

``self.log(name, value, sync_dist=True)`` in a training step makes Lightning reduce the value
across ranks right there, inside the call: ``_ResultMetric.update`` runs the strategy's
``reduce`` on the value, which under DDP is a ``barrier`` and then an ``all_reduce``
(``lightning_fabric.utilities.distributed._sync_ddp``). Every rank therefore stops at that line
until the slowest one arrives, once per logged value, every step. (Logged with
``on_step=False, on_epoch=True``, a value is reduced once per epoch instead.)

Lightning keeps what it was given to itself, so :func:`install` puts a pass-through wrapper of
``log`` and ``log_dict`` on the module *instance* (the class is untouched). A call without
``sync_dist=True`` costs the wrapper one argument lookup; a call with it, during a training
batch, is timed (two clock reads around the real call, which performs the reduction) and
counted under the caller's ``file:line`` (one frame up; for ``log_dict``, the line that called
``log_dict``). :func:`uninstall` puts back what was there.

The batch-size reader of :mod:`lightning_speedpack.core.logged_batch_size` wraps the same two
methods; :func:`install` asks it to ``watch`` first, so its wrapper always sits under this one
whichever tool set up first, and lets go of it after restoring it, so the last one out removes
both.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import numbers
import os
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import torch

from lightning_speedpack.core.logged_batch_size import unwatch, watch

__all__ = ["SyncDistRecorder", "SyncSite", "display_path", "install", "uninstall"]

_METHODS = ("log", "log_dict")


@dataclass
class SyncSite:
    """One line that logged with ``sync_dist=True`` during training batches."""

    filename: str
    line: int
    calls: int = 0  # values reduced (a log_dict of 3 values counts 3)
    steps: int = 0  # training batches in which it reduced at least one value
    seconds: float = 0.0  # wall time inside those self.log calls
    last_step: int = field(default=-1, repr=False)

    @property
    def location(self) -> str:
        """``path/file.py:LINE``, relative to the working directory when below it."""
        return f"{display_path(self.filename)}:{self.line}"

    def code(self) -> str | None:
        """The source line, when it can be read (looked up only for a finding)."""
        text = linecache.getline(self.filename, self.line).strip()
        return text or None


class SyncDistRecorder:
    """Counts and times ``sync_dist=True`` log calls per calling line, per training batch.

    The callback moves it along: :meth:`batch_start` at every training batch (which also turns
    recording on), :meth:`pause` when the training batches stop (validation, epoch end), where
    Lightning's default is ``on_step=False`` and a reduction happens once per epoch.

    Example:
        >>> recorder = SyncDistRecorder()
        >>> recorder.batch_start()
        >>> recorder.add("train.py", 12, 0.002)
        >>> recorder.add("train.py", 12, 0.001)
        >>> [(s.location, s.calls, s.steps) for s in recorder.sites.values()]
        [('train.py:12', 2, 1)]
    """

    def __init__(self) -> None:
        self.sites: dict[tuple[str, int], SyncSite] = {}
        self.steps = 0
        self.active = False
        self._step = 0
        self._caller: tuple[str, int] | None = None  # set by log_dict for the logs it makes

    def batch_start(self) -> None:
        """A training batch begins: its sync_dist calls count from here."""
        self.steps += 1
        self._step = self.steps
        self.active = True

    def pause(self) -> None:
        """The training batches stop (validation, the epoch's end hooks)."""
        self.active = False

    def add(self, filename: str, line: int, seconds: float) -> None:
        """Record one reduced value logged from ``filename:line`` that took ``seconds``."""
        key = (filename, line)
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = SyncSite(filename, line)
        site.calls += 1
        site.seconds += seconds
        if site.last_step != self._step:
            site.last_step = self._step
            site.steps += 1


def display_path(filename: str) -> str:
    """``filename`` as a finding shows it: below site-packages, or relative to the cwd if below.

    Example:
        >>> display_path("/x/lib/python3.11/site-packages/pkg/mod.py")
        'pkg/mod.py'
    """
    for marker in ("site-packages", "dist-packages"):
        _head, sep, tail = filename.partition(f"{os.sep}{marker}{os.sep}")
        if sep:
            return tail
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if rel.startswith("..") else rel


def install(module: Any, recorder: SyncDistRecorder) -> None:
    """Wrap ``module.log`` and ``module.log_dict`` on the instance to feed ``recorder``.

    Pair with :func:`uninstall`. Installing twice on one module is a no-op.
    """
    if any(isinstance(vars(module).get(name), _SyncDistLog) for name in _METHODS):
        return
    watch(module)  # the batch-size reader's wrapper goes (or stays) under ours
    installed = False
    for name in _METHODS:
        current = getattr(module, name, None)
        if not callable(current):
            continue
        positions = _positions(getattr(type(module), name, current))
        if "sync_dist" not in positions:
            continue  # not Lightning's signature: leave it alone
        had = name in vars(module)
        wrapper = _SyncDistLog(current, name, module, recorder, positions, had)
        # nn.Module.__setattr__ keeps a plain callable in the instance's __dict__.
        object.__setattr__(module, name, wrapper)
        installed = True
    if not installed:
        unwatch(module)


def uninstall(module: Any) -> None:
    """Put back what :func:`install` wrapped, then let go of the batch-size reader (idempotent)."""
    found = False
    for name in _METHODS:
        wrapper = vars(module).get(name)
        if not isinstance(wrapper, _SyncDistLog):
            continue
        found = True
        if wrapper.replaced_instance_attribute:
            vars(module)[name] = wrapper.inner
        else:
            del vars(module)[name]
    if found:
        unwatch(module)


def _positions(method: Callable[..., Any]) -> dict[str, int]:
    """Each parameter's position among the positional arguments after ``self``."""
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return {}
    if params and params[0].name == "self":
        params = params[1:]
    return {
        p.name: i
        for i, p in enumerate(params)
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    }


class _SyncDistLog:
    """``module.log`` (or ``log_dict``) as it was, timing the calls that pass ``sync_dist=True``."""

    def __init__(
        self,
        inner: Callable[..., Any],
        name: str,
        module: Any,
        recorder: SyncDistRecorder,
        positions: dict[str, int],
        replaced_instance_attribute: bool,
    ) -> None:
        # Name and docstring only: the inner wrapper's own attributes stay its own.
        functools.update_wrapper(self, inner, updated=())
        self.inner = inner
        self.replaced_instance_attribute = replaced_instance_attribute
        self._name = name
        self._module = weakref.ref(module)  # the wrapper must not keep the module alive
        self._recorder = recorder
        self._sync = positions["sync_dist"]
        self._on_step = positions.get("on_step", -1)
        self._rank_zero_only = positions.get("rank_zero_only", -1)
        self._value = positions.get("value", -1)
        self._is_dict = name == "log_dict"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The common path: one lookup, then the real method.
        sync = args[self._sync] if len(args) > self._sync else kwargs.get("sync_dist", False)
        if not sync or not self._recorder.active:
            return self.inner(*args, **kwargs)
        return self._recorded(sys._getframe(1), args, kwargs)

    def _arg(self, args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, key: str) -> Any:
        return args[pos] if 0 <= pos < len(args) else kwargs.get(key)

    def _recorded(self, caller: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        recorder = self._recorder
        if (
            self._arg(args, kwargs, self._on_step, "on_step") is False
            or self._arg(args, kwargs, self._rank_zero_only, "rank_zero_only") is True
        ):
            return self.inner(*args, **kwargs)  # reduced once per epoch, or not at all
        if self._is_dict:
            outer, recorder._caller = recorder._caller, (caller.f_code.co_filename, caller.f_lineno)
            try:
                return self.inner(*args, **kwargs)  # its self.log calls are timed one by one
            finally:
                recorder._caller = outer
        value = self._arg(args, kwargs, self._value, "value")
        if not isinstance(value, (torch.Tensor, numbers.Number)):
            # A torchmetrics Metric reduces its own state when computed, not in self.log.
            return self.inner(*args, **kwargs)
        filename, line = recorder._caller or (caller.f_code.co_filename, caller.f_lineno)
        start = perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            recorder.add(filename, line, perf_counter() - start)

    def __reduce__(self) -> tuple[Any, ...]:
        # A module pickled mid-fit (ddp_spawn, torch.save) gets its plain method back.
        return getattr, (self._module(), self._name)
