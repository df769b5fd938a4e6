"""The comm tool's findings, from what the callback measured: plain functions, no Lightning."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_speedpack.comm.ddp_stats import DDPSample, steady
from lightning_speedpack.comm.sync_dist import SyncSite
from lightning_speedpack.core.findings import Finding

__all__ = [
    "EVERY_STEP_SHARE",
    "UnusedParameters",
    "find_unused_findings",
    "sync_dist_findings",
]

COMPONENT = "comm"
#: A line that reduced values in at least this share of the training steps counts as "every step".
EVERY_STEP_SHARE = 0.5
#: Below this share of the step time, a per-step sync_dist line is reported as info only.
NEGLIGIBLE_SHARE = 0.01

SYNC_DIST_FIX = (
    "log it with `on_step=False, on_epoch=True` (Lightning then reduces it once per epoch), or "
    "update a torchmetrics metric object in the step and log the object (it reduces its own "
    "state once, when computed); keep `sync_dist=True` on a per-step value only if you need "
    "every rank's value at every step"
)


def sync_dist_findings(
    sites: Sequence[SyncSite], steps: int, step_ms: float | None, world_size: int
) -> list[Finding]:
    """A ``sync-dist-every-step`` finding per line that reduced values in most training steps.

    ``steps`` is the number of training batches the recorder saw; ``step_ms`` the mean wall
    time of a training step (None: not measured). Nothing on one process, where Lightning
    reduces nothing.

    Example:
        >>> site = SyncSite("train.py", 12, calls=60, steps=10, seconds=0.05)
        >>> [f] = sync_dist_findings([site], steps=10, step_ms=10.0, world_size=2)
        >>> (f.id, f.location, f.figures["values_per_step"], f.figures["sync_ms_per_step"])
        ('sync-dist-every-step', 'train.py:12', 6.0, 5.0)
        >>> sync_dist_findings([site], steps=10, step_ms=10.0, world_size=1)
        []
    """
    if world_size <= 1 or steps <= 0:
        return []
    out = []
    for site in sorted(sites, key=lambda s: -s.seconds):
        if site.steps < EVERY_STEP_SHARE * steps:
            continue
        ms = site.seconds * 1e3 / steps
        per_step = site.calls / site.steps
        share = ms / step_ms if step_ms else None
        figures: dict[str, float | int | None] = {
            "values_per_step": round(per_step, 3),
            "steps_with_sync": site.steps,
            "training_steps": steps,
            "sync_ms_per_step": round(ms, 4),
            "sync_share_of_step": None if share is None else round(share, 4),
        }
        code = site.code()
        what = f"`{code}`" if code else "a `self.log(..., sync_dist=True)` call"
        cost = f"{ms:.2f} ms per step" + ("" if share is None else f" ({share:.0%} of the step)")
        values = "a value" if per_step == 1 else f"{per_step:.3g} values"
        out.append(
            Finding(
                COMPONENT,
                "sync-dist-every-step",
                f"{what} reduces {values} across the {world_size} ranks in {site.steps} of "
                f"{steps} training steps: Lightning runs a barrier and an all-reduce per value "
                f"inside the call, so every rank waits there for the slowest; measured: "
                f"{cost}, the wall time inside those calls",
                location=site.location,
                figures=figures,
                severity="warning" if share is None or share >= NEGLIGIBLE_SHARE else "info",
                fix=SYNC_DIST_FIX,
            )
        )
    return out


@dataclass(frozen=True)
class UnusedParameters:
    """What the callback read about DDP's search for unused parameters during one fit."""

    find_unused_parameters: bool
    static_graph: bool
    samples: Sequence[DDPSample]
    batches: int  # training batches of the fit
    #: names of the parameters without a gradient after the last step (read once, at the end)
    names_without_grad: Sequence[str] = ()
    backward_compute_ms: float | None = None
    comm_ms_per_step: float | None = None
    #: the training step optimizes by hand (``automatic_optimization=False``)
    manual_optimization: bool = False


def find_unused_findings(state: UnusedParameters) -> list[Finding]:
    """``find-unused-parameters``: a needless search (warning) or unused layers (info).

    Only where DDP searches the graph every step (``find_unused_parameters=True`` without
    ``static_graph``) and sampled at least one steady iteration.

    Example:
        >>> clean = [DDPSample(i, 1, 1, 1, 1, unused_parameter_bytes=0) for i in (1, 2, 3)]
        >>> [(f.id, f.severity) for f in find_unused_findings(UnusedParameters(True, False,
        ...                                                     clean, batches=3))]
        [('find-unused-parameters', 'warning')]
        >>> unused = [DDPSample(2, 1, 1, 1, 1, unused_parameter_bytes=288)]
        >>> [(f.severity, f.figures["unused_parameter_bytes"]) for f in find_unused_findings(
        ...     UnusedParameters(True, False, unused, batches=2, names_without_grad=["u.w"]))]
        [('info', 288)]
    """
    if not state.find_unused_parameters or state.static_graph:
        return []
    kept = [s for s in steady(state.samples) if s.unused_parameter_bytes is not None]
    if not kept:
        return []
    unused = max(s.unused_parameter_bytes or 0 for s in kept)
    sampled = len(kept)
    if unused == 0:
        return [_needless_search(state, sampled)]
    with_unused = sum(bool(s.unused_parameter_bytes) for s in kept)
    if state.manual_optimization:
        return [_parts_per_backward(sampled, unused, with_unused)]
    return [_unused_layers(state, sampled, unused, with_unused)]


def _needless_search(state: UnusedParameters, sampled: int) -> Finding:
    parts = []
    if state.backward_compute_ms is not None:
        parts.append(f"the search in its backward compute ({state.backward_compute_ms:.2f} ms")
    if state.comm_ms_per_step is not None:
        parts.append(f"the extra all-reduce in its communication ({state.comm_ms_per_step:.2f} ms")
    held = ""
    if parts:
        held = "; DDP's timings hold " + " per step) and ".join(parts)
        held += " per step) without separating them"
    return Finding(
        COMPONENT,
        "find-unused-parameters",
        f"`find_unused_parameters=True`, but no parameter went without a gradient in any of the "
        f"{sampled} steps DDP sampled (of {state.batches} training batches): every step DDP "
        "searches the "
        f"autograd graph after the forward and all-reduces a map of the used parameters, for "
        f"nothing. Cost not measured in this run{held}",
        location="Trainer(strategy)",
        figures={
            "find_unused_parameters": True,
            "sampled_steps": sampled,
            "training_batches": state.batches,
            "unused_parameter_bytes": 0,
        },
        severity="warning",
        fix=(
            'use `strategy="ddp"` (Lightning\'s default is find_unused_parameters=False) or '
            "`DDPStrategy(find_unused_parameters=False)` instead of "
            '"ddp_find_unused_parameters_true"; should a rare step leave a parameter without a '
            "gradient, DDP then stops with an error that names it"
        ),
    )


def _bytes(n: int) -> str:
    """A byte count for a message.

    Example:
        >>> _bytes(288), _bytes(1_050_624)
        ('288 bytes', '1.0 MiB (1,050,624 bytes)')
    """
    if n < 10_000:
        return f"{n} bytes"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit} ({n:,} bytes)"
    return f"{n} bytes"  # pragma: no cover - unreachable


def _modules(names: Sequence[str]) -> list[str]:
    """The modules that own these parameters, in order (``"unused.weight"`` -> ``"unused"``).

    Example:
        >>> _modules(["unused.weight", "unused.bias", "head.0.weight", "scale"])
        ['unused', 'head.0', 'scale']
    """
    return list(dict.fromkeys(name.rpartition(".")[0] or name for name in names))


def _parts_per_backward(sampled: int, unused: int, with_unused: int) -> Finding:
    # A step that optimizes by hand often runs a backward per part of the model (a GAN's
    # generator, then its discriminator): each leaves the other part without a gradient, so
    # every layer is "unused" in some backward and none can be removed. The names read after
    # the last step are then the last backward's other part, not layers the forward skips.
    return Finding(
        COMPONENT,
        "find-unused-parameters",
        f"{_bytes(unused)} of parameters got no gradient in {with_unused} of the {sampled} "
        "iterations DDP sampled (a forward and its backward each): the training step optimizes "
        "by hand (`automatic_optimization=False`), where a backward over one part of the model "
        "(a GAN's generator, then its discriminator) leaves the other parts without a gradient: "
        "`find_unused_parameters=True` is needed for that, and costs a search of the autograd "
        "graph and an extra all-reduce every iteration",
        location="training_step",
        figures={
            "find_unused_parameters": True,
            "manual_optimization": True,
            "sampled_steps": sampled,
            "steps_with_unused": with_unused,
            "unused_parameter_bytes": unused,
        },
        severity="info",
        fix=(
            "keep `find_unused_parameters=True` while a step runs a backward per part of the "
            "model; a layer that no backward reaches, if any, can go"
        ),
    )


def _unused_layers(state: UnusedParameters, sampled: int, unused: int, with_unused: int) -> Finding:
    names = list(state.names_without_grad)
    named = ""
    if names:
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        named = f" ({len(names)} tensors without a gradient after the last step: {shown})"
    return Finding(
        COMPONENT,
        "find-unused-parameters",
        f"{_bytes(unused)} of parameters got no gradient in {with_unused} of the {sampled} steps "
        f"DDP sampled{named}: `find_unused_parameters=True` is needed for them, and costs a "
        "search of the autograd graph and an extra all-reduce every step",
        location=", ".join(_modules(names)) or None,
        figures={
            "find_unused_parameters": True,
            "sampled_steps": sampled,
            "steps_with_unused": with_unused,
            "unused_parameter_bytes": unused,
            "unused_parameter_tensors": len(names) if names else None,
        },
        severity="info",
        fix=(
            "remove the layers the forward never uses; if the same parameters are unused in "
            "every step, `DDPStrategy(static_graph=True)` finds them once instead of every step"
        ),
    )
