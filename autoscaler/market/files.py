"""The shipped market data files and the checked CSV reader the market modules share.

:func:`prices_dir` and :func:`spot_dir` locate the copies shipped in ``autoscaler/data/``
(described in ``autoscaler/data/prices/README.md``). :class:`CsvFile` reads one CSV file with a
header; every malformed file fails with :class:`~autoscaler.errors.TraceFormatError` naming the
file, the 1-based line and the field.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from autoscaler.errors import TraceFormatError

__all__ = [
    "CsvFile",
    "prices_dir",
    "spot_dir",
]


def prices_dir() -> Path:
    """The shipped price files (``autoscaler/data/prices``)."""
    return Path(__file__).resolve().parents[1] / "data" / "prices"


def spot_dir() -> Path:
    """The shipped spot availability traces (``autoscaler/data/spot``)."""
    return Path(__file__).resolve().parents[1] / "data" / "spot"


class CsvFile:
    """Rows of one CSV file with a header: ``(line, {column: stripped text})``, and the
    field checks that make a :class:`TraceFormatError` name the file, line and field."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)

    def error(
        self, message: str, line: int | None = None, field: str | None = None
    ) -> TraceFormatError:
        return TraceFormatError(message, path=self.name, line=line, field=field)

    def rows(self, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
        try:
            handle = open(self.path, newline="", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as e:
            raise self.error(f"cannot read file: {e.strerror}") from e
        try:
            reader = csv.reader(handle)
            try:
                header = [name.strip() for name in next(reader)]
            except StopIteration:
                raise self.error("empty file (no header)", 1) from None
            for name in required:
                if name not in header:
                    raise self.error(
                        f"missing column {name!r} (header: {','.join(header)})", 1, name
                    )
            for cells in reader:
                if not cells or all(not c.strip() for c in cells):
                    continue
                row = {
                    name: (cells[i].strip() if i < len(cells) else "")
                    for i, name in enumerate(header)
                }
                yield reader.line_num, row
        except (UnicodeDecodeError, csv.Error) as e:
            raise self.error(f"not a CSV text file ({e})") from e
        finally:
            handle.close()

    def text(self, row: Mapping[str, str], line: int, name: str) -> str:
        value = row.get(name, "")
        if not value:
            raise self.error("missing value", line, name)
        return value

    def number(
        self, row: Mapping[str, str], line: int, name: str, *, optional: bool = False
    ) -> float | None:
        """A finite number > 0; ``None`` for an empty cell when ``optional``."""
        text = row.get(name, "")
        if not text:
            if optional:
                return None
            raise self.error("missing value", line, name)
        try:
            value = float(text)
        except ValueError:
            raise self.error(f"not a number: {text!r}", line, name) from None
        if not math.isfinite(value):
            raise self.error(f"not finite: {text!r}", line, name)
        if value < 0:
            raise self.error(f"negative: {text!r}", line, name)
        if value == 0:
            raise self.error(f"must be > 0: {text!r}", line, name)
        return value

    def price(self, row: Mapping[str, str], line: int, name: str) -> float:
        value = self.number(row, line, name)
        assert value is not None  # not optional
        return value

    def integer(self, row: Mapping[str, str], line: int, name: str) -> int:
        value = self.price(row, line, name)
        if value != int(value):
            raise self.error(f"not an integer: {row[name]!r}", line, name)
        return int(value)
