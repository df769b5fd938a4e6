"""Public names that load on first use (PEP 562), for a room's ``__init__.py``.

A spawned DataLoader worker unpickles a cache through its room's package: importing the package
must not import the rest of the room (the X-ray's callback would import Lightning).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, where: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``name`` loads from module ``where[name]``.

    A module path starting with ``.`` is relative to ``package``. A loaded name is kept in
    ``namespace`` (the package's globals), so it is looked up once.

    Example:
        >>> getattr_, dir_ = lazy_names("pkg", {"sqrt": "math"}, {})
        >>> getattr_("sqrt")(9.0), dir_()
        (3.0, ['sqrt'])
    """

    def __getattr__(name: str) -> Any:
        home = where.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(f"{package}{home}" if home.startswith(".") else home)
        value = getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
