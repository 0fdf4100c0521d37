"""A job as the API answers it (:class:`~autoscaler.controller.client.JobInfo`), from its
rows in the store: the row, its assignment, latest report, planned batch, restarts, first
placement and ETA.

The ETA is what the controller's last round recorded (:meth:`Store.record_etas
<autoscaler.controller.store.Store.record_etas>`): no model is evaluated per request. It is
answered for a running job only, and never from the store of a cluster that is not up (a
stopped cluster makes no progress): ``etas=False``.

``GET /v1/jobs`` and ``coadapt status`` on a cluster that is not up (:func:`jobs_in_store`)
answer the same, read in a few queries for a whole page (:func:`job_parts`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from autoscaler.controller.client import JobInfo, PlannedBatch, ProgressInfo
from autoscaler.controller.store import (
    JobBatch,
    JobEta,
    JobRow,
    JobStatus,
    ReportRow,
    Store,
    is_deleted_name,
)

__all__ = [
    "DESCRIBE_EVENTS",
    "JobParts",
    "job_history",
    "job_info",
    "job_json",
    "job_parts",
    "jobs_in_store",
    "one_job",
]

JobParts = tuple[
    JobRow,
    tuple[tuple[str, int], ...],
    ReportRow | None,
    JobBatch | None,
    int,
    float | None,
    JobEta | None,
]
"""A job's row, assignment (``(instance_key, gpus)`` by key), latest report, batch, restarts,
when it was first placed (``None``: never) and its recorded ETA (``None``: none)."""


def job_parts(store: Store, rows: tuple[JobRow, ...], *, etas: bool = True) -> list[JobParts]:
    """What a job's answer is made of, for each of ``rows``: the row, its assignment
    (``(instance_key, gpus)`` by key), latest report, planned batch, restarts, start and
    recorded ETA (none read unless ``etas``: a cluster that is not up has none)."""
    names = [row.name for row in rows]
    assigned: dict[str, dict[str, int]] = {}
    for (job, key), gpus in store.assignments_of(names).items():
        assigned.setdefault(job, {})[key] = gpus
    reports = store.latest_reports(names)
    batches = store.list_batches(names)
    restarts = store.restart_counts(names)
    started = store.first_placed_at(names)
    eta = store.list_etas(names) if etas else {}
    return [
        (
            row,
            tuple(sorted(assigned[row.name].items())) if row.name in assigned else (),
            reports.get(row.name),
            batches.get(row.name),
            restarts.get(row.name, 0),
            started.get(row.name),
            eta.get(row.name),
        )
        for row in rows
    ]


def jobs_in_store(store: Store) -> tuple[JobInfo, ...]:
    """Every job but the deleted ones, in submission order, as ``GET /v1/jobs`` answers it,
    read from ``store`` (what ``coadapt status`` shows of a cluster that is not up: no ETA)."""
    rows = tuple(row for row in store.list_jobs() if not is_deleted_name(row.name))
    return tuple(
        job_info(row, dict(assignment), report, batch, restarts, started, eta)
        for row, assignment, report, batch, restarts, started, eta in job_parts(
            store, rows, etas=False
        )
    )


@functools.lru_cache(maxsize=4096)
def job_json(
    row: JobRow,
    assignment: tuple[tuple[str, int], ...],
    report: ReportRow | None,
    batch: JobBatch | None,
    restarts: int,
    started_at_s: float | None = None,
    eta: JobEta | None = None,
) -> str:
    """A job's answer as JSON text (what :func:`~autoscaler.controller.api.wire.json_response`
    writes for :meth:`JobInfo.to_dict`), remembered for the same rows: a job list re-reads
    mostly jobs that did not change since its last page, and encoding them was most of its cost
    (``benchmarks/api_load.py``)."""
    info = job_info(row, dict(assignment), report, batch, restarts, started_at_s, eta)
    return json.dumps(info.to_dict(), sort_keys=True, allow_nan=False)


def job_info(
    row: JobRow,
    assignment: Mapping[str, int],
    report: ReportRow | None,
    batch: JobBatch | None,
    restarts: int,
    started_at_s: float | None = None,
    eta: JobEta | None = None,
) -> JobInfo:
    """A job as the API answers it, from its rows (``started_at_s``: its first placement;
    ``eta``: its recorded ETA, answered while it runs)."""
    if row.status is not JobStatus.RUNNING:
        eta = None
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
        started_at_s=started_at_s,
        deadline_s=row.deadline_s,
        eta_s=None if eta is None else eta.eta_s,
        eta_at_s=None if eta is None else eta.eta_at_s,
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


def one_job(store: Store, row: JobRow, *, etas: bool = True) -> dict[str, Any]:
    """Job ``row`` as the API answers it (a JSON object), its other rows read from ``store``
    (its ETA only if ``etas``: not from a cluster that is not up)."""
    assignment = {k: g for (_, k), g in store.list_assignments(job=row.name).items()}
    restarts = store.restart_counts([row.name]).get(row.name, 0)
    started = store.first_placed_at([row.name]).get(row.name)
    report, batch = store.latest_report(row.name), store.get_batch(row.name)
    eta = store.list_etas([row.name]).get(row.name) if etas else None
    return job_info(row, assignment, report, batch, restarts, started, eta).to_dict()


def job_history(store: Store, name: str, now_s: float) -> dict[str, Any]:
    """What ``coadapt describe`` shows of job ``name`` beyond its answer (``GET
    /v1/jobs/<name>/history``, and read from the store of a cluster that is not up):

    * ``placements``: its assignment spans, oldest first (``instance_key``, ``gpus``,
      ``from_s``, ``to_s``; ``to_s`` null while it holds them);
    * ``events``: the last :data:`DESCRIBE_EVENTS` events about it (re-batches among them),
      oldest first (``at_s``, ``kind``, ``message``);
    * ``gpu_s``: the GPU-seconds it has held to ``now_s`` (the store's attained service).

    :class:`~autoscaler.controller.errors.UnknownRowError` for an unknown job."""
    store.get_job(name)
    spans = store.assignment_history(name)
    served = store.usage([name], now_s).get(name, (0.0, 0))[0]
    return {
        "name": name,
        "placements": [
            {"instance_key": s.instance_key, "gpus": s.gpus, "from_s": s.from_s, "to_s": s.to_s}
            for s in spans
        ],
        "events": [
            {"at_s": e.at_s, "kind": e.kind, "message": e.message}
            for e in store.events_about(name, DESCRIBE_EVENTS)
        ],
        "gpu_s": served,
    }


DESCRIBE_EVENTS: Final = 200
"""The most events :func:`job_history` returns (the latest)."""
