"""The timeline's step hooks on the fit's optimizers, in place only while it times a step.

StepTimeline needs torch's optimizer step pre- and post-hooks on the steps it times (the
optimizer step's end; the ``training_step`` range reopened inside torch's). A sampled timeline
times one step in 8, then one in 64: left in place, the two hooks ran on every other step for
nothing (torch's step wrapper loops over them, two Python calls that return at once). They
are registered when a timed step opens and removed when the timeline goes idle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["OptimizerStepHooks"]

Hook = Callable[[Any, Any, Any], None]


class OptimizerStepHooks:
    """``before`` and ``after`` as step hooks of the optimizers :meth:`watch` names.

    Example:
        >>> import torch
        >>> calls = []
        >>> hooks = OptimizerStepHooks(lambda *a: calls.append("before"),
        ...                            lambda *a: calls.append("after"))
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> hooks.watch([opt])
        >>> opt.step(); hooks.attach(); opt.step(); hooks.detach(); opt.step()
        >>> calls
        ['before', 'after']
    """

    def __init__(self, before: Hook, after: Hook) -> None:
        self._before, self._after = before, after
        self._optimizers: list[Any] = []
        self._handles: list[Any] = []

    def watch(self, optimizers: Iterable[Any]) -> None:
        """The optimizers to hook from now on (detached until :meth:`attach`)."""
        self.detach()
        self._optimizers = list(optimizers)

    def attach(self) -> None:
        """Register both hooks on every watched optimizer (once)."""
        if self._handles:
            return
        for optimizer in self._optimizers:
            self._handles.append(optimizer.register_step_pre_hook(self._before))
            self._handles.append(optimizer.register_step_post_hook(self._after))

    def detach(self) -> None:
        """Remove the hooks (idempotent)."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def forget(self) -> None:
        """Remove the hooks and the optimizers (the end of a fit)."""
        self.detach()
        self._optimizers = []

    def __getstate__(self) -> dict[str, Any]:
        # Spawned ranks pickle the callback: handles and optimizers stay in this process.
        return {"_before": self._before, "_after": self._after, "_optimizers": [], "_handles": []}
