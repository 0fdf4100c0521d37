"""The jobs (``jobs``), each job's planned batch (``job_batches``) and each running job's
ETA (``job_etas``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from autoscaler.controller.errors import DuplicateRowError, StaleVersionError, UnknownRowError
from autoscaler.controller.records import JobBatch, JobEta, JobRow, JobStatus
from autoscaler.controller.store.base import StoreBase, in_chunks
from autoscaler.controller.store.dialect import INTEGRITY_ERRORS, Connection
from autoscaler.controller.store.validate import (
    valid_count,
    valid_enum,
    valid_json_object,
    valid_number,
    valid_text,
    valid_version,
)
from autoscaler.errors import InvalidInputError

__all__ = ["DELETED_MARK", "ENDED_JOB_STATUSES", "MAX_REASON_CHARS", "JobTable", "is_deleted_name"]

_JOB_COLUMNS: Final = (
    "name, spec_json, status, retries, submitted_at_s, updated_at_s, version, reason, deadline_s"
)
_BATCH_COLUMNS: Final = "job_name, global_batch_size, local_batch_size, accum_steps, gpus, at_s"
_ETA_COLUMNS: Final = "job_name, eta_s, eta_at_s"
MAX_REASON_CHARS: Final = 500
"""A job's ``reason`` is cut to this many characters."""
DELETED_MARK: Final = "~"
"""A deleted job is kept as ``<name>~<n>`` (its n-th deletion): a name no submission can take
(``~`` is outside :data:`~autoscaler.controller.jobbook.JOB_NAME_PATTERN`)."""
ENDED_JOB_STATUSES: Final = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.REFUSED}
)
"""The statuses a job can be deleted in (:meth:`JobTable.delete_job`)."""
_MOVE_JOB_ROWS: Final = (  # every table whose job_name references jobs (name), and events
    "UPDATE assignments SET job_name = ? WHERE job_name = ?",
    "UPDATE assignment_history SET job_name = ? WHERE job_name = ?",
    "UPDATE reports SET job_name = ? WHERE job_name = ?",
    "UPDATE models SET job_name = ? WHERE job_name = ?",
    "UPDATE job_batches SET job_name = ? WHERE job_name = ?",
    "UPDATE job_usage SET job_name = ? WHERE job_name = ?",
    "UPDATE events SET subject = ? WHERE subject = ?",
)
_JOB_FIELDS: Final = frozenset({"spec_json", "status", "retries", "reason"})
_JOB_STATUSES: Final = {s.value: s for s in JobStatus}


def _job_row(r: Any) -> JobRow:
    """A row of ``SELECT {_JOB_COLUMNS}`` (by position: a job list reads hundreds a page)."""
    name, spec_json, status, retries, submitted_at_s, updated_at_s, version, reason, deadline = r
    return JobRow(
        name,
        spec_json,
        _JOB_STATUSES.get(status) or JobStatus(status),
        retries,
        submitted_at_s,
        updated_at_s,
        version,
        reason,
        deadline,
    )


def is_deleted_name(name: str) -> bool:
    """Whether ``name`` is a deleted job's (``<name>~<n>``, :meth:`JobTable.delete_job`)."""
    return DELETED_MARK in name


class JobTable(StoreBase):
    """The jobs, their planned batches and the running jobs' ETAs."""

    def delete_job(self, name: str) -> str:
        """Delete ended job ``name`` so that its name can be submitted again; returns the name
        its history is kept under, ``<name>~<n>`` (:data:`DELETED_MARK`).

        Nothing is erased: in one transaction the job's row and every row that names it (its
        assignments and their history, reports, fitted models, batch, usage totals) and the
        events about it move to the kept name, so the bill (which splits each instance's cost
        by the assignment history) stays what it was, the deleted job listed under the kept
        name. :class:`UnknownRowError` when there is no job ``name`` (or it is a deleted
        one); :class:`InvalidInputError` when it has not ended or still holds GPUs."""
        name = valid_text(name, "name")
        if is_deleted_name(name):
            raise UnknownRowError("jobs", name)
        with self._write("delete a job") as conn:
            job = self._job(conn, name)
            if job.status not in ENDED_JOB_STATUSES:
                raise InvalidInputError(
                    f"job {name!r} is {job.status.value}: only an ended job (completed, failed, "
                    "cancelled or refused) can be deleted; cancel it first",
                    field="name",
                )
            held = conn.execute(
                "SELECT count(*) FROM assignments WHERE job_name = ?", (name,)
            ).fetchone()[0]
            if held:
                raise InvalidInputError(
                    f"job {name!r} still holds GPUs; delete it once the next round freed them",
                    field="name",
                )
            taken = conn.execute(
                "SELECT count(*) FROM jobs WHERE substr(name, 1, ?) = ?",
                (len(name) + 1, name + DELETED_MARK),
            ).fetchone()[0]
            kept = f"{name}{DELETED_MARK}{taken + 1}"
            while conn.execute("SELECT 1 FROM jobs WHERE name = ?", (kept,)).fetchone():
                taken += 1
                kept = f"{name}{DELETED_MARK}{taken + 1}"
            conn.execute(
                "INSERT INTO jobs (name, spec_json, status, retries, submitted_at_s, "
                "updated_at_s, version, reason, deadline_s) SELECT ?, spec_json, status, "
                "retries, submitted_at_s, updated_at_s, version, reason, deadline_s FROM jobs "
                "WHERE name = ?",
                (kept, name),
            )
            # An ended job runs no more: its last estimate goes with it.
            conn.execute("DELETE FROM job_etas WHERE job_name = ?", (name,))
            for sql in _MOVE_JOB_ROWS:
                conn.execute(sql, (kept, name))
            conn.execute("DELETE FROM jobs WHERE name = ?", (name,))
        return kept

    def add_job(
        self,
        name: str,
        spec_json: str,
        *,
        status: JobStatus = JobStatus.QUEUED,
        deadline_after_s: float | None = None,
        deadline_at_s: float | None = None,
    ) -> JobRow:
        """Add a job (version 1); :class:`DuplicateRowError` if the name is taken. Its
        deadline (``deadline_s``) is ``deadline_at_s`` if given, else ``deadline_after_s``
        after its submission time (the clock's now), else none."""
        name = valid_text(name, "name")
        spec_json = valid_json_object(spec_json, "spec_json")
        status = valid_enum(JobStatus, status, "status")
        now = self._now()
        deadline: float | None = None
        if deadline_at_s is not None:
            deadline = valid_number(deadline_at_s, "deadline_at_s", minimum=None)
        elif deadline_after_s is not None:
            deadline = now + valid_number(deadline_after_s, "deadline_after_s")
        with self._write("add a job") as conn:
            try:
                conn.execute(
                    "INSERT INTO jobs (name, spec_json, status, retries, submitted_at_s, "
                    "updated_at_s, version, deadline_s) VALUES (?, ?, ?, 0, ?, ?, 1, ?)",
                    (name, spec_json, status.value, now, now, deadline),
                )
            except INTEGRITY_ERRORS as e:
                raise DuplicateRowError("jobs", name) from e
            return self._job(conn, name)

    def get_job(self, name: str) -> JobRow:
        """The job ``name``; :class:`UnknownRowError` if there is none."""
        rows = self._read(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE name = ?", (name,))
        if not rows:
            raise UnknownRowError("jobs", name)
        return _job_row(rows[0])

    def list_jobs(self, statuses: Iterable[JobStatus] | None = None) -> tuple[JobRow, ...]:
        """Jobs (those in ``statuses`` when given), in submission order."""
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs"
        params: list[str] = []
        if statuses is not None:
            params = [valid_enum(JobStatus, s, "statuses").value for s in statuses]
            sql += f" WHERE status IN ({', '.join('?' * len(params))})"
        sql += " ORDER BY submitted_at_s, name"
        return tuple(_job_row(r) for r in self._read(sql, params))

    def job_counts(self) -> dict[JobStatus, int]:
        """How many jobs are in each status (one grouped read; statuses with none left out).
        Deleted jobs (kept as ``<name>~<n>``) count with the status they ended in."""
        rows = self._read("SELECT status, COUNT(*) FROM jobs GROUP BY status")
        return {JobStatus(r[0]): int(r[1]) for r in rows}

    def list_jobs_page(
        self, after: tuple[float, str] | None, limit: int, *, deleted: bool = True
    ) -> tuple[JobRow, ...]:
        """At most ``limit`` jobs in submission order (``(submitted_at_s, name)``, the order
        of :meth:`list_jobs`), those after the job keyed ``after`` (``None``: from the
        first); without the deleted ones (:meth:`delete_job`) unless ``deleted``. A job's key
        never changes, so paging by the last key of each page sees every job that existed
        when it began exactly once."""
        limit = valid_count(limit, "limit", minimum=1)
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs"
        params: list[object] = []
        where = [] if deleted else ["instr(name, ?) = 0"]
        if not deleted:
            params.append(DELETED_MARK)
        if after is not None:  # a row value: the submission index serves it (schema v5)
            at_s, name = after
            where.append("(submitted_at_s, name) > (?, ?)")
            params += [valid_number(at_s, "after", minimum=None), valid_text(name, "after")]
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY submitted_at_s, name LIMIT ?"
        return tuple(_job_row(r) for r in self._read(sql, [*params, limit]))

    def update_job(self, name: str, expected_version: int, **changes: object) -> JobRow:
        """Change ``spec_json``, ``status``, ``retries`` and/or ``reason`` of job ``name``,
        written against ``expected_version``; returns the new row (version + 1). A ``reason``
        is kept on one line, cut to :data:`MAX_REASON_CHARS`.

        :class:`UnknownRowError`, :class:`StaleVersionError` (nothing changed), or
        :class:`InvalidInputError` for an unknown field or value.
        """
        expected_version = valid_version(expected_version)
        unknown = sorted(set(changes) - _JOB_FIELDS)
        if unknown or not changes:
            raise InvalidInputError(
                f"job fields that can change: {sorted(_JOB_FIELDS)}; got {sorted(changes)}",
                field=unknown[0] if unknown else "changes",
            )
        if "spec_json" in changes:
            changes["spec_json"] = valid_json_object(changes["spec_json"], "spec_json")
        if "status" in changes:
            changes["status"] = valid_enum(JobStatus, changes["status"], "status").value
        if "retries" in changes:
            changes["retries"] = valid_count(changes["retries"], "retries")
        if changes.get("reason") is not None:
            reason = " ".join(valid_text(changes["reason"], "reason").split())
            changes["reason"] = reason[:MAX_REASON_CHARS]
        now = self._now()
        with self._write("update a job") as conn:
            old = self._job_at(conn, name, expected_version)
            new = {
                "spec_json": old.spec_json,
                "status": old.status.value,
                "retries": old.retries,
                "reason": old.reason,
                **changes,
            }
            cursor = conn.execute(
                "UPDATE jobs SET spec_json = ?, status = ?, retries = ?, reason = ?, "
                "updated_at_s = ?, version = version + 1 WHERE name = ? AND version = ?",
                (
                    new["spec_json"],
                    new["status"],
                    new["retries"],
                    new["reason"],
                    now,
                    name,
                    expected_version,
                ),
            )
            self._check_updated(conn, cursor, "jobs", name, expected_version)
            return self._job(conn, name)

    def _job(self, conn: Connection, name: str) -> JobRow:
        row = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise UnknownRowError("jobs", name)
        return _job_row(row)

    def _job_at(self, conn: Connection, name: str, expected_version: int) -> JobRow:
        job = self._job(conn, name)
        if job.version != expected_version:
            raise StaleVersionError("jobs", name, expected_version, job.version)
        return job

    # ---- v4: planned batches ---------------------------------------------------------------

    def set_batch(
        self,
        job_name: str,
        *,
        global_batch_size: int,
        local_batch_size: int,
        accum_steps: int,
        gpus: int,
    ) -> JobBatch:
        """Record the batch a round planned for ``job_name`` on ``gpus`` GPUs (replacing the
        one before; its time is kept when nothing changed). :class:`UnknownRowError` for an
        unknown job."""
        values = {
            "global_batch_size": valid_count(global_batch_size, "global_batch_size", minimum=1),
            "local_batch_size": valid_count(local_batch_size, "local_batch_size", minimum=1),
            "accum_steps": valid_count(accum_steps, "accum_steps", minimum=1),
            "gpus": valid_count(gpus, "gpus", minimum=1),
        }
        with self._write("record a batch") as conn:
            if conn.execute("SELECT 1 FROM jobs WHERE name = ?", (job_name,)).fetchone() is None:
                raise UnknownRowError("jobs", job_name)
            old = self._batch(conn, job_name)
            if old is not None and all(getattr(old, k) == v for k, v in values.items()):
                return old
            conn.execute(
                "INSERT INTO job_batches (job_name, global_batch_size, local_batch_size, "
                "accum_steps, gpus, at_s) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_name) DO "
                "UPDATE SET global_batch_size = excluded.global_batch_size, "
                "local_batch_size = excluded.local_batch_size, accum_steps = "
                "excluded.accum_steps, gpus = excluded.gpus, at_s = excluded.at_s",
                (job_name, *values.values(), self._now()),
            )
            new = self._batch(conn, job_name)
        assert new is not None
        return new

    def clear_batch(self, job_name: str) -> None:
        """Forget ``job_name``'s planned batch (it holds no GPUs)."""
        with self._write("clear a batch") as conn:
            conn.execute("DELETE FROM job_batches WHERE job_name = ?", (job_name,))

    def get_batch(self, job_name: str) -> JobBatch | None:
        """The batch last planned for ``job_name`` (``None``: none)."""
        rows = self._read(
            f"SELECT {_BATCH_COLUMNS} FROM job_batches WHERE job_name = ?", (job_name,)
        )
        return JobBatch(*rows[0]) if rows else None

    def list_batches(self, jobs: Iterable[str] | None = None) -> dict[str, JobBatch]:
        """Every job's planned batch (of ``jobs`` only, when given), by job name."""
        if jobs is None:
            rows = self._read(f"SELECT {_BATCH_COLUMNS} FROM job_batches ORDER BY job_name")
            return {r[0]: JobBatch(*r) for r in rows}
        out: dict[str, JobBatch] = {}
        for chunk, marks in in_chunks(jobs):
            rows = self._read(
                f"SELECT {_BATCH_COLUMNS} FROM job_batches WHERE job_name IN ({marks})", chunk
            )
            out.update((r[0], JobBatch(*r)) for r in rows)
        return dict(sorted(out.items()))

    @staticmethod
    def _batch(conn: Connection, job_name: str) -> JobBatch | None:
        row = conn.execute(
            f"SELECT {_BATCH_COLUMNS} FROM job_batches WHERE job_name = ?", (job_name,)
        ).fetchone()
        return None if row is None else JobBatch(*row)

    # ---- v11: ETAs -------------------------------------------------------------------------

    def record_etas(self, etas: Mapping[str, float]) -> None:
        """Record a round's estimates: each job of ``etas`` will be done at its value (the
        clock's time, finite), estimated now; every other job's estimate is forgotten (it
        no longer runs, or has no estimate now). One transaction; the table holds at most a
        row per running job. :class:`UnknownRowError` for an unknown job (nothing changed),
        :class:`InvalidInputError` for a time that is not finite."""
        rows = []
        for name, eta_s in sorted(etas.items()):
            rows.append((valid_text(name, "job_name"), valid_number(eta_s, "eta_s", minimum=None)))
        now = self._now()
        with self._write("record the ETAs") as conn:
            conn.execute("DELETE FROM job_etas")
            for name, eta_s in rows:
                try:
                    conn.execute(
                        "INSERT INTO job_etas (job_name, eta_s, eta_at_s) VALUES (?, ?, ?)",
                        (name, eta_s, now),
                    )
                except INTEGRITY_ERRORS as e:
                    raise UnknownRowError("jobs", name) from e

    def list_etas(self, jobs: Iterable[str] | None = None) -> dict[str, JobEta]:
        """The last recorded estimate of every job that has one (of ``jobs`` only, when
        given), by job name."""
        if jobs is None:
            rows = self._read(f"SELECT {_ETA_COLUMNS} FROM job_etas ORDER BY job_name")
            return {r[0]: JobEta(*r) for r in rows}
        out: dict[str, JobEta] = {}
        for chunk, marks in in_chunks(jobs):
            rows = self._read(
                f"SELECT {_ETA_COLUMNS} FROM job_etas WHERE job_name IN ({marks})", chunk
            )
            out.update((r[0], JobEta(*r)) for r in rows)
        return dict(sorted(out.items()))
