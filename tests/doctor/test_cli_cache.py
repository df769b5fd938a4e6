"""``speedpack cache clean``: lists arenas with size and state, removes only the dead ones."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_speedpack.cache.arena import Arena
from lightning_speedpack.doctor.cli import _fmt_bytes, main

FP = bytes(range(32))


@pytest.fixture
def arenas(tmp_path: Path) -> tuple[Path, Path, Arena]:
    """A dead arena (its users are gone) and one this process still uses, in ``tmp_path``."""
    dead = tmp_path / "speedpack-dead"
    gone = Arena.open(str(dead), fingerprint=FP, n_slots=4, capacity=1 << 20, kind="disk")
    gone.close()  # a disk-kind file survives its users: as a SIGKILLed run's file would
    live = tmp_path / "speedpack-live"
    arena = Arena.open(str(live), fingerprint=FP, n_slots=4, capacity=1 << 20, kind="shared")
    (tmp_path / "unrelated").write_text("x")
    return dead, live, arena


def test_dry_run_lists_sizes_and_states_and_removes_nothing(
    arenas: tuple[Path, Path, Arena], capsys: pytest.CaptureFixture[str]
) -> None:
    dead, live, arena = arenas
    size = _fmt_bytes(dead.stat().st_blocks * 512)  # what it occupies, not its sparse length
    assert main(["cache", "clean", "--dry-run", "--dir", str(dead.parent)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["dead", *size.split(), str(dead), "(would", "remove)"]
    assert lines[1].split()[:2] == ["in", "use"]
    assert lines[1].endswith(str(live))
    assert lines[2] == (
        f"2 speedpack arena(s) in {dead.parent}: 1 in use, 1 dead would be removed ({size})"
    )
    assert dead.exists()
    assert live.exists()
    arena.close()


def test_clean_removes_the_dead_and_keeps_the_one_in_use(
    arenas: tuple[Path, Path, Arena], capsys: pytest.CaptureFixture[str]
) -> None:
    dead, live, arena = arenas
    size = _fmt_bytes(dead.stat().st_blocks * 512)
    assert main(["cache", "clean", "--dir", str(dead.parent)]) == 0
    out = capsys.readouterr().out
    assert f"{dead}  removed" in out
    assert f"1 dead removed ({size} freed)" in out
    assert not dead.exists()
    assert live.exists()
    assert (dead.parent / "unrelated").exists()
    arena.close()
    assert not live.exists()


def test_a_missing_directory_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache", "clean", "--dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err == f"speedpack cache clean: {tmp_path / 'nope'} does not exist (nothing to clean)\n"


def test_console_script_runs_in_a_subprocess(arenas: tuple[Path, Path, Arena]) -> None:
    dead, live, arena = arenas
    code = "import sys; from lightning_speedpack.doctor.cli import main; sys.exit(main())"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "cache", "clean", "--dir", str(dead.parent)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert "1 in use, 1 dead removed" in out
    assert "torch" not in err
    assert not dead.exists()
    assert live.exists()
    arena.close()
