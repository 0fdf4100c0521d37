"""Rich terminal tables of a cost report: summary, per job, per offering and market."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoscaler.accounting.report.rows import (
    CHURN_CAPTION,
    FLOOR_CAPTION,
    ReportTable,
    churn_table,
    floor_table,
    report_tables,
)
from autoscaler.accounting.report.source import RunFloor

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from autoscaler.accounting.churn import ChurnFigures
    from autoscaler.accounting.costs import CostRecord

__all__ = ["print_churn", "print_floor", "print_report", "rich_table"]

_EMPTY = "-"  # what an unknown value shows on a terminal
_WORD_MAX_CHARS = 12  # a text cell up to this long (a market, a GPU type) is never folded
_GAP = 3  # characters between two columns (padding and separator); 1 at each edge


def _widths(table: ReportTable) -> list[int]:
    """Each column's width on a terminal: numbers as wide as the widest cell or header word
    (headers go one word a line); the first column (the key: a job, an offering) as wide as
    its widest cell, never folded; other text as wide as its widest short cell (a market, a
    GPU type: whole), longer ones folded."""
    out = []
    for n, column in enumerate(table.columns):
        widest = max((len(row[n] or _EMPTY) for row in table.rows), default=1)
        words = max(len(word) for word in column.header.split())
        if column.numeric:
            out.append(max(widest, words))
        else:
            short = [len(row[n] or _EMPTY) for row in table.rows]
            whole = max((w for w in short if w <= _WORD_MAX_CHARS), default=1)
            out.append(max(widest if n == 0 else whole, words))
    return out


def rich_table(table: ReportTable, *, label: str | None = None, width: int | None = None) -> Table:
    """``table`` as a :class:`rich.table.Table`, its title suffixed with ``label``: numbers
    right-aligned and never cut (headers one word a line), the first column (the key) whole
    on one line, other long text folded onto several lines when the terminal is narrow. When
    even that does not fit in ``width`` characters, the rightmost columns are left out and the
    caption says how many (``--format csv`` or ``html`` show them all)."""
    from rich import box
    from rich.table import Table

    widths = _widths(table)
    shown = len(table.columns)
    while width is not None and shown > 1 and sum(widths[:shown]) + _GAP * (shown - 1) + 2 > width:
        shown -= 1
    title = table.title if label is None else f"{table.title}: {label}"
    caption = None
    if shown < len(table.columns):
        hidden = len(table.columns) - shown
        what = "column" if hidden == 1 else "columns"
        caption = f"{hidden} more {what} in a wider terminal, or with --wide, --format csv or html"
    out = Table(
        title=title,
        caption=caption,
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for n, column in enumerate(table.columns[:shown]):
        if column.numeric:
            header = column.header.replace(" ", "\n")
            out.add_column(header, justify="right", no_wrap=True, min_width=widths[n])
        elif n == 0:
            out.add_column(column.header, no_wrap=True, min_width=widths[n])
        else:
            out.add_column(column.header, overflow="fold", min_width=widths[n])
    for row in table.rows:
        out.add_row(*(cell or _EMPTY for cell in row[:shown]))
    return out


def print_report(
    console: Console, record: CostRecord, *, label: str | None = None, wide: bool = False
) -> None:
    """Print the three tables of ``record`` to ``console``, fitted to its width (``wide``:
    every column, on lines as long as they need; a table without rows says so)."""
    from rich.console import Console as RichConsole

    for table in report_tables(record):
        if table.rows:
            out = console
            if wide:
                needed = sum(_widths(table)) + _GAP * (len(table.columns) - 1) + 2
                if needed > console.width:
                    out = RichConsole(file=console.file, width=needed, no_color=console.no_color)
            out.print(rich_table(table, label=label, width=None if wide else console.width))
        else:
            what = table.title if label is None else f"{table.title}: {label}"
            console.print(f"{what}: none")


def print_floor(console: Console, floor: RunFloor, *, label: str | None = None) -> None:
    """The run's cost floors (:func:`~autoscaler.accounting.report.rows.floor_table`) and what (a)
    and (b) mean."""
    table = rich_table(floor_table(floor), label=label, width=console.width)
    table.caption = FLOOR_CAPTION if table.caption is None else f"{FLOOR_CAPTION}; {table.caption}"
    console.print(table)


def print_churn(console: Console, churn: ChurnFigures, *, label: str | None = None) -> None:
    """The run's churn (:func:`~autoscaler.accounting.report.rows.churn_table`) and what each
    idle cause means."""
    table = rich_table(churn_table(churn), label=label, width=console.width)
    table.caption = CHURN_CAPTION if table.caption is None else f"{CHURN_CAPTION}; {table.caption}"
    console.print(table)
