"""Where the user's own code is: ``file.py:LINE`` of a function, or None for library code."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

__all__ = ["is_library_file", "user_code_location"]


def user_code_location(fn: Any) -> str | None:
    """``file.py:LINE`` of ``fn`` when it is Python code the user wrote, else None.

    A wrapper made with ``functools.wraps`` (the data profiler's timing subclass, or the
    user's own decorator) is looked through, so a finding points at the code the user wrote.
    Code under ``site-packages`` or in torch is not the user's.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> user_code_location(TensorDataset.__getitem__) is None  # torch's, not the user's
        True
        >>> user_code_location(list.__getitem__) is None  # not Python code
        True
        >>> user_code_location(user_code_location)  # this package is not installed as a library
        'locations.py:12'
    """
    fn = inspect.unwrap(fn) if callable(fn) else fn
    if not inspect.isfunction(fn):
        return None
    try:
        source = inspect.getsourcefile(fn)
        line = inspect.getsourcelines(fn)[1] if source else None
    except (OSError, TypeError):
        return None
    if source is None or line is None:
        return None
    if is_library_file(source):
        return None
    return f"{Path(source).name}:{line}"


def is_library_file(path: str) -> bool:
    """Whether the source file ``path`` is a library's (under ``site-packages``, or torch's).

    Example:
        >>> is_library_file("/venv/lib/site-packages/lightning/pytorch/trainer.py")
        True
        >>> is_library_file("/home/me/project/train.py")
        False
    """
    parts = Path(path).parts
    return "site-packages" in parts or "torch" in parts
