"""The ``batch_size`` a LightningModule tells Lightning through ``self.log(..., batch_size=n)``.

PyTorch Geometric's docs and many custom-batch models say the batch size this way, because
Lightning cannot read it from their batches. Lightning keeps the value to itself (in private
state), so the pack reads it where it is given: :func:`watch` puts a pass-through wrapper of
``log`` and ``log_dict`` on the module *instance* (the class is untouched), which records the
last ``batch_size`` given during training and calls the real method unchanged. :func:`unwatch`
removes the wrapper when the last tool that asked for it lets go, at teardown or on an
exception.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["LoggedBatchSize", "unwatch", "watch"]

_METHODS = ("log", "log_dict")


class LoggedBatchSize:
    """The last ``batch_size`` a module logged during training (None: none yet).

    Example:
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> module = BoringModel()
        >>> logged = watch(module)
        >>> logged(), "log" in vars(module)
        (None, True)
        >>> unwatch(module)
        >>> "log" in vars(module)
        False
    """

    def __init__(self) -> None:
        self.value: int | None = None
        self.users = 0

    def __call__(self) -> int | None:
        """The last logged ``batch_size``."""
        return self.value


_WATCHED: weakref.WeakKeyDictionary[Any, LoggedBatchSize] = weakref.WeakKeyDictionary()


def watch(module: Any) -> LoggedBatchSize:
    """Start recording the ``batch_size`` that ``module`` gives ``self.log``/``self.log_dict``.

    Each call must be paired with :func:`unwatch`; the wrapper stays while any caller watches.
    """
    logged = _WATCHED.get(module)
    if logged is None:
        logged = LoggedBatchSize()
        for name in _METHODS:
            original = getattr(module, name, None)
            if callable(original) and name not in vars(module):
                # nn.Module.__setattr__ keeps a plain function in the instance's __dict__.
                object.__setattr__(module, name, _recording(original, module, logged))
        _WATCHED[module] = logged
    logged.users += 1
    return logged


def unwatch(module: Any) -> None:
    """Stop recording for one caller; the last one removes the wrappers (idempotent)."""
    logged = _WATCHED.get(module)
    if logged is None:
        return
    logged.users -= 1
    if logged.users > 0:
        return
    del _WATCHED[module]
    for name in _METHODS:
        if getattr(vars(module).get(name), "__speedpack_logged__", False):
            del vars(module)[name]


def _recording(method: Callable[..., Any], module: Any, logged: LoggedBatchSize) -> Any:
    return _RecordingLog(method, weakref.ref(module), logged)


class _RecordingLog:
    """``module.log`` as it was, recording the ``batch_size`` it is given during training."""

    __speedpack_logged__ = True

    def __init__(
        self, method: Callable[..., Any], module: weakref.ref[Any], logged: LoggedBatchSize
    ) -> None:
        self._method = method
        self._module = module  # weak: the wrapper must not keep the module alive
        self._logged = logged
        functools.update_wrapper(self, method)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        size = kwargs.get("batch_size")
        if isinstance(size, int) and not isinstance(size, bool) and self._training():
            self._logged.value = size
        return self._method(*args, **kwargs)

    def _training(self) -> bool:
        try:
            return bool(self._module().trainer.training)  # type: ignore[union-attr]
        except (AttributeError, RuntimeError):  # no trainer attached: a bare call
            return True

    def __reduce__(self) -> tuple[Any, ...]:
        # A module pickled mid-fit (ddp_spawn, torch.save) gets its plain method back.
        return getattr, (self._method.__self__, self._method.__name__)  # type: ignore[attr-defined]
