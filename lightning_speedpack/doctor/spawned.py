"""The doctor's report from ranks that Lightning starts in new processes (``ddp_spawn``).

With ``strategy="ddp_spawn"`` (or ``"ddp_fork"``, ``"ddp_notebook"``) Lightning's
``_MultiProcessingLauncher`` fits copies of the Trainer and its callbacks in processes it starts,
then sends rank 0's results back to the process that called ``fit``: the weights, the state, and
``callback_metrics``, through its ``get_extra_results`` (in rank 0) and
``update_main_process_results`` (in the calling process). The doctor's callbacks in the calling
process see none of the fit.

So while ``fit`` runs, :func:`carry` gives the launcher two instance attributes over those
methods: in rank 0 the first adds what the doctor computed of the fit (pickled) to Lightning's
extra results, and in the calling process the second takes it out before Lightning's own method
reads the rest. Lightning's methods run as they would (a subclass's included); the attributes go
when ``fit`` returns, and the job's own results are untouched.

Exercised on two CPU ranks (gloo) with the ``spawn`` and ``fork`` start methods, on
pytorch-lightning 2.5.0 and 2.6.6 (``tests/doctor/test_spawned.py``); not on GPUs.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

__all__ = ["KEY", "carry", "nothing_to_undo"]

#: The key of the doctor's part of the launcher's extra results.
KEY = "speedpack_doctor"
_SEND = "get_extra_results"
_TAKE = "update_main_process_results"


class _Send:
    """The launcher's ``get_extra_results`` in rank 0: Lightning's, and ``collect()`` pickled.

    It travels to the spawned ranks with the launcher, so it holds nothing but ``collect``
    (the doctor's own picklable object's method).
    """

    def __init__(self, collect: Callable[[], Any]) -> None:
        self.collect = collect

    def __call__(self, trainer: Any, *args: Any, **kwargs: Any) -> Any:
        launcher = trainer.strategy.launcher
        extra = getattr(type(launcher), _SEND)(launcher, trainer, *args, **kwargs)
        if isinstance(extra, dict):
            try:
                extra[KEY] = pickle.dumps(self.collect())
            except Exception as err:  # the doctor's failure is never the job's
                extra[KEY] = pickle.dumps(f"{type(err).__name__}: {err}")
        return extra


class _Take:
    """The launcher's ``update_main_process_results`` in the calling process.

    Takes the doctor's part out of the extra results, calls Lightning's method with the rest,
    then hands the part to ``take`` (the unpickled object, or a line saying why rank 0 could not
    send it).
    """

    def __init__(self, take: Callable[[Any], None]) -> None:
        self.take = take

    def __call__(self, trainer: Any, extra: Any, *args: Any, **kwargs: Any) -> Any:
        sent = extra.pop(KEY, None) if isinstance(extra, dict) else None
        launcher = trainer.strategy.launcher
        result = getattr(type(launcher), _TAKE)(launcher, trainer, extra, *args, **kwargs)
        if sent is not None:
            try:
                self.take(pickle.loads(sent))
            except Exception as err:  # pragma: no cover - the same code on both sides
                self.take(f"{type(err).__name__}: {err}")
        return result


def carry(
    launcher: Any, collect: Callable[[], Any], take: Callable[[Any], None]
) -> Callable[[], None]:
    """Send ``collect()`` from a spawned rank 0 to ``take`` in this process; return the undo.

    Nothing is changed (and the undo does nothing) where ``launcher`` is not one that sends
    extra results back, or something else already replaced either method on the instance.

    Example:
        >>> class Launcher:  # Lightning's _MultiProcessingLauncher, as far as this touches it
        ...     def get_extra_results(self, trainer): return {"callback_metrics_bytes": b""}
        ...     def update_main_process_results(self, trainer, extra): self.extra = extra
        >>> class Trainer:
        ...     class strategy: launcher = Launcher()
        >>> launcher, got = Trainer.strategy.launcher, []
        >>> undo = carry(launcher, lambda: "rank 0's report", got.append)
        >>> extra = launcher.get_extra_results(Trainer)  # in rank 0
        >>> launcher.update_main_process_results(Trainer, extra)  # back in this process
        >>> got, launcher.extra
        (["rank 0's report"], {'callback_metrics_bytes': b''})
        >>> undo(); "get_extra_results" in vars(launcher)
        False
    """
    names = (_SEND, _TAKE)
    if launcher is None or not all(callable(getattr(launcher, n, None)) for n in names):
        return nothing_to_undo
    if any(n in vars(launcher) for n in names):
        return nothing_to_undo
    setattr(launcher, _SEND, _Send(collect))
    setattr(launcher, _TAKE, _Take(take))

    def undo() -> None:
        for name in names:
            vars(launcher).pop(name, None)

    return undo


def nothing_to_undo() -> None:
    """The undo of a :func:`carry` that changed nothing."""
