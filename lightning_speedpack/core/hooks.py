"""Keep Lightning from calling the per-batch hooks a pack callback leaves at their no-op default.

For every callback and every hook, every batch, Lightning's ``_call_callback_hooks`` looks the
hook up, builds ``f"[Callback]{callback.state_key}.{hook}"`` and enters
``trainer.profiler.profile(...)`` (a context manager: three frames, and under the doctor the
profiler taps of :mod:`~lightning_speedpack.core.profiler_tap`) only to call Lightning's empty
default. Measured on the DDP zoo's 1 ms MLP step (2026-11-26, one process): ten callbacks that
override nothing cost 170 us a step, 15% of the step, before any of them does any work. It
skips the hook when the attribute is not callable (``if callable(fn)``), so an instance whose
per-batch hooks that its class does not override are ``None`` costs Lightning one attribute
look-up per hook instead.

Only the hooks Lightning calls through ``_call_callback_hooks`` every batch are silenced
(:data:`PER_BATCH_HOOKS`); ``on_save_checkpoint`` and ``on_load_checkpoint``, which Lightning
calls directly, and every once-a-fit hook keep their defaults. A subclass that overrides a hook
keeps it, and ``super().on_train_batch_end(...)`` inside an override still reaches Lightning's
default (``super()`` looks the class up, not the instance).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "PER_BATCH_HOOKS",
    "TRAIN_STEP_HOOKS",
    "overrides",
    "silence_default_hooks",
    "silenced_hooks",
]

#: The callback hooks Lightning calls every batch or optimizer step, always through
#: ``_call_callback_hooks`` (``if callable(fn)``): Lightning 2.5 and 2.6.
PER_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)

#: The per-batch hooks Lightning calls inside a training batch, between its start and its end.
TRAIN_STEP_HOOKS = (
    "on_before_zero_grad",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
)

# Where Lightning defines its empty defaults: Callback's hooks, LightningModule's and its mixins'.
# Lightning's own subclasses (its callbacks, its demo models) override like anyone else's.
_DEFAULTS = frozenset(
    f"{namespace}.{module}"
    for namespace in ("pytorch_lightning", "lightning.pytorch")
    for module in ("callbacks.callback", "core.module", "core.hooks")
)

_SILENCED: dict[type, tuple[str, ...]] = {}  # a class's answer: asked for each instance


def overrides(cls: type[Any], hook: str) -> bool:
    """Whether ``cls`` (or a base outside Lightning) defines ``hook`` over Lightning's default.

    Example:
        >>> from pytorch_lightning import LightningModule
        >>> class Model(LightningModule):
        ...     def validation_step(self, batch, batch_idx): ...
        >>> overrides(Model, "validation_step"), overrides(Model, "on_fit_start")
        (True, False)
    """
    owner = next((k for k in cls.__mro__ if hook in vars(k)), None)
    return owner is not None and owner.__module__ not in _DEFAULTS


def silenced_hooks(cls: type) -> tuple[str, ...]:
    """The per-batch hooks that ``cls`` leaves at Lightning's empty default.

    Example:
        >>> from pytorch_lightning import Callback
        >>> class Mine(Callback):
        ...     def on_train_batch_end(self, *args): ...
        >>> quiet = silenced_hooks(Mine)
        >>> "on_train_batch_end" in quiet, "on_before_backward" in quiet
        (False, True)
    """
    found = _SILENCED.get(cls)
    if found is None:
        found = _SILENCED[cls] = tuple(
            h for h in PER_BATCH_HOOKS if hasattr(cls, h) and not overrides(cls, h)
        )
    return found


def silence_default_hooks(callback: object) -> None:
    """Set ``callback``'s default per-batch hooks to ``None``, so Lightning skips them.

    Example:
        >>> from pytorch_lightning import Callback
        >>> class Mine(Callback):
        ...     def on_train_batch_end(self, *args): ...
        >>> mine = Mine(); silence_default_hooks(mine)
        >>> mine.on_before_backward is None, callable(mine.on_train_batch_end)
        (True, True)
    """
    for hook in silenced_hooks(type(callback)):
        setattr(callback, hook, None)
