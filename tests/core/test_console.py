"""core.console: tables and paragraphs that read in a terminal and in a log file."""

from __future__ import annotations

import argparse
import io

import pytest
from rich.console import Console
from rich.text import Text

from lightning_speedpack.core.console import (
    LAYOUT_ENV,
    LOG_WIDTH,
    WIDTH_ENV,
    add_console_arguments,
    layout_of,
    make_console,
    prepare,
    print_paragraph,
    print_table,
    wrap_paragraph,
)

#: Columns of a table far wider than any width: 8 headers of 20 characters.
WIDE = [f"measured figure {i:>4}" for i in range(8)]
ROWS = [[f"value {r}.{c}" for c in range(8)] for r in range(3)]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No width, layout or colour setting from the environment the tests run in."""
    for name in (WIDTH_ENV, LAYOUT_ENV, "COLUMNS", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    return


def _out(console: Console) -> str:
    file = console.file
    assert isinstance(file, io.StringIO)
    return file.getvalue()


def _log(width: int | None = None) -> Console:
    return make_console(file=io.StringIO(), width=width)


def _terminal(width: int | None = None) -> Console:
    # A terminal without colours, so lines can be measured (colours: the NO_COLOR test).
    return Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)


def test_a_file_gets_the_log_layout_at_120_columns_and_a_terminal_the_table() -> None:
    log, terminal = _log(), _terminal(width=90)
    assert (layout_of(log), log.width) == ("log", LOG_WIDTH)
    assert (layout_of(terminal), terminal.width) == ("table", 90)


def test_width_and_layout_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WIDTH_ENV, "72")
    monkeypatch.setenv(LAYOUT_ENV, "table")
    console = _log()
    assert (layout_of(console), console.width) == ("table", 72)
    assert _log(width=50).width == 50  # an explicit width wins
    monkeypatch.setenv(WIDTH_ENV, "wide")
    monkeypatch.delenv(LAYOUT_ENV)
    assert _log().width == LOG_WIDTH  # not a number: ignored


def test_columns_sets_the_log_width_as_rich_users_expect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "132")
    assert _log().width == 132


def test_force_color_in_ci_still_gets_the_log_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    console = _log()
    assert console.is_terminal  # rich's reading: colours on
    assert layout_of(console) == "log"


def test_a_layout_can_be_forced_on_a_console() -> None:
    console = prepare(_terminal(width=90), layout="log")
    assert layout_of(console) == "log"
    assert layout_of(prepare(console, layout="auto")) == "log"  # auto: no change
    assert console.width == 90  # a width given stays


def test_a_file_console_without_a_width_prints_120_wide_in_the_log_layout() -> None:
    assert prepare(Console(file=io.StringIO())).width == LOG_WIDTH
    assert prepare(Console(file=io.StringIO(), width=70)).width == 70
    assert prepare(Console(file=io.StringIO()), width=60).width == 60


def test_a_wide_table_in_a_log_becomes_records_never_cut() -> None:
    console = _log(width=80)
    print_table(console, "Figures", WIDE, ROWS)
    out = _out(console)
    assert "…" not in out
    assert not set(out) & set("│┃━─")
    lines = out.splitlines()
    assert lines[0] == "Figures"
    for row in ROWS:
        for header, value in zip(WIDE, row, strict=True):
            assert f"{header}: {value}" in lines
    assert lines[1 + len(WIDE)] == ""  # a blank line between rows


def test_a_table_that_fits_the_log_stays_a_table() -> None:
    console = _log(width=80)
    print_table(console, "Small", ["a", "b"], [["1", "2"]])
    assert "│ 1 │ 2 │" in _out(console)


def test_records_in_log_prints_records_even_when_the_table_fits() -> None:
    console = _log(width=80)
    print_table(console, "Small", ["a", "b"], [["1", "2"]], records_in_log=True)
    assert _out(console).splitlines()[:3] == ["Small", "a: 1", "b: 2"]


def test_a_terminal_table_folds_to_the_width_and_never_ellipsises() -> None:
    for width in (60, 120):
        console = _terminal(width=width)
        print_table(console, "Figures", WIDE, ROWS)
        lines = _out(console).splitlines()
        assert max(len(line) for line in lines) == width  # sized to the terminal
        assert "…" not in _out(console)


def test_transposed_table_has_a_row_per_column_and_a_column_per_row() -> None:
    console = _terminal(width=80)
    print_table(
        console,
        None,
        ["run", "wall s", "samples"],
        [["0", "1.5", "64"], ["1", "1.2", "64"]],
        transpose=True,
    )
    lines = [line for line in _out(console).splitlines() if "│" in line or "┃" in line]
    cells = [
        [c.strip() for c in line.strip("│┃").split("│" if "│" in line else "┃")] for line in lines
    ]
    assert cells == [["run", "0", "1"], ["wall s", "1.5", "1.2"], ["samples", "64", "64"]]


def test_cells_are_text_not_rich_markup() -> None:
    for console in (_log(width=30), _terminal(width=80)):
        print_table(console, None, WIDE[:3], [["[bold]x[/bold]", "[red]", Text("styled")]])
        assert "[bold]x[/bold]" in _out(console)
        assert "[red]" in _out(console)


def test_no_color_means_no_escape_sequence_even_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def printed() -> str:
        console = make_console(file=io.StringIO(), width=80, force_terminal=True)
        print_table(console, "Styled", ["a"], [[Text("alarm", style="bold red")]])
        console.print("[bold]bold[/bold] 123")
        return _out(console)

    assert "\x1b[" in printed()  # a terminal gets styles
    monkeypatch.setenv("NO_COLOR", "1")
    plain = printed()
    assert "\x1b" not in plain
    assert "alarm" in plain


def test_wrap_paragraph_breaks_at_spaces_only_and_keeps_newlines() -> None:
    path = "/data/" + "deep/" * 30 + "train.py:12"
    text = f"a sync at {path} every step\nstage   ms/call\nfetch     8.821"
    lines = wrap_paragraph(text, 40, head="[warning] x/y: ", notes=["fix: log the tensor"])
    assert lines[0] == "[warning] x/y: a sync at"
    assert lines[1] == "    " + path  # whole, on a line of its own
    assert lines[-3:] == ["    stage   ms/call", "    fetch     8.821", "    fix: log the tensor"]
    assert all(len(line) <= 40 for line in lines if path not in line)
    assert " ".join(" ".join(lines).split()) == " ".join(
        f"[warning] x/y: {text} fix: log the tensor".split()
    )


def test_print_paragraph_is_printed_verbatim_at_the_console_width() -> None:
    console = _log(width=30)
    print_paragraph(console, "a [bold] word :smile: and 1234 more words to wrap here")
    out = _out(console)
    assert ":smile:" in out
    assert "[bold]" in out
    assert all(len(line) <= 30 for line in out.splitlines())
    assert len(out.splitlines()) == 2


@pytest.mark.parametrize("bad", ["0", "19", "wide"])
def test_width_option_refuses_what_cannot_be_printed(bad: str) -> None:
    parser = argparse.ArgumentParser()
    add_console_arguments(parser)
    assert parser.parse_args(["--width", "60", "--layout", "log"]).width == 60
    with pytest.raises(SystemExit):
        parser.parse_args(["--width", bad])
