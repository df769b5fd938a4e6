"""One shadow of ``strategy.process_dataloader`` for every tool that must see the fit's loaders.

Lightning passes every dataloader it builds through ``trainer.strategy.process_dataloader``
last, after it injected the distributed sampler and before any iterator exists: the one point
where a callback sees (and may replace) the exact loader the fit will iterate. Two tools that
each shadowed the method on their own would undo it in the wrong order (the second to leave
would put the first one's wrapper back), so there is one shadow per strategy here, and each
tool adds a listener with :func:`hook_dataloaders`. Listeners run in ``priority`` order (lower
first); each gets the loader the previous one returned and returns it or a replacement. The
shadow goes when its last listener does, leaving the strategy as it was.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoaderHook", "hook_dataloaders"]

Listener = Callable[[Any], Any]


@dataclass
class _Chain:
    strategy: Any
    own: Any  # the strategy's own instance attribute, if it had one (None: the class's method)
    original: Callable[[Any], Any]
    hooks: list[LoaderHook] = field(default_factory=list)

    def __call__(self, dataloader: Any) -> Any:
        dataloader = self.original(dataloader)
        for hook in list(self.hooks):
            dataloader = hook.listener(dataloader)
        return dataloader


_CHAINS: dict[int, _Chain] = {}
_LOCK = threading.Lock()


@dataclass(eq=False)
class LoaderHook:
    """One listener on a strategy's loaders; :meth:`remove` takes it off (idempotent)."""

    strategy: Any
    listener: Listener
    priority: int = 50

    def remove(self) -> None:
        """Take the listener off; the last one to go puts the strategy's method back."""
        with _LOCK:
            chain = _CHAINS.get(id(self.strategy))
            if chain is None or self not in chain.hooks:
                return
            chain.hooks.remove(self)
            if chain.hooks:
                return
            del _CHAINS[id(self.strategy)]
            if chain.own is None:
                chain.strategy.__dict__.pop("process_dataloader", None)
            else:
                chain.strategy.process_dataloader = chain.own


def hook_dataloaders(strategy: Any, listener: Listener, priority: int = 50) -> LoaderHook:
    """Call ``listener(loader)`` on every loader ``strategy.process_dataloader`` hands back.

    Example:
        >>> class Strategy:
        ...     def process_dataloader(self, dataloader):
        ...         return dataloader
        >>> strategy = Strategy()
        >>> hook = hook_dataloaders(strategy, lambda dl: [*dl, "seen"])
        >>> strategy.process_dataloader([1])
        [1, 'seen']
        >>> hook.remove()
        >>> strategy.process_dataloader([1]), "process_dataloader" in strategy.__dict__
        ([1], False)
    """
    hook = LoaderHook(strategy, listener, priority)
    with _LOCK:
        chain = _CHAINS.get(id(strategy))
        if chain is None:
            own = strategy.__dict__.get("process_dataloader")
            chain = _Chain(strategy, own, strategy.process_dataloader)
            _CHAINS[id(strategy)] = chain
            strategy.process_dataloader = chain
        chain.hooks.append(hook)
        chain.hooks.sort(key=lambda h: h.priority)  # stable: equal priorities keep their order
    return hook
