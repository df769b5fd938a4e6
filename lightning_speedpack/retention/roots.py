"""Where the per-step walk starts: the fit's objects and the globals of the modules around them.

A leak is usually a container on the LightningModule, the datamodule or a callback, or a
module-level list in the training script (``GLOBAL_LOSSES.append(loss)``) or in the module
that defines one of those classes. :class:`WalkRoots` lists those roots for every step: the
objects themselves, the container globals of the modules that define their classes and of
``__main__``, and the roots the heap scan learned (a module or a closure it named). Only the
*names* of the globals are cached (re-read every ``refresh_every`` batches); their values are
read each step, so nothing is kept alive.
"""

from __future__ import annotations

import sys
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from lightning_speedpack.retention.walk import (
    container_globals,
    defining_modules,
    module_display_name,
    module_globals_root,
)

__all__ = ["WalkRoots"]

_MAIN = "__main__"


class WalkRoots:
    """The roots of the per-step walk, with the globals' names cached between refreshes.

    Args:
        refresh_every: batches between re-reading which globals each module holds.

    Example:
        >>> import sys, types
        >>> script = types.ModuleType("__main__")
        >>> script.__file__ = "/tmp/train.py"
        >>> script.LOSSES = []
        >>> real_main, sys.modules["__main__"] = sys.modules["__main__"], script
        >>> try:
        ...     roots = WalkRoots().roots(0, lambda: [])
        ... finally:
        ...     sys.modules["__main__"] = real_main
        >>> [(name, dict(space)) for name, space in roots]
        [('train', {'LOSSES': []})]
    """

    def __init__(self, refresh_every: int = 32) -> None:
        self.refresh_every = refresh_every
        self._names: dict[str, tuple[str, ...]] = {}
        self._refresh_at = 0
        self._learned_modules: list[str] = []
        self._learned_functions: list[weakref.ref[types.FunctionType]] = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_learned_functions"] = []  # weak references do not pickle
        return state

    def learn(self, root: Any) -> tuple[str, Any] | None:
        """Walk ``root`` (a module, for its globals, or a function, for its closure) from now on.

        Returns the root as the walk names it, or ``None`` for anything else.
        """
        if isinstance(root, types.ModuleType):
            if root.__name__ not in self._learned_modules:
                self._learned_modules.append(root.__name__)
            self._refresh_at = 0
            return module_globals_root(root)
        if isinstance(root, types.FunctionType):
            self._learned_functions.append(weakref.ref(root))
            return _function_name(root), root
        return None

    def roots(self, batch: int, owners: Callable[[], Iterable[object]]) -> list[tuple[str, Any]]:
        """The module-global and learned roots for ``batch``.

        Args:
            batch: the current batch (decides when the cached names are refreshed).
            owners: the fit's objects whose classes' modules are walked (called on refresh
                only): the LightningModule, the datamodule, the callbacks.
        """
        if batch >= self._refresh_at:
            self._refresh_at = batch + self.refresh_every
            self._names = {}
            for name in [_MAIN, *defining_modules(owners()), *self._learned_modules]:
                module = sys.modules.get(name)
                if module is not None and name not in self._names:
                    self._names[name] = container_globals(module)
        out: list[tuple[str, Any]] = []
        for name, names in self._names.items():
            if names and (root := module_globals_root(sys.modules.get(name), names)) is not None:
                out.append(root)
        for ref in self._learned_functions:
            fn = ref()
            if fn is not None:
                out.append((_function_name(fn), fn))
        return out


def _function_name(fn: types.FunctionType) -> str:
    return f"{module_display_name(sys.modules.get(fn.__module__ or ''))}.{fn.__qualname__}"
