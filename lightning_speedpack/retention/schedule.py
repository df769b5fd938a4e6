"""Which batches the LossRetentionDetector tags and walks, and how long it can sleep between.

A walk every ``every`` batches needs the loss of the batch before it tagged (see
:func:`tag_due`); between two such batches the detector has nothing to do. Under the doctor's
:class:`~lightning_speedpack.core.hook_hub.HookHub` it then sleeps (:func:`batches_asleep`):
the hub does not call its hooks at all until the batch that needs them, where checking "not
this batch" at every batch start cost ~20 interpreted lines a batch on the DDP zoo's 1 ms MLP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["TAGGED_FIRST", "Schedule", "batches_asleep", "end_due", "tag_due"]

TAGGED_FIRST = 16  # batches whose loss graphs are always tagged (see `tag_due`)


@dataclass
class Schedule:
    """Where the detector stands at the start of batch ``batch`` (counted from 0 in the fit).

    ``last`` is the epoch's batch count (``inf`` for a loader without a length) and
    ``steps_left`` the optimizer steps before ``max_steps`` (``inf`` without one).
    """

    batch: int
    batch_idx: int
    last: float
    every: int
    deep_every: int
    last_deep_scan: int
    epoch_end_walked: bool
    steps_left: float = math.inf


def tag_due(s: Schedule) -> bool:
    """Whether this batch's loss is tagged: when the next batch may walk, and at first.

    A walk knows a graph is from an earlier batch by its tag; an untagged graph it meets is
    tagged then, as first seen, and reported by the next walk that still meets it. So with
    the batch before each walk tagged, a list of losses is found by the first walk that
    meets it (with the tagged graphs counted), and with the first batches tagged, a list
    filled from the start is found nearly whole by the walk at the end of a short fit.
    Tagging costs ~35 us a batch (``grad_fn.metadata`` writes), which the doctor's sparse
    walks (one in 128 batches) no longer pay on nearly every batch.

    Example:
        >>> s = Schedule(batch=31, batch_idx=31, last=100, every=32, deep_every=0,
        ...              last_deep_scan=0, epoch_end_walked=False)
        >>> tag_due(s), tag_due(Schedule(**{**vars(s), "batch": 30, "batch_idx": 30}))
        (True, False)
        >>> end = Schedule(batch=98, batch_idx=98, last=100, every=128, deep_every=0,
        ...                last_deep_scan=0, epoch_end_walked=False)
        >>> tag_due(end), tag_due(Schedule(**{**vars(end), "epoch_end_walked": True}))
        (True, False)
    """
    step = s.batch + 1  # the next batch, which may walk
    if s.every == 1 or s.batch < TAGGED_FIRST or step % s.every == 0:
        return True
    if s.deep_every > 0 and step - s.last_deep_scan >= s.deep_every:
        return True
    # the end of the first epoch (the one that walks at its end) or of the fit (which always
    # walks); the later epochs' ends walk nothing, so their losses are left untagged
    return (not s.epoch_end_walked and s.batch_idx + 2 >= s.last) or s.steps_left <= 2


def end_due(s: Schedule, *, follows_outputs: bool) -> bool:
    """Whether ``on_train_batch_end`` may do anything this batch (a HookHub skips it if not).

    It walks on schedule, follows what ``training_step`` returns besides the loss
    (``follows_outputs``; so does watching CUDA memory), and the first batches run it, to see
    what steps return.
    """
    if follows_outputs or s.batch < TAGGED_FIRST or s.batch % s.every == 0:
        return True
    if s.deep_every > 0 and s.batch - s.last_deep_scan >= s.deep_every:
        return True
    return not s.epoch_end_walked and s.batch_idx + 1 == s.last


def batches_asleep(s: Schedule) -> int:
    """How many batches after this one have nothing to tag or walk (0: the next one has).

    Called on a batch that is due for nothing (neither :func:`tag_due` nor :func:`end_due`);
    the first batch at this count plus one after it is the next that is due for something.

    Example:
        >>> s = Schedule(batch=40, batch_idx=40, last=1000, every=128, deep_every=0,
        ...              last_deep_scan=0, epoch_end_walked=True)
        >>> batches_asleep(s)  # batch 127 tags the loss that batch 128's walk may meet
        86
    """
    b = s.batch
    first = [
        (-(b + 2)) % s.every + 1,  # a tag: (b + j + 1) % every == 0
        (-(b + 1)) % s.every + 1,  # a walk: (b + j) % every == 0
        s.last_deep_scan + s.deep_every - b - 1 if s.deep_every > 0 else math.inf,
        # the tag before the first epoch's last batch, whose end walks
        s.last - s.batch_idx - 2 if not s.epoch_end_walked else math.inf,
        s.steps_left - 2,
    ]
    return max(0, int(min(first)) - 1)
