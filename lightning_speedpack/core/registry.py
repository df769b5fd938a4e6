"""The one place diagnostic callbacks announce themselves to the doctor.

A component registers its callback class once, at import time, next to its definition::

    register_diagnostic("throughput", ThroughputLogger, factory=lambda ctx: ThroughputLogger())

The runner attaches one instance of every registered diagnostic to each ``Trainer`` a script
creates (unless the script already added one of that class), and after ``fit`` asks each for
its findings through the :class:`Diagnosable` protocol. New components add a section to the
report without touching the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.core.lightning import Callback, classes

__all__ = [
    "Diagnosable",
    "Diagnostic",
    "DoctorContext",
    "register_diagnostic",
    "registered_diagnostics",
    "unregister_diagnostic",
]


@dataclass(frozen=True)
class DoctorContext:
    """What a diagnostic's factory may look at when the doctor builds it for a Trainer."""

    trainer_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: ``speedpack doctor --deep``: a factory may then turn on its costlier measurements
    deep: bool = False

    @property
    def accelerator(self) -> str:
        """The ``accelerator`` argument the script passed (``"auto"`` when it passed none)."""
        value = self.trainer_kwargs.get("accelerator", "auto")
        return value if isinstance(value, str) else type(value).__name__


@runtime_checkable
class Diagnosable(Protocol):
    """What a callback offers the doctor after ``fit``."""

    def doctor_findings(self) -> list[Finding]:
        """Return the findings of the run this callback watched."""
        ...

    def doctor_figures(self) -> dict[str, Any]:
        """Return whole-run figures (e.g. ``{"data_wait_fraction": 0.4}``) for the run summary."""
        ...


@dataclass(frozen=True)
class Diagnostic:
    """A registered diagnostic: its callback class and how the doctor builds one."""

    name: str
    callback_type: type[Callback]
    factory: Callable[[DoctorContext], Callback]
    order: int = 100
    deep: bool = False  # attached by ``speedpack doctor --deep`` only (costlier per step)
    deep_adds: str = ""  # what ``--deep`` adds to this diagnostic's default form, if anything
    opt_in: str = ""  # attached only when the doctor runs with this flag (e.g. "--what-if")


_REGISTRY: dict[str, Diagnostic] = {}


def register_diagnostic(
    name: str,
    callback_type: type[Callback],
    factory: Callable[[DoctorContext], Callback] | None = None,
    order: int = 100,
    *,
    deep: bool = False,
    deep_adds: str = "",
    opt_in: str = "",
) -> None:
    """Register ``callback_type`` with the doctor under ``name`` (idempotent for the same class).

    Args:
        name: the report section's name, e.g. ``"throughput"``.
        callback_type: the Callback class; an instance the script already added is reused.
        factory: builds the doctor's instance; default ``callback_type()``.
        order: position in the report and in the callback list (lower first).
        deep: attach it only when the doctor runs with ``--deep``: for checks whose per-step
            cost is too high to leave on by default.
        deep_adds: what the factory adds when ``ctx.deep`` is set (e.g. a one-time probe), for
            the report's line on what the default run left out.
        opt_in: attach it only when the doctor runs with this flag (``"--what-if"``), or
            when ``--only`` names it: for diagnostics that change what the run does before it
            starts (trials), which no default run may do.

    Raises:
        TypeError: ``callback_type`` is not a Lightning ``Callback`` subclass.
        ValueError: ``name`` is already registered to another class.
    """
    if not (isinstance(callback_type, type) and issubclass(callback_type, classes("Callback"))):
        raise TypeError(f"`callback_type` must be a Callback subclass, got {callback_type!r}")
    existing = _REGISTRY.get(name)
    if existing is not None and existing.callback_type is not callback_type:
        raise ValueError(
            f"diagnostic {name!r} is already registered to {existing.callback_type.__qualname__}; "
            "pick another name or unregister it first"
        )
    _REGISTRY[name] = Diagnostic(
        name,
        callback_type,
        factory or (lambda _ctx: callback_type()),
        order,
        deep,
        deep_adds,
        opt_in,
    )


def unregister_diagnostic(name: str) -> None:
    """Remove ``name`` from the registry (no error when absent)."""
    _REGISTRY.pop(name, None)


def registered_diagnostics() -> list[Diagnostic]:
    """Return the registered diagnostics, lowest ``order`` first."""
    return sorted(_REGISTRY.values(), key=lambda d: (d.order, d.name))
