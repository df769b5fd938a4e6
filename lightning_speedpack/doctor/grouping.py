"""The findings as a report presents them: alike ones grouped, then ordered by what pays most.

The diagnostics report one finding per layer, loader or call site, so one model with eight
attention layers of ``head_dim=100`` gives eight rows of the same advice. :func:`presented`
merges findings with the same component, id, severity, fix and message (the message read with
its own location taken out) into one that lists every place, then orders them: what pays on
this run's hardware first, by severity, then by measured share of the run; advice that only
pays on a GPU (``Finding.pays_on``) last. The JSON report keeps every finding as measured; the
text and HTML layouts show :func:`presented`.

Example:
    >>> from lightning_speedpack.core.findings import Finding
    >>> layers = [Finding("advisor", "layer-dims-multiple",
    ...                   f"head_dim=100 in enc.{i}.attn", location=f"enc.{i}.attn",
    ...                   fix="pad to head_dim=104", severity="info") for i in range(6)]
    >>> [group] = presented(layers)
    >>> group.message
    'head_dim=100 in 6 places'
    >>> group.location
    'enc.{0-5}.attn'
"""

from __future__ import annotations

import re
from dataclasses import replace

from lightning_speedpack.core.findings import Finding

__all__ = ["compact_locations", "grouped", "impact", "ordered", "presented"]

_SEVERITY = {"error": 0, "warning": 1, "info": 2}
_NUMBER = re.compile(r"(?<=[.\[])\d+(?=[.\]]|$)")


def impact(finding: Finding) -> float:
    """The finding's measured share of the run: of the wall time, else of the step (0: unknown).

    Example:
        >>> impact(Finding("wall_time", "validation-time", "m", figures={"wall_fraction": 0.6}))
        0.6
    """
    for key in ("wall_fraction", "data_wait_fraction"):
        value = finding.figures.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.0


def ordered(findings: list[Finding]) -> list[Finding]:
    """What pays here first; then severity; then measured impact, largest first (stable)."""
    return sorted(
        findings,
        key=lambda f: (f.pays_on is not None, _SEVERITY.get(f.severity, 3), -impact(f)),
    )


def _evidence(finding: Finding) -> str | None:
    # The advisor appends its evidence to the message as " (<evidence>)" and keeps it in
    # figures["evidence"]; alike findings differ there, so the evidence is read apart.
    evidence = finding.figures.get("evidence")
    if isinstance(evidence, str) and finding.message.endswith(f" ({evidence})"):
        return evidence
    return None


def _base(finding: Finding) -> str:
    evidence = _evidence(finding)
    message = finding.message[: -len(evidence) - 3] if evidence is not None else finding.message
    return message.replace(finding.location, "\0") if finding.location else message


def _key(finding: Finding) -> tuple[object, ...]:
    return (
        finding.component,
        finding.id,
        finding.severity,
        finding.fix,
        finding.pays_on,
        _base(finding),
    )


def grouped(findings: list[Finding]) -> list[Finding]:
    """Merge findings alike but for their location into one per group, in first-seen order.

    A group's message names how many places it covers where each member named its own; its
    ``location`` lists them compactly (:func:`compact_locations`); ``figures["places"]`` keeps
    the full list and ``figures["count_alike"]`` their number. Findings without a location, or
    alone in their group, come back unchanged.
    """
    groups: dict[tuple[object, ...], list[Finding]] = {}
    for finding in findings:
        key = _key(finding) if finding.location else (id(finding),)
        groups.setdefault(key, []).append(finding)
    return [_merge(members) for members in groups.values()]


def _merge(members: list[Finding]) -> Finding:
    if len(members) == 1:
        return members[0]
    first = members[0]
    places = [m.location or "" for m in members]
    label = _label(members)
    message = _base(first).replace("\0", label)
    evidences = [_evidence(m) for m in members]
    if all(e is not None for e in evidences):
        alike = {
            str(e).replace(m.location or "\0", "\0")
            for e, m in zip(evidences, members, strict=True)
        }
        evidence = (
            alike.pop().replace("\0", label)
            if len(alike) == 1
            else "; ".join(str(e) for e in evidences)
        )
        message = f"{message} ({evidence})"
    elif label not in message:  # the message does not name its place: say how many
        message = f"{message} ({label})"
    figures = {
        k: v for k, v in first.figures.items() if all(m.figures.get(k) == v for m in members)
    }
    figures["places"] = places
    figures["count_alike"] = len(members)
    return replace(first, message=message, location=compact_locations(places), figures=figures)


def _label(members: list[Finding]) -> str:
    # "6 MultiheadAttention layers" when the members say which layer type they are.
    layers = {m.figures.get("layer") for m in members}
    if len(layers) == 1 and isinstance(next(iter(layers)), str):
        return f"{len(members)} {layers.pop()} layers"
    return f"{len(members)} places"


def compact_locations(places: list[str]) -> str:
    """List places, folding names that differ only in their layer numbers.

    Example:
        >>> compact_locations(["m.layers.0.attn", "m.layers.1.attn", "m.layers.3.attn", "head"])
        'm.layers.{0,1,3}.attn, head'
        >>> compact_locations(["m.enc.0.attn", "m.enc.1.attn", "m.enc.2.attn"])
        'm.enc.{0-2}.attn'
    """
    folded: dict[str, list[str]] = {}
    for place in places:
        numbers = _NUMBER.findall(place)
        if len(numbers) != 1:
            folded.setdefault(place, [])
            continue
        pattern = _NUMBER.sub("\0", place)
        folded.setdefault(pattern, []).append(numbers[0])
    parts = []
    for pattern, numbers in folded.items():
        if len(numbers) < 2:
            parts.append(pattern.replace("\0", numbers[0]) if numbers else pattern)
        else:
            parts.append(pattern.replace("\0", "{" + _ranges(numbers) + "}"))
    return ", ".join(parts)


def _ranges(numbers: list[str]) -> str:
    values = sorted({int(n) for n in numbers})
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    return ",".join(str(v) for v in values)


def presented(findings: list[Finding]) -> list[Finding]:
    """The findings as the report shows them: :func:`grouped`, then :func:`ordered`."""
    return ordered(grouped(findings))
