"""core/events: the publish/subscribe point, and SyncPointWarnings publishing every sync."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pytorch_lightning import Trainer

from lightning_speedpack.core import events
from lightning_speedpack.sync_points import SyncPointError, SyncPointWarnings
from tests.helpers.models import TinyCNN, quiet_trainer_kwargs


def test_subscribe_publish_close() -> None:
    seen: list[Any] = []
    first = events.subscribe("t", seen.append)
    second = events.subscribe("t", lambda m: seen.append(("2", m)))
    assert events.has_subscribers("t")
    assert events.subscriber_count("t") == 2
    events.publish("t", 1)
    first.close()
    first.close()  # idempotent
    events.publish("t", 2)
    second.close()
    events.publish("t", 3)
    assert seen == [1, ("2", 1), ("2", 2)]
    assert not events.has_subscribers("t")
    assert events.subscriber_count() == 0


def test_subscribe_validates() -> None:
    with pytest.raises(TypeError, match="topic"):
        events.subscribe(1, print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="listener"):
        events.subscribe("t", "print")  # type: ignore[arg-type]


class _Syncing(TinyCNN):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.last = loss.item()  # the planted sync
        return loss


PLANTED_LINE = _Syncing.training_step.__code__.co_firstlineno + 2


def test_sync_point_warnings_publishes_each_recorded_sync(tmp_path: Path) -> None:
    seen: list[events.SyncPoint] = []
    sync = SyncPointWarnings(mode="summary", include_cpu=True)
    trainer = Trainer(callbacks=[sync], **quiet_trainer_kwargs(tmp_path, max_steps=3))
    with events.subscribe(events.SYNC_POINT, seen.append):
        trainer.fit(_Syncing())
    user = [s for s in seen if s.origin == "user"]
    assert [(s.kind, s.location.endswith(f"test_events.py:{PLANTED_LINE}")) for s in user] == [
        ("item", True)
    ] * 3
    assert [s.step for s in user] == [0, 1, 2]


def test_published_before_sync_point_error(tmp_path: Path) -> None:
    seen: list[events.SyncPoint] = []
    sync = SyncPointWarnings(mode="error", include_cpu=True)
    trainer = Trainer(callbacks=[sync], **quiet_trainer_kwargs(tmp_path, max_steps=3))
    with events.subscribe(events.SYNC_POINT, seen.append), pytest.raises(SyncPointError):
        trainer.fit(_Syncing())
    assert [s.kind for s in seen if s.origin == "user"] == ["item"]
