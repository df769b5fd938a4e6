"""A headless Chromium on this machine: find it, and take a screenshot of a page with it.

``make demo`` takes the README's picture of its slow run's page this way, and the browser tests
(``tests/helpers/browser.py``) find their browser here. Nothing here downloads a browser: it
uses ``$SPEEDPACK_CHROMIUM``, else Debian's ``chromium-headless-shell`` or ``chromium``, else
one on ``PATH``. The page itself never needs a browser to be made.

Example:
    >>> binary = find_chromium()  # None on a machine without one
    >>> binary is None or Path(binary).name.startswith(("chromium", "chrome", "google"))
    True
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["CANDIDATES", "CHROMIUM_ENV", "CHROMIUM_FLAGS", "ON_PATH", "find_chromium", "screenshot"]

#: A Chromium binary to use instead of looking for one (a path or a name on ``PATH``).
CHROMIUM_ENV = "SPEEDPACK_CHROMIUM"
#: Debian's headless builds, tried first.
CANDIDATES = ("/usr/bin/chromium-headless-shell", "/usr/bin/chromium")
#: Then these names on ``PATH``.
ON_PATH = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")

#: Headless, no sandbox (root in a container), and closed to the network: without the
#: background-networking flags Chromium keeps opening connections a closed network refuses.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--metrics-recording-only",
    "--no-default-browser-check",
)


def find_chromium() -> str | None:
    """The Chromium binary to use, or None when this machine has none.

    Raises:
        FileNotFoundError: ``$SPEEDPACK_CHROMIUM`` names no executable (a typo there must not
            fall back to another browser without a word).
    """
    override = os.environ.get(CHROMIUM_ENV, "").strip()
    if override:
        found = shutil.which(override)
        if found is None:
            raise FileNotFoundError(
                f"{CHROMIUM_ENV}={override!r} is not an executable Chromium binary"
            )
        return found
    for candidate in CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    for name in ON_PATH:
        found = shutil.which(name)
        if found is not None:
            return found
    return None


def screenshot(
    page: str | os.PathLike[str],
    png: str | os.PathLike[str],
    *,
    width: int = 1280,
    height: int = 2400,
    binary: str | None = None,
    timeout_s: float = 120.0,
) -> Path:
    """A PNG of the top ``width`` x ``height`` pixels of ``page``, in a fresh profile.

    Raises:
        FileNotFoundError: no Chromium here (:func:`find_chromium`), with how to install one.
        RuntimeError: Chromium ran but wrote no picture (its exit code and last output said).
    """
    binary = binary or find_chromium()
    if binary is None:
        raise FileNotFoundError(
            "no headless Chromium here: `apt-get install chromium-headless-shell` (Debian/"
            f"Ubuntu), or set {CHROMIUM_ENV} to a Chromium binary"
        )
    target = Path(png)
    target.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="speedpack-chromium-") as profile:
        cmd = [
            binary,
            *CHROMIUM_FLAGS,
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--screenshot={target}",
            Path(page).resolve().as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if not target.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"Chromium wrote no screenshot (exit {proc.returncode}): {tail}")
    return target
