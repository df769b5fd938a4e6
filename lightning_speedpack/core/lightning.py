"""The Lightning namespace layer: the one module that knows there are two Lightnings.

Lightning ships the same trainer under two import names, ``pytorch_lightning`` (the
``pytorch-lightning`` package) and ``lightning.pytorch`` (the ``lightning`` package). Their
classes are distinct: ``lightning.pytorch.Callback`` is not ``pytorch_lightning.Callback``, and
each Trainer accepts only callbacks, loggers and strategies of its own namespace. Every tool of
the pack asks this module for Lightning types instead of importing one namespace, so each
feature works for both, in the same process, with either one or both installed.

- :data:`Callback` is a real subclass of the ``Callback`` of every installed namespace, so the
  pack's callbacks pass ``isinstance`` checks (and LightningCLI's config parser) in each.
  Its instances leave out the per-batch hooks their class does not override
  (:mod:`~lightning_speedpack.core.hooks`), so Lightning does not profile a no-op call each batch.
- :func:`classes` gives, for a dotted name such as ``"loggers.WandbLogger"``, the tuple of that
  class in every installed namespace, for ``isinstance`` checks that accept both.
- :func:`namespace_of` tells which namespace an object (a Trainer, a module) belongs to, for the
  few utilities that must come from the object's own namespace.
- :data:`INTERNALS` lists what the pack reads that not every supported Lightning release has;
  :func:`has_internal` tells whether an object's Lightning has one, and
  :func:`note_missing_internal` says once, on rank 0, what is not measured without it.

Only installed namespaces are imported, and only when a Lightning type is first needed:
``import lightning_speedpack.data`` imports neither.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from lightning_utilities.core.rank_zero import rank_zero_info, rank_zero_only, rank_zero_warn

from lightning_speedpack.core.hooks import silence_default_hooks

__all__ = [
    "INTERNALS",
    "NAMESPACES",
    "Callback",
    "Internal",
    "classes",
    "combined_loader",
    "has_internal",
    "installed_namespaces",
    "is_overridden",
    "lightning_getattr",
    "lightning_hasattr",
    "lightning_setattr",
    "lightning_version",
    "namespace_of",
    "namespaces",
    "note_missing_internal",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
    "takes_batch_idx",
]

#: Every namespace the pack serves, in order of preference for namespace-free utilities.
NAMESPACES = ("pytorch_lightning", "lightning.pytorch")


def _installed(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (or its parent package)."""
    top, _, rest = name.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if not rest:
        return True
    # `find_spec("lightning.pytorch")` would import `lightning`, which imports everything.
    return any(
        (Path(location, *rest.split(".")) / "__init__.py").is_file()
        for location in spec.submodule_search_locations or ()
    )


@functools.cache
def installed_namespaces() -> tuple[str, ...]:
    """Return the Lightning namespaces that are installed, ``pytorch_lightning`` first.

    Raises:
        ModuleNotFoundError: neither ``pytorch-lightning`` nor ``lightning`` is installed.
    """
    found = tuple(n for n in NAMESPACES if _installed(n))
    if not found:
        raise ModuleNotFoundError(
            "lightning-speedpack needs PyTorch Lightning: `pip install pytorch-lightning` "
            "(or `pip install lightning`)"
        )
    return found


def namespaces() -> tuple[ModuleType, ...]:
    """Return the installed namespace modules (imported on first call), preferred first."""
    return tuple(importlib.import_module(n) for n in installed_namespaces())


@functools.cache
def classes(dotted: str) -> tuple[type[Any], ...]:
    """Return the class ``dotted`` (e.g. ``"loggers.WandbLogger"``) of every installed namespace.

    A namespace that lacks the class (an older release) is skipped. Use it for ``isinstance``
    checks that must accept objects of either namespace.

    Example:
        >>> [c.__module__.split(".")[0] for c in classes("Trainer")][:1]
        ['pytorch_lightning']
    """
    module_path, _, name = dotted.rpartition(".")
    found: list[type[Any]] = []
    for namespace in installed_namespaces():
        full = f"{namespace}.{module_path}" if module_path else namespace
        try:
            found.append(getattr(importlib.import_module(full), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def namespace_of(obj: object) -> ModuleType:
    """Return the namespace module (``pytorch_lightning`` or ``lightning.pytorch``) of ``obj``.

    ``obj`` may be an instance or a class; the first Lightning class in its MRO decides. An
    object of neither namespace (a plain ``nn.Module``) gets the preferred installed namespace.
    """
    cls = obj if isinstance(obj, type) else type(obj)
    for base in cls.__mro__:
        module = base.__module__
        for namespace in installed_namespaces():
            if module == namespace or module.startswith(namespace + "."):
                return importlib.import_module(namespace)
    return namespaces()[0]


def is_overridden(method_name: str, instance: object) -> bool:
    """Lightning's ``is_overridden`` for a LightningModule or DataModule of either namespace."""
    namespace = namespace_of(instance)
    helpers = importlib.import_module(f"{namespace.__name__}.utilities.model_helpers")
    return bool(helpers.is_overridden(method_name, instance))


def takes_batch_idx(module: object) -> bool:
    """Whether ``module.training_step`` takes ``batch_idx``: Lightning's own test for it."""
    namespace = namespace_of(module)
    signatures = importlib.import_module(f"{namespace.__name__}.utilities.signature_utils")
    step = module.training_step  # type: ignore[attr-defined]
    return bool(signatures.is_param_in_hook_signature(step, "batch_idx", min_args=2))


def _preferred(module: str) -> ModuleType:
    """``module`` (e.g. ``"utilities.parsing"``) of the preferred installed namespace."""
    return importlib.import_module(f"{installed_namespaces()[0]}.{module}")


def lightning_hasattr(model: Any, attribute: str) -> bool:
    """Lightning's ``lightning_hasattr``: the model, its ``hparams`` or the datamodule has it."""
    # The helpers are duck-typed (they only read attributes), so either namespace's will do.
    return bool(_preferred("utilities.parsing").lightning_hasattr(model, attribute))


def lightning_getattr(model: Any, attribute: str) -> Any:
    """Lightning's ``lightning_getattr``, for a module of either namespace."""
    return _preferred("utilities.parsing").lightning_getattr(model, attribute)


def lightning_setattr(model: Any, attribute: str, value: Any) -> None:
    """Lightning's ``lightning_setattr``, for a module of either namespace."""
    _preferred("utilities.parsing").lightning_setattr(model, attribute, value)


def combined_loader(loaders: Any, mode: str = "max_size_cycle") -> Any:
    """Lightning's ``CombinedLoader`` over ``loaders`` (it does not depend on the Trainer)."""
    return _preferred("utilities").CombinedLoader(loaders, mode)


def _release(version: str) -> tuple[int, int, int]:
    """``"2.4.0rc1"`` -> ``(2, 4, 0)``: the release a version string names (missing parts 0)."""
    parts = [int(p) for p in re.findall(r"\d+", version.split("+", 1)[0])[:3]]
    return (*parts, 0, 0, 0)[:3]  # type: ignore[return-value]


def lightning_version(obj: object | None = None) -> tuple[int, int, int]:
    """The release of ``obj``'s Lightning namespace (of the preferred one without ``obj``).

    Both packages version the trainer alike (``pytorch-lightning`` 2.4.0 is ``lightning`` 2.4.0's
    ``lightning.pytorch``).

    Example:
        >>> lightning_version() >= (2, 0, 0)
        True
    """
    namespace = namespaces()[0] if obj is None else namespace_of(obj)
    return _release(str(getattr(namespace, "__version__", "0")))


@dataclass(frozen=True)
class Internal:
    """Something of Lightning's the pack reads that the oldest supported releases lack.

    Attributes:
        name: the key in :data:`INTERNALS`.
        since: the first release that has it.
        what: what that release does, as a verb phrase ("does not <what>" on older ones).
        without: what the pack does not measure (or measures otherwise) on an older release.
    """

    name: str
    since: tuple[int, int, int]
    what: str
    without: str


#: Lightning internals that moved within the releases the pack supports (what
#: `make test-versions` found between pytorch-lightning 2.1 and 2.6). Everything else the pack
#: reads (the hooks' profiler action names, ``[_TrainingEpochLoop].train_dataloader_next``,
#: ``run_training_batch``, the fit loop's ``setup_data``/``on_advance_start``/``on_run_end``, the
#: validation loop's ``run``, ``Strategy.process_dataloader``) is the same in all of them.
INTERNALS: dict[str, Internal] = {
    internal.name: internal
    for internal in (
        Internal(
            "save_checkpoint",
            since=(2, 5, 0),
            what="time `Trainer.save_checkpoint` as the profiler action 'save_checkpoint'",
            without=(
                "checkpoint saves are not counted, and a save that no checkpoint callback makes "
                "(`trainer.save_checkpoint` in a hook) is charged to its caller"
            ),
        ),
    )
}


def has_internal(obj: object, name: str) -> bool:
    """Whether the Lightning of ``obj`` (a Trainer, a module, a class) has ``INTERNALS[name]``.

    Raises:
        KeyError: ``name`` is not in :data:`INTERNALS`.

    Example:
        >>> from pytorch_lightning import Trainer
        >>> has_internal(Trainer, "save_checkpoint") == (lightning_version(Trainer) >= (2, 5, 0))
        True
    """
    return lightning_version(obj) >= INTERNALS[name].since


_NOTED: set[tuple[str, str, tuple[int, int, int]]] = set()


def note_missing_internal(obj: object, name: str, tool: str) -> bool:
    """Whether ``obj``'s Lightning has ``INTERNALS[name]``; if not, say so once (rank 0, info).

    The line names the tool, the release, what is not measured there and the release that
    measures it. Said once per tool, internal and release in a process.

    Example:
        >>> from pytorch_lightning import Trainer
        >>> note_missing_internal(Trainer, "save_checkpoint", "WallTimeLedger") == has_internal(
        ...     Trainer, "save_checkpoint")
        True
    """
    if has_internal(obj, name):
        return True
    internal, version = INTERNALS[name], lightning_version(obj)
    if (tool, name, version) not in _NOTED:
        _NOTED.add((tool, name, version))
        found = ".".join(map(str, version))
        since = ".".join(map(str, internal.since))
        rank_zero_info(
            f"{tool}: Lightning {found} does not {internal.what} (Lightning "
            f"{since} and newer do): {internal.without}."
        )
    return False


def _import_error(namespace: str, error: ImportError) -> ImportError:
    """Why an installed namespace does not import, and what to do about it."""
    hint = ""
    if error.name == "pkg_resources":
        hint = (
            " (Lightning before 2.4 imports `pkg_resources`, which setuptools 81 and newer "
            "no longer ship: `pip install 'pytorch-lightning>=2.4'`)"
        )
    return ImportError(f"lightning-speedpack cannot import {namespace}: {error}{hint}")


def _callback_base() -> type[Any]:
    bases = classes("Callback")
    if not bases:  # installed, yet none imports: say why instead of a Callback of no Lightning
        namespace = installed_namespaces()[0]
        try:
            importlib.import_module(f"{namespace}.callbacks")
        except ImportError as error:
            raise _import_error(namespace, error) from error
        raise ImportError(f"lightning-speedpack found no Callback class in {namespace}")
    # One class whose MRO holds every namespace's Callback (all plain classes with the same
    # no-op hooks), so `isinstance(cb, <either>.Callback)` is true and pickling is by one name.
    # Its instances come with their default per-batch hooks silenced (core.hooks): Lightning
    # then skips them instead of profiling a no-op call a batch for each.
    return type(
        "Callback",
        bases,
        {"__module__": __name__, "__qualname__": "Callback", "__new__": _new_callback},
    )


def _new_callback(cls: type[Any], *args: Any, **kwargs: Any) -> Any:
    instance = object.__new__(cls)  # Lightning's Callback defines no __new__ of its own
    silence_default_hooks(instance)
    return instance


if TYPE_CHECKING:
    from pytorch_lightning import Callback
else:
    Callback = _callback_base()
