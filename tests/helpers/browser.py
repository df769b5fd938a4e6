"""Open an HTML page in the system's headless Chromium and read back what it did.

The browser is Debian's own (``chromium-headless-shell`` or ``chromium``), driven through the
``playwright`` package (the dev extra): Playwright's browser download is never used, the binary
is always passed as ``executable_path``. Each launch gets a fresh, empty profile directory and
is closed however the caller ends.

Example::

    chromium = chromium_or_skip()  # the binary, or a clear skip (a failure when required)
    page = render(Path("report.html"), screenshot=Path("report.png"), executable=chromium)
    assert not page.console_errors and not page.page_errors and not page.requests
    assert all(chart.drew for chart in page.charts)

Which binary: ``$SPEEDPACK_CHROMIUM`` (a path or a name on ``PATH``), else
``/usr/bin/chromium-headless-shell``, ``/usr/bin/chromium``, else ``chromium-headless-shell``,
``chromium`` or ``chromium-browser`` on ``PATH``. Without one (or without ``playwright``) a test
is skipped with the command that installs it -- unless ``SPEEDPACK_REQUIRE_BROWSER=1`` (what
``.ci/run`` exports) or ``CI`` is set, where the same message fails the test: CI never passes
by skipping the browser.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from lightning_speedpack.doctor.html.chromium import CHROMIUM_ENV, CHROMIUM_FLAGS, find_chromium

__all__ = [
    "CHROMIUM_ARGS",
    "CHROMIUM_ENV",
    "INSTALL_HINT",
    "PLAYWRIGHT_HINT",
    "REQUIRE_ENV",
    "Chart",
    "Chromium",
    "Rendered",
    "browser_required",
    "chromium_or_skip",
    "find_chromium",
    "render",
]

REQUIRE_ENV = "SPEEDPACK_REQUIRE_BROWSER"

INSTALL_HINT = (
    "headless Chromium is not installed: `sudo apt-get install chromium-headless-shell` "
    f"(Debian/Ubuntu), or set {CHROMIUM_ENV} to a Chromium binary; .ci/run installs it"
)
PLAYWRIGHT_HINT = (
    "the `playwright` Python package (it drives the system's Chromium) is not installed: "
    "`pip install playwright` (it is in the dev extra: `pip install -e '.[dev]'`); "
    "no `playwright install` is needed, the test uses the system's Chromium"
)

#: The package's flags (headless, no sandbox, closed to the network); Playwright sets the profile.
CHROMIUM_ARGS = CHROMIUM_FLAGS

#: URL schemes a self-contained page may load from (itself, inline data, blobs it makes).
LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:")


def browser_required() -> bool:
    """Whether a missing browser fails rather than skips: ``$SPEEDPACK_REQUIRE_BROWSER`` when
    set (``0``/``false``/empty: not required), else whether ``$CI`` is set to a true value."""
    value = os.environ.get(REQUIRE_ENV)
    if value is None:
        value = os.environ.get("CI", "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def chromium_or_skip() -> str:
    """The Chromium binary, after checking ``playwright`` imports: else ``pytest.skip`` with
    the command that installs what is missing, or ``pytest.fail`` with it when
    :func:`browser_required`."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable(PLAYWRIGHT_HINT)
    try:
        chromium = find_chromium()
    except FileNotFoundError as err:
        _unavailable(f"{err}; {INSTALL_HINT}")
    if chromium is None:
        _unavailable(INSTALL_HINT)
    return chromium


def _unavailable(message: str) -> NoReturn:
    import pytest

    if browser_required():
        pytest.fail(
            f"{message}\n({REQUIRE_ENV}=1 or CI is set: the browser test may not be skipped)",
            pytrace=False,
        )
    pytest.skip(message)


@dataclass(frozen=True)
class Chart:
    """One ``<figure class="chart">`` as the browser laid it out.

    ``kind`` is ``"svg"``, ``"canvas"`` or ``None`` (neither inside); ``marks`` counts the
    painted shapes of its SVG (outside ``<defs>``/clip paths, with a non-empty box) or, for a
    canvas, its non-transparent pixels; ``width``/``height`` are its drawing's box in CSS px;
    ``ink`` is the share of the drawing's pixels on the screenshot that differ from its most
    common colour (``None`` without a screenshot).
    """

    name: str
    kind: str | None
    width: float
    height: float
    marks: int
    ink: float | None = None

    @property
    def drew(self) -> bool:
        """A non-empty drawing: a box with an area, painted shapes in it, and (when a
        screenshot was taken) more than one colour on screen."""
        painted = self.ink is None or self.ink > 0
        return self.kind is not None and self.width * self.height > 0 and self.marks > 0 and painted


@dataclass
class Rendered:
    """What a page did in the browser, and what its DOM held after the ``load`` event."""

    url: str
    title: str = ""
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    #: Every request to anything but the page's own file, ``data:`` or ``blob:`` URLs: a
    #: self-contained page makes none.
    requests: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    finding_ids: list[str] = field(default_factory=list)
    #: ``loadEventEnd`` of the navigation entry: ms from the start of navigation.
    load_ms: float = 0.0
    #: Wall seconds from opening a new tab to the end of the ``load`` event.
    wall_s: float = 0.0
    screenshot: Path | None = None
    size_bytes: int = 0

    def problems(self) -> list[str]:
        """Everything that makes a self-contained page defective, one line each."""
        return (
            [f"console error: {m}" for m in self.console_errors]
            + [f"page error: {m}" for m in self.page_errors]
            + [f"network request: {u}" for u in self.requests]
            + [f"failed request: {u}" for u in self.failed_requests]
            + [f"chart {c.name!r} drew nothing: {c}" for c in self.charts if not c.drew]
        )


#: Read back in the page after ``load``: the charts, the findings, the navigation timing.
_READ_DOM = """
() => {
  const hidden = 'defs, clipPath, mask, symbol, marker, pattern, linearGradient, radialGradient';
  const shapes = 'path, rect, line, polyline, polygon, circle, ellipse, text, use, image';
  const charts = [...document.querySelectorAll('figure.chart')].map(fig => {
    const out = {
      name: fig.getAttribute('data-chart') || '', kind: null, width: 0, height: 0, marks: 0,
      box: null,
    };
    const grow = r => {  // the union of the drawings' boxes, in page coordinates
      const b = [r.left + window.scrollX, r.top + window.scrollY,
                 r.right + window.scrollX, r.bottom + window.scrollY];
      out.box = out.box ? [Math.min(out.box[0], b[0]), Math.min(out.box[1], b[1]),
                           Math.max(out.box[2], b[2]), Math.max(out.box[3], b[3])] : b;
      out.width = Math.max(out.width, r.width);
      out.height = Math.max(out.height, r.height);
    };
    for (const svg of fig.querySelectorAll('svg')) {
      if (svg.parentElement.closest('svg')) continue;  // an <svg> nested in the chart's own
      out.kind = 'svg';
      grow(svg.getBoundingClientRect());
      for (const el of svg.querySelectorAll(shapes)) {
        if (el.closest(hidden)) continue;
        const style = getComputedStyle(el);
        if (style.display === 'none' || style.visibility === 'hidden') continue;
        let b;
        try { b = el.getBBox(); } catch (e) { continue; }
        if (b.width > 0 || b.height > 0) out.marks += 1;
      }
    }
    for (const canvas of fig.querySelectorAll('canvas')) {
      out.kind = out.kind || 'canvas';
      grow(canvas.getBoundingClientRect());
      try {
        const ctx = canvas.getContext('2d');
        const px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
        for (let i = 3; i < px.length; i += 4) if (px[i] !== 0) out.marks += 1;
      } catch (e) { /* a WebGL canvas or a tainted one: the screenshot's ink decides */ }
    }
    return out;
  });
  const ids = [...document.querySelectorAll('[data-finding-id]')]
    .map(el => el.getAttribute('data-finding-id'));
  const nav = performance.getEntriesByType('navigation')[0];
  const loadMs = nav ? nav.loadEventEnd
    : performance.timing.loadEventEnd - performance.timing.navigationStart;
  return {charts, ids, loadMs, title: document.title};
}
"""

_LOADED = (
    "() => { const n = performance.getEntriesByType('navigation')[0];"
    " return n ? n.loadEventEnd > 0 : performance.timing.loadEventEnd > 0; }"
)


class Chromium:
    """One headless Chromium with a profile of its own; each :meth:`render` a fresh tab.

    Use as a context manager: the browser, its driver and its profile directory are gone when
    the block ends, however it ends.
    """

    def __init__(self, executable: str | None = None, *, timeout_s: float = 60.0) -> None:
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise FileNotFoundError(INSTALL_HINT)
        self.timeout_ms = timeout_s * 1000
        self._stack = contextlib.ExitStack()
        self._context: Any = None

    def __enter__(self) -> Chromium:
        from playwright.sync_api import sync_playwright

        try:
            profile = self._stack.enter_context(
                tempfile.TemporaryDirectory(
                    prefix="speedpack-chromium-", ignore_cleanup_errors=True
                )
            )
            playwright = self._stack.enter_context(sync_playwright())
            # launch_persistent_context: Playwright refuses --user-data-dir in `args`; this is
            # how a profile directory of our own is given.
            self._context = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=self.executable,
                headless=True,
                args=list(CHROMIUM_ARGS),
                timeout=self.timeout_ms,
                viewport={"width": 1280, "height": 900},
                service_workers="block",
            )
            self._stack.callback(self._context.close)
            self._context.set_default_timeout(self.timeout_ms)
            for page in self._context.pages:  # the blank tab a persistent context opens with
                page.close()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._context = None
        self._stack.close()

    def render(self, path: Path, screenshot: Path | None = None) -> Rendered:
        """Open ``path`` (a local file) in a new tab, wait for ``load``, read the DOM back and
        take a full-page PNG to ``screenshot`` (when given)."""
        if self._context is None:
            raise RuntimeError("use Chromium(...) as a context manager")
        path = Path(path).resolve()
        result = Rendered(url=path.as_uri(), size_bytes=path.stat().st_size)

        def console(message: Any) -> None:
            if message.type == "error":
                where = _where(message.location)
                result.console_errors.append(f"{message.text} ({where})")

        def request(req: Any) -> None:
            if not req.url.startswith(LOCAL_SCHEMES):
                result.requests.append(req.url)

        start = time.perf_counter()
        page = self._context.new_page()
        try:
            page.on("console", console)
            page.on("pageerror", lambda err: result.page_errors.append(str(err)))
            page.on("request", request)
            page.on(
                "requestfailed", lambda r: result.failed_requests.append(f"{r.url}: {r.failure}")
            )
            page.goto(result.url, wait_until="load")
            page.wait_for_function(_LOADED)
            result.wall_s = time.perf_counter() - start
            dom = page.evaluate(_READ_DOM)
            result.title = dom["title"]
            result.finding_ids = list(dom["ids"])
            result.load_ms = float(dom["loadMs"])
            png = None
            if screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                png = page.screenshot(path=str(screenshot), full_page=True, animations="disabled")
                result.screenshot = screenshot
            result.charts = [_chart(c, png) for c in dom["charts"]]
        finally:
            page.close()
        return result

    def blank(self) -> float:
        """Wall seconds to open ``about:blank`` in a new tab: the fixed cost of a tab."""
        if self._context is None:
            raise RuntimeError("use Chromium(...) as a context manager")
        start = time.perf_counter()
        page = self._context.new_page()
        try:
            page.goto("about:blank", wait_until="load")
            return time.perf_counter() - start
        finally:
            page.close()


def render(
    path: Path, screenshot: Path | None = None, *, executable: str | None = None
) -> Rendered:
    """:meth:`Chromium.render` in a browser launched for this page alone."""
    with Chromium(executable) as chromium:
        return chromium.render(path, screenshot)


def _where(location: Any) -> str:
    if not location:
        return "?"
    return f"{location.get('url', '?')}:{location.get('lineNumber', '?')}"


def _chart(dom: dict[str, Any], png: bytes | None) -> Chart:
    ink = None
    if png is not None and dom["box"] is not None:
        ink = _ink(png, *dom["box"])
    return Chart(
        name=dom["name"],
        kind=dom["kind"],
        width=float(dom["width"]),
        height=float(dom["height"]),
        marks=int(dom["marks"]),
        ink=ink,
    )


def _ink(png: bytes, x0: float, y0: float, x1: float, y1: float) -> float | None:
    """The share of pixels in the box that differ from its most common colour (the drawing's
    background): 0.0 for a blank drawing. ``None`` without Pillow."""
    try:
        from PIL import Image
    except ImportError:
        return None
    with Image.open(io.BytesIO(png)) as image:
        left, top = max(0, int(x0)), max(0, int(y0))
        right, bottom = min(image.width, round(x1)), min(image.height, round(y1))
        if right <= left or bottom <= top:
            return 0.0
        box = image.crop((left, top, right, bottom)).convert("RGB")
        colours = box.getcolors(maxcolors=box.width * box.height) or []
        total: int = box.width * box.height
        background: int = max((count for count, _ in colours), default=total)
        return (total - background) / total
