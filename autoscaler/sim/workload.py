"""Workload files: ``name,time,application,num_replicas,batch_size`` — one submitted job a row.

``time`` is the submission second; ``num_replicas`` and ``batch_size`` are the user's settings
(used as-is by fixed-size baselines). Any malformed row fails with
:class:`~autoscaler.errors.TraceFormatError` naming the file, the line and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from autoscaler.errors import TraceFormatError
from autoscaler.jobs import JobSpec
from autoscaler.traces import APPLICATIONS, parse_float, parse_int, read_csv_rows

__all__ = ["WORKLOAD_COLUMNS", "Workload", "load_workload", "workload_files"]

WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


@dataclass(frozen=True)
class Workload:
    """A named list of job submissions, in file order."""

    name: str
    jobs: tuple[JobSpec, ...]


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload CSV (see the module docstring); the workload's name is the
    file's stem. Raises :class:`TraceFormatError` on a missing column or value, an unknown
    application, a non-numeric / negative / non-integer number, a zero replica count or batch
    size, a duplicate job name, or a file without jobs."""
    path = Path(path)
    jobs: list[JobSpec] = []
    seen: set[str] = set()
    for line, row in read_csv_rows(path, WORKLOAD_COLUMNS):
        name = row["name"]
        if name in seen:
            raise TraceFormatError(
                f"duplicate job name {name!r}", path=str(path), line=line, field="name"
            )
        seen.add(name)
        app = row["application"]
        if app not in APPLICATIONS:
            raise TraceFormatError(
                f"unknown application {app!r}; expected one of {', '.join(APPLICATIONS)}",
                path=str(path),
                line=line,
                field="application",
            )
        time_s = parse_float(row["time"], path=path, line=line, name="time")
        replicas, batch = (
            parse_int(row[col], path=path, line=line, name=col, minimum=1)
            for col in ("num_replicas", "batch_size")
        )
        jobs.append(JobSpec(name, app, time_s, replicas, batch))
    if not jobs:
        raise TraceFormatError("no jobs in workload", path=str(path), line=2)
    return Workload(path.stem, tuple(jobs))


def workload_files(path: str | Path) -> list[Path]:
    """The workload CSVs at ``path``: the file itself, or a folder's ``*.csv`` in natural order
    (``workload-2`` before ``workload-10``)."""
    path = Path(path)
    if path.is_dir():
        files = [p for p in path.iterdir() if p.suffix == ".csv" and p.is_file()]

        def natural(p: Path) -> tuple:
            parts = []
            for chunk in re.split(r"(\d+)", p.stem):
                parts.append((0, int(chunk), "") if chunk.isdigit() else (1, 0, chunk))
            return tuple(parts)

        return sorted(files, key=natural)
    return [path]
