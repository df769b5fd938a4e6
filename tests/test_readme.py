"""Every code block in README.md runs: Python blocks execute, shell lines run.

The helpers here serve ``tests/test_docs.py`` too (the pages under ``docs/``):

- :func:`code_blocks` reads a page's fenced blocks with their line numbers. A block the tests
  must not run carries a tag on the line before its fence, ``<!-- not run: REASON -->``; the
  reason says what this machine lacks (a GPU, a network, a second node) and the page says it too.
  A block tagged ``<!-- slow: REASON -->`` (two DDP ranks, say) runs under the ``slow`` marker.
- :func:`run_python_blocks` runs Python blocks as scripts, each in a forked child of one process
  that imported torch and Lightning once: the child is a fresh ``__main__`` (``runpy``) in a
  directory of its own, with the block's own imports, its own process group (its DataLoader
  workers die with it) and a normal interpreter exit (``atexit`` runs, as for ``python
  block.py``). On a loaded 2-core machine importing Lightning takes 5-20 s and a block's fit
  under a second, so one import for all blocks is what keeps these tests short.
- :func:`shell_argv` turns a shell line into what runs: ``make X`` becomes ``make -n X`` (the
  target and its recipe exist and parse; CI and the demo run them for real) and ``python``,
  ``speedpack`` and ``torchrun`` are the venv's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.procs import run_in_session

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(
    r"(?:<!-- (?P<tag>not run|slow): (?P<why>[^>]+?) -->\n)?```(?P<lang>\w+)\n(?P<code>.*?)```",
    re.S,
)
#: What a tagged block may lack here; anything else must run.
SKIP_REASONS = ("GPU", "network", "nodes")
#: Seconds one Python block may take before its stacks are dumped and it is killed.
BLOCK_TIMEOUT = 240

# Imported once by the process that forks the blocks: the heavy third-party modules only, so
# each block still runs its own imports of the pack (and registers what they register).
_SERVER = """
import atexit, faulthandler, json, os, runpy, signal, sys, time, traceback

import numpy, torch, torchmetrics, rich, pytorch_lightning, lightning.pytorch  # noqa: F401

manifest = json.loads(open(sys.argv[1]).read())
results = {}
for spec in manifest:
    sys.stdout.flush(); sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        out = os.open(spec["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        err = os.open(spec["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1); os.dup2(err, 2)
        os.chdir(spec["cwd"])
        os.environ.update(spec["env"])
        sys.argv = [spec["script"]]
        sys.path[0] = spec["cwd"]
        faulthandler.enable()
        faulthandler.dump_traceback_later(spec["timeout"], exit=True)
        code = 0
        try:
            runpy.run_path(spec["script"], run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        # What a normal exit does that a block can see: atexit handlers (weakref finalizers
        # among them) and flushed output; the module teardown after them only costs seconds.
        atexit._run_exitfuncs()
        faulthandler.cancel_dump_traceback_later()
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    deadline = start + spec["timeout"] + 15
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            rc = -9
            break
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)  # what the block left behind (workers)
    except ProcessLookupError:
        pass
    results[spec["id"]] = {"rc": rc, "seconds": round(time.monotonic() - start, 2)}
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)
"""


@dataclass(frozen=True)
class CodeBlock:
    """One fenced block of a page."""

    page: str  # relative to the repository
    line: int  # of the opening fence
    lang: str
    code: str
    skip: str | None  # the reason of a `<!-- not run: ... -->` tag
    slow: str | None = None  # the reason of a `<!-- slow: ... -->` tag (marked `slow`)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def code_blocks(page: Path) -> list[CodeBlock]:
    """Every fenced block with a language, in page order."""
    text = page.read_text()
    rel = str(page.relative_to(REPO))
    return [
        CodeBlock(
            rel,
            text[: m.start("lang")].count("\n") + 1,
            m.group("lang"),
            m.group("code"),
            m.group("why") if m.group("tag") == "not run" else None,
            m.group("why") if m.group("tag") == "slow" else None,
        )
        for m in BLOCK.finditer(text)
    ]


def block_env(tmp: Path) -> dict[str, str]:
    return {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp), "WANDB_SILENT": "true"}


def run_python_blocks(blocks: list[CodeBlock], tmp: Path) -> dict[str, dict[str, object]]:
    """Run ``blocks`` (one import of Lightning for all); per block id: rc, seconds, stderr."""
    manifest = []
    for i, block in enumerate(blocks):
        cwd = tmp / f"block{i}"
        cwd.mkdir()
        (cwd / "examples").symlink_to(REPO / "examples")  # pages' paths are repo-relative
        stem = Path(block.page).stem.lower().replace("-", "_")
        script = cwd / f"{stem}_line_{block.line}.py"
        script.write_text(block.code)
        manifest.append(
            {
                "id": block.id,
                "script": str(script),
                "cwd": str(cwd),
                "out": str(cwd / "stdout.txt"),
                "err": str(cwd / "stderr.txt"),
                "env": block_env(cwd),
                "timeout": BLOCK_TIMEOUT,
            }
        )
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    (tmp / "server.py").write_text(_SERVER)
    proc = run_in_session(
        [
            sys.executable,
            str(tmp / "server.py"),
            str(tmp / "manifest.json"),
            str(tmp / "results.json"),
        ],
        timeout=(BLOCK_TIMEOUT + 20) * len(blocks) + 120,
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    found = (
        json.loads((tmp / "results.json").read_text()) if (tmp / "results.json").exists() else {}
    )
    results: dict[str, dict[str, object]] = {}
    for spec in manifest:
        err = Path(str(spec["err"]))
        result = dict(found.get(str(spec["id"]), {"rc": None, "seconds": None}))
        result["stderr"] = err.read_text(errors="replace") if err.exists() else ""
        if result["rc"] is None:
            result["stderr"] = (
                f"not run: the block server exited {proc.returncode}\n{proc.stderr[-3000:]}"
            )
        results[str(spec["id"])] = result
    return results


def selected_blocks(request: pytest.FixtureRequest, test_name: str) -> list[CodeBlock]:
    """The blocks of ``test_name``'s parametrisation that this session will run (after ``-k``)."""
    return [
        item.callspec.params["block"]  # type: ignore[attr-defined]
        for item in request.session.items
        if getattr(item, "originalname", None) == test_name and item.module is request.module
    ]


def as_param(block: CodeBlock) -> object:
    """``block`` as a pytest parameter, marked ``slow`` when its page tags it so."""
    return pytest.param(block, id=block.id, marks=[pytest.mark.slow] if block.slow else [])


def check_python_result(block: CodeBlock, results: dict[str, dict[str, object]]) -> None:
    result = results[block.id]
    stderr = str(result["stderr"])
    assert result["rc"] == 0, f"{block.id} exited {result['rc']}:\n{stderr[-4000:]}"


def shell_argv(cmd: str) -> list[str]:
    argv = shlex.split(cmd)
    if argv[0] == "make":
        return ["make", "-n", *argv[1:]]
    if argv[0] in ("python", "speedpack", "torchrun"):  # the venv's, wherever PATH points
        return [str(Path(sys.executable).with_name(argv[0])), *argv[1:]]
    return argv


def shell_lines(block: CodeBlock) -> list[tuple[int, str]]:
    """The commands of a shell block (comments dropped) with their line numbers."""
    out = []
    for i, raw in enumerate(block.code.splitlines()):
        cmd = raw.split("#", 1)[0].strip()
        if cmd:
            out.append((block.line + 1 + i, cmd))
    return out


def run_shell_line(cmd: str, cwd: Path, timeout: float = 600) -> tuple[int, str]:
    """Run one command line of a page; ``make`` in the repository, the rest in ``cwd``."""
    argv = shell_argv(cmd)
    if not (cwd / "examples").exists():
        (cwd / "examples").symlink_to(REPO / "examples")  # pages' paths are repo-relative
    proc = run_in_session(
        argv,
        timeout=timeout,
        cwd=REPO if argv[0] == "make" else cwd,
        env={**os.environ, **block_env(cwd)},
    )
    return proc.returncode, proc.stderr


README = REPO / "README.md"
_BLOCKS = code_blocks(README)


def test_readme_has_only_languages_this_test_runs() -> None:
    assert {b.lang for b in _BLOCKS} <= {"python", "bash", "text"}, {b.lang for b in _BLOCKS}
    assert all(b.skip is None or any(r in b.skip for r in SKIP_REASONS) for b in _BLOCKS)


def test_readme_two_commands_block_comes_first() -> None:
    """The first block a reader meets is `make demo` / `make test`, which CI (.ci/run) runs."""
    first = next(b for b in _BLOCKS if b.lang == "bash")
    assert [cmd for _, cmd in shell_lines(first)][:2] == ["make demo", "make test"], first
    assert first.line < 40, first
    assert "make test" in (REPO / ".ci" / "run").read_text()


_PYTHON = [b for b in _BLOCKS if b.lang == "python" and b.skip is None]


@pytest.fixture(scope="module")
def python_results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, object]]:
    blocks = selected_blocks(request, "test_python_block_runs")
    return run_python_blocks(blocks, tmp_path_factory.mktemp("readme"))


@pytest.mark.parametrize("block", [as_param(b) for b in _PYTHON])
def test_python_block_runs(block: CodeBlock, python_results: dict[str, dict[str, object]]) -> None:
    check_python_result(block, python_results)


def _shell_param(line: int, cmd: str) -> object:
    """A README command as a parameter: two ranks are `ddp`, a fit under the doctor `slow`."""
    argv = shlex.split(cmd)
    marks = []
    if argv[0] == "torchrun" or "--devices" in argv:
        marks.append(pytest.mark.ddp)
    elif argv[0] in ("python", "speedpack") and "cache" not in argv[1:2]:
        marks.append(pytest.mark.slow)
    return pytest.param(line, cmd, marks=marks, id=f"{line}-{cmd}"[:40])


_SHELL = [
    _shell_param(line, cmd)
    for b in _BLOCKS
    if b.lang == "bash" and b.skip is None
    for line, cmd in shell_lines(b)
]


@pytest.mark.parametrize(("line", "cmd"), _SHELL)
def test_shell_line_runs(line: int, cmd: str, tmp_path: Path) -> None:
    rc, stderr = run_shell_line(cmd, tmp_path)
    assert rc == 0, f"README.md line {line}: {cmd}\n{stderr[-3000:]}"
