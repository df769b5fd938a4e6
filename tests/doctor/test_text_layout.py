"""The doctor's text report read where people read it: a terminal, and a log file (SLURM, CI)."""

from __future__ import annotations

import io
import json
import math
import os
import re
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import lightning_speedpack.doctor.html as html_pages
from lightning_speedpack.core.console import LAYOUT_ENV, LOG_WIDTH, WIDTH_ENV
from lightning_speedpack.doctor.cli import main
from lightning_speedpack.doctor.grouping import presented
from lightning_speedpack.doctor.report import Finding, Report, RunSummary
from lightning_speedpack.sync_points.callback import SyncPointWarnings
from tests.helpers.models import quiet_trainer_kwargs
from tests.helpers.namespaces import Namespace, each_namespace

VERDICT = (
    "data-bound: the loader delivers 113 samples/s, the model could consume 191; 1 core(s) "
    "for loading cannot close it with workers (one delivers 113 samples/s while busy); instead: "
    "cache the deterministic preprocessing with lightning_speedpack.CachedDataset"
)
LONG_PATH = "/scratch/users/someone/projects/" + "nested/" * 14 + "transformer.py:49"
STAGES = (
    "where a training sample's loading time goes:\n"
    "stage            ms/call     calls\n"
    "fetch (sample)     8.821       400\n"
    "collate (batch)    0.893         4"
)
BOX = "│┃┆┊─━┏┓┗┛┡┩┣┫┳┻╇╋┼├┤┬┴┌┐└┘╭╮╯╰"


def _figures(scale: int) -> dict[str, Any]:
    """19 scalar figures (what a default doctor run measures), a series and two tables."""
    figures: dict[str, Any] = {f"count_{i:02d}": i * scale for i in range(15)}
    figures.update(
        data_wait_fraction=0.6291 / scale,
        end_heap_scan=False,
        bound="data",
        verdict=VERDICT,
        samples_per_sec_over_steps=[[10, 50.0], [20, 52.0]],
        wall_time={
            "total_s": 12.5 / scale,
            "parts": {"training_step": 6.0 / scale, "data_wait": 6.0 / scale, "callbacks": 0.5},
            "callbacks": {"SyncPointWarnings": 0.5 / scale},
        },
        what_if={
            "columns": [
                "knob",
                "today",
                "candidate",
                "before",
                "after",
                "gain",
                "gain_low",
                "gain_high",
                "verdict",
                "note",
            ],
            "rows": [
                [
                    "num_workers",
                    0,
                    4,
                    51.0,
                    120.0,
                    2.35,
                    2.1,
                    2.6,
                    "faster",
                    "measured on this model and data over 20 steps after a warm-up of 3 steps",
                ],
                [
                    "compile",
                    False,
                    True,
                    None,
                    None,
                    None,
                    None,
                    None,
                    "not tried",
                    "torch.compile pays on a GPU; named only",
                ],
            ],
            "trial_seconds": 12.0,
            "applied": {},
        },
    )
    return figures


def _findings() -> list[Finding]:
    return [
        Finding(
            "wall_time",
            "validation-time",
            "validation took 12% of the wall time",
            "val_dataloader",
            severity="info",
            fix="validate less often: Trainer(check_val_every_n_epoch=5) or "
            "limit_val_batches=0.25; each validation pass re-reads the whole val set",
        ),
        Finding(
            "data",
            "data-bound",
            VERDICT + " (the run waited for data 43% of its training time)",
            "jpeg_common.py:61",
            figures={"data_wait_fraction": 0.43},
            fix="DataLoader(num_workers=1); cache the deterministic preprocessing with "
            "lightning_speedpack.CachedDataset (decoded once, read from RAM after)",
        ),
        Finding(
            "sync_points",
            "sync-item",
            '`self.log("train_loss", loss.item())  # waits for the GPU every step` makes the '
            "CPU wait for the device (item, 1x per step)",
            LONG_PATH,
            fix=".item() -> log the tensor with self.log(...) (Lightning reduces it "
            "without a sync) or accumulate on the device and read it once per epoch",
        ),
        Finding("data", "data-pipeline", STAGES, "jpeg_common.py:61", severity="info"),
        *[
            Finding(
                "advisor",
                "layer-dims-multiple",
                f"head_dim=100 in enc.{i}.attn is not a multiple of 8, so fp16/bf16 "
                "tensor cores are not used fully",
                f"enc.{i}.attn",
                fix="pad head_dim to 104",
                severity="info",
                pays_on="GPU",
            )
            for i in range(6)
        ],
    ]


@pytest.fixture
def report() -> Report:
    runs = [RunSummary(12.5, 640, 51.2, _figures(1)), RunSummary(6.25, 640, 102.4, _figures(2))]
    skipped = [
        "data: the loader and model ceilings probed aside from the fit (without it, the "
        "verdict comes from the run's own epochs)"
    ]
    return Report(findings=_findings(), runs=runs, skipped=skipped)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (WIDTH_ENV, LAYOUT_ENV, "COLUMNS", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)


def _log_text(report: Report, width: int | None = None) -> str:
    console = Console(file=io.StringIO())  # a file, as under SLURM or nohup: not a terminal
    report.print(console, width=width)
    return _value(console)


def _table_text(report: Report, width: int) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, color_system=None)
    report.print(console, width=width)
    return _value(console)


def _value(console: Console) -> str:
    assert isinstance(console.file, io.StringIO)
    return console.file.getvalue()


def _normal(text: str) -> str:
    """The words of ``text``: box drawing and runs of whitespace made one space."""
    return " ".join(text.translate({ord(c): " " for c in BOX}).split())


def _unbreakable(line: str) -> bool:
    return " " not in line.strip()


def _finding_paragraphs(text: str) -> list[list[str]]:
    section = text[text.index("\nFindings (") :].strip("\n").splitlines()[1:]
    return [p.splitlines() for p in "\n".join(section).split("\n\n")]


def test_a_log_file_gets_every_figure_on_a_line_and_nothing_cut(report: Report) -> None:
    text = _log_text(report)
    assert "…" not in text
    assert all(len(line) <= 120 or _unbreakable(line) for line in text.splitlines())
    assert max(len(line) for line in text.splitlines() if LONG_PATH not in line) <= LOG_WIDTH
    lines = text.splitlines()
    for scale, run in ((1, "0"), (2, "1")):
        start = lines.index(f"run: {run}")
        block = lines[start : lines.index("", start)]
        for i in range(15):
            assert f"count_{i:02d}: {i * scale}" in block
        assert f"data_wait_fraction: {0.6291 / scale:.3g}" in block
        assert "end_heap_scan: False" in block
        assert "bound: data" in block
        assert any(line.startswith("verdict: data-bound:") for line in block)
    assert "samples_per_sec_over_steps" not in text  # series stay in the JSON
    assert _normal(VERDICT) in _normal(text)


def test_each_finding_is_one_short_paragraph_led_by_severity_and_id(report: Report) -> None:
    shown = presented(report.findings)
    paragraphs = _finding_paragraphs(_log_text(report))
    assert len(paragraphs) == len(shown) == 5  # six alike layers reported once
    for finding, lines in zip(shown, paragraphs, strict=True):
        label = "info, on GPU" if finding.pays_on else finding.severity
        first_words = " ".join(finding.message.split()[:2])
        assert lines[0].startswith(f"[{label}] {finding.component}/{finding.id}: {first_words}")
        budget = 3 * max(1, math.ceil(len(finding.message) / 100))
        assert len(lines) <= budget, lines
        body = _normal(" ".join(lines))
        for field in (finding.location, finding.fix):
            assert field is None or _normal(field) in body
    gpu = paragraphs[-1]
    assert gpu[0].startswith("[info, on GPU] advisor/layer-dims-multiple: head_dim=100 in 6 places")
    assert "enc.{0-5}.attn" in " ".join(gpu)


def test_a_message_keeps_its_own_lines(report: Report) -> None:
    text = _log_text(report)
    for row in STAGES.splitlines()[1:]:
        assert f"    {row}" in text.splitlines()  # the stage table keeps its columns


def test_the_table_and_the_log_layouts_carry_the_same_content(report: Report) -> None:
    table, log = _normal(_table_text(report, width=1000)), _normal(_log_text(report))
    fields: list[str] = ["Runs", "Left out", *report.skipped]
    for finding in presented(report.findings):
        fields += [f"{finding.component}/{finding.id}", finding.location or "", finding.fix or ""]
        fields += ["info, on GPU" if finding.pays_on else finding.severity]
        fields += finding.message.splitlines()
    for run in report.runs:
        fields += [f"{run.wall_s:.2f}", str(run.samples), f"{run.samples_per_sec:.1f}"]
        fields += [k for k, v in run.figures.items() if not isinstance(v, (list, dict))]
        fields += ["training_step", "callback SyncPointWarnings", "num_workers", "not tried"]
        fields += [run.figures["what_if"]["rows"][0][-1], "2.35x (2.10-2.60)"]
    for field in fields:
        assert _normal(field) in table, field
        assert _normal(field) in log, field
    assert "…" not in table


def test_width_sizes_the_terminal_tables(report: Report) -> None:
    narrow, wide = _table_text(report, width=60), _table_text(report, width=120)
    assert max(len(line) for line in narrow.splitlines()) == 60
    assert max(len(line) for line in wide.splitlines()) == 120
    assert "…" not in narrow
    # the runs turned on their side: a row per figure, one column per run
    assert re.search(r"│ count_03 +│ +3 │ +6 │", narrow)


def test_width_wraps_the_log(report: Report) -> None:
    lines = _log_text(report, width=70).splitlines()
    assert all(len(line) <= 70 or _unbreakable(line) for line in lines)
    assert any(len(line) > 60 for line in lines)


def test_what_pays_on_a_gpu_comes_last_in_both_layouts(report: Report) -> None:
    for text in (_table_text(report, width=200), _log_text(report)):
        ids = re.findall(
            r"\b(sync_points/sync-item|data/data-bound|data/data-pipeline|"
            r"wall_time/validation-time|advisor/layer-dims-multiple)\b",
            text,
        )
        assert ids[-1] == "advisor/layer-dims-multiple"
        assert "info, on GPU" in text


SCRIPT = """
import os
from {ns}.demos.boring_classes import BoringModel
from {ns} import Trainer

print("width", os.environ.get({width_env!r}), "layout", os.environ.get({layout_env!r}))
trainer = Trainer(accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir={root!r})
trainer.fit(BoringModel())
"""


@each_namespace
def test_doctor_width_layout_and_html_reach_the_report_and_the_script(
    ns: Namespace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pages: list[tuple[dict[str, Any], str]] = []

    def write_report_page(report: dict[str, Any], path: str) -> Path:
        pages.append((report, path))
        return Path(path)

    monkeypatch.setattr(html_pages, "write_report_page", write_report_page)
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            SCRIPT.format(
                ns=ns.name, width_env=WIDTH_ENV, layout_env=LAYOUT_ENV, root=str(tmp_path)
            )
        )
    )
    page = tmp_path / "report.html"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the script's warnings are not under test
        code = main(
            [
                "doctor",
                "--width",
                "70",
                "--layout",
                "log",
                "--only",
                "throughput",
                str(script),
                "--html",
                str(page),
            ]
        )
    captured = capsys.readouterr()
    assert code == 0
    assert "width 70 layout log" in captured.out  # what the script (and its callbacks) saw
    assert WIDTH_ENV not in os.environ  # put back after the script
    assert LAYOUT_ENV not in os.environ
    report = captured.err[captured.err.index("speedpack doctor ─") :]
    assert all(len(line) <= 70 or _unbreakable(line) for line in report.splitlines())
    assert "\nrun: 0\n" in report
    assert "samples_per_sec: " in report
    ((written, path),) = pages
    assert path == str(page)
    assert set(written) >= {"findings", "runs", "skipped"}
    assert json.loads(json.dumps(written, default=str))["runs"][0]["samples"] == 3


def test_html_without_its_requirement_stops_before_the_script_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hint = "--html needs matplotlib: pip install 'lightning-speedpack[html]'"
    monkeypatch.setattr(html_pages, "missing_requirement", lambda: hint)
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert main(["doctor", "--html", str(tmp_path / "r.html"), str(script)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"speedpack doctor: {hint}"]
    assert not marker.exists()


def test_a_page_that_cannot_be_made_costs_neither_the_report_nor_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(report: dict[str, Any], path: str) -> Path:
        raise ValueError("a figure the page cannot draw")

    monkeypatch.setattr(html_pages, "write_report_page", broken)
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    report = tmp_path / "r.json"
    argv = ["doctor", "--json", str(report), "--html", str(tmp_path / "r.html"), str(script)]
    assert main(argv) == 1  # the script succeeded; the page did not
    captured = capsys.readouterr()
    assert captured.out == "trained\n"
    assert "speedpack doctor ─" in captured.err  # the text report was printed all the same
    assert (
        "speedpack doctor: --html: the page could not be made (ValueError: a figure the page "
        "cannot draw); the text report and --json have it"
    ) in captured.err
    assert json.loads(report.read_text())["runs"] == []
    assert not (tmp_path / "r.html").exists()


def _syncing_model(ns: Namespace) -> Any:
    class Syncing(ns.BoringModel):  # type: ignore[misc,name-defined]
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = super().training_step(batch, batch_idx)
            self.seen = out["loss"].item()  # a host-device sync (counted here on a CPU)
            return out

    return Syncing()


@each_namespace
def test_a_callbacks_table_in_a_log_follows_the_width(
    ns: Namespace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(WIDTH_ENV, "60")  # what `speedpack doctor --width 60` sets
    callback = SyncPointWarnings(mode="summary", include_cpu=True)
    trainer = ns.Trainer(callbacks=[callback], **quiet_trainer_kwargs(tmp_path, max_steps=3))
    trainer.fit(_syncing_model(ns))
    err = capsys.readouterr().err
    lines = err[err.index("Host-device syncs") :].splitlines()
    table = lines[: lines.index("")]
    assert "…" not in err
    assert all(len(line) <= 60 or _unbreakable(line) for line in table)
    code = 'code: self.seen = out["loss"].item() # a host-device sync (counted here on a CPU)'
    assert code in _normal(" ".join(table))
    assert "per step: 1.00" in table
