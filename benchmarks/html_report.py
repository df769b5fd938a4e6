"""The doctor's HTML report page: its size and how fast headless Chromium opens it.

Writes the page (``lightning_speedpack.doctor.html.write_report_page``) for a doctor JSON report
and opens it ``--repeats`` times in Debian's headless Chromium (one browser, a fresh tab each
time), alternating with ``about:blank`` in a fresh tab as the baseline (a tab's fixed cost).
Prints the page's size and the medians of its ``load`` time (the navigation entry's
``loadEventEnd``: ms from the start of navigation to the end of the load event) and of the wall
time of a whole open (new tab, navigation, load), next to the blank tab's. Goal (issue 25): the
page of the demo's slow run is at most 5 MB and opens in under 2 s on this machine.

The report is ``--report PATH`` (e.g. ``demo-output/slow_training.json``, which ``make demo``
writes), else one made here by ``speedpack doctor --deep``'s session around a small in-process
fit (a ``.item()`` sync each step, a slow loader without workers: findings and charts to draw).

Run ``.venv/bin/python benchmarks/html_report.py [--quick] [--report PATH] [--out DIR]``. Needs
``chromium-headless-shell`` (or ``chromium``; ``$SPEEDPACK_CHROMIUM`` names another binary) and
the ``playwright`` package (the dev extra); Playwright's own browser download is never used.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests.helpers.browser
from _common import TinyMLP, print_table, quiet_trainer

from lightning_speedpack.doctor.compare import load_report
from lightning_speedpack.doctor.runner import DoctorSession
from tests.helpers.browser import Chromium, find_chromium

GOAL_BYTES = 5 * 1024 * 1024
GOAL_OPEN_S = 2.0


class SlowSamples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """2 ms a sample, fetched in the training loop (no workers): a data-bound run."""

    def __init__(self, n: int, width: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, width, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.002)
        return self.x[i], self.y[i]


class SyncingMLP(TinyMLP):
    """TinyMLP that reads its loss on the host every step and feeds itself from SlowSamples."""

    def __init__(self, n: int) -> None:
        super().__init__(n=n, batch_size=10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if loss.item() > 1e9:  # a host-device sync each step: a finding
            print("diverged")
        return loss

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(SlowSamples(len(self.data)), batch_size=self.batch_size, num_workers=0)


def make_report(steps: int, folder: Path) -> dict[str, Any]:
    """A doctor report (``--deep``) of a small fit, written as JSON and read back."""
    session = DoctorSession(deep=True)
    with session.installed():
        trainer = quiet_trainer(max_steps=steps, log_every_n_steps=5)
        trainer.fit(SyncingMLP(n=10 * steps))
    path = folder / "report.json"
    session.report().write_json(path)
    return load_report(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a shorter fit, 3 opens")
    parser.add_argument("--report", type=Path, help="a `speedpack doctor --json` report")
    parser.add_argument("--repeats", type=int, default=None, help="opens of each page (5)")
    parser.add_argument("--out", type=Path, help="keep the page (and its screenshot) here")
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 5)
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit(
            "headless Chromium is not installed: `sudo apt-get install chromium-headless-shell` "
            "(or set SPEEDPACK_CHROMIUM to a Chromium binary)"
        )
    from lightning_speedpack.doctor.html import write_report_page

    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="speedpack-html-bench-") as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if args.report is not None:
            report, source = load_report(args.report), str(args.report)
        else:
            steps = 20 if args.quick else 60
            report, source = make_report(steps, folder), f"an in-process fit of {steps} steps"
        start = time.perf_counter()
        page = write_report_page(report, folder / "report.html")
        write_s = time.perf_counter() - start
        size = page.stat().st_size
        load_ms: list[float] = []
        open_s: list[float] = []
        blank_s: list[float] = []
        start = time.perf_counter()
        with Chromium(chromium) as browser:
            launch_s = time.perf_counter() - start
            browser.blank()  # warm-up: the first tab pays for the renderer's start
            for r in range(repeats):
                if r % 2:
                    blank_s.append(browser.blank())
                shot = folder / "report.png" if r == 0 and args.out else None
                rendered = browser.render(page, shot)
                if rendered.problems():
                    raise SystemExit("the page is defective:\n" + "\n".join(rendered.problems()))
                load_ms.append(rendered.load_ms)
                open_s.append(rendered.wall_s)
                if not r % 2:
                    blank_s.append(browser.blank())
    median_open = statistics.median(open_s)
    print_table(
        f"HTML report of {source}: {len(report['findings'])} findings, "
        f"{len(rendered.charts)} charts; {chromium}, median of {repeats} opens in fresh tabs "
        f"(browser launch {launch_s:.2f} s, page written in {write_s:.2f} s)",
        ["page", "bytes", "MB", "load event end ms", "open wall s", "goal"],
        [
            [
                "report",
                size,
                f"{size / 1e6:.2f}",
                f"{statistics.median(load_ms):.0f}",
                median_open,
                f"<= 5 MB: {'yes' if size <= GOAL_BYTES else 'NO'}; "
                f"< 2 s: {'yes' if median_open < GOAL_OPEN_S else 'NO'}",
            ],
            ["about:blank", 0, "0.00", "-", statistics.median(blank_s), "baseline"],
        ],
    )
    print(
        "\nper open (s): "
        + json.dumps(
            {"report": [round(s, 3) for s in open_s], "blank": [round(s, 3) for s in blank_s]}
        )
    )
    if args.out:
        print(f"page: {page}")


if __name__ == "__main__":
    main()
