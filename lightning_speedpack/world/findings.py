"""The world's figures as findings: the straggler, stalls, uneven or repeated ranks, missing ranks.

Plain functions over ``figures["world"]`` (:func:`~lightning_speedpack.world.engine.world_figures`).
Each finding names the rank and the cause, its share of the wall time (``wall_fraction``, what
the report orders by) and the setting to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_speedpack.core.findings import Finding, Severity
from lightning_speedpack.world.engine import CPU_WAIT, IN_ALL_REDUCE
from lightning_speedpack.world.same_batches import same_batches_finding
from lightning_speedpack.world.stalls import STALL_FACTOR

__all__ = [
    "COMPONENT",
    "comm_bound_in_world",
    "imbalance_finding",
    "missing_finding",
    "stalls_finding",
    "straggler_finding",
    "straggler_severity",
    "world_findings",
]

COMPONENT = "world"

_FIXES = {
    "data wait": (
        "make rank {rank}'s batches as quick to load as the others': more DataLoader workers "
        "(`num_workers`), its shard on fast local storage or in memory (CachedDataset), and "
        "check what differs on node {node} (disk, network filesystem, other jobs)"
    ),
    "training step": (
        "find what makes rank {rank}'s step longer: inputs of uneven size per rank (bucket by "
        "sequence length or image size), work done only on that rank inside the step (`if "
        "self.global_rank == ...`), or a slower device or host on node {node}"
    ),
    "callbacks": (
        "make the hooks of {callback} cheaper on rank {rank} (its work every N steps, or off the "
        "training thread): every rank waits for them in the next all-reduce"
    ),
    CPU_WAIT: (
        "free cores for rank {rank} on node {node}: other processes on that host, more threads "
        "than cores (`torch.set_num_threads`, `OMP_NUM_THREADS`, DataLoader workers per rank) or "
        "a CPU quota; its code is not slower than the others'"
    ),
}
_MOVING_FIX = (
    "balance the work per batch across ranks: bucket samples by size (sequence length, image "
    "size) so every rank's batch costs alike, cache the costly decode (CachedDataset), or add "
    "DataLoader workers so slow batches are ready in time"
)
_STALL_FIXES = {
    "data wait": (
        "find what rank {rank}'s loader waits on in those batches (a network filesystem, a cold "
        "cache, one slow file or shard on node {node}); DataLoader workers with batches in hand "
        "(`num_workers`, `prefetch_factor`) or the decoded samples cached (CachedDataset) ride "
        "over a slow read"
    ),
    "training step": (
        "find what rank {rank} does in those batches that the others do not: work under `if "
        "self.global_rank == ...` or in a callback that runs on one rank (a plot, a file written, "
        "a metric computed every N batches), or Python's garbage collector (`gc.freeze()` after "
        "setup); do it at the epoch's end, on every rank, or off the training thread"
    ),
    "callbacks": (
        "make the hooks of {callback} cheap on rank {rank} in those batches: do its work every N "
        "steps at the epoch's end, off the training thread, or on every rank alike (a "
        "`rank_zero_only` plot or sample written in the loop holds every other rank in the "
        "next all-reduce)"
    ),
    CPU_WAIT: (
        "free cores for rank {rank} on node {node}: other processes on that host took its CPU in "
        "those batches (its code is not slower than the others')"
    ),
}
_IMBALANCE_FIX = (
    "give every rank the same batch size and number of batches: a `DistributedSampler` "
    "(Lightning adds one unless `use_distributed_sampler=False` or the loader has its own "
    "sampler), `drop_last=True` on a dataset that does not divide evenly, and an "
    "IterableDataset sharded by `global_rank` into equal parts"
)


def _where(rank: int, node: Any, host: Any) -> str:
    parts = [f"rank {rank}"]
    if node is not None:
        parts.append(f"node {node}")
    if host:
        parts.append(str(host))
    return ", ".join(parts)


def _label(rank: int, node: Any, host: Any) -> str:
    # "rank 1 (node 0, gpu7)": the rank a finding's message opens with
    label = _where(rank, node, host).replace(f"rank {rank}, ", f"rank {rank} (", 1)
    return f"{label})" if "(" in label else label


def _the_others(others: int) -> tuple[str, str, str]:
    # (who waited, whose, " each (mean)" or "") for the ranks that waited
    if others == 1:
        return "the other rank", "its", ""
    return f"the other {others} ranks", "their", " each (mean)"


def straggler_finding(straggler: Mapping[str, Any]) -> Finding:
    """The ``world/straggler`` warning (see :class:`~lightning_speedpack.world.engine.Straggler`).

    Example:
        >>> f = straggler_finding({"rank": 1, "node": 0, "host": "gpu7", "own_ms": 40.0,
        ...     "others_ms": 5.0, "excess_ms": 35.0, "part": "data wait", "part_ms": 37.0,
        ...     "part_others_ms": 2.5, "callback": None, "waited_ms": 34.0, "waited_s": 10.1,
        ...     "waited_step_fraction": 0.92, "wall_fraction": 0.8, "others": 1, "moving": None})
        >>> print(f.message)
        rank 1 (node 0, gpu7) is the straggler: its own time is 40.0 ms a step against 5.0 ms \
on the other rank (+35.0 ms), mostly its data wait (37.0 ms a step against 2.5 ms); the other \
rank waited 10.1 s for it in the gradient all-reduce, 92% of its steps (80% of the wall time)
    """
    rank = int(straggler["rank"])
    node, host = straggler.get("node"), straggler.get("host")
    who, its, each = _the_others(int(straggler.get("others") or 1))
    waited = (
        f"{who} waited {straggler['waited_s']:.1f} s{each} for it "
        f"{straggler.get('waited_in') or IN_ALL_REDUCE}, "
        f"{straggler['waited_step_fraction']:.0%} of {its} steps "
        f"({straggler['wall_fraction']:.0%} of the wall time)"
    )
    label = _label(rank, node, host)
    moving = straggler.get("moving")
    figures = {
        "wall_fraction": straggler["wall_fraction"],
        "rank": rank,
        "node": node,
        "host": host,
        "part": straggler["part"],
        "excess_ms": straggler["excess_ms"],
        "waited_s": straggler["waited_s"],
        "waited_step_fraction": straggler["waited_step_fraction"],
    }
    if moving:
        epochs = "; ".join(f"epoch {e}: rank {r}" for e, r in moving[:8])
        more = f"; ... ({len(moving)} epochs)" if len(moving) > 8 else ""
        figures["slowest_by_epoch"] = [list(m) for m in moving]
        return Finding(
            COMPONENT,
            "straggler",
            f"the slowest rank changes from epoch to epoch ({epochs}{more}): it is the data, not "
            f"one slow host -- some batches cost more to load or compute than others and each "
            f"epoch deals them out anew; the ranks waited {straggler['waited_s']:.1f} s each for "
            f"the slowest in the gradient all-reduce ({straggler['wall_fraction']:.0%} of the wall "
            "time)",
            location="every rank, by epoch",
            figures=figures,
            severity=straggler_severity(straggler),
            fix=_MOVING_FIX,
        )
    part = straggler["part"]
    detail = (
        f"the hooks of {straggler['callback']}"
        if part == "callbacks" and straggler.get("callback")
        else f"its {part}"
    )
    starved = (
        ", ready to run with every core busy -- the host, not the job's code"
        if part == CPU_WAIT
        else ""
    )
    message = (
        f"{label} is the straggler: its own time is {straggler['own_ms']:.1f} ms a step against "
        f"{straggler['others_ms']:.1f} ms on {who} (+{straggler['excess_ms']:.1f} ms), mostly "
        f"{detail} ({straggler['part_ms']:.1f} ms a step against "
        f"{straggler['part_others_ms']:.1f} ms{starved}); {waited}"
    )
    fix = _FIXES[part].format(
        rank=rank, node=node if node is not None else "?", callback=straggler.get("callback")
    )
    return Finding(
        COMPONENT,
        "straggler",
        message,
        location=_where(rank, node, host),
        figures=figures,
        severity=straggler_severity(straggler),
        fix=fix,
    )


def straggler_severity(straggler: Mapping[str, Any]) -> Severity:
    """A warning; an error when the other ranks waited more than they computed (as data-bound).

    An info when the straggler mostly waited for a CPU: its host was busy (``cpu-threads``
    warns where the job's own threads are too many).

    Example:
        >>> straggler_severity({"waited_step_fraction": 0.92})
        'error'
        >>> straggler_severity({"waited_step_fraction": 0.92, "part": CPU_WAIT})
        'info'
    """
    if straggler.get("part") == CPU_WAIT:
        return "info"
    return "error" if float(straggler.get("waited_step_fraction") or 0.0) > 0.5 else "warning"


def stalls_finding(stalls: Mapping[str, Any]) -> Finding:
    """The ``world/stalls`` warning (see :class:`~lightning_speedpack.world.stalls.Stalls`).

    An error when the others waited more than half their training loop; an info when the
    stalling rank's wait for a CPU explains them (its host, as for a straggler).

    Example:
        >>> f = stalls_finding({"rank": 1, "node": 0, "host": "gpu7", "stalls": 4,
        ...     "batches": 61, "typical_ms": 5.2, "longest": [[151.0, 0, 8, 0.3],
        ...     [150.4, 1, 24, 0.2]], "excess_s": 0.58, "part": "training step",
        ...     "waited_s": 0.57, "loop_fraction": 0.55, "others": 1})
        >>> print(f.message)
        rank 1 (node 0, gpu7) stalls now and then in its training step: 4 of its 61 batches took \
over 4x its typical own time (5.2 ms, its waits for other ranks left out): 151.0 ms (epoch 0, \
batch 8), 150.4 ms (epoch 1, batch 24); the other rank waited 0.57 s for them in the gradient \
all-reduce, 55% of its training loop
        >>> f.severity
        'error'
    """
    rank = int(stalls["rank"])
    node, host = stalls.get("node"), stalls.get("host")
    who, its, each = _the_others(int(stalls.get("others") or 1))
    label = _label(rank, node, host)
    longest = list(stalls.get("longest") or [])[:4]
    listed = ", ".join(f"{ms:.1f} ms (epoch {int(e)}, batch {int(b)})" for ms, e, b, _ in longest)
    part = str(stalls["part"])
    where = f" in its {part}"
    if part == CPU_WAIT:
        where = ", ready to run with every core busy (the host, not the job's code)"
    elif part == "callbacks" and stalls.get("callback"):
        where = f" in the hooks of {stalls['callback']}"
    fraction = float(stalls["loop_fraction"])
    message = (
        f"{label} stalls now and then{where}: {stalls['stalls']} of its {stalls['batches']} "
        f"batches took over {STALL_FACTOR:.0f}x its typical own time "
        f"({stalls['typical_ms']:.1f} ms, its waits for other ranks left out)"
        f"{f': {listed}' if listed else ''}; "
        f"{who} waited {stalls['waited_s']:.2f} s{each} for them "
        f"{stalls.get('waited_in') or IN_ALL_REDUCE}, {fraction:.0%} of {its} training loop"
    )
    severity: Severity = "info" if part == CPU_WAIT else ("error" if fraction > 0.5 else "warning")
    return Finding(
        COMPONENT,
        "stalls",
        message,
        location=_where(rank, node, host),
        figures={
            "wall_fraction": fraction,
            "rank": rank,
            "node": node,
            "host": host,
            "part": part,
            "callback": stalls.get("callback"),
            "stalls": stalls["stalls"],
            "excess_s": stalls["excess_s"],
            "waited_s": stalls["waited_s"],
            "longest": [list(x) for x in longest],
        },
        severity=severity,
        fix=_STALL_FIXES[part].format(
            rank=rank,
            node=node if node is not None else "?",
            callback=stalls.get("callback") or "its callbacks",
        ),
    )


def _size(sizes: Sequence[Any]) -> str:
    low, high = (sizes[0], sizes[1]) if len(sizes) >= 2 else (None, None)
    if low is None:
        return ""
    return f", batch size {low}" if low == high else f", batch size {low}-{high}"


def imbalance_finding(
    imbalance: Mapping[str, Any], straggler: Mapping[str, Any] | None = None
) -> Finding:
    """The ``world/rank-imbalance`` warning: ranks given different amounts of work.

    Example:
        >>> f = imbalance_finding({"samples": {0: 512, 1: 1024}, "batches": {0: 64, 1: 64},
        ...                        "batch_sizes": {0: [8, 8], 1: [16, 16]}, "ratio": 2.0})
        >>> print(f.message)
        the ranks trained on different amounts of data (2.00x from the fewest samples to the \
most): rank 0: 512 samples in 64 batches, batch size 8; rank 1: 1,024 samples in 64 batches, \
batch size 16
    """
    samples = {int(k): int(v) for k, v in imbalance["samples"].items()}
    batches = {int(k): int(v) for k, v in imbalance["batches"].items()}
    sizes = {int(k): v for k, v in (imbalance.get("batch_sizes") or {}).items()}
    order = sorted(samples, key=lambda r: (samples[r], r))
    shown = order if len(order) <= 6 else [*order[:3], *order[-3:]]
    listed = "; ".join(
        f"rank {r}: {samples[r]:,} samples in {batches.get(r, 0):,} batches"
        + _size(sizes.get(r, []))
        for r in sorted(shown)
    )
    if len(shown) < len(order):
        listed += f" (fewest and most of {len(order)} ranks)"
    ratio = imbalance["ratio"]
    ratio_text = f"{ratio:.2f}x" if ratio != float("inf") else "some ranks none"
    share = 0.0
    if straggler is not None and int(straggler["rank"]) == order[-1]:
        share = float(straggler.get("wall_fraction") or 0.0)  # the rank with most work is slow
    message = (
        f"the ranks trained on different amounts of data ({ratio_text} from the fewest samples "
        f"to the most): {listed}"
    )
    uneven = imbalance.get("uneven_epochs") or {}
    if uneven:
        epoch, counts = next(iter(uneven.items()))
        per_rank = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
        dealt = (
            f"{len(uneven)} epoch(s) dealt the ranks different batch counts (epoch {epoch}: "
            f"{per_rank} batches): a rank that runs out first leaves the others' collectives "
            "waiting, or hangs them"
        )
        even_totals = len(set(batches.values())) == 1 and ratio != float("inf") and ratio < 1.01
        message = (
            f"the ranks were given different amounts of work: {dealt}; the run's totals agree "
            f"(max_steps or the last epoch evened them): {listed}"
            if even_totals
            else f"{message}; {dealt}"
        )
    return Finding(
        COMPONENT,
        "rank-imbalance",
        message,
        location=f"rank {order[-1]} (most), rank {order[0]} (fewest)",
        figures={"wall_fraction": share, "samples_ratio": ratio},
        fix=_IMBALANCE_FIX,
    )


def missing_finding(missing: Sequence[str], world_size: int) -> Finding:
    """``world/ranks-missing``: ranks whose figures did not reach rank 0 (died, hung, slow).

    Example:
        >>> missing_finding(["rank 3: no answer in 30 s"], 4).message
        'rank 3: no answer in 30 s; the world table has 3 of 4 ranks'
    """
    lines = "; ".join(missing)
    return Finding(
        COMPONENT,
        "ranks-missing",
        f"{lines}; the world table has {world_size - len(missing)} of {world_size} ranks",
        figures={"missing": len(missing)},
        fix="look at the missing ranks' own logs (a rank that raised, was killed, or hangs in a "
        "DataLoader worker); raise LIGHTNING_SPEEDPACK_COLLECTIVE_TIMEOUT if it was only late",
    )


def world_findings(world: Mapping[str, Any]) -> list[Finding]:
    """The straggler, stalls, imbalance, ranks that repeated each other, missing ranks, in order."""
    out = []
    straggler = world.get("straggler")
    if straggler:
        out.append(straggler_finding(straggler))
    stalls = world.get("stalls")
    if stalls:
        out.append(stalls_finding(stalls))
    imbalance = world.get("imbalance")
    if imbalance:
        out.append(imbalance_finding(imbalance, straggler))
    same = world.get("same_batches")
    if same:
        out.append(same_batches_finding(same))
    missing = world.get("missing") or []
    if missing:
        out.append(missing_finding(missing, int(world.get("world_size") or 0)))
    return out


def comm_bound_in_world(finding: Finding, world: Mapping[str, Any]) -> Finding | None:
    """Rank 0's ``comm/comm-bound`` judged on every rank: on the one that waited least, or None.

    A rank's wait after its last gradient is the all-reduce itself plus any wait for a slower
    rank; the rank that waited least waited for nobody (as ``wait_ms`` in the world rows
    counts it). The job is communication-bound only where that rank's wait passes the finding's
    own thresholds (``figures["info_share"]``/``["warning_share"]``); with a straggler the wait
    is its (one cause, one first warning): kept, as an info, only where the least-waiting rank
    passes the warning share on its own. The share is ``comm_wait_least_fraction`` (the least
    sampled iteration's), else ``comm_wait_fraction``; unchanged where some rank has neither.

    Example:
        >>> f = Finding("comm", "comm-bound", "communication-bound: ...", severity="warning",
        ...             figures={"comm_wait_fraction": 0.8, "wall_fraction": 0.7,
        ...                      "warning_share": 0.3, "info_share": 0.25})
        >>> rows = [{"rank": 0, "comm_wait_fraction": 0.8}, {"rank": 1, "comm_wait_fraction": 0.02}]
        >>> comm_bound_in_world(f, {"ranks": rows}) is None  # rank 0 waited for rank 1
        True
        >>> rows[1]["comm_wait_fraction"] = 0.4
        >>> g = comm_bound_in_world(f, {"ranks": rows})
        >>> g.severity, g.figures["comm_wait_fraction"], g.message[:39]
        ('warning', 0.4, 'on every rank (rank 0: 80%, rank 1: 40%')
    """
    rows = [r for r in world.get("ranks") or [] if "rank" in r]
    # the statistic the finding judged (the least sampled iteration's wait), else the mean's
    least_key = "comm_wait_least_fraction"
    key = least_key if all(least_key in r for r in rows) else "comm_wait_fraction"
    shares = {int(r["rank"]): r.get(key) for r in rows}
    if len(shares) < 2 or not all(isinstance(v, (int, float)) for v in shares.values()):
        return finding
    least = min(shares, key=lambda r: float(shares[r]))
    low = float(shares[least])
    warning = float(finding.figures.get("warning_share") or 1.0)
    info = float(finding.figures.get("info_share") or warning)
    straggler = world.get("straggler")
    if low < (warning if straggler else info):
        return None
    severity: Severity = "warning" if low >= warning and not straggler else "info"
    listed = ", ".join(f"rank {r}: {float(v):.0%}" for r, v in sorted(shares.items()))
    own = float(finding.figures.get("comm_wait_fraction") or 0.0)
    wall = finding.figures.get("wall_fraction")
    scaled = None if not isinstance(wall, (int, float)) or own <= 0 else wall * min(1.0, low / own)
    besides = f"; besides rank {straggler['rank']}, the straggler" if straggler else ""
    return Finding(
        finding.component,
        finding.id,
        f"on every rank ({listed} of the step waiting for the gradient all-reduce; rank "
        f"{least}, which waited least, waited for nobody{besides}): {finding.message}",
        location=finding.location,
        figures={
            **finding.figures,
            "comm_wait_fraction": round(low, 4),
            "wall_fraction": None if scaled is None else round(scaled, 4),
            "comm_wait_fraction_by_rank": {str(r): v for r, v in sorted(shares.items())},
            "least_waiting_rank": least,
        },
        severity=severity,
        fix=finding.fix,
    )
