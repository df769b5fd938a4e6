"""Read ``trainer.global_step`` on a hot path without its chain of properties.

``trainer.global_step`` goes through seven Python properties (the Trainer's and the epoch
loop's ``global_step``, the Trainer's ``strategy`` and ``lightning_module``, the strategy's
``lightning_module``, ``automatic_optimization``, the progress's ``optimizer_steps``): ~12
interpreted lines, read a few times a batch by the doctor's tools. The
count itself is one attribute of a progress tracker that Lightning updates in place for the
whole fit; :func:`step_reader` finds that tracker once and reads it with no Python frame.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["step_reader"]


def step_reader(trainer: Any) -> Callable[[], int]:
    """A function that returns ``trainer.global_step``, cheaply, for the rest of this fit.

    Build it once the model is attached (``on_train_start`` or later): whether the model
    optimizes automatically or manually picks the tracker. Where Lightning's loops are not
    laid out as expected (another release, a custom loop), or the tracker does not read what
    ``trainer.global_step`` does, it reads ``trainer.global_step`` itself.

    Example:
        >>> from pytorch_lightning import Trainer
        >>> from pytorch_lightning.demos.boring_classes import BoringModel
        >>> class Steps(BoringModel):
        ...     def on_train_start(self):
        ...         self.read_step = step_reader(self.trainer)
        ...     def on_train_batch_end(self, *args):
        ...         self.seen = (self.read_step(), self.trainer.global_step)
        >>> trainer = Trainer(max_steps=3, logger=False, enable_progress_bar=False,
        ...                   enable_model_summary=False, enable_checkpointing=False)
        >>> model = Steps()
        >>> trainer.fit(model)
        >>> model.seen
        (3, 3)
    """
    try:
        loop = trainer.fit_loop.epoch_loop
        module = trainer.lightning_module
        if module is None or module.automatic_optimization:
            tracker = loop.automatic_optimization.optim_progress.optimizer.step.total
        else:
            tracker = loop.manual_optimization.optim_step_progress.total
        read: Callable[[], int] = functools.partial(getattr, tracker, "completed")
        if read() == trainer.global_step:
            return read
    except (AttributeError, RuntimeError):  # not Lightning's loops as we know them
        pass
    return lambda: int(trainer.global_step)
