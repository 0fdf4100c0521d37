"""Workload files: ``name,time,application,num_replicas,batch_size`` — one submitted job a row.

``time`` is the submission second; ``num_replicas`` and ``batch_size`` are the user's settings
(used as-is by fixed-size baselines). Any malformed row fails with
:class:`~autoscaler.errors.TraceFormatError` naming the file, the line and the field.

Heavier loads: :func:`compress_arrivals` divides every submission time by a factor (2 = jobs
arrive twice as fast, the same jobs in the same order), and :func:`write_workload` writes a
workload back as CSV, so that the simulator and the benchmarks can replay it from a file.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from autoscaler.errors import InvalidInputError, TraceFormatError
from autoscaler.model.traces import APPLICATIONS, parse_float, parse_int, read_csv_rows

__all__ = [
    "WORKLOAD_COLUMNS",
    "TraceJob",
    "Workload",
    "compress_arrivals",
    "load_workload",
    "workload_files",
    "write_workload",
]

WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


@dataclass(frozen=True)
class TraceJob:
    """One job of a workload file: a training job as the traces submitted it.

    ``num_replicas`` and ``batch_size`` are the user's own settings (the paper's "TunedJobs"):
    fixed-size baselines run the job with exactly these; Pollux ignores them and adapts both.
    ``deadline_after_s``: the job's deadline, seconds after its submission (``None``: none).
    """

    name: str
    application: str
    submit_time_s: float
    num_replicas: int
    batch_size: int
    deadline_after_s: float | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInputError("job name must not be empty", field="name")
        if not math.isfinite(self.submit_time_s) or self.submit_time_s < 0:
            raise InvalidInputError(
                f"submit time must be finite and >= 0, got {self.submit_time_s}", field="time"
            )
        if self.num_replicas < 1:
            raise InvalidInputError(
                f"num_replicas must be >= 1, got {self.num_replicas}", field="num_replicas"
            )
        if self.batch_size < 1:
            raise InvalidInputError(
                f"batch_size must be >= 1, got {self.batch_size}", field="batch_size"
            )
        if self.deadline_after_s is not None and not (
            math.isfinite(self.deadline_after_s) and self.deadline_after_s > 0
        ):
            raise InvalidInputError(
                f"deadline_after_s must be > 0, got {self.deadline_after_s}", field="deadline"
            )


@dataclass(frozen=True)
class Workload:
    """A named list of job submissions, in file order."""

    name: str
    jobs: tuple[TraceJob, ...]


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload CSV (see the module docstring); the workload's name is the
    file's stem. Raises :class:`TraceFormatError` on a missing column or value, an unknown
    application, a non-numeric / negative / non-integer number, a zero replica count or batch
    size, a duplicate job name, or a file without jobs."""
    path = Path(path)
    jobs: list[TraceJob] = []
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
        jobs.append(TraceJob(name, app, time_s, replicas, batch))
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


def compress_arrivals(workload: Workload, factor: float) -> Workload:
    """The same jobs submitted ``factor`` times as fast: each submission time divided by
    ``factor`` (> 0; 1.5 and 2 give the 1.5x and 2x arrival rates of a workload). Names,
    applications, user settings and the order of submissions are unchanged. Raises
    :class:`InvalidInputError` (field ``arrival_scale``) for a factor that is not a finite
    number > 0."""
    if not (isinstance(factor, int | float) and math.isfinite(factor) and factor > 0):
        raise InvalidInputError(
            f"arrival scale must be a finite number > 0, got {factor!r}", field="arrival_scale"
        )
    jobs = tuple(replace(job, submit_time_s=job.submit_time_s / factor) for job in workload.jobs)
    return Workload(workload.name, jobs)


def write_workload(workload: Workload, path: str | Path) -> Path:
    """Write ``workload`` as a workload CSV at ``path`` (created, or replaced) that
    :func:`load_workload` reads back to the same jobs (times written with ``repr`` precision).
    Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(WORKLOAD_COLUMNS)
        for job in workload.jobs:
            time_s = job.submit_time_s
            text = str(int(time_s)) if float(time_s).is_integer() else repr(float(time_s))
            writer.writerow([job.name, text, job.application, job.num_replicas, job.batch_size])
    return path
