"""Register ``"ddp_speedpack"`` in each Lightning namespace's registry, whenever it is imported.

``import lightning_speedpack`` must stay cheap (DataLoader workers and ``speedpack --help`` pay
for it), so it imports no Lightning. Yet ``Trainer(strategy="ddp_speedpack")`` must work after
it, whether the script imported Lightning before or after the pack. So: a namespace that is
already imported gets its strategy module now; for one that is not, a meta-path finder waits
for the namespace's own import to finish and imports the strategy module right after it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["STRATEGY_MODULES", "register_when_imported"]

#: Lightning namespace -> the module that defines and registers its ``DDPSpeedpackStrategy``.
STRATEGY_MODULES = {
    "pytorch_lightning": "lightning_speedpack.strategies.pytorch_lightning",
    "lightning.pytorch": "lightning_speedpack.strategies.lightning",
}


def _register(namespace: str) -> None:
    try:
        importlib.import_module(STRATEGY_MODULES[namespace])
    except Exception as err:  # never break the user's `import lightning`
        warnings.warn(
            f"lightning-speedpack could not register 'ddp_speedpack' for {namespace}: {err}",
            stacklevel=2,
        )


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs :func:`_register` right after a watched namespace has been imported."""

    def __init__(self) -> None:
        self.pending: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.pending:
            return None
        # A look-up without an import (`importlib.util.find_spec`, as the pack's own
        # `installed_namespaces()` does) also lands here: stay pending until a module is
        # really executed from a spec we handed out.
        spec = _find_with_the_others(self, fullname, path, target)
        loader: Any = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module
        pending = self.pending

        def exec_then_register(module: ModuleType) -> None:
            exec_module(module)
            if fullname in pending:  # once, however many specs were handed out
                pending.discard(fullname)
                _register(fullname)

        loader.exec_module = exec_then_register  # this spec's own loader instance only
        return spec


def _find_with_the_others(
    me: object, fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> importlib.machinery.ModuleSpec | None:
    """Find ``fullname`` as the import system would without us: the other meta-path finders.

    Asking them (not just ``PathFinder``) keeps editable installs, zip imports and any finder
    that hides a package (``ModuleNotFoundError`` propagates unchanged) working as before.
    """
    for finder in list(sys.meta_path):
        if finder is me:
            continue
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        spec: importlib.machinery.ModuleSpec | None = find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


_FINDER = _AfterImport()


def register_when_imported() -> None:
    """Register the strategy in every namespace imported now, and in each one imported later."""
    for namespace in STRATEGY_MODULES:
        if namespace in sys.modules:
            _register(namespace)
        else:
            _FINDER.pending.add(namespace)
    if _FINDER.pending and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
