"""The source of ``data_wait``: the seconds spent inside the training DataLoader's fetch.

Lightning's data fetcher announces its ``next(iterator)`` to ``trainer.profiler`` as
``[<loop class>].train_dataloader_next`` (``[_TrainingEpochLoop]...`` today). A
:class:`FetchTimer`, tapped onto that profiler with
:func:`~lightning_speedpack.core.profiler_tap.tap`, times exactly those actions and charges them
to the open step of a :class:`~lightning_speedpack.throughput.rates.StepClock`. What happens
between two batches outside that call (other callbacks' batch hooks, a checkpoint save, the
batch's transfer to the device) is therefore never counted as waiting for data.
"""

from __future__ import annotations

from lightning_speedpack.throughput.rates import StepClock

__all__ = ["FETCH_ACTION_SUFFIX", "FetchTimer"]

#: How the name of the training fetch action ends. Matched as a suffix: the part before it is
#: the epoch loop's class name, which a subclassed or future loop may change.
FETCH_ACTION_SUFFIX = "].train_dataloader_next"


class FetchTimer:
    """An action listener that adds each training-batch fetch's seconds to a :class:`StepClock`.

    It is told of every profiled action (tens per batch: every hook of every callback), so
    the check that rejects the others is one ``str.endswith``; a fetch costs one subtraction
    and one :meth:`StepClock.add_wait`. Validation fetches (``...val_next``) are not training
    fetches and are ignored.

    Example:
        >>> clock = StepClock(window=4)
        >>> clock.epoch_start(0.0)
        >>> timer = FetchTimer(clock)
        >>> timer.on_action("[_TrainingEpochLoop].train_dataloader_next", True, 1.0)
        >>> timer.on_action("[Callback]Slow.on_train_batch_end", True, 1.5)  # not a fetch
        >>> timer.on_action("[_TrainingEpochLoop].train_dataloader_next", False, 3.0)
        >>> clock.batch_start()
        >>> clock.batch_end(4.0, samples=1).data_wait
        2.0
    """

    __slots__ = ("_began", "_clock")

    def __init__(self, clock: StepClock) -> None:
        self._clock = clock
        self._began: float | None = None  # when the fetch in progress started

    def on_action(self, name: str, started: bool, now: float) -> None:
        """Time ``name`` if it is a training fetch: its seconds go to the clock's open step."""
        if not name.endswith(FETCH_ACTION_SUFFIX):
            return
        if started:
            self._began = now
        elif self._began is not None:  # a stop whose start came before the tap is dropped
            self._clock.add_wait(now - self._began)
            self._began = None
