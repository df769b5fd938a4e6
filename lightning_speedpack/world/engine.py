"""Every rank side by side: a row per rank, the spread, and who the others wait for.

Plain functions over the payloads the ranks sent (:mod:`lightning_speedpack.world.payload`);
no process group, no Lightning. The model of a DDP step behind them:

- the ranks run in lock step: each batch ends on every rank at about the same time, because
  every rank waits in the gradient all-reduce (inside ``backward``) for the slowest one;
- a rank's *cycle* is the time from one batch's end to the next one's (its own clock);
- a rank's *wait* is what it spent in ``backward`` beyond the rank that spent least there
  (that rank arrived last and waited for nobody); when a diagnostic publishes the time spent
  waiting for the all-reduce (``comm_wait_ms``, else ``comm_ms_per_step``) on every rank, that
  is used instead, the same way; either with the time in Lightning's per-batch broadcast
  before the fetch (``start_wait_ms``), where the ranks wait for a rank 0 still busy after the
  last all-reduce;
- a rank's *own* time is its cycle less its wait: the data wait, the step's compute, the
  hooks. The rank whose own time is largest is the one the others wait for.

The straggler is named only when the evidence is plain (:data:`STRAGGLER_RATIO`,
:data:`STRAGGLER_MIN_MS`, :data:`CONFIRM_FRACTION`): a clean 2-rank run on a busy CPU has
noise, a planted 4 ms/sample is far beyond it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_speedpack.world.buckets import typical_s

__all__ = [
    "CONFIRM_FRACTION",
    "CPU_WAIT",
    "CPU_WAIT_SHARE",
    "IMBALANCE_RATIO",
    "IN_ALL_REDUCE",
    "IN_BROADCAST",
    "STRAGGLER_MIN_MS",
    "STRAGGLER_RATIO",
    "Imbalance",
    "Straggler",
    "find_imbalance",
    "find_straggler",
    "kept_off_cpu",
    "mark_waiting",
    "mark_waiting_for",
    "median",
    "spread",
    "top_callback",
    "typically_waited",
    "waited_where",
    "world_rows",
]

#: The straggler's own time must be at least this many times the other ranks' (median) ...
STRAGGLER_RATIO = 1.5
#: ... and exceed it by at least this many ms a step ...
STRAGGLER_MIN_MS = 2.0
#: ... and the others must wait at least this fraction of that excess (the confirmation).
CONFIRM_FRACTION = 0.5
#: The straggler's part when its extra time was spent ready to run with no CPU free ...
CPU_WAIT = "wait for a CPU"
#: ... that is, when its extra wait for a CPU is at least this fraction of its excess.
CPU_WAIT_SHARE = 0.5
#: Ranks whose samples differ by more than this fraction are given uneven work.
IMBALANCE_RATIO = 0.02
#: Where the waiting ranks waited, as the findings say it.
IN_ALL_REDUCE = "in the gradient all-reduce"
IN_BROADCAST = "before each batch (Lightning's broadcast from rank 0)"

#: The keys each row carries from the engine (the rest are the rank's published figures).
ROW_KEYS = (
    "rank",
    "node",
    "host",
    "local_rank",
    "wall_s",
    "samples",
    "samples_per_sec",
    "batches",
    "batch_size",
    "batch_size_min",
    "batch_size_max",
    "cycle_ms",
    "data_wait_ms",
    "step_wall_ms",
    "backward_ms",
    "start_wait_ms",
    "wait_typical_ms",
    "wait_ms",
    "own_ms",
    "data_wait_fraction",
    "wait_fraction",
    "callbacks_s",
    "checkpoint_s",
    "cpu_wait_ms",
)
#: Published figures that are the world's on every rank, replaced by the rank's own.
_WORLD_ALIKE = ("samples_per_sec", "data_wait_fraction", "step_time_ms")
#: Published figures of the same name and meaning as the engine's (counted the same way).
_SAME = ("batches", "batch_size")
_ENGINE_KEYS = frozenset(ROW_KEYS) - frozenset(_SAME)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _per_batch_ms(seconds: Any, batches: int) -> float:
    value = _number(seconds)
    return 1000.0 * value / batches if value is not None and batches else 0.0


def world_rows(payloads: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A row per rank (lowest rank first): the engine's columns, then every published figure.

    Example:
        >>> rows = world_rows({0: {"rank": 0, "wall_s": 2.0, "samples": 64,
        ...                        "clock": {"batches": 8, "cycle_ms": 40.0, "gap_ms": 2.0,
        ...                                  "backward_ms": 36.0}}})
        >>> rows[0]["samples_per_sec"], rows[0]["wait_ms"], rows[0]["own_ms"]
        (32.0, 0.0, 40.0)
    """
    rows = []
    for rank in sorted(payloads):
        payload = payloads[rank]
        clock = payload.get("clock") or {}
        figures = payload.get("figures") or {}
        batches = int(_number(clock.get("batches")) or 0)
        samples = int(_number(payload.get("samples")) or 0)
        wall = _number(payload.get("wall_s")) or 0.0
        cycle = _number(clock.get("cycle_ms")) or 0.0
        data = _data_ms(figures, clock)
        row: dict[str, Any] = {}
        for key, value in figures.items():
            if key in _WORLD_ALIKE:
                continue  # the world's on every rank: the rank's own below
            # A published figure named like one of the engine's keeps its value, renamed.
            row[f"published/{key}" if key in _ENGINE_KEYS else key] = value
        row.update(
            rank=int(payload.get("rank", rank)),
            node=payload.get("node"),
            host=payload.get("host"),
            local_rank=payload.get("local_rank"),
            wall_s=round(wall, 4),
            samples=samples,
            samples_per_sec=round(samples / wall, 3) if wall > 0 else 0.0,
            batches=batches,
            batch_size=round(samples / batches, 3) if batches else None,
            batch_size_min=clock.get("batch_size_min"),
            batch_size_max=clock.get("batch_size_max"),
            cycle_ms=round(cycle, 3),
            data_wait_ms=round(data, 3),
            step_wall_ms=round(max(cycle - data, 0.0), 3),
            backward_ms=round(_number(clock.get("backward_ms")) or 0.0, 3),
            start_wait_ms=round(_number(clock.get("start_ms")) or 0.0, 3),
            wait_typical_ms=_typical_ms((clock.get("tally") or {}).get("waits")),
            data_wait_fraction=round(data / cycle, 4) if cycle > 0 else None,
            callbacks_s=_number(figures.get("wall_time/parts/callbacks")),
            checkpoint_s=_number(figures.get("wall_time/parts/checkpoint")),
            cpu_wait_ms=_cpu_wait_ms(payload, batches),
        )
        row["step_time_ms"] = row["cycle_ms"]
        rows.append(row)
    _estimate_waits(rows)
    return rows


def _typical_ms(buckets: Any) -> float | None:
    # The rank's typical wait (its median batch's bucket), where its clock kept buckets.
    return round(1000.0 * typical_s(buckets), 3) if buckets else None


def _cpu_wait_ms(payload: Mapping[str, Any], batches: int) -> float | None:
    # The fit thread's time ready to run with no CPU free (core.cpu_wait), per batch.
    seconds = _number(payload.get("cpu_wait_s"))
    return round(1000.0 * seconds / batches, 3) if seconds is not None and batches else None


def _data_ms(figures: Mapping[str, Any], clock: Mapping[str, Any]) -> float:
    # StepTimeline's fetch and copy when it ran on this rank (the fetch alone), else the gap
    # between batches on the recorder's own clock (the fetch and the hooks between batches),
    # less its part before the fetch (Lightning's broadcast: a wait, not data).
    fetch = _number(figures.get("phase_ms/data_wait"))
    if fetch is not None:
        return fetch + (_number(figures.get("phase_ms/batch_transfer")) or 0.0)
    gap = _number(clock.get("gap_ms")) or 0.0
    return max(gap - (_number(clock.get("start_ms")) or 0.0), 0.0)


def _estimate_waits(rows: list[dict[str, Any]]) -> None:
    # The comm diagnostic's time waiting for the all-reduce, when every rank measured it;
    # else the time in backward (where DDP waits for the all-reduce) above the least. Either
    # with the wait before the fetch (Lightning's broadcast from rank 0 at each batch's start,
    # where the others wait for a rank 0 still busy after the last all-reduce).
    starts = [float(r.get("start_wait_ms") or 0.0) for r in rows]
    waits = _above_min([float(r["backward_ms"]) + s for r, s in zip(rows, starts, strict=True)])
    for key in ("comm_wait_ms", "comm_ms_per_step"):
        comm = [_number(r.get(key)) for r in rows]
        if rows and all(c is not None for c in comm):
            waits = _above_min([float(c or 0.0) + s for c, s in zip(comm, starts, strict=True)])
            break
    for row, wait in zip(rows, waits, strict=True):
        cycle = float(row["cycle_ms"])
        wait = min(wait, cycle)
        row["wait_ms"] = round(wait, 3)
        row["own_ms"] = round(cycle - wait, 3)
        row["wait_fraction"] = round(wait / cycle, 4) if cycle > 0 else None


def _above_min(values: Sequence[float]) -> list[float]:
    low = min(values) if values else 0.0
    return [v - low for v in values]


@dataclass
class Straggler:
    """The rank the others wait for, its largest part, and what the waiting cost the world."""

    rank: int
    node: Any
    host: Any
    own_ms: float  # its own time a step
    others_ms: float  # the other ranks' own time a step (median)
    excess_ms: float
    part: str  # "data wait", "training step", "callbacks", CPU_WAIT
    part_ms: float
    part_others_ms: float
    callback: str | None  # the callback whose hooks are the part, when it is "callbacks"
    waited_ms: float  # the others' wait a step (median)
    waited_s: float  # the others' wait over the run (mean per rank)
    waited_step_fraction: float  # of their steps
    wall_fraction: float  # of their wall time
    others: int
    moving: list[list[int]] | None = None  # [[epoch, slowest rank], ...] when it moves
    waited_in: str = IN_ALL_REDUCE  # where the others waited (waited_where)

    def to_dict(self) -> dict[str, Any]:
        """The straggler as plain values (for the JSON report)."""
        return asdict(self)


def waited_where(rows: Sequence[Mapping[str, Any]]) -> str:
    """Where ``rows``' ranks waited: :data:`IN_BROADCAST` when most of it was before the fetch.

    A rank 0 busy after the all-reduce (its optimizer step, its batch-end hooks) holds the
    others at the broadcast that starts Lightning's next batch, not in their backward.

    Example:
        >>> waited_where([{"wait_ms": 30.0, "start_wait_ms": 29.5}]) == IN_BROADCAST
        True
        >>> waited_where([{"wait_ms": 30.0, "start_wait_ms": 0.1}])
        'in the gradient all-reduce'
    """
    waits = [float(r.get("wait_ms") or 0.0) for r in rows]
    starts = [float(r.get("start_wait_ms") or 0.0) for r in rows]
    return IN_BROADCAST if sum(waits) > 0 and 2 * sum(starts) >= sum(waits) else IN_ALL_REDUCE


def median(values: Sequence[float]) -> float:
    """The median, 0 for no values.

    Example:
        >>> median([1.0, 5.0, 2.0]), median([])
        (2.0, 0.0)
    """
    return float(statistics.median(values)) if values else 0.0


def _parts(row: Mapping[str, Any]) -> dict[str, float]:
    batches = int(row.get("batches") or 0)
    callbacks = _per_batch_ms(row.get("callbacks_s"), batches)
    data = float(row.get("data_wait_ms") or 0.0)
    compute = float(row.get("own_ms") or 0.0) - data - callbacks
    return {"data wait": data, "training step": max(compute, 0.0), "callbacks": callbacks}


def top_callback(row: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> str | None:
    """The callback whose hooks took ``row``'s rank longest beyond the others' (median), if any.

    From the wall-time ledger's ``wall_time/callbacks/<name>`` seconds each rank published.

    Example:
        >>> top_callback({"wall_time/callbacks/Plots": 2.0, "wall_time/callbacks/Log": 0.1},
        ...              [{"wall_time/callbacks/Plots": 0.0, "wall_time/callbacks/Log": 0.1}])
        'Plots'
    """
    prefix = "wall_time/callbacks/"
    names = {k[len(prefix) :] for k in row if k.startswith(prefix)}
    best, best_excess = None, 0.0
    for name in names:
        mine = _number(row.get(prefix + name)) or 0.0
        theirs = median([_number(o.get(prefix + name)) or 0.0 for o in others])
        if mine - theirs > best_excess:
            best, best_excess = name, mine - theirs
    return best


def find_straggler(
    rows: Sequence[Mapping[str, Any]],
    *,
    ratio: float = STRAGGLER_RATIO,
    min_ms: float = STRAGGLER_MIN_MS,
    confirm: float = CONFIRM_FRACTION,
) -> Straggler | None:
    """The rank whose own time a step exceeds the others' and that they wait for, or None.

    Named only when its own time is at least ``ratio`` times the others' (median), exceeds it
    by ``min_ms`` a step or more, and the others waited at least ``confirm`` of that excess: on
    the mean, and, where every rank has DDP's sampled waits, typically (:func:`typically_waited`).
    """
    if len(rows) < 2:
        return None
    slow = max(rows, key=lambda r: float(r.get("own_ms") or 0.0))
    others = [r for r in rows if r is not slow]
    own = float(slow.get("own_ms") or 0.0)
    base = median([float(r.get("own_ms") or 0.0) for r in others])
    excess = own - base
    waited = median([float(r.get("wait_ms") or 0.0) for r in others])
    if own < ratio * base or excess < min_ms or waited < confirm * excess:
        return None
    if not typically_waited(slow, others, confirm * excess):
        return None
    mine = _parts(slow)
    theirs = {p: median([_parts(o)[p] for o in others]) for p in mine}
    part = max(mine, key=lambda p: mine[p] - theirs[p])
    starved = _cpu_starved(slow, others, excess)
    if starved is not None:  # its code did not take longer: it was kept off the CPU
        part = CPU_WAIT
        mine[part], theirs[part] = starved
    waited_s = [float(r.get("wait_ms") or 0.0) * int(r.get("batches") or 0) / 1000 for r in others]
    steps = [float(r.get("step_wall_ms") or 0.0) for r in others]
    walls = [float(r.get("wall_s") or 0.0) for r in others]
    mean_waited = statistics.fmean(waited_s)
    step_fraction = (
        statistics.fmean(
            float(r.get("wait_ms") or 0.0) / s for r, s in zip(others, steps, strict=True) if s > 0
        )
        if any(s > 0 for s in steps)
        else 0.0
    )
    wall = statistics.fmean(walls)
    return Straggler(
        rank=int(slow["rank"]),
        node=slow.get("node"),
        host=slow.get("host"),
        own_ms=round(own, 3),
        others_ms=round(base, 3),
        excess_ms=round(excess, 3),
        part=part,
        part_ms=round(mine[part], 3),
        part_others_ms=round(theirs[part], 3),
        callback=top_callback(slow, others) if part == "callbacks" else None,
        waited_ms=round(waited, 3),
        waited_s=round(mean_waited, 3),
        waited_step_fraction=round(min(step_fraction, 1.0), 4),
        wall_fraction=round(min(mean_waited / wall, 1.0), 4) if wall > 0 else 0.0,
        others=len(others),
        waited_in=waited_where(others),
    )


def typically_waited(
    slow: Mapping[str, Any], others: Sequence[Mapping[str, Any]], least_ms: float
) -> bool:
    """Whether the others' typical wait exceeds the slow rank's by ``least_ms`` or more.

    The per-batch means weigh a few long stalls of one rank (a host's hiccup on a short run) as
    much as a slowness of every step; a typical wait follows the typical step. Two are read,
    each where every rank has it, and either may show the wait:

    - ``comm_wait_median_ms``, the median of the waits DDP sampled after the last gradient
      (:class:`~lightning_speedpack.comm.CommMonitor`): exact, but the all-reduce's alone;
    - ``wait_typical_ms``, each rank's clock's median bucket of its backward and of the wait
      before its fetch (where Lightning's per-batch broadcast holds the others for a rank 0
      still busy after the all-reduce); a rank kept off the CPU is slow in those too, which
      DDP's figure leaves out.

    A real straggler makes the others wait in most steps, a median with them; stalls in a few
    do not. True when no rank has either: the means then decide alone.

    Example:
        >>> slow = {"comm_wait_median_ms": 0.8}
        >>> typically_waited(slow, [{"comm_wait_median_ms": 34.0}], least_ms=16.0)
        True
        >>> typically_waited(slow, [{"comm_wait_median_ms": 1.1}], least_ms=16.0)
        False
        >>> typically_waited({**slow, "wait_typical_ms": 3.0},  # waited before the fetch
        ...                  [{"comm_wait_median_ms": 1.1, "wait_typical_ms": 33.0}], 16.0)
        True
        >>> typically_waited({}, [{"comm_wait_median_ms": 1.1}], least_ms=16.0)
        True
    """
    measured = False
    for key in ("comm_wait_median_ms", "wait_typical_ms"):
        mine = _number(slow.get(key))
        theirs = [_number(o.get(key)) for o in others]
        if mine is not None and all(t is not None for t in theirs):
            measured = True
            if median([t for t in theirs if t is not None]) - mine >= least_ms:
                return True
    return not measured


def mark_waiting(rows: Sequence[dict[str, Any]], straggler: Straggler | None) -> None:
    """Make the ``bound`` (and ``verdict``) of each rank that waited for ``straggler`` say so.

    A rank's own data verdict counts its wait in the gradient all-reduce as its model's time:
    rank 0 waiting for a slow loader on rank 1 reads "model", which the straggler finding
    contradicts. A rank that waited at least :data:`CONFIRM_FRACTION` of the straggler's excess a
    step is bound by ``rank k``, its verdict ``waiting for rank k: ...``; what it said alone is
    kept as ``rank_bound`` and ``rank_verdict``. Nothing changes without a straggler, or when it
    moves between epochs (every rank waits in some of them).

    Example:
        >>> rows = [{"rank": 0, "bound": "model", "wait_ms": 32.0, "cycle_ms": 40.0},
        ...         {"rank": 1, "bound": "data", "wait_ms": 0.0, "cycle_ms": 40.0}]
        >>> slow = Straggler(1, 0, None, 41.0, 8.0, 33.0, "data wait", 35.0, 0.8, None,
        ...                  32.0, 2.1, 0.8, 0.78, 1)
        >>> mark_waiting(rows, slow)
        >>> [(r["bound"], r.get("rank_bound")) for r in rows]
        [('rank 1', 'model'), ('data', None)]
    """
    if straggler is None or straggler.moving:
        return
    mark_waiting_for(rows, straggler.rank, CONFIRM_FRACTION * straggler.excess_ms)


def mark_waiting_for(
    rows: Sequence[dict[str, Any]], rank: int, least_ms: float, why: str = ""
) -> None:
    """:func:`mark_waiting` for the ranks that waited ``least_ms`` a step or more for ``rank``.

    ``why`` follows the rank's name in the verdict (``" (its stalls)"``).

    Example:
        >>> rows = [{"rank": 0, "bound": "model", "wait_ms": 9.0, "cycle_ms": 15.0}]
        >>> mark_waiting_for(rows, 1, 4.7, " (its stalls)")
        >>> rows[0]["bound"], rows[0]["verdict"][:44]
        ('rank 1', 'waiting for rank 1 (its stalls): 9.0 ms a st')
    """
    for row in rows:
        wait = float(row.get("wait_ms") or 0.0)
        if int(row["rank"]) == rank or wait < least_ms or wait <= 0:
            continue
        cycle = float(row.get("cycle_ms") or 0.0)
        share = f" ({wait / cycle:.0%} of its step)" if cycle > 0 else ""
        where = waited_where([row])
        verdict = f"waiting for rank {rank}{why}: {wait:.1f} ms a step {where}"
        for key, text in (("bound", f"rank {rank}"), ("verdict", verdict + share)):
            if row.get(key) is not None:
                row[f"rank_{key}"] = row[key]
            row[key] = text


def _cpu_starved(
    slow: Mapping[str, Any], others: Sequence[Mapping[str, Any]], excess: float
) -> tuple[float, float] | None:
    """The slow rank's and the others' CPU wait a step, when that explains its excess."""
    mine = _number(slow.get("cpu_wait_ms"))
    return kept_off_cpu(mine, [_number(o.get("cpu_wait_ms")) for o in others], excess)


def kept_off_cpu(
    mine: float | None, theirs: Sequence[float | None], excess: float
) -> tuple[float, float] | None:
    """The slow rank's CPU wait and the others' (median), when that wait explains its excess.

    Its extra wait for a CPU must be :data:`CPU_WAIT_SHARE` of its ``excess`` or more; None
    when it is not, or when a rank did not measure it (a None among the waits).

    Example:
        >>> kept_off_cpu(4.9, [0.2], excess=4.4), kept_off_cpu(0.4, [0.2], excess=4.4)
        ((4.9, 0.2), None)
    """
    if mine is None or any(t is None for t in theirs):
        return None
    base = median([float(t) for t in theirs if t is not None])
    return (mine, base) if mine - base >= CPU_WAIT_SHARE * excess else None


@dataclass
class Imbalance:
    """Ranks given different amounts of work, counted from each rank's own batches."""

    samples: dict[int, int]
    batches: dict[int, int]
    batch_sizes: dict[int, list[Any]]  # rank: [min, max]
    ratio: float  # the most samples over the fewest
    #: epochs whose batch counts differed between ranks: {epoch: {rank: batches}} (a run cut by
    #: ``max_steps`` can end with equal totals while each epoch dealt the ranks uneven shares)
    uneven_epochs: dict[int, dict[int, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The imbalance as plain values (for the JSON report)."""
        return asdict(self)


def find_imbalance(
    rows: Sequence[Mapping[str, Any]],
    *,
    tolerance: float = IMBALANCE_RATIO,
    epochs: Mapping[int, Sequence[Sequence[float]]] | None = None,
) -> Imbalance | None:
    """Ranks with different batch counts (in the run or an epoch), or samples apart by more.

    Samples apart by more than ``tolerance`` count.

    ``epochs`` holds each rank's per-epoch clock rows (epoch, batches, ...): an epoch whose
    complete batch counts differ between ranks is uneven even when the totals agree (a sampler
    that is not a ``DistributedSampler``, cut by ``max_steps``). The run's last epoch is left
    out when ``max_steps`` may have cut it on one rank only.

    Example:
        >>> rows = [{"rank": 0, "samples": 512, "batches": 64, "batch_size_min": 8,
        ...          "batch_size_max": 8}, {"rank": 1, "samples": 1024, "batches": 64,
        ...          "batch_size_min": 16, "batch_size_max": 16}]
        >>> find_imbalance(rows).ratio
        2.0
    """
    if len(rows) < 2:
        return None
    samples = {int(r["rank"]): int(r.get("samples") or 0) for r in rows}
    batches = {int(r["rank"]): int(r.get("batches") or 0) for r in rows}
    low, high = min(samples.values()), max(samples.values())
    uneven_batches = len(set(batches.values())) > 1
    ratio = high / low if low > 0 else float("inf") if high > 0 else 1.0
    uneven_epochs = _uneven_epochs(epochs or {}, set(batches))
    if not uneven_batches and not uneven_epochs and ratio - 1.0 <= tolerance:
        return None
    sizes = {int(r["rank"]): [r.get("batch_size_min"), r.get("batch_size_max")] for r in rows}
    return Imbalance(samples, batches, sizes, round(ratio, 4) if low > 0 else ratio, uneven_epochs)


def _uneven_epochs(
    epochs: Mapping[int, Sequence[Sequence[float]]], ranks: set[int]
) -> dict[int, dict[int, int]]:
    """Complete epochs (not the last) whose batch counts differ between the ranks."""
    table: dict[int, dict[int, int]] = {}
    for rank, rows in epochs.items():
        for row in rows:
            table.setdefault(int(row[0]), {})[int(rank)] = int(row[1])
    if len(table) < 2:
        return {}
    last = max(table)  # may be cut short by max_steps: not an epoch's share
    return {
        epoch: counts
        for epoch, counts in sorted(table.items())
        if epoch != last and set(counts) == ranks and len(set(counts.values())) > 1
    }


def spread(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """Max over min of a column (None when it is not a positive number on every rank)."""
    values = [_number(r.get(key)) for r in rows]
    if not values or any(v is None or v <= 0 for v in values):
        return None
    numbers = [v for v in values if v is not None]
    return round(max(numbers) / min(numbers), 3)
