"""cache_peers.py's printed comparison: medians (min-max) over rounds, ratios, memory by mapping.

``report`` prints every table from the children's records (``breakdown``: where the memory is,
per process role and kind of mapping); the helpers pair records of the same round.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _cache_peers_memory import MiB
from _cache_peers_variants import BATCH, CROP, PREFETCH, SIZE
from _common import print_table

__all__ = [
    "batch_bytes",
    "breakdown",
    "by_round",
    "kind_sum",
    "nonfile",
    "paired",
    "report",
    "role_sum",
    "select",
    "stat",
]


def stat(values: list[float], digits: int = 3) -> str:
    if not values:
        return "n/a"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def select(records: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def by_round(records: list[dict[str, Any]], **match: Any) -> dict[int, dict[str, Any]]:
    return {r["round"]: r for r in select(records, **match)}


def paired(
    a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], f: Callable[..., float | None]
) -> list[float]:
    out = []
    for rnd in sorted(set(a) & set(b)):
        value = f(a[rnd], b[rnd])
        if value is not None:
            out.append(value)
    return out


def kind_sum(record: dict[str, Any], role: str, kind: str, field: str = "pss") -> float:
    return float(
        sum(p["kinds"][kind][field] for p in record["procs"] if role in ("all", p["role"]))
    )


def role_sum(record: dict[str, Any], role: str, field: str) -> float:
    return float(sum(p[field] for p in record["procs"] if role in ("all", p["role"])))


def batch_bytes(transform: int) -> int:
    side = CROP if transform else SIZE
    return BATCH * (3 * side * side + 8)  # uint8 images + int64 labels


def nonfile(record: dict[str, Any]) -> float:
    """The tree's PSS outside file-backed mappings: anonymous + shared memory + arena.

    File-backed pages (torch's libraries) are shared with every other process on the machine
    that maps them, so their PSS moves with whatever else runs; these kinds are this tree's own.
    """
    return sum(kind_sum(record, "all", k) for k in ("anon", "shm", "arena"))


def report(
    records: list[dict[str, Any]],
    kills: list[dict[str, Any]],
    n: int,
    rounds: int,
    workers: list[int],
    variants: list[str],
    ddp_variants: list[str],
) -> None:
    payload = n * 3 * SIZE * SIZE
    single = [r for r in records if not r["ddp"]]
    ddp = [r for r in records if r["ddp"]]
    tag = {0: "no", 1: "yes"}

    def extra(rec: dict[str, Any], base: dict[str, Any]) -> float:
        return (rec["pss_tree"] - base["pss_tree"]) / payload

    def extra_nf(rec: dict[str, Any], base: dict[str, Any]) -> float:
        return (nonfile(rec) - nonfile(base)) / payload

    def extra_ratio(
        ours: dict[int, Any], peer: dict[int, Any], base: dict[int, Any], f: Callable[..., float]
    ) -> list[float]:
        return [
            f(ours[rnd], base[rnd]) / f(peer[rnd], base[rnd])
            for rnd in sorted(set(ours) & set(peer) & set(base))
        ]

    rows = []
    for transform in (0, 1):
        for nw in workers:
            base_mem = by_round(
                single, variant="uncached", role="mem", workers=nw, transform=transform
            )
            for v in variants:
                t = select(single, variant=v, role="time", workers=nw, transform=transform)
                mem = by_round(single, variant=v, role="mem", workers=nw, transform=transform)
                rows.append(
                    [
                        tag[transform],
                        nw,
                        v,
                        stat([r["epoch1"] for r in t]),
                        stat([r["construct"] for r in t]),
                        stat([r["epoch2"] for r in t]),
                        stat([r["pss_tree"] / MiB for r in mem.values()], 0),
                        stat(paired(mem, base_mem, extra), 2),
                        stat([nonfile(r) / MiB for r in mem.values()], 0),
                        stat(paired(mem, base_mem, extra_nf), 2),
                    ]
                )
    print_table(
        f"{n} JPEGs -> 3x{SIZE}x{SIZE} uint8 (payload {payload / MiB:.1f} MiB), batch {BATCH}, "
        f"shuffle, persistent forked workers; each run a fresh process; median (min-max) of "
        f"{rounds} alternating rounds. Epoch 1 includes the dataset's construction (MONAI eager: "
        f"its whole fill). Memory mid epoch 2, summed over the process tree: psutil PSS, and the "
        f"PSS of its anonymous + shared-memory + arena mappings (non-file: immune to other "
        f"processes mapping the same libraries); extra = minus uncached's in the same round and "
        f"setting, over the payload",
        [
            "random transform",
            "workers",
            "variant",
            "epoch 1 s",
            "of which construction s",
            "epoch 2 s",
            "tree PSS MiB",
            "extra PSS / payload",
            "non-file PSS MiB",
            "extra non-file PSS / payload",
        ],
        rows,
    )

    ratio_rows = []
    for transform in (0, 1):
        for nw in workers:

            def cells(v: str, role: str, nw: int = nw, transform: int = transform) -> Any:
                return by_round(single, variant=v, role=role, workers=nw, transform=transform)

            monai_t, monai_m = cells("monai_eager", "time"), cells("monai_eager", "mem")
            base_m = cells("uncached", "mem")
            for ours in ("ours", "ours_filled"):
                if ours not in variants:
                    continue
                ours_t, ours_m = cells(ours, "time"), cells(ours, "mem")
                ratio_rows.append(
                    [
                        tag[transform],
                        nw,
                        ours,
                        stat(paired(ours_t, monai_t, lambda a, b: a["epoch2"] / b["epoch2"]), 2),
                        stat(
                            paired(
                                ours_t,
                                cells("uncached", "time"),
                                lambda a, b: a["epoch1"] / b["epoch1"],
                            ),
                            2,
                        ),
                        stat(paired(ours_t, monai_t, lambda a, b: a["epoch1"] / b["epoch1"]), 2),
                        stat(extra_ratio(ours_m, monai_m, base_m, extra), 2),
                        stat(extra_ratio(ours_m, monai_m, base_m, extra_nf), 2),
                        stat(
                            paired(ours_m, monai_m, lambda a, b: a["pss_tree"] / b["pss_tree"]), 3
                        ),
                    ]
                )
    print_table(
        "Ratios (ours = the variant named), median (min-max) over rounds of the ratio within "
        "each round",
        [
            "random transform",
            "workers",
            "ours",
            "ours / monai_eager epoch 2",
            "ours / uncached epoch 1",
            "ours / monai_eager epoch 1",
            "ours / monai_eager extra PSS",
            "ours / monai_eager extra non-file PSS",
            "ours / monai_eager tree PSS",
        ],
        ratio_rows,
    )

    print_table(
        "Batches in flight (computed, not measured): workers x prefetch_factor x batch bytes; "
        "they live in torch's shared memory while queued, on top of every variant's PSS",
        ["random transform", "workers", "batch bytes", "in flight MiB", "in flight / payload"],
        [
            [
                tag[t],
                nw,
                f"{batch_bytes(t):,}",
                f"{nw * PREFETCH * batch_bytes(t) / MiB:.2f}",
                f"{nw * PREFETCH * batch_bytes(t) / payload:.3f}",
            ]
            for t in (0, 1)
            for nw in workers
        ],
    )

    arena_rows = []
    for transform in (0, 1):
        for nw in workers:
            mem = select(single, variant="ours", role="mem", workers=nw, transform=transform)
            mem = [r for r in mem if "arena_allocated" in r]
            if mem:
                arena_rows.append(
                    [
                        tag[transform],
                        nw,
                        stat([r["arena_bytes_used"] / payload for r in mem]),
                        stat([r["arena_allocated"] / payload for r in mem]),
                        stat([kind_sum(r, "all", "arena") / payload for r in mem]),
                        stat([kind_sum(r, "all", "arena", "rss") / payload for r in mem]),
                    ]
                )
    if arena_rows:
        print_table(
            "ours: the arena mid epoch 2, over the payload. Allocated = the /dev/shm file's "
            "blocks (RAM, reserved ahead in 16 MiB chunks); PSS = what the tree's mappings of "
            "it add up to (pages no process touched count in no PSS)",
            [
                "random transform",
                "workers",
                "bytes used",
                "file allocated",
                "arena PSS (all processes)",
                "arena RSS summed",
            ],
            arena_rows,
        )

    breakdown(single, payload, workers, variants)

    if ddp:
        rows = []
        for transform in (0, 1):
            base = by_round(ddp, variant="uncached", transform=transform)
            for v in ddp_variants:
                mem = by_round(ddp, variant=v, transform=transform)
                rows.append(
                    [
                        tag[transform],
                        v,
                        stat([r["epoch1"] for r in mem.values()]),
                        stat([r["pss_tree"] / MiB for r in mem.values()], 0),
                        stat(paired(mem, base, extra), 2),
                        stat([nonfile(r) / MiB for r in mem.values()], 0),
                        stat(paired(mem, base, extra_nf), 2),
                        stat([kind_sum(r, "all", "arena") / payload for r in mem.values()], 2),
                    ]
                )
            m = by_round(ddp, variant="monai_eager", transform=transform)
            for ours in ("ours", "ours_filled"):
                if ours not in ddp_variants:
                    continue
                o = by_round(ddp, variant=ours, transform=transform)
                rows.append(
                    [
                        tag[transform],
                        f"ratio {ours} / monai_eager",
                        stat(paired(o, m, lambda a, b: a["epoch1"] / b["epoch1"]), 2),
                        stat(paired(o, m, lambda a, b: a["pss_tree"] / b["pss_tree"]), 3),
                        stat(extra_ratio(o, m, base, extra), 2),
                        "",
                        stat(extra_ratio(o, m, base, extra_nf), 2),
                        "",
                    ]
                )
        print_table(
            "DDP, 2 ranks x 2 workers (gloo, DistributedSampler): memory of both ranks' trees "
            f"mid epoch 2 (as above); epoch 1 = construction + epoch 1 of the slower rank; "
            f"median (min-max) of {rounds} rounds",
            [
                "random transform",
                "variant",
                "epoch 1 s",
                "tree PSS MiB",
                "extra PSS / payload",
                "non-file PSS MiB",
                "extra non-file PSS / payload",
                "arena PSS / payload",
            ],
            rows,
        )

    if kills:
        keys = [k for k in kills[0] if k != "case"]
        print_table(
            "Kill: ours, 2 workers, SIGKILL mid epoch 2; the run's /dev/shm/speedpack-* files",
            ["case", *keys],
            [[k.get("case"), *[k.get(key, "") for key in keys]] for k in kills],
        )


def breakdown(
    single: list[dict[str, Any]], payload: int, workers: list[int], variants: list[str]
) -> None:
    """Where the memory is: PSS per process role and kind of mapping, MiB, medians."""
    shown = [
        v for v in ("ours", "ours_filled", "uncached", "monai_eager", "naive_list") if v in variants
    ]
    rows = []
    for nw in workers:
        for v in shown:
            for transform in (0, 1):
                mem = select(single, variant=v, role="mem", workers=nw, transform=transform)
                if not mem:
                    continue

                def med(f: Callable[[dict[str, Any]], float], mem: Any = mem) -> str:
                    return f"{statistics.median(f(r) for r in mem) / MiB:.1f}"

                rows.append(
                    [
                        nw,
                        v,
                        "yes" if transform else "no",
                        med(lambda r: role_sum(r, "main", "pss")),
                        med(lambda r: kind_sum(r, "main", "anon")),
                        med(lambda r: kind_sum(r, "main", "arena")),
                        med(lambda r: kind_sum(r, "main", "shm")),
                        med(lambda r: role_sum(r, "worker", "pss")),
                        med(lambda r: role_sum(r, "worker", "uss")),
                        med(lambda r: kind_sum(r, "worker", "anon")),
                        med(lambda r: kind_sum(r, "worker", "anon", "private")),
                        med(lambda r: kind_sum(r, "worker", "arena")),
                        med(lambda r: kind_sum(r, "worker", "shm")),
                        med(lambda r: kind_sum(r, "worker", "file")),
                        med(lambda r: role_sum(r, "other", "pss")),
                    ]
                )
    print_table(
        "Where the memory is mid epoch 2 (MiB, medians over rounds): PSS by process and by "
        "mapping (smaps): anon = heap and anonymous mappings, arena = /dev/shm/speedpack-*, "
        "shm = torch's shared batches; workers summed; other = MONAI's manager process",
        [
            "workers",
            "variant",
            "transform",
            "main PSS",
            "main anon",
            "main arena",
            "main shm",
            "workers PSS",
            "workers USS",
            "workers anon PSS",
            "workers anon private",
            "workers arena",
            "workers shm",
            "workers file",
            "other PSS",
        ],
        rows,
    )
    delta_rows = []
    for nw in workers:
        for v in shown:
            a = by_round(single, variant=v, role="mem", workers=nw, transform=1)
            b = by_round(single, variant=v, role="mem", workers=nw, transform=0)
            if not (a and b):
                continue

            def d(f: Callable[[dict[str, Any]], float], a: Any = a, b: Any = b) -> str:
                return stat(paired(a, b, lambda x, y: (f(x) - f(y)) / MiB), 1)

            delta_rows.append(
                [
                    nw,
                    v,
                    d(lambda r: r["pss_tree"]),
                    d(lambda r: kind_sum(r, "main", "anon")),
                    d(lambda r: kind_sum(r, "main", "arena")),
                    d(lambda r: kind_sum(r, "worker", "anon")),
                    d(lambda r: kind_sum(r, "worker", "arena")),
                    d(lambda r: kind_sum(r, "all", "shm")),
                    d(lambda r: kind_sum(r, "all", "file") + kind_sum(r, "all", "other")),
                ]
            )
    print_table(
        "With the random transform minus without, same variant, workers and round (MiB, median "
        "(min-max)): which process and which mapping grows",
        [
            "workers",
            "variant",
            "tree PSS",
            "main anon",
            "main arena",
            "workers anon",
            "workers arena",
            "shm (all)",
            "file + other (all)",
        ],
        delta_rows,
    )
