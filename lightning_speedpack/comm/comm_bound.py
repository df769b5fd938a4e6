"""``comm/comm-bound``: the backward waits for the gradient all-reduce a large share of every step.

A plain function over one rank's measured figures and the settings its DDP ran with. The rank
alone cannot tell a slow all-reduce from a wait for a slower rank (both are time after its last
gradient until the all-reduce completes): under ``speedpack doctor`` the world view judges the
finding again on the rank that waited least (``comm_bound_in_world`` in the world's findings),
and drops it where the wait was for a straggler.

What is judged is the wait in the sampled iteration where it was least: one where this rank
reached the all-reduce last, so that it waited for the all-reduce itself and for no other rank.
Its mean (``comm_wait_fraction``) and median also hold the waits for whichever rank was slower
in that step: on a busy host, ranks whose step times jitter wait for one another in turn. On
the DDP zoo (``benchmarks/world_zoo.py``: 2 gloo ranks on a 2-core CPU shared with other jobs,
``speedpack doctor``, 2026-11-26, 2 runs at load average 1-4): the clean 1 ms MLP and its
``clean-sync-epoch`` twin waited 0.21-0.48 of their steps on the mean, 0.17-0.32 on the
median, 0.004-0.033 at the least; the ``comm-bound`` job (a 128 MiB embedding table's gradient,
all-reduced after the compute) 0.46-0.59 on the mean and 0.35-0.45 at the least, on each rank;
the ``slow-step`` straggler's rank 0 0.43-0.74 at the least, its rank 1 (the slow one) 0.002.
A warning from :data:`WARNING_SHARE` of the step, an info from :data:`INFO_SHARE`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_speedpack.core.findings import Finding

__all__ = ["INFO_SHARE", "WARNING_SHARE", "CommBound", "comm_bound_finding"]

#: The backward's wait for the all-reduce, over the step, from which the finding is a warning ...
WARNING_SHARE = 0.25
#: ... and an info.
INFO_SHARE = 0.15
#: Below this share of the communication hidden behind the compute, smaller buckets may help.
LOW_OVERLAP = 0.5
#: torch's default ``bucket_cap_mb``.
DEFAULT_BUCKET_MB = 25.0

_MIB = 1 << 20


@dataclass(frozen=True)
class CommBound:
    """One rank's measured communication and the DDP settings the fixes would change."""

    #: the backward's wait for the all-reduce / step time, in the sampled iteration where it
    #: was least (this rank reached the all-reduce last: the all-reduce itself, no other rank)
    comm_wait_fraction: float
    comm_wait_ms: float  # that wait
    comm_ms_per_step: float
    overlap_fraction: float
    step_ms: float  # per DDP iteration (times accumulate_grad_batches)
    world_size: int
    rank: int = 0
    #: DDP iterations of the fit and the fit's seconds (setup to the end of training): the
    #: share of the wall time; None: not known
    iterations: int | None = None
    fit_s: float | None = None
    accumulate_grad_batches: int = 1
    gradient_bytes: int | None = None
    largest_gradient_bytes: int | None = None
    fp32_gradients: bool = True
    gradient_as_bucket_view: bool = False
    bucket_cap_mb: float | None = None
    comm_hook: str | None = None  # the user's communication hook, if any
    static_graph: bool = False
    cuda: bool = False
    source: str = "DDP's runtime statistics"
    #: the mean wait per iteration (the wall time it cost; None: ``comm_wait_ms``) and the
    #: sampled iterations the figures come from
    mean_wait_ms: float | None = None
    samples: int | None = None
    typical_wait_ms: float | None = None  # the median sampled iteration's wait

    @property
    def wall_fraction(self) -> float | None:
        """The wait's share of the fit's wall time (None: not known)."""
        if not self.iterations or not self.fit_s:
            return None
        mean = self.comm_wait_ms if self.mean_wait_ms is None else self.mean_wait_ms
        return min(1.0, mean * self.iterations / 1e3 / self.fit_s)


def _mib(n: int) -> str:
    return f"{n / _MIB:.0f} MiB" if n >= 10 * _MIB else f"{n / _MIB:.1f} MiB"


def _fixes(state: CommBound) -> tuple[list[str], list[str]]:
    """The fixes that apply given what was measured, best first, and those already in place."""
    fixes: list[str] = []
    done: list[str] = []
    k = state.accumulate_grad_batches
    if k > 1:
        fixes.append(
            f"raise `Trainer(accumulate_grad_batches={k})` (the all-reduce runs once per "
            "window; Lightning runs the window's other batches under DDP's `no_sync`)"
        )
    else:
        fixes.append(
            "`Trainer(accumulate_grad_batches=k)`: one all-reduce every k batches (Lightning "
            "runs the others under DDP's `no_sync`), so the wait per sample falls k-fold; the "
            "effective batch grows k-fold (scale the learning rate)"
        )
    fixes.append(
        "a larger batch per rank (`DataLoader(batch_size=...)`, memory allowing): the same "
        "all-reduce for more samples"
    )
    if state.gradient_as_bucket_view:
        done.append("gradient_as_bucket_view=True")
    else:
        fixes.append(
            "`DDPStrategy(gradient_as_bucket_view=True)`: the gradients live in the all-reduce "
            "buckets, no copy into them and back each step (and less memory)"
        )
    cap = state.bucket_cap_mb or DEFAULT_BUCKET_MB
    if state.overlap_fraction < LOW_OVERLAP:
        largest = state.largest_gradient_bytes
        alone = (
            f"; but the largest gradient ({_mib(largest)}) is over any cap: its bucket waits "
            "for it, and if its layer comes first in the forward (an embedding) it is computed "
            "last, so its all-reduce cannot overlap: accumulation, compression, or a sparse "
            "or sharded embedding then"
            if largest is not None and largest > cap * _MIB
            else ""
        )
        fixes.append(
            f"`DDPStrategy(bucket_cap_mb=...)` below {cap:g}: smaller buckets start "
            f"all-reducing earlier in the backward (measured: {state.overlap_fraction:.0%} of "
            f"the communication hidden behind the compute){alone}"
        )
    if state.comm_hook is not None:
        done.append(f"a communication hook ({state.comm_hook})")
    elif state.fp32_gradients:
        hook = "bf16_compress_hook" if state.cuda else "fp16_compress_hook"
        where = (
            f"`DDPStrategy(ddp_comm_hook=default.{hook})` (from "
            "`torch.distributed.algorithms.ddp_comm_hooks import default_hooks as default`)"
            if state.cuda
            else f"`ddp_model.register_comm_hook(None, default.{hook})` in `on_fit_start` "
            "(Lightning applies `DDPStrategy(ddp_comm_hook=...)` on CUDA only)"
        )
        fixes.append(f"{where}: half the bytes on the wire, gradients rounded to 16 bits")
    if state.static_graph:
        done.append("static_graph=True")
    else:
        fixes.append(
            "`DDPStrategy(static_graph=True)` if every step uses the same parameters: DDP "
            "then skips its per-step bookkeeping (a small gain)"
        )
    return fixes, done


def comm_bound_finding(state: CommBound) -> Finding | None:
    """``comm-bound`` when the least wait is at least :data:`INFO_SHARE` of the step, else None.

    Example:
        >>> f = comm_bound_finding(CommBound(comm_wait_fraction=0.42, comm_wait_ms=210.0,
        ...     comm_ms_per_step=215.0, overlap_fraction=0.02, step_ms=500.0, world_size=2,
        ...     iterations=24, fit_s=15.0, gradient_bytes=134_217_728))
        >>> (f.id, f.severity, f.figures["wall_fraction"])
        ('comm-bound', 'warning', 0.336)
        >>> comm_bound_finding(CommBound(0.1, 0.5, 1.0, 0.5, 5.0, world_size=2)) is None
        True
    """
    share = state.comm_wait_fraction
    if state.world_size <= 1 or share < INFO_SHARE:
        return None
    wall = state.wall_fraction
    size = (
        f" of {_mib(state.gradient_bytes)} of gradients" if state.gradient_bytes is not None else ""
    )
    least = "the least" if not state.samples else f"the least of {state.samples} sampled steps"
    typical = "" if state.typical_wait_ms is None else f"; {state.typical_wait_ms:.1f} ms typical"
    message = (
        f"communication-bound: on rank {state.rank} the backward waits for the gradient "
        f"all-reduce{size} across {state.world_size} ranks after its last gradient at least "
        f"{state.comm_wait_ms:.1f} ms a step ({least}, where no other rank was waited for"
        f"{typical}), {share:.0%} of the {state.step_ms:.1f} ms step"
        + ("" if wall is None else f" ({wall:.0%} of the wall time)")
        + f"; the all-reduce takes {state.comm_ms_per_step:.1f} ms, "
        f"{state.overlap_fraction:.0%} of it hidden behind the backward compute "
        f"(from {state.source})"
    )
    fixes, done = _fixes(state)
    fix = "; ".join(f"({i}) {text}" for i, text in enumerate(fixes, start=1))
    if done:
        fix += f" (already set: {', '.join(done)})"
    return Finding(
        "comm",
        "comm-bound",
        message,
        location="the gradient all-reduce (DDP)",
        figures={
            "wall_fraction": None if wall is None else round(wall, 4),
            "comm_wait_fraction": round(share, 4),
            "comm_wait_ms": round(state.comm_wait_ms, 4),
            "comm_ms_per_step": round(state.comm_ms_per_step, 4),
            "overlap_fraction": round(state.overlap_fraction, 4),
            "step_ms": round(state.step_ms, 4),
            "gradient_bytes": state.gradient_bytes,
            "rank": state.rank,
            "warning_share": WARNING_SHARE,
            "info_share": INFO_SHARE,
        },
        severity="warning" if share >= WARNING_SHARE else "info",
        fix=fix,
    )
