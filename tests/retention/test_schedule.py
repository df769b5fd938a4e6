"""The detector sleeps exactly through the batches that have nothing to tag or walk."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from lightning_speedpack.retention.schedule import (
    TAGGED_FIRST,
    Schedule,
    batches_asleep,
    end_due,
    tag_due,
)


def _due(s: Schedule) -> bool:
    return tag_due(s) or end_due(s, follows_outputs=False)


def _later(s: Schedule, j: int) -> Schedule:
    return replace(s, batch=s.batch + j, batch_idx=s.batch_idx + j, steps_left=s.steps_left - j)


@pytest.mark.parametrize("every", [3, 7, 20, 128])
@pytest.mark.parametrize("deep_every", [0, 50])
@pytest.mark.parametrize(("last", "max_steps"), [(100, math.inf), (math.inf, 300), (37, 90)])
@pytest.mark.parametrize("walked", [True, False], ids=["epoch-end-walked", "first-epoch"])
def test_it_wakes_on_the_first_batch_that_is_due_and_on_no_later_one(
    every: int, deep_every: int, last: float, max_steps: float, walked: bool
) -> None:
    seen = 0
    for batch in range(TAGGED_FIRST, 260):
        batch_idx = batch % int(last) if last != math.inf else batch
        s = Schedule(batch, batch_idx, last, every, deep_every, 0, walked, max_steps - batch)
        if _due(s) or s.steps_left <= 0:
            continue
        asleep = batches_asleep(s)
        horizon = int(min(asleep, last - batch_idx - 1))  # the epoch's last batch ends a count
        assert not any(_due(_later(s, j)) for j in range(1, horizon + 1)), (batch, asleep)
        if asleep + 1 < last - batch_idx:
            assert _due(_later(s, asleep + 1)), (batch, asleep)
        seen += 1
    assert seen > 0


def test_a_detector_that_follows_outputs_is_due_every_batch() -> None:
    s = Schedule(40, 40, 1000, 128, 0, 0, True)
    assert not end_due(s, follows_outputs=False)
    assert end_due(s, follows_outputs=True)


def test_only_the_first_epochs_end_is_tagged_for_a_walk() -> None:
    # The first epoch's last batch walks (a list emptied at each epoch's end is full there),
    # so the two batches before it are tagged; once it has walked, later epochs' ends are not.
    first = Schedule(98, 98, 100, 128, 0, 0, False)
    later = replace(first, epoch_end_walked=True)
    assert tag_due(first)
    assert end_due(replace(first, batch=99, batch_idx=99), follows_outputs=False)
    assert not tag_due(later)
    assert not end_due(replace(later, batch=99, batch_idx=99), follows_outputs=False)
    assert batches_asleep(replace(later, batch=90, batch_idx=90)) > 9  # sleeps past the end
