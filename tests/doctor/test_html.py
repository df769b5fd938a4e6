"""``speedpack doctor --html`` / ``compare --html``: one self-contained page from real reports."""

from __future__ import annotations

import copy
import json
import re
import textwrap
import warnings
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from lightning_speedpack.doctor import html as doctor_html
from lightning_speedpack.doctor.compare import compare
from lightning_speedpack.doctor.html import (
    missing_requirement,
    render_compare_page,
    render_report_page,
    write_compare_page,
    write_report_page,
)
from lightning_speedpack.doctor.html.sections import MAX_BARS, phase_windows
from lightning_speedpack.doctor.runner import run_script
from lightning_speedpack.what_if.report import COLUMNS as WHAT_IF_COLUMNS
from tests.helpers.namespaces import NAMESPACE_IDS, NAMESPACE_NAMES

pytest.importorskip("matplotlib")

#: The imports (two lines each, so every variant has the same line numbers) and the Trainer.
HEADERS = {
    "pytorch_lightning": (
        "from pytorch_lightning import Trainer\n"
        "from pytorch_lightning.demos.boring_classes import BoringModel",
        "Trainer",
    ),
    "lightning.pytorch": (
        "import lightning as L\nfrom lightning.pytorch.demos.boring_classes import BoringModel",
        "L.Trainer",
    ),
}

SCRIPT = """\
import torch
{imports}
from torch.utils.data import DataLoader, Dataset
from lightning_speedpack import stage


class Staged(Dataset):  # two named stages per sample: the data X-ray's per-stage figures
    def __len__(self):
        return 64

    def __getitem__(self, i):
        with stage("decode"):
            x = torch.randn(32)
        with stage("augment"):
            x = x * 2
        return x


kept = []


class Model(BoringModel):
    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).sum()
        {planted}
        if batch_idx == {crash_at}:
            raise RuntimeError("the script crashed")
        return loss

    def train_dataloader(self):
        return DataLoader(Staged(), batch_size=4)


trainer = {trainer}(accelerator="cpu", max_steps=8, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    log_every_n_steps=2, default_root_dir={root!r})
trainer.fit(Model())
"""
#: A host-device sync (`.item()`) and every loss kept with its graph: both must be on the page.
SLOW = "kept.append(loss); print(loss.item())"
REPORT_CHARTS = ("samples_per_sec", "step_phases", "data_pipeline", "wall_time")
_CACHE: dict[tuple[str, str, int], dict[str, Any]] = {}


def _doctor(root: Path, namespace: str, planted: str, crash_at: int = -1) -> dict[str, Any]:
    """The JSON report of a real doctor run of the script (cached per variant)."""
    key = (namespace, planted, crash_at)
    if key not in _CACHE:
        imports, trainer = HEADERS[namespace]
        folder = root / f"{NAMESPACE_IDS[namespace]}-{len(_CACHE)}"
        folder.mkdir()
        script = folder / "train.py"
        body = SCRIPT.format(
            imports=imports, trainer=trainer, planted=planted, crash_at=crash_at, root=str(folder)
        )
        script.write_text(textwrap.dedent(body))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the script's planted mistakes warn, as they should
            result = run_script(script)
        assert result.exit_code == (0 if crash_at < 0 else 1), result.error
        # through JSON, as `--html` and an archived `--json` file see it
        _CACHE[key] = json.loads(json.dumps(result.report.to_dict(), default=str))
    return copy.deepcopy(_CACHE[key])


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("html")


class _Tags(HTMLParser):
    """Every start tag with its attributes, to check what the page would fetch."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _tags(page: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Tags()
    parser.feed(page)
    parser.close()
    return parser.tags


def assert_self_contained(page: str) -> None:
    tags = _tags(page)
    assert tags, "no markup parsed"
    names = {tag for tag, _ in tags}
    assert not names & {"script", "link", "iframe", "img", "object", "embed"}
    for tag, attrs in tags:
        for attr in ("src", "href", "xlink:href", "data"):
            value = (attrs.get(attr) or "").strip().lower()
            assert not value.startswith(("http:", "https:", "//", "file:")), (tag, attr, value)
    assert "@import" not in page
    assert not re.search(r"url\(\s*['\"]?(https?:|//)", page)


def charts(page: str) -> dict[str, list[str]]:
    """Each chart frame's SVG, by its data-chart name."""
    out: dict[str, list[str]] = {}
    for name, body in re.findall(
        r'<figure class="chart" data-chart="([^"]+)"[^>]*>(.*?)</figure>', page, re.S
    ):
        svg = re.search(r"<svg.*</svg>", body, re.S)
        out.setdefault(name, []).append(svg.group(0) if svg else body)
    return out


def assert_drawn(svg: str) -> None:
    assert svg.lstrip().startswith("<svg"), svg[:80]
    assert svg.rstrip().endswith("</svg>")
    drawn = re.findall(r'<path d="M[^"]+"', svg)
    assert len(drawn) >= 2, "a chart without drawn paths"
    assert "<image" not in svg  # vector only: no raster embedded


@pytest.mark.parametrize("namespace", NAMESPACE_NAMES, ids=lambda n: NAMESPACE_IDS[n])
def test_a_real_report_makes_one_self_contained_page(
    root: Path, tmp_path: Path, namespace: str
) -> None:
    report = _doctor(root, namespace, SLOW)
    (run,) = report["runs"]
    figures = run["figures"]
    steps = [step for step, _ in figures["phase_ms_over_steps"]]
    assert steps == [2, 4, 6, 8]  # one window per log (log_every_n_steps=2)
    assert {"stage_decode_ms", "stage_augment_ms"} <= set(figures)

    path = write_report_page(report, tmp_path / "out" / "report.html")
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert_self_contained(page)
    assert len(page.encode()) < 1_000_000

    drawn = charts(page)
    for name in REPORT_CHARTS:
        assert name in drawn, f"no {name} chart"
        for svg in drawn[name]:
            assert_drawn(svg)
    (phases,) = drawn["step_phases"]
    assert "whole run" not in phases  # the series, not the one-bar fallback
    for step in steps:  # a bar per logging window, labelled by its step
        assert re.search(rf">\s*{step}\s*</text>", phases), step
    (stages,) = drawn["data_pipeline"]
    assert "stage decode (per call)" in stages
    assert "stage augment (per call)" in stages

    for finding in report["findings"]:
        key = f"{finding['component']}/{finding['id']}"
        assert f'data-finding-id="{key}"' in page, key
    assert re.search(
        r'<section class="finding [a-z]+" id="finding-sync_points-sync-item-\d+"', page
    )

    sync = re.search(r'<section class="block" id="sync-points">(.*?)</section>', page, re.S)
    assert sync is not None
    assert "train.py:" in sync.group(1)
    assert "print(loss.item())" in sync.group(1)  # the code line of the sync
    held = re.search(r'<section class="block" id="retained-graphs">(.*?)</section>', page, re.S)
    assert held is not None  # the holder of the graphs
    assert "kept" in held.group(1)


@pytest.mark.parametrize("namespace", NAMESPACE_NAMES, ids=lambda n: NAMESPACE_IDS[n])
def test_a_script_that_crashed_still_gets_a_page(
    root: Path, tmp_path: Path, namespace: str
) -> None:
    report = _doctor(root, namespace, "pass", crash_at=3)
    assert report["runs"] == []
    page = write_report_page(report, tmp_path / "crash.html").read_text(encoding="utf-8")
    assert_self_contained(page)
    assert "No Trainer.fit ran to completion" in page
    assert charts(page) == {}
    for finding in report["findings"]:
        assert f'data-finding-id="{finding["component"]}/{finding["id"]}"' in page


@pytest.mark.parametrize("namespace", NAMESPACE_NAMES, ids=lambda n: NAMESPACE_IDS[n])
def test_the_compare_page_shows_both_runs_ratios_and_the_finding_gone(
    root: Path, tmp_path: Path, namespace: str
) -> None:
    before = _doctor(root, namespace, SLOW)
    after = _doctor(root, namespace, "pass")
    path = write_compare_page({"before": before, "after": after}, tmp_path / "cmp.html")
    page = path.read_text(encoding="utf-8")
    assert_self_contained(page)
    drawn = charts(page)
    (rates,) = drawn["samples_per_sec"]
    assert_drawn(rates)
    assert ">before<" in rates  # one line per report, in the legend
    assert ">after<" in rates
    (shares,) = drawn["phase_shares"]
    assert_drawn(shares)
    assert 'data-report="before"' in page
    assert 'data-report="after"' in page
    rates = compare({"before": before, "after": after}).figures["samples_per_sec"]
    row = re.search(r"<tr><td>samples/s</td>(.*?)</tr>", page)
    assert row is not None
    assert f"{rates[1] / rates[0]:.2f}x" in row.group(1)
    gone = re.search(r'<div class="changes" data-change="gone"[^>]*>(.*?)</div>', page, re.S)
    assert gone is not None
    assert 'data-finding-id="sync_points/sync-item"' in gone.group(1)
    assert 'data-finding-id="loss_retention/retained-graph"' in gone.group(1)


# --- dict-level: escaping, badges, fallbacks --------------------------------------------------


def _run(**figures: Any) -> dict[str, Any]:
    return {"wall_s": 2.0, "samples": 64, "samples_per_sec": 32.0, "figures": figures}


def test_every_string_from_the_report_is_escaped() -> None:
    evil = "<script>alert('x')</script>"
    report = {
        "findings": [
            {
                "component": "sync_points",
                "id": "sync-item",
                "message": f"`{evil}` waits for the device",
                "location": f"{evil}.py:3",
                "fix": evil,
                "severity": "warning",
                "figures": {"kind": evil, "code": evil},
            }
        ],
        "runs": [
            _run(
                phase_ms={evil: 1.0, "backward": 2.0},
                wall_time={"total_s": 3.0, "parts": {evil: 2.0}, "callbacks": {}},
                verdict=evil,
            )
        ],
        "skipped": [evil],
        "script": evil,
    }
    page = render_report_page(report)
    assert "<script" not in page
    assert "&lt;script&gt;" in page
    assert_self_contained(page)
    assert "&lt;script&gt;" in charts(page)["wall_time"][0]  # chart labels too (SVG text)


def test_gpu_advice_is_badged_and_listed_after_what_pays_here() -> None:
    report = {
        "findings": [
            {
                "component": "advisor",
                "id": "layer-dims-multiple",
                "message": "pad it",
                "severity": "info",
                "pays_on": "GPU",
                "figures": {},
            },
            {
                "component": "data",
                "id": "data-bound",
                "message": "cache it",
                "severity": "info",
                "figures": {},
            },
            # an older report: no pays_on, no figures
            {"component": "timeline", "id": "step-phases", "message": "phases"},
        ],
        "runs": [],
    }
    page = render_report_page(report)
    ids = re.findall(r'data-finding-id="([^"]+)"', page)
    assert ids == ["timeline/step-phases", "data/data-bound", "advisor/layer-dims-multiple"]
    gpu = re.search(r'data-finding-id="advisor/layer-dims-multiple".*?</h3>', page, re.S)
    assert gpu is not None
    assert "on GPU" in gpu.group(0)
    assert page.count(">on GPU<") == 1


def _finding(component: str, id_: str, severity: str, pays_on: str | None = None) -> dict[str, Any]:
    message = f"{id_} says so"
    return {"component": component, "id": id_, "message": message, "severity": severity,
            "pays_on": pays_on, "figures": {}}  # fmt: skip


def _top_tile(page: str) -> str:
    tile = re.search(r'<div class="label">top finding</div><div class="value">(.*?)</div>', page)
    assert tile is not None, "no top-finding tile"
    return tile.group(1)


def test_the_top_finding_is_the_first_warning_that_pays_here() -> None:
    infos = [_finding("data", "data-pipeline", "info"), _finding("data", "model-bound", "info")]
    gpu = _finding("sync_points", "sync-item", "warning", pays_on="GPU")
    only_notes = render_report_page({"findings": [*infos, gpu], "runs": [_run()]})
    assert _top_tile(only_notes) == "no warning that pays on this hardware; 3 notes below"
    wall = _finding("wall_time", "validation-time", "warning")
    page = render_report_page({"findings": [*infos, gpu, wall], "runs": [_run()]})
    assert _top_tile(page) == "[warning] validation-time says so"


def test_lines_orders_of_magnitude_apart_get_a_log_axis() -> None:
    from lightning_speedpack.doctor.html import charts as html_charts

    near = {"loader": [[0, 120.0], [1, 130.0]], "model": [[0, 100.0], [1, 90.0]]}
    apart = {"loader": [[0, 16000.0], [1, 19000.0]], "model": [[0, 30.0], [1, 32.0]]}
    linear = html_charts.line_chart("near", near, "epoch", "samples / s")
    log = html_charts.line_chart("apart", apart, "epoch", "samples / s")
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", log)
    assert {"100", "1,000", "10,000"} <= set(labels)  # decades, as plain numbers
    assert "1,000" not in re.findall(r"<text[^>]*>([^<]*)</text>", linear)
    assert not [label for label in labels if "$" in label]  # no raw mathtext in the page


def test_alike_findings_are_grouped_with_their_places() -> None:
    layers = [
        {
            "component": "advisor",
            "id": "layer-dims-multiple",
            "message": f"head_dim=100 in enc.{i}",
            "location": f"enc.{i}",
            "severity": "info",
            "fix": "pad",
            "figures": {},
        }
        for i in range(4)
    ]
    page = render_report_page({"findings": layers, "runs": []})
    assert page.count('data-finding-id="advisor/layer-dims-multiple"') == 1
    assert "4 places" in page
    assert "enc.{0-3}" in page


def test_one_phase_bar_without_the_series_and_the_what_if_table() -> None:
    what_if = {
        "columns": list(WHAT_IF_COLUMNS),  # as WhatIf writes them
        "rows": [
            [
                "num_workers",
                "loader",
                "0",
                "2",
                128.9,
                239.6,
                1.848,
                1.699,
                1.997,
                None,
                "apply",
                "2 of 3 rounds",
            ]
        ],
        "applied": {"num_workers": 2},
        "trial_seconds": 36.9,
    }
    run = _run(phase_ms={"data_wait": 8.0, "backward": 2.0}, what_if=what_if)
    projection = {
        "component": "what_if",
        "id": "what-if-projection",
        "severity": "info",
        "message": "end to end today: 129 samples/s; with the winners: 238 samples/s",
    }
    page = render_report_page({"findings": [projection], "runs": [run]})
    (bar,) = charts(page)["step_phases"]
    assert_drawn(bar)
    assert "whole run" in bar
    block = re.search(r'<section class="block" id="what-if">(.*?)</section>', page, re.S)
    assert block is not None
    assert "1.85x (1.70-2.00)" in block.group(1)
    assert "num_workers=2" in block.group(1)
    assert "with the winners: 238" in block.group(1)


def test_the_world_size_is_shown_when_the_figures_carry_it() -> None:
    page = render_report_page({"findings": [], "runs": [_run(world_size=2)]})
    assert re.search(r"<dt>world size</dt><dd>2 ", page)
    assert "world size" not in render_report_page({"findings": [], "runs": [_run()]})


def test_long_series_are_merged_to_at_most_max_bars() -> None:
    series = [[2 * (i + 1), {"data_wait": float(i), "backward": 1.0}] for i in range(150)]
    labels, stacks = phase_windows(series)
    assert len(labels) <= MAX_BARS
    assert labels[-1] == "300"
    assert stacks["backward"] == [1.0] * len(labels)
    assert stacks["data_wait"][0] == pytest.approx(sum(range(3)) / 3)


def test_charts_are_deterministic_and_their_ids_do_not_clash() -> None:
    report = {
        "findings": [],
        "runs": [
            _run(samples_per_sec_over_steps=[[1, 2.0], [2, 3.0]], phase_ms={"other": 1.0}),
            _run(samples_per_sec_over_steps=[[1, 4.0], [2, 5.0]], phase_ms={"other": 2.0}),
        ],
    }
    first, second = render_report_page(report), render_report_page(report)
    svgs = re.findall(r"<svg.*?</svg>", first, re.S)
    assert svgs == re.findall(r"<svg.*?</svg>", second, re.S)
    ids = re.findall(r'\bid="([^"]+)"', "".join(svgs))
    assert ids
    assert len(ids) == len(set(ids))


def test_missing_matplotlib_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert missing_requirement() is None
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    assert missing_requirement() == (
        "--html needs matplotlib: pip install 'lightning-speedpack[html]'"
    )


def test_the_package_exports_exactly_the_page_functions() -> None:
    assert sorted(doctor_html.__all__) == [
        "missing_requirement",
        "render_compare_page",
        "render_report_page",
        "write_compare_page",
        "write_report_page",
    ]
    with pytest.raises(ValueError, match="two"):
        render_compare_page({"only": {"findings": [], "runs": []}})
