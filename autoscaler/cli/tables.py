"""Terminal tables that stay readable at 80 columns (thin: layout only, no figures).

A table is a list of :class:`Column` and rows of strings. :func:`fit_columns` keeps every
column that must be seen and drops the optional ones, least useful first, until the table fits
the terminal; :func:`render_table` prints what is kept, never cutting a cell (numbers on one
line, text folded onto several lines when even the kept columns are too wide) and says in its
caption which columns were left out and that ``--wide`` shows them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["Column", "fit_columns", "render_table", "table_width"]

GAP_CHARS = 3  # between two columns: padding, separator, padding
EDGE_CHARS = 2  # the table's two edges
WIDE_CONSOLE_CHARS = 1000  # --wide: a console this wide never folds or drops a column


@dataclass(frozen=True)
class Column:
    """One column: its ``header``, right-aligned when ``numeric``; ``drop_rank`` None when it
    is always shown, else the order in which optional columns go when the terminal is narrow
    (1 goes first). A ``key`` column (a job's or an instance's name, an offering key) is
    never folded or cut, when shown: the other text columns fold to make room for it."""

    header: str
    numeric: bool = False
    drop_rank: int | None = None
    key: bool = False


def _width(column: Column, cells: Sequence[str]) -> int:
    return max([len(column.header), *(len(c) for c in cells)])


def _folded_width(column: Column, cells: Sequence[str]) -> int:
    """The narrowest a column can be: a key or a number whole, other text folded between
    words (its longest word, or header)."""
    if column.key or column.numeric:
        return _width(column, cells)
    return max([len(column.header), *(len(w) for c in cells for w in c.split())])


def table_width(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], *, folded: bool = False
) -> int:
    """Characters ``columns`` take on one line each, with their separators and edges
    (``folded``: the least they can take, text folded between words)."""
    measure = _folded_width if folded else _width
    widths = [measure(c, [r[n] for r in rows]) for n, c in enumerate(columns)]
    return sum(widths) + GAP_CHARS * max(len(columns) - 1, 0) + EDGE_CHARS


def fit_columns(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], width_chars: int | None
) -> list[int]:
    """Indices of the columns to show in ``width_chars`` (None: all): optional columns are
    dropped by ``drop_rank`` until the rest fits; columns without a rank always stay."""
    shown = list(range(len(columns)))
    if width_chars is None:
        return shown
    optional = sorted(
        (n for n, c in enumerate(columns) if c.drop_rank is not None),
        key=lambda n: columns[n].drop_rank or 0,
    )
    for n in optional:
        kept = [columns[i] for i in shown]
        cells = [[r[i] for i in shown] for r in rows]
        if table_width(kept, cells, folded=True) <= width_chars:
            break
        shown.remove(n)
    return shown


def render_table(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    caption: str | None = None,
    wide: bool = False,
) -> list[str]:
    """Print ``rows`` under ``columns`` on ``console``, fitted to its width unless ``wide``
    (then every column, on a line as long as it needs); returns the headers left out. The
    caption (after ``caption``) names them and how to see them."""
    from rich import box
    from rich.table import Table

    shown = fit_columns(columns, rows, None if wide else console.width)
    hidden = [columns[n].header for n in range(len(columns)) if n not in shown]
    notes = [caption] if caption else []
    if hidden:
        notes.append(f"Not shown at this width: {', '.join(hidden)} (--wide shows them).")
    table = Table(
        title=title,
        caption=" ".join(notes) or None,
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for n in shown:
        column = columns[n]
        if column.key:
            whole = _width(column, [r[n] for r in rows])
            table.add_column(column.header, no_wrap=True, min_width=whole)
        elif column.numeric:
            table.add_column(column.header, justify="right", no_wrap=True)
        else:
            words = _folded_width(column, [r[n] for r in rows])
            table.add_column(column.header, overflow="fold", min_width=words)
    for row in rows:
        table.add_row(*(row[n] for n in shown))
    if wide:
        from rich.console import Console as RichConsole

        needed = table_width([columns[n] for n in shown], rows)
        if needed > console.width:
            console = RichConsole(
                file=console.file, width=min(needed, WIDE_CONSOLE_CHARS), no_color=console.no_color
            )
    console.print(table)
    return hidden
