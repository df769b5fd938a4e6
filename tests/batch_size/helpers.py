"""A model per Lightning namespace that records every batch size it trained on, and a fake clock."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.helpers.namespaces import NAMESPACE_IDS, Namespace, load

#: seconds one training step of ``batch_size`` samples takes on the fake clock
Cost = Callable[[int], float]


class FakeClock:
    """``time.perf_counter`` that only the model's training steps advance (by ``cost(batch)``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0.0
        self.cost: Cost | None = None
        monkeypatch.setattr(time, "perf_counter", lambda: self.now)

    def step(self, batch_size: int) -> None:
        if self.cost is not None:
            self.now += self.cost(batch_size)


@functools.cache
def recording_model(name: str) -> type[Any]:
    """``SizedBoringModel`` of namespace ``name`` that records the sizes of its batches.

    ``trial_sizes``: batch sizes of the ``training_step`` calls before ``on_train_start`` (the
    tuner's trials); ``train_sizes``: those of the fit. A batch larger than ``limit`` raises
    ``torch.OutOfMemoryError`` (the injected memory limit); ``clock`` is advanced every step.
    """
    base = load(name).SizedBoringModel

    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(
            self,
            batch_size: int = 8,
            length: int = 64,
            limit: int = 10**9,
            clock: FakeClock | None = None,
        ) -> None:
            super().__init__(batch_size=batch_size, length=length)
            self.limit, self.clock = limit, clock
            self.started = False
            self.trial_sizes: list[int] = []
            self.train_sizes: list[int] = []

        def on_train_start(self) -> None:
            self.started = True

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            size = int(batch.shape[0])
            (self.train_sizes if self.started else self.trial_sizes).append(size)
            if size > self.limit:
                raise torch.OutOfMemoryError(f"CUDA out of memory (injected: {size})")
            if self.clock is not None:
                self.clock.step(size)
            return super().training_step(batch, batch_idx)

    Recording.__qualname__ = f"Recording_{NAMESPACE_IDS[name]}"
    return Recording


def model(ns: Namespace, **kwargs: Any) -> Any:
    """A recording model of namespace ``ns`` (see :func:`recording_model`)."""
    return recording_model(ns.name)(**kwargs)
