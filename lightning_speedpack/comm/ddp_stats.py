"""What the gradient all-reduce costs a DDP step, from DDP's own runtime statistics.

``DistributedDataParallel``'s reducer times its iterations itself: on the iterations it samples
(always the first 10, then one in every *sample rate*, torch's default 100) it records, in
nanoseconds, when the forward started, when the backward began and ended computing, and when
the first gradient bucket's all-reduce was launched and the last one finished. Its logger keeps
the last sampled iteration's durations next to their running averages, and
``DistributedDataParallel._get_ddp_logging_data()`` returns them as a dict. The reducer's
marks, as recorded in ``torch/csrc/distributed/c10d/reducer.cpp``:

- *forward*: from the DDP forward's start (``prepare_for_forward``) to its end
  (``prepare_for_backward``): under Lightning, the whole ``training_step``;
- *backward compute*: from the end of that forward to the autograd engine's final callback,
  after the last gradient was computed (the search for unused parameters that
  ``find_unused_parameters=True`` adds runs at the start of this span);
- *comm*: from the launch of the first bucket's all-reduce to the end of ``finalize_backward``,
  which waits for every bucket (and, with ``find_unused_parameters=True``, for the all-reduce of
  the map of used parameters);
- *overlap*: from that first launch to the end of the backward compute: the part of the
  communication hidden behind computation. What is left of *comm* after it (its end minus the
  compute's end) is the time the backward waits for the all-reduce with nothing else to do.

This module holds the plain functions: find the DDP wrapper, say when a new sample can be read,
turn the logger's dict into a :class:`DDPSample`, and summarise the samples into per-rank figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DDP_DEFAULT_SAMPLE_RATE",
    "DDP_FIRST_SAMPLED",
    "CommFigures",
    "DDPSample",
    "find_ddp",
    "logging_data",
    "next_read",
    "read_due",
    "read_sample",
    "set_sample_rate",
    "settings",
    "summarize",
]

#: torch's ``kDDPRuntimeLoggingSampleRate`` (reducer.hpp): after the first iterations, DDP
#: samples one iteration in this many unless told otherwise. DDP has no getter for the rate.
DDP_DEFAULT_SAMPLE_RATE = 100
#: DDP samples every one of its first this many iterations, whatever the rate.
DDP_FIRST_SAMPLED = 10
#: Iterations left out of the figures: the first runs DDP's lazy initialisation and the bucket
#: rebuild, many times slower than a steady step.
WARMUP_ITERATIONS = 1

_NS_PER_MS = 1e6


@dataclass(frozen=True)
class DDPSample:
    """One iteration as DDP's reducer timed it (nanoseconds; see the module docstring).

    Example:
        >>> s = DDPSample(iteration=12, forward_ns=200_000, backward_compute_ns=900_000,
        ...               comm_ns=1_000_000, overlap_ns=600_000)
        >>> s.wait_ns  # the all-reduce's part after the backward's last gradient
        400000
    """

    iteration: int
    #: None where the iteration was timed by the timing comm hook, which sees the buckets only
    #: (:mod:`~lightning_speedpack.comm.timing_hook`)
    forward_ns: int | None
    backward_compute_ns: int | None
    comm_ns: int
    overlap_ns: int
    #: bytes of the parameters that got no gradient in this iteration (None: DDP did not look,
    #: ``find_unused_parameters=False``)
    unused_parameter_bytes: int | None = None

    @property
    def wait_ns(self) -> int:
        """The communication not hidden behind computation: the comm's end minus compute's end."""
        return max(0, self.comm_ns - min(max(self.overlap_ns, 0), self.comm_ns))


@dataclass(frozen=True)
class CommFigures:
    """Per-rank means over the sampled steady iterations (milliseconds and fractions)."""

    samples: int
    forward_ms: float | None  # None: not measured (the timing comm hook's samples)
    backward_compute_ms: float | None
    comm_ms_per_step: float
    comm_wait_ms: float
    #: the overlapped part of the communication over all of it (1.0: fully hidden)
    overlap_fraction: float
    #: the median of the sampled iterations' waits: the typical one, which a few iterations of
    #: a rank descheduled (a busy host) or a hiccup do not move as they move the mean
    comm_wait_median_ms: float | None = None
    #: the least of them: an iteration where this rank reached the all-reduce last and waited
    #: for nobody, only for the all-reduce itself (with 2 ranks of jittery step times, about
    #: every other iteration; the others add the wait for the slower rank of the moment)
    comm_wait_least_ms: float | None = None

    def as_dict(self, step_ms: float | None) -> dict[str, float | int]:
        """The figures for ``doctor_figures()``; ``comm_wait_fraction`` needs the step time.

        Example:
            >>> f = CommFigures(4, 0.2, 0.9, 1.0, 0.4, 0.6)
            >>> f.as_dict(step_ms=2.0)["comm_wait_fraction"]
            0.2
        """
        out: dict[str, float | int] = {"comm_samples": self.samples}
        for key, value in (
            ("forward_ms", self.forward_ms),
            ("backward_compute_ms", self.backward_compute_ms),
        ):
            if value is not None:
                out[key] = round(value, 4)
        out.update(
            {
                "comm_ms_per_step": round(self.comm_ms_per_step, 4),
                "comm_wait_ms": round(self.comm_wait_ms, 4),
                "overlap_fraction": round(self.overlap_fraction, 4),
            }
        )
        spread = {"median": self.comm_wait_median_ms, "least": self.comm_wait_least_ms}
        for name, value in spread.items():
            if value is not None:
                out[f"comm_wait_{name}_ms"] = round(value, 4)
        if step_ms is not None and step_ms > 0:
            out["comm_wait_fraction"] = round(self.comm_wait_ms / step_ms, 4)
            for name, value in spread.items():
                if value is not None:
                    out[f"comm_wait_{name}_fraction"] = round(value / step_ms, 4)
        return out


def find_ddp(model: Any) -> Any:
    """The ``DistributedDataParallel`` wrapper, if ``model`` (``trainer.strategy.model``) is one.

    Lightning's ``DDPStrategy`` (``"ddp"``, ``"ddp_spawn"``, ``"ddp_speedpack"``...) wraps the
    LightningModule in it; FSDP, DeepSpeed and single-device strategies do not.

    Example:
        >>> import torch
        >>> find_ddp(torch.nn.Linear(2, 2)) is None
        True
    """
    from torch.nn.parallel import DistributedDataParallel

    return model if isinstance(model, DistributedDataParallel) else None


def logging_data(ddp: Any) -> dict[str, Any] | None:
    """``ddp._get_ddp_logging_data()``, or None where this torch has no such prototype API."""
    getter = getattr(ddp, "_get_ddp_logging_data", None)
    if getter is None:
        return None
    try:
        data = getter()
    except (RuntimeError, AttributeError):
        return None
    return data if isinstance(data, dict) else None


def settings(ddp: Any, data: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the fit's DDP runs with, for the ``comm-bound`` fixes (read once, at train start).

    The gradients' bytes and the largest one's, whether they are fp32, the bucket settings,
    ``static_graph``, the device, and the user's communication hook (DDP's logging data names
    it when available, else ``ddp._comm_hooks``).

    Example:
        >>> import torch
        >>> class Stub(torch.nn.Module):  # DDP's attributes on a plain module
        ...     gradient_as_bucket_view, bucket_bytes_cap, static_graph = False, 26214400, False
        ...     _comm_hooks = []
        ...     def __init__(self):
        ...         super().__init__(); self.module = torch.nn.Linear(256, 256)
        >>> s = settings(Stub(), None)
        >>> s["gradient_bytes"], s["largest_gradient_bytes"], s["bucket_cap_mb"], s["comm_hook"]
        (263168, 262144, 25.0, None)
    """
    import torch

    params = [p for p in getattr(ddp, "module", ddp).parameters() if p.requires_grad]
    sizes = [p.numel() * p.element_size() for p in params]
    hook = (data or {}).get("comm_hook") or None
    listed = getattr(ddp, "_comm_hooks", None) or []
    if hook is None and listed:
        hook = getattr(listed[0][0], "__qualname__", None) or str(listed[0][0])
    cap = getattr(ddp, "bucket_bytes_cap", None)
    return {
        "gradient_bytes": sum(sizes),
        "largest_gradient_bytes": max(sizes, default=0),
        "fp32_gradients": any(p.dtype == torch.float32 for p in params),
        "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
        "bucket_cap_mb": None if not isinstance(cap, int) else cap / (1 << 20),
        "static_graph": bool(getattr(ddp, "static_graph", False)),
        "cuda": any(p.device.type == "cuda" for p in params[:1]),
        "comm_hook": None if hook is None else str(hook),
    }


def set_sample_rate(ddp: Any, rate: int) -> bool:
    """Ask DDP to sample one iteration in ``rate`` after its first ten; False where it cannot."""
    setter = getattr(ddp, "_set_ddp_runtime_logging_sample_rate", None)
    if setter is None:
        return False
    try:
        setter(rate)
    except (RuntimeError, ValueError, AttributeError):
        return False
    return True


def read_due(batches: int, rate: int, batches_per_iteration: int = 1) -> bool:
    """Whether DDP can have logged a new sample by the end of training batch number ``batches``.

    DDP logs iteration ``N`` at the start of iteration ``N + 1``'s forward. An iteration is a
    forward that synchronises gradients: one per training batch, or one per
    ``batches_per_iteration`` batches when Lightning accumulates gradients (its other batches
    run under ``no_sync``, where DDP neither counts nor logs). Iterations 1 to 10 are always
    sampled, then every ``rate``-th.

    Example:
        >>> [n for n in range(1, 40) if read_due(n, rate=10)]
        [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 21, 31]
        >>> [n for n in range(1, 12) if read_due(n, rate=10, batches_per_iteration=4)]
        [8]
    """
    if batches % batches_per_iteration:
        return False
    iteration = batches // batches_per_iteration - 1
    return iteration >= 1 and (iteration <= DDP_FIRST_SAMPLED or iteration % rate == 0)


def next_read(batches: int, rate: int, batches_per_iteration: int = 1) -> int:
    """The first batch count after ``batches`` at which :func:`read_due` is true.

    :func:`read_due` states the schedule; this is its closed form (the tests check one against
    the other), worked out once per read, so a training batch compares one number.

    Example:
        >>> [next_read(n, rate=10) for n in (0, 2, 10, 11, 21)]
        [2, 3, 11, 21, 31]
        >>> next_read(0, rate=10, batches_per_iteration=4), next_read(8, 10, 4)
        (8, 12)
    """
    iteration = max(1, batches // batches_per_iteration)  # the first whose end is past it
    if iteration > DDP_FIRST_SAMPLED:
        iteration = -(-iteration // rate) * rate
    return (iteration + 1) * batches_per_iteration


def _int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_sample(data: Mapping[str, Any]) -> DDPSample | None:
    """The last sampled iteration in DDP's logging data, or None when there is none (yet).

    A duration DDP could not measure in that iteration keeps its previous value in the logger
    (``CpuTimer::measureDifference`` skips an end before its start), so when the timestamps are
    there the sample is kept only if they are in order and belong to one iteration.

    Example:
        >>> data = {"iteration": 3, "forward_compute_time": 10, "backward_compute_time": 40,
        ...         "backward_comm_time": 30, "backward_compute_comm_overlap_time": 20,
        ...         "find_unused_parameters": 1, "unused_parameter_size": 0}
        >>> read_sample(data)
        DDPSample(iteration=3, forward_ns=10, backward_compute_ns=40, comm_ns=30, overlap_ns=20, unused_parameter_bytes=0)
        >>> read_sample({"iteration": 0}) is None
        True
    """  # noqa: E501
    iteration = _int(data, "iteration")
    forward = _int(data, "forward_compute_time")
    compute = _int(data, "backward_compute_time")
    comm = _int(data, "backward_comm_time")
    overlap = _int(data, "backward_compute_comm_overlap_time")
    if not iteration or forward is None or compute is None or comm is None or overlap is None:
        return None
    if not _in_order(data):
        return None
    unused = _int(data, "unused_parameter_size") if data.get("find_unused_parameters") else None
    return DDPSample(iteration, forward, compute, comm, overlap, unused)


def _in_order(data: Mapping[str, Any]) -> bool:
    marks = [
        _int(data, key)
        for key in (
            "forward_compute_time_start",
            "backward_compute_time_start",
            "backward_comm_time_start",
            "backward_compute_time_end",
            "backward_comm_time_end",
        )
    ]
    known = [m for m in marks if m is not None]
    if len(known) < len(marks):
        return True  # a timer without timestamps (CUDA events): durations only
    forward, compute, comm, compute_end, comm_end = known
    return forward <= compute <= comm <= comm_end and compute <= compute_end <= comm_end


def steady(samples: Sequence[DDPSample]) -> list[DDPSample]:
    """The samples after DDP's warm-up iteration(s), which the figures are about."""
    return [s for s in samples if s.iteration > WARMUP_ITERATIONS]


def summarize(samples: Sequence[DDPSample]) -> CommFigures | None:
    """Per-rank means of the steady samples; None when there is none.

    Example:
        >>> a = DDPSample(2, 100_000, 800_000, 1_000_000, 500_000)
        >>> b = DDPSample(3, 300_000, 1_200_000, 3_000_000, 1_500_000)
        >>> f = summarize([DDPSample(1, 9, 9, 9, 9), a, b])  # iteration 1 is left out
        >>> (f.samples, f.forward_ms, f.comm_ms_per_step, f.comm_wait_ms, f.overlap_fraction)
        (2, 0.2, 2.0, 1.0, 0.5)
    """
    kept = steady(samples)
    if not kept:
        return None
    n = len(kept)
    comm = sum(s.comm_ns for s in kept)
    wait = sum(s.wait_ns for s in kept)
    return CommFigures(
        samples=n,
        forward_ms=_mean_ms([s.forward_ns for s in kept]),
        backward_compute_ms=_mean_ms([s.backward_compute_ns for s in kept]),
        comm_ms_per_step=comm / n / _NS_PER_MS,
        comm_wait_ms=wait / n / _NS_PER_MS,
        comm_wait_median_ms=statistics.median(s.wait_ns for s in kept) / _NS_PER_MS,
        comm_wait_least_ms=min(s.wait_ns for s in kept) / _NS_PER_MS,
        overlap_fraction=(comm - wait) / comm if comm > 0 else 1.0,
    )


def _mean_ms(values: Sequence[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) / _NS_PER_MS if known else None
