"""Every page under docs/ is linked, and every code block in it runs, as README.md's do.

Python blocks run as scripts (one forked child each of a process that imported Lightning once,
``tests/test_readme.py``); shell blocks run line by line in one directory per block, so a block
may make a report and then compare it. A block whose code is also in README.md runs there only.
A block tagged ``<!-- not run: ... -->`` needs what this machine lacks (a GPU, a network, a
second node), and its page says so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_readme import (
    README,
    REPO,
    SKIP_REASONS,
    CodeBlock,
    as_param,
    check_python_result,
    code_blocks,
    run_python_blocks,
    run_shell_line,
    selected_blocks,
    shell_lines,
)

DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")

_README_CODE = {b.code for b in code_blocks(README)}
_README_LINES = {cmd for b in code_blocks(README) if b.lang == "bash" for _, cmd in shell_lines(b)}
_BLOCKS = [b for page in PAGES for b in code_blocks(page)]


def test_every_page_is_in_the_index() -> None:
    index = (DOCS / "index.md").read_text()
    linked = {m.group(1).split("#")[0] for m in LINK.finditer(index)}
    missing = [p.name for p in PAGES if p.name != "index.md" and p.name not in linked]
    assert not missing, f"docs/index.md does not link {missing}"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for m in LINK.finditer(page.read_text()):
        target = m.group(1).split("#")[0]
        local = target and "://" not in target and not target.startswith("mailto:")
        if local and not (page.parent / target).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_pages_have_only_languages_the_tests_run() -> None:
    langs = {b.lang for b in _BLOCKS}
    assert langs <= {"python", "bash", "text"}, langs
    untold = [b.id for b in _BLOCKS if b.skip and not any(r in b.skip for r in SKIP_REASONS)]
    assert not untold, f"blocks not run for a reason this machine has: {untold}"


_PYTHON = [b for b in _BLOCKS if b.lang == "python" and not b.skip and b.code not in _README_CODE]


@pytest.fixture(scope="module")
def python_results(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, object]]:
    blocks = selected_blocks(request, "test_python_block_runs")
    return run_python_blocks(blocks, tmp_path_factory.mktemp("docs"))


@pytest.mark.parametrize("block", [as_param(b) for b in _PYTHON])
def test_python_block_runs(block: CodeBlock, python_results: dict[str, dict[str, object]]) -> None:
    check_python_result(block, python_results)


_SHELL = [
    b
    for b in _BLOCKS
    if b.lang == "bash"
    and not b.skip
    and any(cmd not in _README_LINES for _, cmd in shell_lines(b))
]


@pytest.mark.slow
@pytest.mark.parametrize("block", _SHELL, ids=lambda b: b.id)
def test_shell_block_runs(block: CodeBlock, tmp_path: Path) -> None:
    for line, cmd in shell_lines(block):
        if cmd in _README_LINES:
            continue  # tests/test_readme.py runs it
        rc, stderr = run_shell_line(cmd, tmp_path)
        assert rc == 0, f"{block.page} line {line}: {cmd}\n{stderr[-3000:]}"
