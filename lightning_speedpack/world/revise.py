"""Rank 0's report, read with the whole world in view: verdicts per rank, no blame on backward.

Every diagnostic is rank-local: on rank 0, a rank that loads or computes slowly shows up as a
long ``backward`` (rank 0 waits in the gradient all-reduce). Given ``figures["world"]``
(:func:`~lightning_speedpack.world.engine.world_figures`), :func:`revise_findings` turns rank
0's findings into the world's:

- the world's findings come first (:func:`~lightning_speedpack.world.findings.world_findings`);
- the step-phase finding says "waiting for rank k" for the part of ``backward`` that was wait
  (for a straggler, or for a rank's stalls), and where the straggler's own batch went;
- the data verdict is the slowest rank's (the straggler's when there is one): the world is
  data-bound when the slowest rank is; with a straggler, ``data-pipeline`` (where a sample's
  loading time goes) is the straggler's too;
- ``cpu-threads`` is judged on every rank: it is reported when any rank has it, naming them;
- ``comm-bound`` is judged on the rank that waited least, and gives way to a straggler
  (:func:`~lightning_speedpack.world.findings.comm_bound_in_world`);
- ``find-unused-parameters`` as a warning ("none unused", from rank 0's reducer) stands only when
  no other rank found unused parameters: DDP needs the search when any rank has them.

:func:`revise_figures` does the same to the run's figures: ``verdict``/``bound`` become the
slowest rank's (rank 0's stay in its row), and the wall-time ledger's ``training_step`` is split
into the step and ``waiting for rank k``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from lightning_speedpack.core.findings import Finding, Severity
from lightning_speedpack.world.findings import (
    comm_bound_in_world,
    straggler_severity,
    world_findings,
)

__all__ = ["judged_rank", "revise_figures", "revise_findings"]

_VERDICTS = ("data-bound", "model-bound")
_PER_RANK = ("cpu-threads",)
_BELOW: dict[str, Severity] = {"error": "warning", "warning": "info", "info": "info"}
_RANK = {"info": 0, "warning": 1, "error": 2}


def _rows(world: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    return {int(r["rank"]): r for r in world.get("ranks") or [] if "rank" in r}


def _by_rank(world: Mapping[str, Any]) -> dict[int, list[Mapping[str, Any]]]:
    return {int(rank): list(items) for rank, items in world.get("findings_by_rank") or []}


def judged_rank(world: Mapping[str, Any]) -> int | None:
    """The rank whose verdict is the world's: the straggler, else the one with most own time."""
    straggler = world.get("straggler")
    if straggler:
        return int(straggler["rank"])
    rows = _rows(world)
    if len(rows) < 2:
        return None
    return max(rows, key=lambda r: float(rows[r].get("own_ms") or 0.0))


def _waited_for(world: Mapping[str, Any]) -> int | None:
    # Rank 0 waited for another rank: a straggler that is not rank 0 (and does not move), else
    # a rank whose stalls it waited for.
    straggler = world.get("straggler")
    if straggler:
        moving = straggler.get("moving") or int(straggler["rank"]) == 0
        return None if moving else int(straggler["rank"])
    stalls = world.get("stalls")
    return int(stalls["rank"]) if stalls and int(stalls["rank"]) != 0 else None


def revise_findings(findings: Sequence[Finding], world: Mapping[str, Any] | None) -> list[Finding]:
    """Rank 0's ``findings`` as the world's (see the module docstring); inputs are not changed.

    Example:
        >>> phases = Finding("timeline", "step-phases", "backward 86%, other 7%",
        ...                  figures={"backward": 0.86, "other": 0.07}, severity="info")
        >>> world = {"ranks": [{"rank": 0, "wait_ms": 34.0, "cycle_ms": 40.0},
        ...                    {"rank": 1, "wait_ms": 0.0, "cycle_ms": 40.0}],
        ...          "straggler": {"rank": 1, "node": 0, "host": "h", "own_ms": 40.0,
        ...              "others_ms": 6.0, "excess_ms": 34.0, "part": "data wait",
        ...              "part_ms": 37.0, "part_others_ms": 2.5, "callback": None,
        ...              "waited_ms": 34.0, "waited_s": 2.2, "waited_step_fraction": 0.9,
        ...              "wall_fraction": 0.8, "others": 1, "moving": None}}
        >>> [f.id for f in revise_findings([phases], world)]
        ['straggler', 'step-phases']
        >>> revise_findings([phases], world)[1].message
        "Where a training batch's host time goes on rank 0: waiting for rank 1 85% (in \
backward's gradient all-reduce), other 7%, backward 1%"
    """
    if not world:
        return list(findings)
    out = list(world_findings(world))
    slow = _waited_for(world)
    judged = judged_rank(world)
    straggling = judged if world.get("straggler") and judged not in (None, 0) else None
    by_rank = _by_rank(world)
    rows = _rows(world)
    for finding in findings:
        if finding.id == "step-phases" and slow is not None and 0 in rows:
            waiting = _phases_waiting(finding, slow, rows[0])
            if world.get("straggler"):  # a rank slow in every step: where its step went
                waiting = _with_phases_of(waiting, slow, by_rank.get(slow, []))
            out.append(waiting)
        elif finding.id in _VERDICTS and judged not in (None, 0):
            theirs = by_rank.get(int(judged), [])
            straggler = world.get("straggler")
            cap = _BELOW[straggler_severity(straggler)] if straggler else None
            out.append(_verdict_of(finding, int(judged), theirs, cap))
        elif finding.id == "data-pipeline" and straggling is not None:
            out.append(_pipeline_of(finding, straggling, by_rank.get(straggling, [])))
        elif finding.id in _PER_RANK:
            out.append(_on_ranks(finding, by_rank))
        elif finding.id == "find-unused-parameters" and finding.severity == "warning":
            out.append(_unused_elsewhere(finding, by_rank))
        elif finding.id == "comm-bound":
            judged_on_all = comm_bound_in_world(finding, world)  # None: a wait for a straggler
            out.extend([] if judged_on_all is None else [judged_on_all])
        else:
            out.append(finding)
    have = {f.id for f in out}
    out.extend(_only_elsewhere(by_rank, have))
    return out


def _phases_waiting(finding: Finding, slow: int, row0: Mapping[str, Any]) -> Finding:
    shares = {
        k: float(v)
        for k, v in finding.figures.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    cycle = float(row0.get("cycle_ms") or 0.0)
    wait = float(row0.get("wait_ms") or 0.0) / cycle if cycle > 0 else 0.0
    wait = min(wait, shares.get("backward", 0.0))
    shares["backward"] = shares.get("backward", 0.0) - wait
    label = f"waiting for rank {slow}"
    ranked = sorted([(label, wait), *shares.items()], key=lambda kv: -kv[1])
    breakdown = ", ".join(
        f"{name} {share:.0%}" + (" (in backward's gradient all-reduce)" if name == label else "")
        for name, share in ranked
        if share >= 0.005
    )
    figures = {**finding.figures, "backward": round(shares["backward"], 4)}
    figures[f"waiting_for_rank_{slow}"] = round(wait, 4)
    message = f"Where a training batch's host time goes on rank 0: {breakdown}"
    return replace(finding, message=message, figures=figures)


def _with_phases_of(finding: Finding, rank: int, theirs: Sequence[Mapping[str, Any]]) -> Finding:
    # Rank 0's phases say it waited; the straggler's say where its own step went.
    phases = next((f for f in theirs if f.get("id") == finding.id), None)
    text = str(phases.get("message") or "") if phases is not None else ""
    _, found, breakdown = text.partition("host time goes: ")
    if not found:
        return finding
    breakdown = breakdown.split(" (timed on")[0]
    return replace(
        finding, message=f"{finding.message}; on rank {rank}, the straggler: {breakdown}"
    )


def _pipeline_of(finding: Finding, rank: int, theirs: Sequence[Mapping[str, Any]]) -> Finding:
    # Where a sample's loading time goes on the straggler, not on rank 0 that waited for it.
    pipeline = next((f for f in theirs if f.get("id") == finding.id), None)
    if pipeline is None:
        return replace(finding, message=f"on rank 0 (rank {rank} did not say): {finding.message}")
    return replace(
        finding,
        message=f"on rank {rank}, the slowest rank: {pipeline.get('message', '')}",
        location=pipeline.get("location") or finding.location,
        figures=_theirs(finding, rank),
    )


def _verdict_of(
    finding: Finding, rank: int, theirs: Sequence[Mapping[str, Any]], cap: Severity | None
) -> Finding:
    # `cap`: with a straggler, the verdict (why that rank is slow) ranks below its finding.
    straggler = cap is not None
    verdict = next((f for f in theirs if f.get("id") in _VERDICTS), None)
    if verdict is None:  # that rank reached no verdict: keep rank 0's, said to be rank 0's
        if not straggler:
            return finding
        message = f"on rank 0 (rank {rank} gave no verdict): {finding.message}"
        return replace(finding, message=message)
    if not straggler and verdict["id"] == finding.id:
        return finding  # ranks about alike, and of one verdict: rank 0's says it
    severity: Severity = verdict.get("severity") or finding.severity
    if cap is not None and _RANK[severity] > _RANK[cap]:
        severity = cap
    note = ""
    if verdict["id"] != finding.id:
        note = (
            f" (rank 0 alone would say {finding.id}: it counts its wait for rank {rank} as the "
            "model's time)"
        )
    return replace(
        finding,
        id=str(verdict["id"]),
        severity=severity,
        message=f"on rank {rank}, the slowest rank: {verdict.get('message', '')}{note}",
        location=verdict.get("location") or finding.location,
        fix=verdict.get("fix") if verdict.get("fix") is not None else finding.fix,
        figures=_theirs(finding, rank),
    )


def _theirs(finding: Finding, rank: int) -> dict[str, Any]:
    # The message is now rank k's; rank 0's measured figures stay, under its name, not as k's.
    return {"rank": rank, "rank_0": dict(finding.figures)} if finding.figures else {"rank": rank}


def _ranks_with(by_rank: Mapping[int, Sequence[Mapping[str, Any]]], finding_id: str) -> list[int]:
    found = (r for r, items in by_rank.items() if any(i.get("id") == finding_id for i in items))
    return sorted(found)


def _on_ranks(finding: Finding, by_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> Finding:
    ranks = _ranks_with(by_rank, finding.id)
    if len(ranks) < 2:
        return finding
    listed = ", ".join(map(str, ranks))
    return replace(
        finding,
        message=f"{finding.message} (on ranks {listed})",
        figures={**finding.figures, "ranks": ranks},
    )


def _unused_elsewhere(
    finding: Finding, by_rank: Mapping[int, Sequence[Mapping[str, Any]]]
) -> Finding:
    """Rank 0 found no unused parameter; another rank's reducer may have (then it is needed)."""
    for rank, items in sorted(by_rank.items()):
        theirs = [
            i
            for i in items
            if i.get("id") == finding.id and i.get("severity") == "info" and rank != 0
        ]
        if theirs:
            return Finding(
                finding.component,
                finding.id,
                f"on rank {rank}: {theirs[0].get('message', '')} (rank 0 found none: "
                "`find_unused_parameters=True` is needed while any rank has them)",
                location=theirs[0].get("location"),
                figures={"ranks": [rank]},
                severity="info",
                fix=theirs[0].get("fix"),
            )
    return finding


def _only_elsewhere(
    by_rank: Mapping[int, Sequence[Mapping[str, Any]]], have: set[str]
) -> list[Finding]:
    # A per-rank finding that rank 0 does not have, but another rank does.
    out = []
    for finding_id in _PER_RANK:
        ranks = [r for r in _ranks_with(by_rank, finding_id) if r != 0]
        if finding_id in have or not ranks:
            continue
        item = next(i for i in by_rank[ranks[0]] if i.get("id") == finding_id)
        listed = ", ".join(map(str, ranks))
        out.append(
            Finding(
                str(item.get("component")),
                finding_id,
                f"on rank{'s' if len(ranks) > 1 else ''} {listed}: {item.get('message', '')}",
                location=item.get("location"),
                figures={"ranks": ranks},
                severity=item.get("severity") or "warning",
                fix=item.get("fix"),
            )
        )
    return out


def revise_figures(figures: dict[str, Any], world: Mapping[str, Any] | None) -> None:
    """Rank 0's run ``figures`` as the world's, in place (see the module docstring)."""
    if not world:
        return
    rows = _rows(world)
    judged = judged_rank(world)
    if judged not in (None, 0) and judged in rows:
        row = rows[int(judged)]
        if world.get("straggler") or row.get("bound") != figures.get("bound"):
            for key in ("verdict", "bound"):
                if row.get(key) is not None:
                    figures[key] = row[key]
    slow = _waited_for(world)
    ledger = figures.get("wall_time")
    if slow is None or 0 not in rows or not isinstance(ledger, dict):
        return
    row0 = rows[0]
    wait_s = float(row0.get("wait_ms") or 0.0) * int(row0.get("batches") or 0) / 1000.0
    parts = dict(ledger.get("parts") or {})
    step = float(parts.get("training_step") or 0.0)
    wait_s = round(min(wait_s, step), 4)
    if wait_s <= 0:
        return
    label = f"waiting for rank {slow}"
    parts["training_step"] = round(step - wait_s, 4)
    parts[label] = wait_s
    total = float(ledger.get("total_s") or 0.0)
    fractions = dict(ledger.get("fractions") or {})
    if total > 0:
        fractions["training_step"] = round(parts["training_step"] / total, 4)
        fractions[label] = round(wait_s / total, 4)
    figures["wall_time"] = {**ledger, "parts": parts, "fractions": fractions}
