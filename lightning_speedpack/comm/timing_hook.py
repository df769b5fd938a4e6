"""A timing communication hook: the comm figures where DDP's own runtime statistics are missing.

``DistributedDataParallel._get_ddp_logging_data()`` (:mod:`~lightning_speedpack.comm.ddp_stats`)
is a private, prototype API: a torch may lack it, or it may raise. Then, and only where the
model has no communication hook of its own, :class:`~lightning_speedpack.comm.CommMonitor`
registers :func:`timed_allreduce`: DDP's default all-reduce
(``ddp_comm_hooks.default_hooks.allreduce_hook``: divide by the world size, all-reduce, the same
result as no hook) with a clock around it on the iterations it samples (the first ten, then one
in every ``rate``). On each of those it records, per gradient bucket, when the all-reduce was
launched and when its future completed:

- on the CPU (gloo): ``time.perf_counter()`` at the launch and in the future's ``then``
  callback, which runs when the all-reduce is done;
- on CUDA (NCCL): a CUDA event recorded at the launch on the current stream and one in the
  ``then`` callback (torch runs it with the all-reduce's stream made current, so the event marks
  its end on the device); a step is read only once its last event has completed
  (``Event.query()``, no synchronisation). This path is written but was exercised on the CPU
  only (its bookkeeping in a test with stand-in events): no CUDA device here.

Of an iteration: *comm* is the first bucket's launch to the last bucket's completion, *overlap*
the first launch to the last launch (DDP launches the last bucket when the backward has
computed its last gradient: what it launched before ran under the compute), and the *wait*
what is left: the last launch to the last completion. DDP's own statistics time the compute and
the forward too; the hook cannot, so ``forward_ms`` and ``backward_compute_ms`` stay unmeasured.

Never two hooks: nothing is registered where the model has one (``ddp._comm_hooks``, what
``register_comm_hook`` keeps), where Lightning's ``DDPStrategy(ddp_comm_hook=...)`` is set,
where torch does not say (no ``_comm_hooks``), or where the reducer refuses a second one (a
built-in hook, which ``_comm_hooks`` does not list). The hook adds no collective and no sync.

Its cost, the price of a Python hook over DDP's C++ one (a Python call and a future callback a
bucket, every iteration): on a world-size-1 gloo DDP of the zoo's MLP, 1.22 ms a step with DDP's
all-reduce against 1.34 ms with this hook (1.095x, medians of 6 alternating runs of 300 steps,
load average 4.4 on 2 cores); on the zoo's 128 MiB embedding job, within the noise. Only where
DDP's statistics are missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from lightning_speedpack.comm.ddp_stats import DDP_FIRST_SAMPLED, DDPSample

__all__ = ["CommTimer", "attach_timer", "timed_allreduce"]

_NS_PER_S = 1e9
_NS_PER_MS = 1e6


@dataclass
class _Step:
    """One sampled iteration's marks: CPU seconds, or CUDA events."""

    iteration: int
    first: Any  # the first bucket's launch
    last: Any = None  # the last bucket's launch (None: not launched yet)
    launched: int = 0
    ends: list[Any] = field(default_factory=list)  # appended by the futures' callbacks


_UNTIMED = _Step(0, None)  # the open iteration is only counted


class CommTimer:
    """The timing hook's state: which iterations to time, and what was measured.

    ``event_factory`` makes a timing event on CUDA (``torch.cuda.Event(enable_timing=True)``
    when None); None on the CPU, where the marks are ``perf_counter`` seconds.
    """

    def __init__(
        self, process_group: Any, rate: int, *, cuda: bool = False, event_factory: Any = None
    ) -> None:
        self.process_group = process_group
        self.rate = rate
        self.cuda = cuda
        if cuda and event_factory is None:
            import torch

            event_factory = _cuda_event_factory(torch)
        self._event = event_factory
        self.active = True  # False after the fit: the hook only all-reduces
        self.iteration = 0  # DDP iterations (synchronising backwards) seen
        self._open: _Step | None = None
        self._done: list[_Step] = []
        self.samples: list[DDPSample] = []

    def sampled(self, iteration: int) -> bool:
        """Whether ``iteration`` is timed (DDP's own schedule: the first ten, then every rate)."""
        return iteration <= DDP_FIRST_SAMPLED or iteration % self.rate == 0

    def _mark(self) -> Any:
        if self._event is None:
            return perf_counter()
        event = self._event()
        event.record()
        return event

    def launch(self, bucket: Any) -> _Step | None:
        """Called by the hook before a bucket's all-reduce: its launch mark (None: not timed)."""
        if self._open is None:
            self.iteration += 1
            timed = self.active and self.sampled(self.iteration)
            self._open = _Step(self.iteration, self._mark()) if timed else _UNTIMED
        step = self._open
        last = bucket.is_last()
        if last:
            self._open = None
        if step is _UNTIMED:
            return None
        step.launched += 1
        if last:
            step.last = step.first if step.launched == 1 else self._mark()
            self._done.append(step)
        return step

    def complete(self, step: _Step) -> None:
        """Called in a bucket's future callback when its all-reduce is done."""
        step.ends.append(self._mark())

    def collect(self) -> None:
        """Turn the completed iterations into samples (main thread; skips unfinished ones)."""
        pending = []
        for step in self._done:
            if len(step.ends) < step.launched or not self._finished(step):
                pending.append(step)
                continue
            comm, overlap = self._durations_ns(step)
            self.samples.append(DDPSample(step.iteration, None, None, comm, overlap))
        self._done = pending

    def _finished(self, step: _Step) -> bool:
        return self._event is None or all(bool(end.query()) for end in step.ends)

    def _durations_ns(self, step: _Step) -> tuple[int, int]:
        if self._event is None:
            end = max(step.ends)
            comm = (end - step.first) * _NS_PER_S
            overlap = (step.last - step.first) * _NS_PER_S
        else:  # CUDA events: milliseconds between two recorded events
            comm = max(step.first.elapsed_time(end) for end in step.ends) * _NS_PER_MS
            overlap = step.first.elapsed_time(step.last) * _NS_PER_MS if step.launched > 1 else 0
        return max(0, round(comm)), max(0, min(round(overlap), round(comm)))


def _cuda_event_factory(torch: Any) -> Any:
    def make() -> Any:
        return torch.cuda.Event(enable_timing=True)

    return make


def timed_allreduce(state: CommTimer, bucket: Any) -> Any:
    """DDP's default all-reduce (``allreduce_hook``), timed on the iterations ``state`` samples."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    step = state.launch(bucket)
    future = allreduce_hook(state.process_group, bucket)
    if step is None:
        return future

    def done(fut: Any) -> Any:
        state.complete(step)
        return fut.value()

    return future.then(done)


def _name(hook: Any) -> str:
    inner = getattr(hook, "func", hook)  # a functools.partial, as Lightning's wrappers make
    return str(getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or hook)


def attach_timer(ddp: Any, rate: int, strategy_hook: Any = None) -> tuple[CommTimer | None, str]:
    """Register the timing hook on ``ddp``: the timer, or None and why not (see the module).

    ``strategy_hook`` is Lightning's ``DDPStrategy(ddp_comm_hook=...)``, registered by Lightning
    on CUDA only: set, it is the user's choice of hook all the same, so none is added. A timer
    already registered on ``ddp`` (a second fit of the same model) is reused.
    """
    if strategy_hook is not None:
        return None, (
            f"the strategy has a communication hook of the user's "
            f"(`DDPStrategy(ddp_comm_hook={_name(strategy_hook)})`): no timing hook is added"
        )
    hooks = getattr(ddp, "_comm_hooks", None)
    if not isinstance(hooks, list):
        return None, (
            "this torch's DDP does not list its communication hooks (no `_comm_hooks`): a "
            "timing hook could clash with one of the user's, so none is added"
        )
    mine = next((state for _, state in hooks if isinstance(state, CommTimer)), None)
    if mine is not None:
        mine.active = True
        return mine, ""
    if hooks:
        return None, (
            f"the model has a communication hook of its own ({_name(hooks[0][0])}): no "
            "second hook is added"
        )
    import torch
    import torch.distributed as dist

    # DDP checks the hook's annotations (``bucket: GradBucket``, ``-> Future[Tensor]``) as
    # objects: this module's are strings (``from __future__ import annotations``).
    timed_allreduce.__annotations__ = {
        "state": CommTimer,
        "bucket": dist.GradBucket,  # type: ignore[attr-defined]
        "return": torch.futures.Future[torch.Tensor],
    }
    device = next((p.device.type for p in ddp.parameters()), "cpu")
    timer = CommTimer(getattr(ddp, "process_group", None), rate, cuda=device == "cuda")
    try:
        ddp.register_comm_hook(timer, timed_allreduce)
    except (RuntimeError, AssertionError, ValueError) as error:
        # The reducer holds a hook already (a built-in one, unlisted): take ours off the list.
        ddp._comm_hooks[:] = [h for h in ddp._comm_hooks if h[1] is not timer]
        return None, f"DDP refused a timing hook ({error}): the model has a hook of its own"
    return timer, ""
