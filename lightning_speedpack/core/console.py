"""Print a table or paragraphs so they read in a terminal and in a log file.

A report printed into a SLURM, CI or ``nohup`` log has no terminal width to fit: a rich table
squeezed into the 80 columns rich assumes there turns into rows of ``…`` and 15-character
columns. So every table and finding the pack prints goes through here and takes one of two
layouts (:func:`layout_of`):

- ``"table"`` (stderr is a terminal): rich tables sized to the terminal, cells folded, never
  cut;
- ``"log"`` (anything else): a table is printed as is when its natural width fits the width
  (nothing folds), else as records (the title, then each row as ``column: value`` lines, a
  blank line between rows); paragraphs are wrapped with :mod:`textwrap` at whitespace only,
  so a path is never broken, and keep their own newlines. The width defaults to
  :data:`LOG_WIDTH`.

The width comes from the caller (``--width``), else :data:`WIDTH_ENV`, else ``COLUMNS``, else
the terminal (or :data:`LOG_WIDTH` in a log). :data:`LAYOUT_ENV` forces a layout. Both are
environment variables so that the tables the callbacks print during a fit under ``speedpack
doctor`` (and in every DDP rank it re-launches) follow the doctor's options. ``NO_COLOR``
turns off every escape sequence, bold included. No torch and no Lightning here.

Example:
    >>> import sys
    >>> console = make_console(file=sys.stdout)  # not a terminal here
    >>> layout_of(console)
    'log'
    >>> print_table(console, "Runs", ["run", "wall s"], [["0", "1.25"]], records_in_log=True)
    Runs
    run: 0
    wall s: 1.25
    <BLANKLINE>
    >>> wrap_paragraph("a long sentence that wraps at whitespace only", 24, head="[info] ")
    ['[info] a long sentence', '    that wraps at', '    whitespace only']
"""

from __future__ import annotations

import argparse
import os
import textwrap
import weakref
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Literal, TypeAlias, cast

if TYPE_CHECKING:  # rich is imported when something is printed: ``speedpack --help`` stays quick
    from rich.console import Console
    from rich.table import Column, Table
    from rich.text import Text

__all__ = [
    "LAYOUTS",
    "LAYOUT_ENV",
    "LOG_WIDTH",
    "WIDTH_ENV",
    "Cell",
    "Layout",
    "add_console_arguments",
    "env_width",
    "layout_of",
    "make_console",
    "prepare",
    "print_lines",
    "print_paragraph",
    "print_table",
    "wrap_paragraph",
]

Layout = Literal["table", "log"]
#: A table cell: plain text (printed verbatim, never read as rich markup) or styled rich Text.
Cell: TypeAlias = "str | Text"

#: The choices of ``--layout``: ``auto`` is ``table`` on a terminal, else ``log``.
LAYOUTS = ("auto", "table", "log")
#: Width (columns) every speedpack table and paragraph is printed at, when set (``--width``).
WIDTH_ENV = "LIGHTNING_SPEEDPACK_WIDTH"
#: ``table`` or ``log``: the layout every speedpack print takes, when set (``--layout``).
LAYOUT_ENV = "LIGHTNING_SPEEDPACK_LAYOUT"
#: The log layout's wrap width when nothing else sets one.
LOG_WIDTH = 120
_MIN_WIDTH = 20
_INDENT = "    "

# The layout a console was made for (make_console(layout=...)); weak, so consoles still die.
_FORCED: weakref.WeakKeyDictionary[Console, Layout] = weakref.WeakKeyDictionary()


def add_console_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--width N`` and ``--layout {auto,table,log}`` (how the text report is laid out)."""
    parser.add_argument(
        "--width",
        metavar="N",
        type=_width,
        help="print tables and text N columns wide (default: the terminal's; 120 in a log file)",
    )
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="auto",
        help="table: rich tables; log: for log files, nothing wider than the width, records as "
        "`name: value` lines, a paragraph per finding; auto (default): table when the output "
        "is a terminal, else log",
    )


def _width(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of columns: {text!r}") from None
    if value < _MIN_WIDTH:
        raise argparse.ArgumentTypeError(f"must be at least {_MIN_WIDTH} columns, got {value}")
    return value


def env_width() -> int | None:
    """The width :data:`WIDTH_ENV` asks for, or None when unset or not a positive integer."""
    value = os.environ.get(WIDTH_ENV, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def _env_layout() -> Layout | None:
    value = os.environ.get(LAYOUT_ENV, "").strip().lower()
    return cast(Layout, value) if value in ("table", "log") else None


def make_console(
    *,
    stderr: bool = True,
    width: int | None = None,
    layout: str | None = None,
    file: IO[str] | None = None,
    force_terminal: bool | None = None,
) -> Console:
    """A rich console for speedpack's output; stderr by default (the script's stdout is its own).

    Args:
        stderr: write to stderr (else stdout); ignored when ``file`` is given.
        width: columns to print at; default :data:`WIDTH_ENV`, else ``COLUMNS``, else the
            terminal's width (or :data:`LOG_WIDTH` in the log layout).
        layout: ``"table"``, ``"log"``, or ``"auto"``/None (:data:`LAYOUT_ENV`, else by
            whether the output is a terminal).
        file: write here instead of stderr/stdout.
        force_terminal: treat the output as a terminal (True) or not (False); default: detect.
    """
    from rich.console import Console

    chosen = width or env_width()
    console = Console(
        stderr=stderr,
        file=file,
        width=chosen,
        force_terminal=force_terminal,
        # rich's own NO_COLOR handling keeps bold and the like; a NO_COLOR user wants none.
        color_system=None if os.environ.get("NO_COLOR", "") != "" else "auto",
    )
    return prepare(console, layout=layout)


def prepare(console: Console, *, layout: str | None = None, width: int | None = None) -> Console:
    """Set up a console (yours or :func:`make_console`'s) for :func:`print_table` and friends.

    Args:
        console: the rich console to print to; changed in place and returned.
        layout: ``"table"`` or ``"log"`` to force that layout; ``"auto"``/None: no change.
        width: columns to print at. Without it, a console in the log layout that nobody gave a
            width (rich assumes 80 for a file) prints :data:`LOG_WIDTH` wide.
    """
    if layout in ("table", "log"):
        _FORCED[console] = cast(Layout, layout)
    if width:
        console.width = width
    elif getattr(console, "_width", 0) is None and layout_of(console) == "log":
        # rich keeps ``_width`` None unless a width (argument or COLUMNS) was given.
        console.width = LOG_WIDTH
    return console


def layout_of(console: Console) -> Layout:
    """``"table"`` or ``"log"``: the layout output to ``console`` takes.

    The layout the console was made for (:func:`make_console`), else :data:`LAYOUT_ENV`, else
    ``"table"`` on a terminal. ``FORCE_COLOR`` (set in many CI systems for colour in logs)
    makes rich treat a log file as a terminal; the layout still reads it as a log.
    """
    forced = _FORCED.get(console) or _env_layout()
    if forced is not None:
        return forced
    if not console.is_terminal:
        return "log"
    if getattr(console, "_force_terminal", None) is None and not _isatty(console):
        return "log"  # a terminal only by FORCE_COLOR / TTY_COMPATIBLE: a CI log
    return "table"


def _isatty(console: Console) -> bool:
    isatty = getattr(console.file, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed file
        return False


def print_lines(console: Console, lines: Iterable[str]) -> None:
    """Print ``lines`` verbatim: no markup, no highlighting, and no re-wrapping or cropping."""
    for line in lines:
        console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)


def wrap_paragraph(
    text: str, width: int, *, head: str = "", indent: str = _INDENT, notes: Sequence[str] = ()
) -> list[str]:
    """Lines of ``head + text`` at most ``width`` long, then each note on lines of its own.

    Lines break at whitespace only (a path or identifier longer than the width stays whole on a
    line of its own); continuation lines and notes start with ``indent``; the text's own
    newlines are kept (each line after the first is indented), so a small table embedded in a
    message keeps its rows.

    Example:
        >>> wrap_paragraph("see /a/very/long/path/to/train.py:12", 20, notes=["fix: x"])
        ['see', '    /a/very/long/path/to/train.py:12', '    fix: x']
    """
    lines: list[str] = []
    for i, part in enumerate(text.split("\n")):
        lines += _wrap(part, width, head if i == 0 else indent, indent)
    for note in notes:
        for part in note.split("\n"):
            lines += _wrap(part, width, indent, indent)
    return lines


def _wrap(text: str, width: int, first: str, indent: str) -> list[str]:
    wrapped = textwrap.wrap(
        text,
        width=max(width, len(first) + 1, len(indent) + 1),
        initial_indent=first,
        subsequent_indent=indent,
        break_long_words=False,  # a path cut in two cannot be pasted or clicked
        break_on_hyphens=False,
    )
    return wrapped or [first.rstrip()]


def print_paragraph(
    console: Console, text: str, *, head: str = "", notes: Sequence[str] = ()
) -> None:
    """Print :func:`wrap_paragraph` of the arguments at the console's width (either layout)."""
    print_lines(console, wrap_paragraph(text, console.width, head=head, notes=notes))


def print_table(
    console: Console,
    title: str | None,
    columns: Sequence[str | Column],
    rows: Iterable[Sequence[Cell]],
    *,
    transpose: bool = False,
    records_in_log: bool = False,
    show_lines: bool = False,
    expand: bool = False,
) -> None:
    """Print rows under columns: a rich table in a terminal; in a log, what fits without folding.

    Args:
        console: where to print; its :func:`layout_of` decides the form.
        title: shown above the table or the records (None: no title).
        columns: headers, or rich :class:`~rich.table.Column` for justification or ratios.
        rows: one sequence of cells per row, as many as there are columns.
        transpose: show the table turned: a row per column, a column per row, headed by each
            row's first cell (a run's many figures side by side, fitting 80 columns).
        records_in_log: in the log layout, print records even when the table would fit.
        show_lines: rule between the table's rows.
        expand: in the table layout, fill the width (columns share it by their ``ratio``).
    """
    from rich.table import Column

    specs = [c if isinstance(c, Column) else Column(c) for c in columns]
    data = [list(row) for row in rows]
    table = _transposed(title, specs, data) if transpose else _table(title, specs, data)
    table.show_lines = show_lines
    if layout_of(console) == "table":
        table.expand = expand
        console.print(table)
    elif not records_in_log and _natural_width(console, table) <= console.width:
        console.print(table)
    else:
        print_lines(console, _records(title, [str(c.header) for c in specs], data, console.width))


def _table(title: str | None, specs: list[Column], data: list[list[Cell]]) -> Table:
    from rich.table import Table

    table = Table(*(_folding(c) for c in specs), title=_title(title))
    for row in data:
        table.add_row(*(_cell(c) for c in row))
    return table


def _transposed(title: str | None, specs: list[Column], data: list[list[Cell]]) -> Table:
    from rich.table import Column, Table
    from rich.text import Text

    names = [str(spec.header) for spec in specs]
    heads = [_folding(Column(names[0]))]
    heads += [_folding(Column(_plain(row[0]), justify="right")) for row in data]
    table = Table(*heads, title=_title(title))
    for i, name in enumerate(names[1:], 1):
        table.add_row(Text(name), *(_cell(row[i]) for row in data))
    return table


def _title(title: str | None) -> Text | None:
    from rich.text import Text

    # Text, not markup: a report named "[run]" keeps its brackets.
    return None if title is None else Text(title, style="table.title")


def _folding(column: Column) -> Column:
    # "fold" instead of rich's default ellipsis: a narrow terminal gets every character.
    column.overflow = "fold"
    return column


def _cell(cell: Cell) -> Text:
    from rich.text import Text

    # A plain string becomes Text so "[...]" in a message is shown, not read as rich markup.
    return cell if isinstance(cell, Text) else Text(cell)


def _plain(cell: Cell) -> str:
    return cell if isinstance(cell, str) else cell.plain


def _natural_width(console: Console, table: Table) -> int:
    """Columns the table needs with no cell wrapped (rich clamps to the width it is given)."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(1_000_000)
    return Measurement.get(console, unbounded, table).maximum


def _records(
    title: str | None, headers: list[str], data: list[list[Cell]], width: int
) -> list[str]:
    lines = wrap_paragraph(title, width) if title else []
    for i, row in enumerate(data):
        if i:
            lines.append("")
        for j, (header, cell) in enumerate(zip(headers, row, strict=False)):
            value = _plain(cell)
            if value.strip() or j == 0:  # an empty cell says nothing; the first names the row
                lines += wrap_paragraph(value, width, head=f"{header}: " if header else "")
    return [*lines, ""]
