"""What the trainers teach: their reports (``reports``, v2) and the goodput fits made from
them (``models``, v2)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autoscaler.controller.errors import StoreError, UnknownRowError
from autoscaler.controller.records import ReportRow
from autoscaler.controller.store.base import StoreBase, in_chunks
from autoscaler.controller.store.validate import valid_count, valid_json_object, valid_text

__all__ = ["ModelRow", "TrainerReportTable"]


@dataclass(frozen=True)
class ModelRow:
    """The latest goodput fit of one job on one GPU type (parameters as a JSON object)."""

    job_name: str
    gpu_type: str
    params_json: str
    fitted_at_s: float


class TrainerReportTable(StoreBase):
    """The trainer reports and the goodput fits."""

    def add_report(self, job_name: str, payload_json: str) -> ReportRow:
        """Append a trainer report (a JSON object) of a known job."""
        payload_json = valid_json_object(payload_json, "payload_json")
        now = self._now()
        with self._write("add a report") as conn:
            if conn.execute("SELECT 1 FROM jobs WHERE name = ?", (job_name,)).fetchone() is None:
                raise UnknownRowError("jobs", job_name)
            cursor = conn.execute(
                "INSERT INTO reports (job_name, at_s, payload_json) VALUES (?, ?, ?) "
                "RETURNING report_id",
                (job_name, now, payload_json),
            )
            report_id = cursor.fetchone()[0]
        if report_id is None:  # pragma: no cover - an INSERT into a rowid table always sets it
            raise StoreError(f"{self._path}: no id for the report", path=str(self._path))
        return ReportRow(report_id, job_name, now, payload_json)

    def latest_report(self, job_name: str) -> ReportRow | None:
        """The last report of a job, or ``None``."""
        rows = self._read(
            "SELECT report_id, job_name, at_s, payload_json FROM reports WHERE job_name = ? "
            "ORDER BY report_id DESC LIMIT 1",
            (job_name,),
        )
        return ReportRow(*rows[0]) if rows else None

    def latest_reports(self, jobs: Iterable[str] | None = None) -> dict[str, ReportRow]:
        """The last report of every job that has one (of ``jobs`` only, when given), by job
        name."""
        if jobs is not None:
            out: dict[str, ReportRow] = {}
            for chunk, marks in in_chunks(jobs):
                rows = self._read(
                    "SELECT report_id, job_name, at_s, payload_json FROM reports WHERE "
                    f"report_id IN (SELECT max(report_id) FROM reports WHERE job_name IN ({marks}) "
                    "GROUP BY job_name)",
                    chunk,
                )
                out.update((r[1], ReportRow(*r)) for r in rows)
            return dict(sorted(out.items()))
        rows = self._read(
            "SELECT report_id, job_name, at_s, payload_json FROM reports WHERE report_id IN "
            "(SELECT max(report_id) FROM reports GROUP BY job_name) ORDER BY job_name"
        )
        return {r[1]: ReportRow(*r) for r in rows}

    def reports_after(self, cursor: int) -> tuple[int, tuple[tuple[str, str], ...]]:
        """Reports that arrived after ``cursor`` (0: all), oldest first, as ``(job name,
        payload JSON)``, with the cursor to pass next time."""
        cursor = valid_count(cursor, "cursor")
        rows = self._read(
            "SELECT report_id, job_name, payload_json FROM reports WHERE report_id > ? "
            "ORDER BY report_id",
            (cursor,),
        )
        last = rows[-1][0] if rows else cursor
        return last, tuple((r[1], r[2]) for r in rows)

    def prune_reports(self, jobs: Iterable[str], through_id: int, keep_per_job: int) -> int:
        """Delete the reports of ``jobs`` up to ``through_id`` (those the controller has read:
        what they taught is in its profiles and ``models``), except the newest
        ``keep_per_job`` of each job, whatever their id: the latest report (progress, the
        gradient statistics a restart reads) and a bounded history are always kept. Returns
        how many were deleted. Report ids are never reused, so cursors stay valid."""
        through_id = valid_count(through_id, "through_id")
        keep_per_job = valid_count(keep_per_job, "keep_per_job", minimum=1)
        names = sorted(set(jobs))
        if not names:
            return 0
        deleted = 0
        with self._write("prune reports") as conn:
            for name in names:
                # The id of the oldest report to keep (the keep_per_job-th newest).
                row = conn.execute(
                    "SELECT report_id FROM reports WHERE job_name = ? "
                    "ORDER BY report_id DESC LIMIT 1 OFFSET ?",
                    (name, keep_per_job - 1),
                ).fetchone()
                if row is None:
                    continue  # no more than keep_per_job reports
                cursor = conn.execute(
                    "DELETE FROM reports WHERE job_name = ? AND report_id < ? AND report_id <= ?",
                    (name, int(row[0]), through_id),
                )
                deleted += max(0, cursor.rowcount)
        return deleted

    def report_count(self, job_name: str | None = None) -> int:
        """How many reports the store holds (of ``job_name`` only, when given)."""
        if job_name is None:
            rows = self._read("SELECT count(*) FROM reports")
        else:
            rows = self._read("SELECT count(*) FROM reports WHERE job_name = ?", (job_name,))
        return int(rows[0][0])

    def last_report_id(self) -> int:
        """The id of the newest report (0: none): the cursor that skips every report so far."""
        rows = self._read("SELECT coalesce(max(report_id), 0) FROM reports")
        return int(rows[0][0])

    # ---- v2: models ------------------------------------------------------------------------

    def upsert_model(self, job_name: str, gpu_type: str, params_json: str) -> ModelRow:
        """Record the latest fit of a known job on ``gpu_type`` (replacing the previous one)."""
        return self.upsert_models([(job_name, gpu_type, params_json)])[0]

    def upsert_models(self, models: Sequence[tuple[str, str, str]]) -> list[ModelRow]:
        """:meth:`upsert_model` of every ``(job name, GPU type, params JSON)``, in one
        transaction (all or nothing: :class:`UnknownRowError` for an unknown job)."""
        checked = [
            (job, valid_text(gpu_type, "gpu_type"), valid_json_object(params, "params_json"))
            for job, gpu_type, params in models
        ]
        now = self._now()
        with self._write("record models") as conn:
            for job_name, gpu_type, params_json in checked:
                if (
                    conn.execute("SELECT 1 FROM jobs WHERE name = ?", (job_name,)).fetchone()
                    is None
                ):
                    raise UnknownRowError("jobs", job_name)
                conn.execute(
                    "INSERT INTO models (job_name, gpu_type, params_json, fitted_at_s) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (job_name, gpu_type) DO UPDATE SET "
                    "params_json = excluded.params_json, fitted_at_s = excluded.fitted_at_s",
                    (job_name, gpu_type, params_json, now),
                )
        return [ModelRow(job, gpu_type, params, now) for job, gpu_type, params in checked]

    def get_model(self, job_name: str, gpu_type: str) -> ModelRow | None:
        """The latest fit of a job on a GPU type, or ``None``."""
        rows = self._read(
            "SELECT job_name, gpu_type, params_json, fitted_at_s FROM models "
            "WHERE job_name = ? AND gpu_type = ?",
            (job_name, gpu_type),
        )
        return ModelRow(*rows[0]) if rows else None

    def application_models(self, application: str) -> tuple[ModelRow, ...]:
        """Every fit of every job (running, ended or deleted) whose stored spec names
        ``application``: what this cluster has measured of that application's speed (the
        estimate of a declared length at submission reads it), by job and GPU type."""
        rows = self._read(
            "SELECT m.job_name, m.gpu_type, m.params_json, m.fitted_at_s FROM models m "
            "JOIN jobs j ON j.name = m.job_name "
            "WHERE json_extract(j.spec_json, '$.application') = ? "
            "ORDER BY m.job_name, m.gpu_type",
            (application,),
        )
        return tuple(ModelRow(*r) for r in rows)

    def list_models(self, job_name: str | None = None) -> tuple[ModelRow, ...]:
        """Every fit (of one job when given), by job and GPU type."""
        sql = "SELECT job_name, gpu_type, params_json, fitted_at_s FROM models"
        params: tuple[str, ...] = ()
        if job_name is not None:
            sql += " WHERE job_name = ?"
            params = (job_name,)
        return tuple(ModelRow(*r) for r in self._read(sql + " ORDER BY job_name, gpu_type", params))
