"""Which ledger key each action Lightning profiles is charged to, and which it leaves alone.

:class:`~lightning_speedpack.wall_time.WallTimeLedger` hears the actions Lightning times through
``trainer.profiler`` (:mod:`~lightning_speedpack.core.profiler_tap`). Each action name is mapped
once (:class:`ActionKeys`) to the ``(key, detail)`` bracket it opens, or to :data:`IGNORED`, or
to :data:`FETCHED` (the DataLoader's fetch: data wait, or the epoch's start).

An action is left unbracketed where a bracket would only cost time (the three below: 72 Python
lines a batch under the doctor, ``benchmarks/doctor_lines.py``), and the ledger's parts come out
the same or are filled another way:

- Lightning's empty default of a hook (a callback's, or the module's ``on_before_batch_transfer``
  when neither the module nor the datamodule overrides it): Lightning's call of the empty hook
  stays with Lightning's loop (``unaccounted``);
- a :class:`~lightning_speedpack.core.hook_hub.HookHub`'s per-batch hooks in training: the hub
  times each member's call with its own clock, and :data:`HUB_CARVED` says which part ran
  them, so :func:`~lightning_speedpack.wall_time.ledger.carve` moves those seconds to the hub
  and :func:`~lightning_speedpack.wall_time.ledger.share_out` on to its members. The hub's
  dispatch around them (a loop and a clock read a member, and its wake check: 38 Python lines
  a batch on rank 0 of the DDP zoo's clean job, counted with ``sys.settrace``) stays with
  Lightning's loop.
"""

from __future__ import annotations

from typing import Any

from lightning_speedpack.core.hook_hub import HookHub
from lightning_speedpack.core.hooks import PER_BATCH_HOOKS, TRAIN_STEP_HOOKS, overrides
from lightning_speedpack.core.lightning import classes
from lightning_speedpack.core.profiler_tap import TRAIN_FETCH
from lightning_speedpack.wall_time.ledger import CALLBACK_PREFIX

__all__ = ["FETCHED", "HUB_CARVED", "IGNORED", "ActionKeys", "callback_key"]

IGNORED = ("", "")  # an action the ledger does not bracket (cached by name)
FETCHED = ("fetch", "")  # the DataLoader's fetch: data wait, or the epoch's start

#: A hub's per-batch training hooks, not bracketed: hook -> the part that was charged while
#: they ran (inside the training batch; or Lightning's loop, between the batch's brackets).
HUB_CARVED: dict[str, str] = {
    **dict.fromkeys(TRAIN_STEP_HOOKS, "training_step"),
    "on_train_batch_start": "unaccounted",
    "on_train_batch_end": "unaccounted",
}

_TRANSFER = "batch_to_device"
_BEFORE_TRANSFER = "on_before_batch_transfer"
_LOADER_HOOKS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")
_MODULES = ("[LightningModule", "[LightningDataModule")


def callback_key(callback: Any) -> str:
    """The ledger key of a callback's hooks: checkpointing, logging, or ``callback:<Class>``."""
    if isinstance(callback, classes("callbacks.Checkpoint")):
        return "checkpoint"
    if isinstance(callback, classes("callbacks.ProgressBar")):
        return "logging"
    return CALLBACK_PREFIX + type(callback).__name__


class ActionKeys(dict[str, tuple[str, str]]):
    """Action name -> ``(key, detail)``, found the first time the name is heard.

    ``callbacks`` maps the fit's callbacks by state key; ``module`` is the LightningModule.

    Example:
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> keys = ActionKeys({}, BoringModel())
        >>> keys["run_training_batch"], keys["[Strategy]DDPStrategy.batch_to_device"]
        (('training_step', ''), ('batch_transfer', ''))
        >>> keys["[LightningModule]BoringModel.on_before_batch_transfer"] is IGNORED  # a default
        True
    """

    def __init__(self, callbacks: dict[str, Any], module: Any) -> None:
        super().__init__()
        self.callbacks = callbacks
        self.module = module

    def __missing__(self, name: str) -> tuple[str, str]:
        found = self[name] = self._key_of(name) or IGNORED
        return found

    def _key_of(self, name: str) -> tuple[str, str] | None:
        if name.endswith(TRAIN_FETCH):
            return FETCHED
        if name == "run_training_batch":
            return "training_step", ""
        if name == "save_checkpoint":
            return "checkpoint", "save_checkpoint"
        kind, _, rest = name.partition("]")
        target, _, hook = rest.rpartition(".")
        if kind == "[Callback":
            return self._callback_key_of(target, hook)
        if kind == "[Strategy" and hook == _TRANSFER:
            return "batch_transfer", ""
        if kind in _MODULES and hook in _LOADER_HOOKS:
            return "setup", hook
        if kind in _MODULES and hook == _BEFORE_TRANSFER:
            # Lightning calls it just before `batch_to_device`. The action names the module
            # unless the datamodule overrides the hook, in which case it names the datamodule.
            if kind == "[LightningModule" and not self._module_overrides(_BEFORE_TRANSFER):
                return None
            return "batch_transfer", hook
        return None

    def _callback_key_of(self, target: str, hook: str) -> tuple[str, str] | None:
        if hook in ("on_save_checkpoint", "on_load_checkpoint"):
            return "checkpoint", hook
        callback = self.callbacks.get(target)
        if callback is None:  # added after setup: its state key starts with its class name
            return _key_from_state(target), hook
        own = getattr(callback, "__dict__", {}).get(hook)  # set on the instance (a HookHub)
        if not overrides(type(callback), hook) and not callable(own):
            return None  # Lightning's empty default: a bracket would only cost time
        if isinstance(callback, HookHub) and hook not in PER_BATCH_HOOKS:
            # An owning hub's action holds its members' own hooks (timed by its clock, shared
            # out to them); where none has one, or the hub only dispatches, it is upkeep.
            return (callback_key(callback), hook) if callback.forwards(hook) else None
        if isinstance(callback, HookHub) and hook in HUB_CARVED:
            return None  # carved out of the part it ran in by the hub's clock
        return callback_key(callback), hook

    def _module_overrides(self, hook: str) -> bool:
        # No module known (a ledger fed by hand): bracket, as a user's hook would be.
        return self.module is None or overrides(type(self.module), hook)


def _key_from_state(state_key: str) -> str:
    # A callback added after setup: its state key starts with its class's qualified name.
    return CALLBACK_PREFIX + state_key.partition("{")[0].rpartition(".")[2]
