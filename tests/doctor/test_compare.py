"""``speedpack compare`` on real doctor reports: figures side by side, findings gone, the chart."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lightning_speedpack.core.console import LOG_WIDTH
from lightning_speedpack.doctor.compare import SERIES, compare, load_report, main
from lightning_speedpack.doctor.runner import run_script

SCRIPT = """
import torch
from pytorch_lightning import Trainer
from pytorch_lightning.demos.boring_classes import BoringModel

class Model(BoringModel):
    def training_step(self, batch, batch_idx):
        loss = self.step(batch)
        {planted}
        return {{"loss": loss}}

trainer = Trainer(accelerator="cpu", max_steps=30, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir={root!r})
trainer.fit(Model())
"""


def _report(tmp_path: Path, name: str, planted: str) -> Path:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(SCRIPT.format(planted=planted, root=str(tmp_path))))
    result = run_script(script)
    assert result.exit_code == 0, result.error
    path = tmp_path / f"{name}.json"
    result.report.write_json(path)
    return path


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp_path = tmp_path_factory.mktemp("reports")
    before = _report(tmp_path, "before", "self.seen = loss.item()  # planted sync")
    after = _report(tmp_path, "after", "pass")
    return before, after


@pytest.mark.slow
def test_compare_prints_figures_ratios_and_the_finding_that_disappeared(
    reports: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = reports
    assert ("sync_points", "sync-item") in {
        (f["component"], f["id"]) for f in load_report(before)["findings"]
    }
    png, out_json = tmp_path / "chart.png", tmp_path / "cmp.json"
    args = [str(before), str(after), "--plot", str(png), "--json", str(out_json)]
    code = main([*args, "--layout", "table", "--width", "200"])
    out = capsys.readouterr().out
    assert code == 0
    assert "speedpack compare (ratio to before)" in out
    syncs = next(line for line in out.splitlines() if "syncs per step (user code)" in line)
    cells = [cell.strip() for cell in syncs.split("│")[1:-1]]
    assert cells == ["syncs per step (user code)", "1", "0", "0.00x"]
    assert "samples/s" in out
    assert "Findings: before -> after" in out
    assert "sync_points/sync-item" in out
    assert "disappeared" in out
    assert png.stat().st_size > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads(out_json.read_text())
    assert written["reports"] == ["before", "after"]
    assert written["figures"]["syncs_per_step"]["values"] == [1.0, 0.0]
    assert written["figures"]["syncs_per_step"]["ratio_to_first"] == [1.0, 0.0]
    (change,) = written["findings"]
    assert change["report"] == "after"
    assert "sync-item" in {f["id"] for f in change["disappeared"]}
    assert "sync-item" not in {f["id"] for f in change["appeared"]}
    assert all(written["samples_per_sec_over_steps"][name] for name in ("before", "after"))


def test_compare_into_a_log_file_gives_a_line_per_figure_and_a_paragraph_per_finding(
    reports: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = reports
    assert main([str(before), str(after)]) == 0  # stdout captured: not a terminal
    out = capsys.readouterr().out
    assert "syncs per step (user code): before=1, after=0 (0.00x)" in out.splitlines()
    assert "│" not in out
    assert "…" not in out
    # at most LOG_WIDTH characters, but for a path alone on its line (never broken)
    assert all(len(line) <= LOG_WIDTH or " " not in line.strip() for line in out.splitlines())
    changes = out[out.index("Findings: before -> after") :]
    assert "disappeared: [warning] sync_points/sync-item: " in changes


def test_three_reports_each_get_a_ratio_to_the_first(reports: tuple[Path, Path]) -> None:
    before, after = reports
    loaded = {n: load_report(p) for n, p in (("a", before), ("b", after), ("c", before))}
    result = compare(loaded)
    assert result.ratios["samples"] == [1.0, 1.0, 1.0]  # 30 steps of 2 samples each
    assert result.disappeared[2] == []
    assert result.appeared[2] == []
    sps = result.figures["samples_per_sec"]
    assert result.ratios["samples_per_sec"][1] == pytest.approx(sps[1] / sps[0])


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "not valid JSON"),
        ('{"loss": [1, 2, 3]}', "not a speedpack doctor report (no 'findings' list)"),
        ("[1, 2]", "not a speedpack doctor report (the top level is a list"),
        ('{"findings": [], "runs": [{"wall_s": "x"}]}', "runs[0] lacks numeric"),
    ],
)
def test_a_broken_or_foreign_json_gets_one_line_and_exit_code_2(
    reports: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    says: str,
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code = main([str(reports[0]), str(bad)])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"speedpack compare: {bad}: ")
    assert says in line


def test_missing_file_and_a_single_report_exit_2(
    reports: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(reports[0]), str(tmp_path / "nope.json")]) == 2
    assert main([str(reports[0])]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert "cannot read it" in lines[0]
    assert "at least two reports" in lines[1]


def test_plot_without_a_series_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run: dict[str, Any] = {"wall_s": 1.0, "samples": 10, "samples_per_sec": 10.0, "figures": {}}
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"findings": [], "runs": [run]}))
    png = tmp_path / "x.png"
    code = main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--plot", str(png)])
    assert code == 1
    assert "no chart drawn" in capsys.readouterr().err
    assert not png.exists()


def _tiny_reports(tmp_path: Path) -> list[str]:
    run: dict[str, Any] = {"wall_s": 1.0, "samples": 10, "samples_per_sec": 10.0, "figures": {}}
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"findings": [], "runs": [run]}))
    return [str(tmp_path / "a.json"), str(tmp_path / "b.json")]


def test_html_writes_the_compare_page_of_the_reports_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_speedpack.doctor.html as html_pages

    pages: list[tuple[dict[str, Any], str]] = []

    def write_compare_page(reports: dict[str, Any], path: str) -> Path:
        pages.append((reports, path))
        return Path(path)

    monkeypatch.setattr(html_pages, "write_compare_page", write_compare_page)
    page = str(tmp_path / "cmp.html")
    assert main([*_tiny_reports(tmp_path), "--html", page]) == 0
    ((reports, path),) = pages
    assert path == page
    assert list(reports) == ["a", "b"]  # the names the comparison prints
    assert reports["a"]["runs"][0]["samples"] == 10
    assert f"HTML page: {page}" in capsys.readouterr().out


def test_a_page_that_cannot_be_made_still_lets_the_chart_be_drawn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_speedpack.doctor.html as html_pages

    def broken(reports: dict[str, Any], path: str) -> Path:
        raise ValueError("a figure the page cannot draw")

    monkeypatch.setattr(html_pages, "write_compare_page", broken)
    run: dict[str, Any] = {"wall_s": 1.0, "samples": 10, "samples_per_sec": 10.0,
                           "figures": {SERIES: [[1, 9.0], [2, 11.0]]}}  # fmt: skip
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"findings": [], "runs": [run]}))
    chart = tmp_path / "chart.png"
    argv = [str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--html", "x.html"]
    assert main([*argv, "--plot", str(chart)]) == 1  # the page failed; the rest did not
    assert chart.is_file()
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "speedpack compare: --html: the page could not be made (ValueError: a figure the page "
        "cannot draw)"
    ]


def test_html_without_matplotlib_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_speedpack.doctor.html as html_pages

    hint = "--html needs matplotlib: pip install 'lightning-speedpack[html]'"
    monkeypatch.setattr(html_pages, "missing_requirement", lambda: hint)
    assert main([*_tiny_reports(tmp_path), "--html", str(tmp_path / "x.html")]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"speedpack compare: {hint}"]
    assert captured.out == ""
    assert not (tmp_path / "x.html").exists()


def test_width_sizes_the_compare_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verdict = "model-bound: the model consumes 214 samples/s, the loader could deliver 10,200"
    run = {"wall_s": 1.0, "samples": 10, "samples_per_sec": 10.0, "figures": {"verdict": verdict}}
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"findings": [], "runs": [run]}))
    for width in (60, 120):
        args = [str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--layout", "table"]
        assert main([*args, "--width", str(width)]) == 0
        out = capsys.readouterr().out
        assert max(len(line) for line in out.splitlines()) == width
        assert "…" not in out
        assert "10,200" in out
