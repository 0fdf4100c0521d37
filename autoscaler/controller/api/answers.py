"""A job as the API answers it (:class:`~autoscaler.controller.client.JobInfo`), from its
rows in the store: the row, its assignment, latest report, planned batch and restarts.

``GET /v1/jobs`` and ``coadapt status`` on a cluster that is not up (:func:`jobs_in_store`)
answer the same, read in a few queries for a whole page (:func:`job_parts`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from autoscaler.controller.client import JobInfo, PlannedBatch, ProgressInfo
from autoscaler.controller.store import JobBatch, JobRow, ReportRow, Store

__all__ = ["JobParts", "job_info", "job_json", "job_parts", "jobs_in_store", "one_job"]

JobParts = tuple[JobRow, tuple[tuple[str, int], ...], ReportRow | None, JobBatch | None, int]
"""A job's row, assignment (``(instance_key, gpus)`` by key), latest report, batch, restarts."""


def job_parts(store: Store, rows: tuple[JobRow, ...]) -> list[JobParts]:
    """What a job's answer is made of, for each of ``rows``: the row, its assignment
    (``(instance_key, gpus)`` by key), latest report, planned batch and restarts."""
    names = [row.name for row in rows]
    assigned: dict[str, dict[str, int]] = {}
    for (job, key), gpus in store.assignments_of(names).items():
        assigned.setdefault(job, {})[key] = gpus
    reports = store.latest_reports(names)
    batches = store.list_batches(names)
    restarts = store.restart_counts(names)
    return [
        (
            row,
            tuple(sorted(assigned[row.name].items())) if row.name in assigned else (),
            reports.get(row.name),
            batches.get(row.name),
            restarts.get(row.name, 0),
        )
        for row in rows
    ]


def jobs_in_store(store: Store) -> tuple[JobInfo, ...]:
    """Every job, in submission order, as ``GET /v1/jobs`` answers it, read from ``store``
    (what ``coadapt status`` shows of a cluster that is not up)."""
    return tuple(
        job_info(row, dict(assignment), report, batch, restarts)
        for row, assignment, report, batch, restarts in job_parts(store, store.list_jobs())
    )


@functools.lru_cache(maxsize=4096)
def job_json(
    row: JobRow,
    assignment: tuple[tuple[str, int], ...],
    report: ReportRow | None,
    batch: JobBatch | None,
    restarts: int,
) -> str:
    """A job's answer as JSON text (what :func:`~autoscaler.controller.api.wire.json_response`
    writes for :meth:`JobInfo.to_dict`), remembered for the same rows: a job list re-reads
    mostly jobs that did not change since its last page, and encoding them was most of its cost
    (``benchmarks/api_load.py``)."""
    info = job_info(row, dict(assignment), report, batch, restarts)
    return json.dumps(info.to_dict(), sort_keys=True, allow_nan=False)


def job_info(
    row: JobRow,
    assignment: Mapping[str, int],
    report: ReportRow | None,
    batch: JobBatch | None,
    restarts: int,
) -> JobInfo:
    """A job as the API answers it, from its rows."""
    return JobInfo(
        name=row.name,
        status=row.status,
        retries=row.retries,
        submitted_at_s=row.submitted_at_s,
        updated_at_s=row.updated_at_s,
        version=row.version,
        spec=_stored_spec(row.spec_json),
        assignment=assignment,
        report=None if report is None else ProgressInfo.from_report(report),
        batch=None if batch is None or not assignment else PlannedBatch.of(batch),
        restarts=restarts,
        reason=row.reason,
    )


@functools.lru_cache(maxsize=4096)
def _stored_spec(spec_json: str) -> Mapping[str, Any]:
    """A stored spec as the JSON object it is (read-only; a job list parses each spec once,
    not on every page it is read in), even one that no longer passes the checks."""
    try:
        spec = json.loads(spec_json)
    except ValueError:
        spec = {}
    return MappingProxyType(spec if isinstance(spec, dict) else {})


def one_job(store: Store, row: JobRow) -> dict[str, Any]:
    """Job ``row`` as the API answers it (a JSON object), its other rows read from ``store``."""
    assignment = {k: g for (_, k), g in store.list_assignments(job=row.name).items()}
    restarts = store.restart_counts([row.name]).get(row.name, 0)
    return job_info(
        row, assignment, store.latest_report(row.name), store.get_batch(row.name), restarts
    ).to_dict()
