"""The maths of the data-pipeline profile: counter-table reads turned into per-stage figures.

The main process reads the shared table (:class:`~lightning_speedpack.core.stages.
CounterTable`) now and then; :func:`delta` turns two reads into what happened in between
(a row whose process changed -- a new worker pool -- counts from zero), and
:class:`PipelineTotals` sums such windows into the figures the profiler logs and reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_speedpack.core import stages as _stages
from lightning_speedpack.core.stages import CACHE_HIT_STAGE, CACHE_MISS_STAGE, RowSnapshot

__all__ = ["PipelineTotals", "RowDelta", "delta", "format_stage_table", "read_table"]


def read_table(table: _stages.CounterTable) -> list[RowSnapshot]:
    """``table.read()``, the same rows, at a fraction of the cost (read once per log window).

    ``CounterTable.read`` decodes every stage slot of every row (16 slots a row, rows for four
    worker-pool generations) through numpy: ~0.1 ms a row. Here the cells are read from Python
    through flat memoryviews, with no numpy call (each costs microseconds): a row no process
    took (its pid still 0: a process clears its row before it sets its pid) is zeros and is not
    read, and of a row read, only the stage slots that counted anything are decoded. A loader
    without workers takes one row of five.

    Example:
        >>> table = _stages.CounterTable(rows=2)
        >>> rec = _stages.activate(table, row=1)
        >>> with _stages.stage("decode"):
        ...     pass
        >>> _stages.deactivate()
        >>> read_table(table) == table.read()
        True
    """
    cells, names = table.flat_cells, table.flat_names
    fields, width = _stages.FIELDS, _stages.NAME_BYTES
    s0, n = _stages.F_STAGES, _stages.MAX_STAGES
    out = []
    for r in range(table.rows):
        base = r * fields
        if not cells[base + _stages.F_PID]:
            out.append(_untaken())
            continue
        row: list[float] = cells[base : base + fields].tolist()  # a copy: the row as it is now
        stages: dict[str, tuple[float, float]] = {}
        for s in range(n):
            count = row[s0 + 2 * s + 1]
            if not count:
                continue
            at = (r * n + s) * width
            raw = names[at : at + width].tobytes().rstrip(b"\0")
            if raw:
                name = raw.decode("utf-8", "replace")
                old = stages.get(name, (0.0, 0.0))
                stages[name] = (old[0] + row[s0 + 2 * s], old[1] + count)
        out.append(
            RowSnapshot(
                start=row[_stages.F_START],
                pid=int(row[_stages.F_PID]),
                fetch_seconds=row[_stages.F_FETCH_S],
                samples=row[_stages.F_FETCH_N],
                collate_seconds=row[_stages.F_COLLATE_S],
                batches=row[_stages.F_COLLATE_N],
                overflow=bool(row[_stages.F_OVERFLOW]),
                stages=stages,
                ring=row[_stages.F_RING : s0],
                fetch_cpu_seconds=row[_stages.F_FETCH_CPU],
            )
        )
    return out


def _untaken() -> RowSnapshot:
    """The snapshot of a row no process took (a new one each time: readers may change it)."""
    return RowSnapshot(0.0, 0, 0.0, 0.0, 0.0, 0.0, False, {}, [0.0] * _stages.RING, 0.0)


@dataclass
class RowDelta:
    """What one loading process did between two reads."""

    row: int
    wall: float
    fetch_seconds: float = 0.0
    samples: float = 0.0
    collate_seconds: float = 0.0
    batches: float = 0.0
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)
    fetch_cpu_seconds: float = 0.0

    @property
    def busy_seconds(self) -> float:
        """Seconds spent fetching and collating."""
        return self.fetch_seconds + self.collate_seconds


def delta(
    before: list[RowSnapshot] | None,
    after: list[RowSnapshot],
    t_before: float,
    t_after: float,
    live: list[int],
) -> list[RowDelta]:
    """Per row of ``live`` (and any other row that did work): the work between two reads.

    Example:
        >>> from lightning_speedpack.core.stages import RowSnapshot
        >>> a = RowSnapshot(1.0, 7, 0.5, 10.0, 0.1, 1.0, False, {"decode": (0.25, 10.0)}, [])
        >>> b = RowSnapshot(1.0, 7, 1.5, 30.0, 0.3, 3.0, False, {"decode": (0.75, 30.0)}, [])
        >>> d = delta([a], [b], 2.0, 4.0, live=[0])[0]
        >>> d.samples, d.wall, d.stages
        (20.0, 2.0, {'decode': (0.5, 20.0)})
    """
    out: list[RowDelta] = []
    for r, now in enumerate(after):
        if now.pid == 0:
            continue
        old = before[r] if before is not None and r < len(before) else None
        same = old is not None and old.pid == now.pid and old.start == now.start
        if same:
            start = t_before
        elif old is None or old.pid == 0:  # never read before: count its whole life
            start = now.start
        else:  # another process took the row since the last read
            start = max(t_before, now.start)
        d = RowDelta(row=r, wall=max(t_after - start, 0.0))
        base = old if same and old is not None else None
        d.fetch_seconds = now.fetch_seconds - (base.fetch_seconds if base else 0.0)
        d.samples = now.samples - (base.samples if base else 0.0)
        d.collate_seconds = now.collate_seconds - (base.collate_seconds if base else 0.0)
        d.batches = now.batches - (base.batches if base else 0.0)
        d.fetch_cpu_seconds = now.fetch_cpu_seconds - (base.fetch_cpu_seconds if base else 0.0)
        for name, (seconds, count) in now.stages.items():
            prev = base.stages.get(name, (0.0, 0.0)) if base else (0.0, 0.0)
            if count - prev[1] > 0:
                d.stages[name] = (seconds - prev[0], count - prev[1])
        if r in live or d.samples > 0 or d.batches > 0:
            out.append(d)
    return out


@dataclass
class PipelineTotals:
    """Sums over windows of :class:`RowDelta` (and the main process's queue waits)."""

    fetch_seconds: float = 0.0
    samples: float = 0.0
    collate_seconds: float = 0.0
    batches: float = 0.0
    busy_seconds: float = 0.0
    wall_seconds: float = 0.0  # summed over loading processes
    wait_seconds: float = 0.0
    waits: int = 0
    # Seconds the fetches computed or waited for a core (not for I/O), over loading processes
    fetch_cpu_seconds: float = 0.0
    stages: dict[str, list[float]] = field(default_factory=dict)
    per_row: dict[int, list[float]] = field(default_factory=dict)  # row -> [busy, wall, samples]

    def merge(self, other: PipelineTotals) -> None:
        """Add another total (e.g. a window) to this one."""
        for name in (
            "fetch_seconds",
            "samples",
            "collate_seconds",
            "batches",
            "busy_seconds",
            "fetch_cpu_seconds",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.wall_seconds += other.wall_seconds
        self.wait_seconds += other.wait_seconds
        self.waits += other.waits
        for name, (seconds, count) in other.stages.items():
            s = self.stages.setdefault(name, [0.0, 0.0])
            s[0] += seconds
            s[1] += count
        for row, values in other.per_row.items():
            acc = self.per_row.setdefault(row, [0.0, 0.0, 0.0])
            for i, v in enumerate(values):
                acc[i] += v

    def add(self, rows: list[RowDelta], wait_seconds: float = 0.0, waits: int = 0) -> None:
        """Add one window."""
        for d in rows:
            self.fetch_seconds += d.fetch_seconds
            self.samples += d.samples
            self.collate_seconds += d.collate_seconds
            self.batches += d.batches
            self.busy_seconds += d.busy_seconds
            self.fetch_cpu_seconds += d.fetch_cpu_seconds
            self.wall_seconds += d.wall
            acc = self.per_row.setdefault(d.row, [0.0, 0.0, 0.0])
            acc[0] += d.busy_seconds
            acc[1] += d.wall
            acc[2] += d.samples
            for name, (seconds, count) in d.stages.items():
                s = self.stages.setdefault(name, [0.0, 0.0])
                s[0] += seconds
                s[1] += count
        self.wait_seconds += wait_seconds
        self.waits += waits

    def metrics(self, prefix: str = "data/") -> dict[str, float]:
        """The logged keys (only those with something measured).

        Example:
            >>> t = PipelineTotals()
            >>> t.add([RowDelta(1, 2.0, 0.5, 50, 0.1, 5, {"decode": (0.2, 50)})])
            >>> {k: round(v, 3) for k, v in t.metrics().items()}
            {'data/fetch_ms': 10.0, 'data/collate_ms': 20.0, 'data/worker_busy_fraction': 0.3, \
'data/stage/decode_ms': 4.0}
        """
        m: dict[str, float] = {}
        if self.samples > 0:
            m[f"{prefix}fetch_ms"] = 1000.0 * self.fetch_seconds / self.samples
        if self.batches > 0:
            m[f"{prefix}collate_ms"] = 1000.0 * self.collate_seconds / self.batches
        if self.wall_seconds > 0:
            m[f"{prefix}worker_busy_fraction"] = min(self.busy_seconds / self.wall_seconds, 1.0)
        if self.fetch_cpu_seconds > 0 and self.busy_seconds > 0:
            m[f"{prefix}fetch_compute_fraction"] = min(
                self.fetch_cpu_seconds / self.busy_seconds, 1.0
            )
        if self.waits > 0:
            m[f"{prefix}queue_wait_ms"] = 1000.0 * self.wait_seconds / self.waits
        for name, (seconds, count) in sorted(self.stages.items()):
            if count > 0:
                m[f"{prefix}stage/{name}_ms"] = 1000.0 * seconds / count
        hits = self.stages.get(CACHE_HIT_STAGE, [0.0, 0.0])[1]
        misses = self.stages.get(CACHE_MISS_STAGE, [0.0, 0.0])[1]
        if hits + misses > 0:
            m[f"{prefix}cache_hit_rate"] = hits / (hits + misses)
        return m

    def cache_reads(self) -> tuple[float, float]:
        """Hits and misses of a cache the X-ray sees (0, 0 without one)."""
        hits = self.stages.get(CACHE_HIT_STAGE, [0.0, 0.0])[1]
        misses = self.stages.get(CACHE_MISS_STAGE, [0.0, 0.0])[1]
        return hits, misses

    def per_process_samples_per_sec(self) -> float | None:
        """Samples one loading process produces per second of busy time."""
        if self.busy_seconds <= 0 or self.samples <= 0:
            return None
        return self.samples / self.busy_seconds


def format_stage_table(totals: PipelineTotals) -> str:
    """The stage table of the doctor report (plain text).

    Example:
        >>> t = PipelineTotals()
        >>> t.add([RowDelta(1, 2.0, 0.5, 50, 0.1, 5, {"decode": (0.2, 50)})])
        >>> print(format_stage_table(t))
        stage            ms/call     calls
        fetch (sample)    10.000        50
          decode           4.000        50
        collate (batch)   20.000         5
    """
    lines = [f"{'stage':<16}{'ms/call':>8}{'calls':>10}"]
    if totals.samples > 0:
        ms = 1000.0 * totals.fetch_seconds / totals.samples
        lines.append(f"{'fetch (sample)':<16}{ms:>8.3f}{totals.samples:>10.0f}")
    for name, (seconds, count) in sorted(totals.stages.items()):
        if count > 0:
            lines.append(f"  {name[:14]:<14}{1000.0 * seconds / count:>8.3f}{count:>10.0f}")
    if totals.batches > 0:
        ms = 1000.0 * totals.collate_seconds / totals.batches
        lines.append(f"{'collate (batch)':<16}{ms:>8.3f}{totals.batches:>10.0f}")
    if totals.waits > 0:
        ms = 1000.0 * totals.wait_seconds / totals.waits
        lines.append(f"{'queue wait':<16}{ms:>8.3f}{totals.waits:>10.0f}")
    return "\n".join(lines)
