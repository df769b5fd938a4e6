"""The findings on the page: every one with its fix, and the sync points and retained graphs.

Findings are read back from the report's dicts
(:func:`~lightning_speedpack.core.findings.findings_from_dicts`) and shown as
:func:`~lightning_speedpack.doctor.grouping.presented` orders and groups them. Each is a
``<section class="finding">`` whose ``id`` and ``data-finding-id`` (``component/id``) a test or
a link can find.
"""

from __future__ import annotations

import re

from lightning_speedpack.core.findings import Finding
from lightning_speedpack.doctor.grouping import presented
from lightning_speedpack.doctor.html.markup import esc, fmt, human_bytes, slug, table

__all__ = ["finding_list", "retained_graphs", "sync_points"]

_BACKTICKED = re.compile(r"`([^`]+)`")


def _code(finding: Finding) -> str:
    code = finding.figures.get("code")
    if isinstance(code, str) and code.strip():
        return code.strip()
    match = _BACKTICKED.search(finding.message)
    return match.group(1) if match else ""


def sync_points(findings: list[Finding]) -> str:
    """A table of the host-device syncs: where (file:line, function), the code line, how often."""
    syncs = [f for f in presented(findings) if f.component == "sync_points"]
    if not syncs:
        return ""
    rows = []
    for f in syncs:
        code = _code(f)
        rows.append(
            [
                ("raw", f"<code>{esc(f.location or '-')}</code>"),
                f.figures.get("function") or "-",
                ("raw", f"<code>{esc(code)}</code>" if code else "-"),
                f.figures.get("kind"),
                f.figures.get("per_step"),
                f.figures.get("count"),
                "yours" if f.id.startswith("sync-") else "framework",
                f.fix or "",
            ]
        )
    header = ["where", "function", "code", "kind", "per step", "count", "whose", "fix"]
    return table(header, rows, numeric=[4, 5])


def retained_graphs(findings: list[Finding]) -> str:
    """A table of the containers holding autograd graphs from earlier steps, with their fix."""
    held = [f for f in presented(findings) if f.component == "loss_retention"]
    if not held:
        return ""
    rows = [
        [
            ("raw", f"<code>{esc(f.location or '-')}</code>"),
            f.figures.get("count"),
            human_bytes(f.figures.get("est_bytes")),
            f.figures.get("backpropagated"),
            f.figures.get("step_first_seen"),
            f.fix or "",
        ]
        for f in held
    ]
    header = ["holder", "graphs", "est. size", "back-propagated", "first seen (batch)", "fix"]
    return table(header, rows, numeric=[1, 2, 4])


def _figures_line(finding: Finding) -> str:
    shown = {
        k: v
        for k, v in finding.figures.items()
        if k not in {"places", "evidence", "code"} and not isinstance(v, (dict, list))
    }
    if not shown:
        return ""
    text = ", ".join(f"{k}={fmt(v)}" for k, v in shown.items())
    return f'<p class="muted figures">{esc(text)}</p>'


def _message(message: str) -> str:
    # A message with a table after its first line (the data pipeline's) keeps its columns.
    first, _, rest = message.partition("\n")
    out = f'<p class="message">{esc(first)}</p>'
    return out + (f"<pre>{esc(rest)}</pre>" if rest.strip() else "")


def finding_list(findings: list[Finding], prefix: str = "finding") -> str:
    """Every finding (grouped and ordered) as a ``<section class="finding">`` with its fix.

    Example:
        >>> html = finding_list([Finding("sync_points", "sync-item", "<b>", severity="warning",
        ...                                  pays_on="GPU")])
        >>> 'data-finding-id="sync_points/sync-item"' in html and "on GPU" in html
        True
        >>> "<b>" in html
        False
    """
    if not findings:
        return '<p class="muted">No findings.</p>'
    out = []
    for n, f in enumerate(presented(findings)):
        key = f"{f.component}/{f.id}"
        dom_id = f"{prefix}-{slug(f.component)}-{slug(f.id)}-{n}"
        severity = f.severity if f.severity in {"error", "warning", "info"} else "info"
        badges = f'<span class="badge {severity}">{esc(f.severity)}</span>'
        if f.pays_on == "GPU":
            badges += '<span class="badge gpu" title="pays on a CUDA GPU">on GPU</span>'
        elif f.pays_on:
            badges += f'<span class="badge gpu">on {esc(f.pays_on)}</span>'
        where = f' <span class="mono">at {esc(f.location)}</span>' if f.location else ""
        places = f.figures.get("places")
        extra = ""
        if isinstance(places, list) and len(places) > 1:
            extra = (
                "<details><summary>"
                f"{len(places)} places</summary><pre>{esc(chr(10).join(map(str, places)))}</pre>"
                "</details>"
            )
        fix = f'<p class="fix">{esc(f.fix)}</p>' if f.fix else ""
        out.append(
            f'<section class="finding {severity}" id="{esc(dom_id)}" '
            f'data-finding-id="{esc(key)}" data-severity="{esc(f.severity)}">'
            f"<h3>{badges}<code>{esc(key)}</code>{where}</h3>"
            f"{_message(f.message)}{fix}{_figures_line(f)}{extra}</section>"
        )
    return "".join(out)
