"""The doctor's HTML pages in a real browser: Debian's headless Chromium (issue #25).

Each page is built from a real ``speedpack doctor`` report of a tiny script (a ``loss.item()``
sync in ``training_step``, a slow ``DataLoader`` with no workers: findings to show), opened from
disk, and must: log no JavaScript error, throw none, request nothing from the network (it is
self-contained), draw every chart, and carry every finding's ``component/id`` in its DOM. Its
full-page screenshot is kept as an artifact under ``$SPEEDPACK_ARTIFACTS`` (default
``<repo>/test-artifacts/``), with the page itself beside it.

Without Chromium (or the ``playwright`` package) these tests skip with the command that installs
it; under ``.ci/run`` (``SPEEDPACK_REQUIRE_BROWSER=1``) or with ``CI`` set they fail instead.
How fast the page opens is a benchmark (``benchmarks/html_report.py``), not asserted here.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from lightning_speedpack.doctor.compare import load_report
from lightning_speedpack.doctor.html import write_compare_page, write_report_page
from lightning_speedpack.doctor.runner import run_script
from tests.helpers.browser import Chromium, Rendered, chromium_or_skip, render
from tests.helpers.namespaces import Namespace, each_namespace

pytestmark = pytest.mark.browser  # make test-all (and CI), not the fast `make test`

REPO = Path(__file__).resolve().parents[2]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

SCRIPT = """\
import sys
import time
import torch
from {ns} import Trainer
from {ns}.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, Dataset

BATCH = int(sys.argv[1]) if len(sys.argv) > 1 else 7
SYNC = "--no-sync" not in sys.argv


class Slow(Dataset):  # 5 ms a sample, fetched in the training loop: the loop waits for data
    def __len__(self):
        return 8 * BATCH

    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.randn(32)


class Model(BoringModel):
    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).sum()
        if SYNC and loss.item() > 1e9:  # a host-device sync every step
            print("big")
        return loss

    def train_dataloader(self):
        return DataLoader(Slow(), batch_size=BATCH, num_workers=0)


trainer = Trainer(accelerator="cpu", max_steps=8, log_every_n_steps=2, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False)
trainer.fit(Model())
"""


def artifacts_dir() -> Path:
    """Where screenshots (and their pages) are kept after the run: ``$SPEEDPACK_ARTIFACTS``,
    else ``<repo>/test-artifacts/`` (git-ignored)."""
    root = Path(os.environ.get("SPEEDPACK_ARTIFACTS") or REPO / "test-artifacts")
    folder = root / "html"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def doctor_report(tmp_path: Path, ns_name: str, *args: str, tag: str = "run") -> dict[str, Any]:
    """The JSON report ``speedpack doctor --deep --json`` writes for :data:`SCRIPT`, read back
    as ``speedpack compare`` reads it."""
    folder = tmp_path / tag
    folder.mkdir()
    script = folder / "train.py"
    script.write_text(SCRIPT.format(ns=ns_name))
    with warnings.catch_warnings():  # the script's warnings are not under test
        warnings.simplefilter("ignore")
        result = run_script(script, args, deep=True)
    assert result.exit_code == 0, result.error
    result.report.write_json(folder / "report.json")
    report = load_report(folder / "report.json")
    assert report["findings"], "the script was written to yield findings"
    return report


def finding_ids(*reports: dict[str, Any]) -> set[str]:
    return {f"{f['component']}/{f['id']}" for report in reports for f in report["findings"]}


def keep(page: Path, rendered: Rendered, name: str) -> Path:
    """Copy the page beside its screenshot in the artifacts folder; print where they are."""
    assert rendered.screenshot is not None
    shutil.copyfile(page, rendered.screenshot.with_name(f"{name}.html"))
    print(
        f"\nscreenshot: {rendered.screenshot}  (page: {rendered.screenshot.with_suffix('.html')})"
    )
    return rendered.screenshot


def assert_sound(rendered: Rendered, expected_ids: set[str]) -> None:
    """What every page must do in the browser (see the module doc)."""
    assert rendered.console_errors == [], "JavaScript console errors"
    assert rendered.page_errors == [], "uncaught JavaScript errors"
    assert rendered.requests == [], "the page is not self-contained: it requested these"
    assert rendered.failed_requests == []
    assert rendered.charts, "the page has no <figure class='chart'>"
    blank = [chart for chart in rendered.charts if not chart.drew]
    assert blank == [], "charts that drew nothing"
    names = [chart.name for chart in rendered.charts]
    assert all(names), f"a chart without its data-chart name: {names}"
    assert "samples_per_sec" in names, f"no throughput chart among {names}"
    missing = expected_ids - set(rendered.finding_ids)
    assert not missing, f"findings absent from the DOM: {sorted(missing)}"
    assert_png(rendered.screenshot)


def assert_png(path: Path | None) -> None:
    """A real PNG of a page with something on it, not a blank or truncated file."""
    from PIL import Image

    assert path is not None, "no screenshot taken"
    assert path.is_file(), f"no screenshot at {path}"
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC), f"{path} is not a PNG"
    assert len(data) > 10_000, f"{path}: {len(data)} bytes is too small for a rendered report"
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.width >= 800, image.size
        assert image.height >= 400, image.size
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 16, "the screenshot is (nearly) one colour"


@each_namespace
def test_the_report_page_works_in_headless_chromium(ns: Namespace, tmp_path: Path) -> None:
    chromium = chromium_or_skip()
    report = doctor_report(tmp_path, ns.name)
    expected = finding_ids(report)
    assert {"sync_points/sync-item", "advisor/dataloader-workers"} <= expected
    page = write_report_page(report, tmp_path / "report.html")
    name = f"doctor-report-{ns.id}"
    rendered = render(page, artifacts_dir() / f"{name}.png", executable=chromium)
    keep(page, rendered, name)
    assert_sound(rendered, expected)


def test_the_compare_page_works_in_headless_chromium(tmp_path: Path) -> None:
    chromium = chromium_or_skip()
    before = doctor_report(tmp_path, "pytorch_lightning", tag="before")
    # The same script, fixed: no `.item()` each step, a batch of 8 (the multiple the advisor
    # asks for). Findings disappear; the page must still show every one of either run.
    after = doctor_report(tmp_path, "pytorch_lightning", "8", "--no-sync", tag="after")
    assert "sync_points/sync-item" in finding_ids(before) - finding_ids(after)
    page = write_compare_page({"before": before, "after": after}, tmp_path / "compare.html")
    rendered = render(page, artifacts_dir() / "doctor-compare.png", executable=chromium)
    keep(page, rendered, "doctor-compare")
    assert_sound(rendered, finding_ids(before, after))


BROKEN_PAGE = """\
<!doctype html>
<html><head><meta charset="utf-8"><title>broken</title></head><body>
<figure class="chart" data-chart="drawn">{svg}</figure>
<figure class="chart" data-chart="empty-svg"><svg width="200" height="100"></svg></figure>
<figure class="chart" data-chart="blank-canvas"><canvas width="60" height="60"></canvas></figure>
<figure class="chart" data-chart="canvas"><canvas id="c" width="60" height="60"></canvas></figure>
<p data-finding-id="sync_points/sync-item">a finding</p>
<img src="http://speedpack.invalid/pixel.png" alt="">
<script>
document.getElementById("c").getContext("2d").fillRect(0, 0, 20, 20);
console.error("logged on purpose");
</script>
<script>notDefinedAnywhere();</script>
</body></html>
"""


def test_the_harness_sees_what_a_broken_page_does(tmp_path: Path) -> None:
    """The checks above cannot pass by seeing nothing: every defect they look for is seen on a
    page that has each one, and a matplotlib SVG (what the report draws) counts as drawn."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    chromium = chromium_or_skip()
    figure = Figure(figsize=(3, 2))
    figure.subplots().plot([0, 1, 2], [1, 3, 2])
    svg = io.StringIO()
    figure.savefig(svg, format="svg")
    svg_text = svg.getvalue()
    page = tmp_path / "broken.html"
    page.write_text(BROKEN_PAGE.format(svg=svg_text[svg_text.index("<svg") :]))
    with Chromium(chromium) as browser:
        rendered = browser.render(page, tmp_path / "broken.png")
        assert browser.blank() > 0  # a second tab in the same browser
    assert any(m.startswith("logged on purpose (file:") for m in rendered.console_errors)
    assert any("notDefinedAnywhere" in e for e in rendered.page_errors)
    assert rendered.requests == ["http://speedpack.invalid/pixel.png"]
    assert [r.split(": ")[0] for r in rendered.failed_requests] == rendered.requests
    drew = {chart.name: chart.drew for chart in rendered.charts}
    assert drew == {"drawn": True, "empty-svg": False, "blank-canvas": False, "canvas": True}
    assert rendered.finding_ids == ["sync_points/sync-item"]
    assert rendered.load_ms > 0
    assert rendered.wall_s > 0
    assert rendered.screenshot is not None
    assert rendered.screenshot.read_bytes()[:8] == PNG_MAGIC
    kinds = {problem.split(":")[0] for problem in rendered.problems()}
    assert kinds == {"console error", "page error", "network request", "failed request"} | {
        "chart 'empty-svg' drew nothing",
        "chart 'blank-canvas' drew nothing",
    }
    assert json.dumps(rendered.finding_ids)  # plain data, as a benchmark prints it


def test_a_missing_browser_skips_with_the_install_command_or_fails_when_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import lightning_speedpack.doctor.html.chromium as package_chromium
    import tests.helpers.browser as browser

    monkeypatch.setattr(package_chromium, "CANDIDATES", ())
    monkeypatch.setattr(package_chromium, "ON_PATH", ())
    monkeypatch.delenv(browser.CHROMIUM_ENV, raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(browser.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium-headless-shell"):
        browser.chromium_or_skip()
    monkeypatch.setenv(browser.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="apt-get install chromium-headless-shell"):
        browser.chromium_or_skip()
    monkeypatch.delenv(browser.REQUIRE_ENV)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="may not be skipped"):
        browser.chromium_or_skip()
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # an ImportError
    with pytest.raises(pytest.fail.Exception, match="pip install playwright"):
        browser.chromium_or_skip()
    monkeypatch.delitem(sys.modules, "playwright.sync_api")
    monkeypatch.setenv(browser.REQUIRE_ENV, "0")  # an explicit opt-out wins over CI
    monkeypatch.setenv(browser.CHROMIUM_ENV, str(tmp_path / "no-such-chromium"))
    with pytest.raises(pytest.skip.Exception, match="is not an executable Chromium binary"):
        browser.chromium_or_skip()


def test_chromium_comes_from_the_override_then_debian_paths(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import lightning_speedpack.doctor.html.chromium as package_chromium
    import tests.helpers.browser as browser

    fake = tmp_path / "my-chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv(browser.CHROMIUM_ENV, str(fake))
    assert browser.find_chromium() == str(fake)
    monkeypatch.delenv(browser.CHROMIUM_ENV)
    monkeypatch.setattr(package_chromium, "CANDIDATES", (str(tmp_path / "absent"), str(fake)))
    assert browser.find_chromium() == str(fake)


def test_the_package_takes_a_screenshot_of_a_page_as_make_demo_does(tmp_path: Path) -> None:
    from lightning_speedpack.doctor.html.chromium import screenshot

    chromium = chromium_or_skip()
    report = {"findings": [], "runs": [{"wall_s": 2.0, "samples": 64, "samples_per_sec": 32.0,
              "figures": {"samples_per_sec_over_steps": [[1, 30.0], [2, 34.0]]}}]}  # fmt: skip
    page = write_report_page(report, tmp_path / "page.html")
    png = screenshot(page, tmp_path / "page.png", width=1000, height=800, binary=chromium)
    assert_png(png)
    from PIL import Image

    with Image.open(png) as image:
        assert image.size == (1000, 800)
    with pytest.raises(FileNotFoundError, match="apt-get install chromium-headless-shell"):
        _no_browser(page)


def _no_browser(page: Path) -> None:
    """``screenshot`` on a machine without Chromium: the error says how to install one."""
    import lightning_speedpack.doctor.html.chromium as package_chromium

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(package_chromium, "find_chromium", lambda: None)
        package_chromium.screenshot(page, page.with_suffix(".png"))


DDP_SCRIPT = """\
from {ns} import Trainer
from {ns}.demos.boring_classes import BoringModel


class Model(BoringModel):
    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.seen = out["loss"].item()  # a sync point on each rank
        return out


trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=6, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, log_every_n_steps=2)
trainer.fit(Model())
"""


@pytest.mark.ddp
@pytest.mark.timeout(240)
def test_a_ddp_run_gives_one_page_with_the_ranks_combined(tmp_path: Path) -> None:
    """``speedpack doctor --html`` on a 2-rank DDP script: one page (rank 0 writes it), the
    samples of both ranks, the world size said, every finding in the DOM, sound in a browser."""
    import subprocess

    chromium = chromium_or_skip()
    script = tmp_path / "ddp_train.py"
    script.write_text(DDP_SCRIPT.format(ns="pytorch_lightning"))
    page, report_path = tmp_path / "ddp.html", tmp_path / "ddp.json"
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_speedpack", "doctor", "--json", str(report_path),
         "--html", str(page), str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("*.html")) == ["ddp.html"]  # one page, not 2
    report = json.loads(report_path.read_text())
    (run,) = report["runs"]
    assert run["samples"] == 6 * 2  # 6 batches of 1 on each of 2 ranks
    assert run["figures"]["world_size"] == 2
    text = page.read_text()
    assert "<dt>world size</dt><dd>2 " in text  # the header says the figures span 2 ranks
    rendered = render(page, artifacts_dir() / "doctor-report-ddp.png", executable=chromium)
    keep(page, rendered, "doctor-report-ddp")
    assert_sound(rendered, finding_ids(report))
