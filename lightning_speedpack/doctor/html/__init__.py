"""``speedpack doctor --html`` and ``speedpack compare --html``: the report as one HTML page.

The page is self-contained: the style sheet is inline, every chart is an inline ``<svg>``
drawn by matplotlib (text kept as text), and there is no JavaScript, no font and no link to
fetch, so it opens from a ``file://`` URL or a CI artifact, even where a viewer's
Content-Security-Policy blocks scripts. It is made from the JSON report alone
(``Report.to_dict()``, what ``--json`` writes); nothing here imports torch or Lightning, and
matplotlib (the ``html`` extra) is imported only when a chart is drawn.

Stable hooks for tests and links: each chart is ``<figure class="chart" data-chart=NAME>``
(``data-run`` gives the run's index on a report page), each finding a ``<section
class="finding" id="finding-<component>-<id>-<n>" data-finding-id="<component>/<id>">``.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> report = {"findings": [{"component": "sync_points", "id": "sync-item",
    ...                         "message": "`loss.item()` waits", "location": "train.py:9"}],
    ...           "runs": [{"wall_s": 2.0, "samples": 64, "samples_per_sec": 32.0,
    ...                     "figures": {"samples_per_sec_over_steps": [[5, 30.0], [10, 34.0]]}}]}
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     page = write_report_page(report, Path(tmp) / "report.html").read_text()
    >>> 'data-finding-id="sync_points/sync-item"' in page and 'data-chart="samples_per_sec"' in page
    True
"""

from __future__ import annotations

import importlib

from lightning_speedpack.doctor.html.compare_page import render_compare_page, write_compare_page
from lightning_speedpack.doctor.html.page import render_report_page, write_report_page

__all__ = [
    "missing_requirement",
    "render_compare_page",
    "render_report_page",
    "write_compare_page",
    "write_report_page",
]

_REQUIREMENT = "--html needs matplotlib: pip install 'lightning-speedpack[html]'"


def missing_requirement() -> str | None:
    """What ``--html`` lacks: the install hint when matplotlib is not importable, else None.

    Example:
        >>> missing_requirement() is None  # matplotlib is installed here
        True
    """
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        return _REQUIREMENT
    return None
