"""The timing hook's bookkeeping and its rules for registering, without a process group.

The marks are given: stand-in buckets, and stand-in CUDA events (no CUDA device here) whose
times the test sets; tests/comm/test_timing_hook_ddp.py runs the hook on 2 real gloo ranks.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from lightning_speedpack.comm.timing_hook import CommTimer, attach_timer


class Bucket:
    def __init__(self, index: int, last: bool) -> None:
        self._index, self._last = index, last

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last


class Event:
    """A CUDA event stand-in: ``record()`` takes the next time (ms) from a shared clock."""

    clock: ClassVar[list[float]] = []

    def __init__(self) -> None:
        self.t: float | None = None
        self.done = True

    def record(self) -> None:
        self.t = Event.clock.pop(0)

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: Event) -> float:
        assert self.t is not None
        assert end.t is not None
        return end.t - self.t


def _iteration(timer: CommTimer, buckets: int) -> list[Any]:
    steps = [timer.launch(Bucket(i, i == buckets - 1)) for i in range(buckets)]
    for step in steps:
        if step is not None:
            timer.complete(step)
    return steps


def test_an_iteration_is_first_launch_to_last_completion_and_the_wait_after_the_last_launch() -> (
    None
):
    Event.clock = [0.0, 4.0, 5.0, 7.5]  # launch 1, launch 2 (the last), end 1, end 2 (ms)
    timer = CommTimer(None, rate=10, cuda=True, event_factory=Event)
    _iteration(timer, buckets=2)
    timer.collect()
    [sample] = timer.samples
    assert (sample.iteration, sample.comm_ns, sample.overlap_ns) == (1, 7_500_000, 4_000_000)
    assert sample.wait_ns == 3_500_000  # the last launch (compute over) to the last end
    assert sample.forward_ns is None
    assert sample.backward_compute_ns is None


def test_a_cuda_iteration_is_read_only_once_its_events_completed() -> None:
    Event.clock = [0.0, 2.0]
    timer = CommTimer(None, rate=10, cuda=True, event_factory=Event)
    [step] = _iteration(timer, buckets=1)
    step.ends[0].done = False  # still running on the device: no sync, read later
    timer.collect()
    assert timer.samples == []
    step.ends[0].done = True
    timer.collect()
    assert [(s.comm_ns, s.overlap_ns) for s in timer.samples] == [(2_000_000, 0)]


def test_it_times_the_iterations_ddp_would_sample_and_only_counts_the_others() -> None:
    timer = CommTimer(None, rate=5)  # CPU: perf_counter marks
    timed = []
    for _ in range(21):
        steps = _iteration(timer, buckets=3)
        timed.append(steps[0] is not None)
    timer.collect()
    assert timer.iteration == 21
    expected = [i for i in range(1, 22) if i <= 10 or i % 5 == 0]
    assert [i + 1 for i, t in enumerate(timed) if t] == expected
    assert [s.iteration for s in timer.samples] == expected
    assert all(0 <= s.overlap_ns <= s.comm_ns for s in timer.samples)


def test_an_inactive_timer_only_counts() -> None:
    timer = CommTimer(None, rate=1)
    timer.active = False
    assert _iteration(timer, buckets=2) == [None, None]
    timer.collect()
    assert timer.samples == []


class FakeDDP(torch.nn.Module):
    """DDP's hook registry over a module (``_comm_hooks``, ``register_comm_hook``)."""

    def __init__(self, hooks: list[Any] | None, refuse: bool = False) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.process_group = None
        if hooks is not None:
            self._comm_hooks = hooks
        self.refuse = refuse

    def register_comm_hook(self, state: object, hook: Any) -> None:
        self._comm_hooks.append((hook, state))
        if self.refuse:  # as the reducer with a built-in hook already
            raise RuntimeError("register_comm_hook can only be called once.")


def users_hook(state: object, bucket: Any) -> Any:
    return None


def test_it_registers_one_hook_where_the_model_has_none_and_reuses_it() -> None:
    ddp = FakeDDP([])
    timer, why = attach_timer(ddp, rate=10)
    assert isinstance(timer, CommTimer)
    assert why == ""
    assert [h.__name__ for h, _ in ddp._comm_hooks] == ["timed_allreduce"]
    timer.active = False  # a finished fit
    again, _ = attach_timer(ddp, rate=10)  # a second fit of the same wrapper
    assert again is timer
    assert again.active
    assert len(ddp._comm_hooks) == 1


@pytest.mark.parametrize(
    ("ddp", "strategy_hook", "why"),
    [
        (FakeDDP([(users_hook, None)]), None, "the model has a communication hook of its own "
         "(users_hook): no second hook is added"),
        (FakeDDP([]), users_hook, "the strategy has a communication hook of the user's "
         "(`DDPStrategy(ddp_comm_hook=users_hook)`)"),
        (FakeDDP(None), None, "this torch's DDP does not list its communication hooks"),
        (FakeDDP([], refuse=True), None, "DDP refused a timing hook (register_comm_hook can "
         "only be called once.): the model has a hook of its own"),
    ],
)  # fmt: skip
def test_never_a_second_hook(ddp: FakeDDP, strategy_hook: Any, why: str) -> None:
    before = list(getattr(ddp, "_comm_hooks", []))
    timer, reason = attach_timer(ddp, rate=10, strategy_hook=strategy_hook)
    assert timer is None
    assert reason.startswith(why)
    assert list(getattr(ddp, "_comm_hooks", [])) == before  # nothing left behind
