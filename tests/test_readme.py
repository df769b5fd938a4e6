"""Every code block in README.md runs: Python blocks execute, shell lines run."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.helpers.procs import run_in_session

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def _blocks(lang: str) -> list[tuple[int, str]]:
    text = (REPO / "README.md").read_text()
    return [
        (text[: m.start()].count("\n") + 1, m.group(2))
        for m in BLOCK.finditer(text)
        if m.group(1) == lang
    ]


def test_readme_has_only_languages_this_test_runs() -> None:
    langs = {m.group(1) for m in BLOCK.finditer((REPO / "README.md").read_text())}
    assert langs <= {"python", "bash"}, langs


@pytest.mark.parametrize(("line", "code"), _blocks("python"), ids=lambda v: str(v)[:12])
def test_python_block_runs(line: int, code: str, tmp_path: Path) -> None:
    script = tmp_path / f"readme_line_{line}.py"
    script.write_text(code)
    proc = run_in_session(
        [sys.executable, str(script)],
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, f"README.md line {line}:\n{proc.stderr[-3000:]}"


def _shell_lines() -> list[tuple[int, str]]:
    out = []
    for line, code in _blocks("bash"):
        for i, raw in enumerate(code.splitlines()):
            cmd = raw.split("#", 1)[0].strip()
            if cmd:
                out.append((line + 1 + i, cmd))
    return out


@pytest.mark.parametrize(("line", "cmd"), _shell_lines(), ids=lambda v: str(v)[:40])
def test_shell_line_runs(line: int, cmd: str, tmp_path: Path) -> None:
    argv = shlex.split(cmd)
    if argv[0] == "make":
        # `make test`/`make demo` would recurse or take minutes here: check the target and its
        # recipe exist and parse (a dry run), the CI and the demo run them for real.
        argv = ["make", "-n", *argv[1:]]
    elif argv[0] in ("python", "speedpack", "torchrun"):  # the venv's, wherever PATH points
        argv = [str(Path(sys.executable).with_name(argv[0])), *argv[1:]]
    (tmp_path / "examples").symlink_to(REPO / "examples")  # README paths are repo-relative
    proc = run_in_session(
        argv,
        timeout=600,
        cwd=REPO if argv[0] == "make" else tmp_path,
        env={**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, f"README.md line {line}: {cmd}\n{proc.stderr[-3000:]}"
