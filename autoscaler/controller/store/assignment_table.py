"""Which job holds how many GPUs of which instance (``assignments``), and since when
(``assignment_history``): the spans billing, the events and a policy's attained service read.

Usage and restarts (the one definition; billing, the events and the API read it from here)
    A job's **attained service** at time ``t`` is the sum over its spans of ``gpus x (end -
    from_s)``, ``end`` being ``to_s`` or, for a span still open, ``t`` (floored at 0). Its
    **restarts** are the number of distinct instants at which a span of it opened (its
    placements: a change of assignment opens all its new spans at one instant, and
    :meth:`AssignmentTable.record_relaunch` opens one), less the first. A job never placed
    has neither.

    The store keeps both as running totals in ``job_usage`` (schema v8), updated in the
    transaction that opens or closes a span: the GPU-seconds of the closed spans, the count
    of placements and the latest placement instant. A round reads those and the open spans
    (a partial index), never the whole history, so its cost does not grow with the cluster's
    age. The totals equal the full-history computation (``tests/controller/test_store.py``
    checks it over random histories): the placement count exactly, also under a clock stepped
    back (an opening before the latest instant counts only if no span of the job opened at
    that very instant), the GPU-seconds up to floating-point summation order.

    Only :meth:`AssignmentTable._open_span` and :meth:`AssignmentTable._close_spans` write
    ``assignment_history`` (the v3 migration aside), so the totals cannot miss a change.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autoscaler.controller.errors import UnknownRowError
from autoscaler.controller.records import JobStatus
from autoscaler.controller.store.base import StoreBase, in_chunks
from autoscaler.controller.store.dialect import Connection
from autoscaler.controller.store.validate import valid_count, valid_text

__all__ = ["AssignmentRow", "AssignmentSpan", "AssignmentTable"]


@dataclass(frozen=True)
class AssignmentRow:
    """``gpus`` GPUs of instance ``instance_key`` assigned to job ``job_name``; ``version``
    counts the changes of this pair's GPU count since it was assigned."""

    job_name: str
    instance_key: str
    gpus: int
    version: int


@dataclass(frozen=True)
class AssignmentSpan:
    """Job ``job_name`` held ``gpus`` GPUs of ``instance_key`` from ``from_s`` to ``to_s``
    (``None``: still does)."""

    job_name: str
    instance_key: str
    gpus: int
    from_s: float
    to_s: float | None


class AssignmentTable(StoreBase):
    """The assignments and their history."""

    def set_assignments(self, job_name: str, gpus_by_instance: Mapping[str, int]) -> None:
        """Make ``gpus_by_instance`` the whole of job ``job_name``'s assignments, atomically:
        pairs not in it are removed, new ones added (version 1), changed GPU counts updated
        (version + 1), unchanged ones left as they are. Zero counts mean "not assigned".
        :class:`UnknownRowError` for an unknown job or instance (nothing changed)."""
        wanted: dict[str, int] = {}
        for key, gpus in gpus_by_instance.items():
            count = valid_count(gpus, f"gpus on {key}")
            if count:
                wanted[valid_text(key, "instance_key")] = count
        with self._write("set assignments") as conn:
            if conn.execute("SELECT 1 FROM jobs WHERE name = ?", (job_name,)).fetchone() is None:
                raise UnknownRowError("jobs", job_name)
            for key in sorted(wanted):
                found = conn.execute(
                    "SELECT 1 FROM instances WHERE instance_key = ?", (key,)
                ).fetchone()
                if found is None:
                    raise UnknownRowError("instances", key)
            held = {
                r[0]: r[1]
                for r in conn.execute(
                    "SELECT instance_key, gpus FROM assignments WHERE job_name = ?", (job_name,)
                )
            }
            now = self._now()
            for key in sorted(set(held) - set(wanted)):
                conn.execute(
                    "DELETE FROM assignments WHERE job_name = ? AND instance_key = ?",
                    (job_name, key),
                )
            for key, gpus in sorted(wanted.items()):
                if key not in held:
                    conn.execute(
                        "INSERT INTO assignments (job_name, instance_key, gpus, version) "
                        "VALUES (?, ?, ?, 1)",
                        (job_name, key, gpus),
                    )
                elif held[key] != gpus:
                    conn.execute(
                        "UPDATE assignments SET gpus = ?, version = version + 1 "
                        "WHERE job_name = ? AND instance_key = ?",
                        (gpus, job_name, key),
                    )
            for key in sorted(set(held) | set(wanted)):
                if held.get(key) == wanted.get(key):
                    continue
                self._close_spans(conn, job_name, key, now)  # the span that ends now
                if key in wanted:
                    self._open_span(conn, job_name, key, wanted[key], now)

    def record_relaunch(self, job_name: str, instance_key: str) -> bool:
        """``job_name``'s processes on ``instance_key`` were started again without a change
        of assignment (its agent restarted and found them gone): its open span there ends
        now and a new one begins, so the relaunch counts as a restart (:meth:`usage`, the one
        place restarts are counted). False (nothing written) when it holds nothing there."""
        with self._write("record a relaunch") as conn:
            row = conn.execute(
                "SELECT gpus FROM assignments WHERE job_name = ? AND instance_key = ?",
                (job_name, instance_key),
            ).fetchone()
            if row is None:
                return False
            now = self._now()
            self._close_spans(conn, job_name, instance_key, now)
            self._open_span(conn, job_name, instance_key, row[0], now)
        return True

    @staticmethod
    def _close_spans(conn: Connection, job_name: str, instance_key: str, now: float) -> None:
        """End ``job_name``'s open span on ``instance_key`` at ``now`` (if it has one), its
        GPU-seconds added to the job's closed total, in the caller's transaction."""
        rows = conn.execute(
            "SELECT gpus, from_s FROM assignment_history "
            "WHERE job_name = ? AND instance_key = ? AND to_s IS NULL",
            (job_name, instance_key),
        ).fetchall()
        if not rows:
            return
        conn.execute(
            "UPDATE assignment_history SET to_s = ? "
            "WHERE job_name = ? AND instance_key = ? AND to_s IS NULL",
            (now, job_name, instance_key),
        )
        conn.execute(
            "UPDATE job_usage SET closed_gpu_s = closed_gpu_s + ? WHERE job_name = ?",
            (math.fsum(gpus * (now - from_s) for gpus, from_s in rows), job_name),
        )

    @staticmethod
    def _open_span(
        conn: Connection, job_name: str, instance_key: str, gpus: int, now: float
    ) -> None:
        """Open a span of ``job_name`` on ``instance_key`` at ``now``, counting ``now`` as a
        new placement unless one of the job's spans already opened at that instant (the
        module docstring), in the caller's transaction."""
        usage = conn.execute(
            "SELECT last_placed_at_s FROM job_usage WHERE job_name = ?", (job_name,)
        ).fetchone()
        if usage is None:
            conn.execute(
                "INSERT INTO job_usage (job_name, closed_gpu_s, placements, last_placed_at_s) "
                "VALUES (?, 0.0, 1, ?)",
                (job_name, now),
            )
        elif now > usage[0]:
            conn.execute(
                "UPDATE job_usage SET placements = placements + 1, last_placed_at_s = ? "
                "WHERE job_name = ?",
                (now, job_name),
            )
        elif now < usage[0]:  # the clock was stepped back: new unless that instant was seen
            seen = conn.execute(
                "SELECT 1 FROM assignment_history WHERE job_name = ? AND from_s = ? LIMIT 1",
                (job_name, now),
            ).fetchone()
            if seen is None:
                conn.execute(
                    "UPDATE job_usage SET placements = placements + 1 WHERE job_name = ?",
                    (job_name,),
                )
        conn.execute(
            "INSERT INTO assignment_history "
            "(job_name, instance_key, gpus, from_s, to_s) VALUES (?, ?, ?, ?, NULL)",
            (job_name, instance_key, gpus, now),
        )

    def assignment_history(self, job: str | None = None) -> tuple[AssignmentSpan, ...]:
        """Every span in which a job held GPUs of an instance (``to_s`` ``None``: still
        holds them), oldest first; of one job if ``job`` is given."""
        sql = "SELECT job_name, instance_key, gpus, from_s, to_s FROM assignment_history"
        params: tuple[str, ...] = ()
        if job is not None:
            sql += " WHERE job_name = ?"
            params = (job,)
        return tuple(AssignmentSpan(*r) for r in self._read(sql + " ORDER BY seq", params))

    def placed_since(self, jobs: Iterable[str]) -> dict[str, float]:
        """When the latest current placement of ``jobs`` on each instance began: per instance
        key, the latest ``from_s`` of their open spans on it (a job placed, moved or resumed
        there); instances none of them holds are left out. Reads the open spans of ``jobs``
        only (the partial index), never the history."""
        out: dict[str, float] = {}
        for chunk, marks in in_chunks(jobs):
            for key, at_s in self._read(
                "SELECT instance_key, max(from_s) FROM assignment_history "
                f"WHERE job_name IN ({marks}) AND to_s IS NULL GROUP BY instance_key",
                chunk,
            ):
                out[key] = max(out.get(key, at_s), float(at_s))
        return out

    def placed_at(self, jobs: Iterable[str]) -> dict[str, float]:
        """When each job's current placement began: per job name, the latest ``from_s`` of
        its open spans (its latest placement, rescale, move or relaunch: the instant its
        current launch was asked for). Jobs holding nothing are left out. Reads the open spans
        of ``jobs`` only (the partial index), never the history."""
        out: dict[str, float] = {}
        for chunk, marks in in_chunks(jobs):
            for job, at_s in self._read(
                "SELECT job_name, max(from_s) FROM assignment_history "
                f"WHERE job_name IN ({marks}) AND to_s IS NULL GROUP BY job_name",
                chunk,
            ):
                out[job] = float(at_s)
        return out

    def assignment_rows(
        self, job: str | None = None, instance: str | None = None
    ) -> tuple[AssignmentRow, ...]:
        """Assignment rows, of one job and/or one instance when given, by (job, instance)."""
        sql = "SELECT job_name, instance_key, gpus, version FROM assignments"
        where, params = [], []
        if job is not None:
            where.append("job_name = ?")
            params.append(job)
        if instance is not None:
            where.append("instance_key = ?")
            params.append(instance)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY job_name, instance_key"
        return tuple(AssignmentRow(r[0], r[1], r[2], r[3]) for r in self._read(sql, params))

    def assignments_of(self, jobs: Iterable[str]) -> dict[tuple[str, str], int]:
        """GPUs by ``(job name, instance key)`` of ``jobs`` only (a page of a job list)."""
        out: dict[tuple[str, str], int] = {}
        for chunk, marks in in_chunks(jobs):
            rows = self._read(
                "SELECT job_name, instance_key, gpus FROM assignments "
                f"WHERE job_name IN ({marks}) ORDER BY job_name, instance_key",
                chunk,
            )
            out.update(((r[0], r[1]), r[2]) for r in rows)
        return out

    def list_assignments(
        self, job: str | None = None, instance: str | None = None
    ) -> dict[tuple[str, str], int]:
        """GPUs by ``(job name, instance key)``, of one job and/or one instance when given."""
        return {(a.job_name, a.instance_key): a.gpus for a in self.assignment_rows(job, instance)}

    def first_placed_at(self, jobs: Iterable[str]) -> dict[str, float]:
        """When each job (of ``jobs``) was first placed: its start (the module docstring's
        first placement). Jobs never placed are left out."""
        out: dict[str, float] = {}
        for chunk, marks in in_chunks(jobs):
            rows = self._read(
                "SELECT job_name, min(from_s) FROM assignment_history "
                f"WHERE job_name IN ({marks}) GROUP BY job_name",
                chunk,
            )
            out.update((job, float(at_s)) for job, at_s in rows)
        return out

    def restart_counts(self, jobs: Iterable[str]) -> dict[str, int]:
        """How many times each job (of ``jobs``) was placed again after its first start (the
        module docstring's definition). The one count of restarts: the policy's
        ``num_restarts``, the API's, the bill's ``restart`` events
        (:func:`~autoscaler.controller.store.placement_instants`), the events' ``rescale`` and
        ``resume`` and the simulator's results. Jobs never placed are left out."""
        return {name: restarts for name, (_, restarts) in self.usage(jobs, 0.0).items()}

    def finished_gpu_s(self, limit: int) -> tuple[float, ...]:
        """The attained service (GPU-seconds, the module docstring's) at which each of the
        ``limit`` (>= 1) most recently completed jobs ended, the latest first (by when its row
        last changed, its completion; ties by name): the job lengths a policy learns from
        (:attr:`~autoscaler.decide.views.RoundInput.finished_gpu_s`). Only ``completed``
        jobs: a failed, cancelled or refused job's service is not a length. A completed job
        holds no span, so its closed total is all it had. It reads the past (the completed
        jobs through the status index): a controller reads it once, then keeps the lengths
        as jobs complete (:meth:`Controller._learn_lengths
        <autoscaler.controller.loop.Controller._learn_lengths>`)."""
        limit = valid_count(limit, "limit", minimum=1)
        rows = self._read(
            "SELECT u.closed_gpu_s FROM jobs AS j JOIN job_usage AS u ON u.job_name = j.name "
            "WHERE j.status = ? ORDER BY j.updated_at_s DESC, j.name DESC LIMIT ?",
            (JobStatus.COMPLETED.value, limit),
        )
        return tuple(max(0.0, float(r[0])) for r in rows)

    def usage(self, jobs: Iterable[str], now_s: float) -> dict[str, tuple[float, int]]:
        """Each job's (GPU-seconds it has held to ``now_s``, restarts), as the module
        docstring defines them: the attained service a policy weighs, and
        :meth:`restart_counts`. Read from the running totals and the open spans, never the
        whole history. Jobs never placed are left out."""
        out: dict[str, tuple[float, int]] = {}
        for chunk, marks in in_chunks(jobs):
            totals = self._read(
                "SELECT job_name, closed_gpu_s, placements FROM job_usage "
                f"WHERE job_name IN ({marks})",
                chunk,
            )
            open_gpu_s: dict[str, list[float]] = {}
            for job, gpus, from_s in self._read(
                "SELECT job_name, gpus, from_s FROM assignment_history "
                f"WHERE job_name IN ({marks}) AND to_s IS NULL",
                chunk,
            ):
                open_gpu_s.setdefault(job, []).append(gpus * (now_s - from_s))
            for job, closed, placements in totals:
                served = math.fsum([closed, *open_gpu_s.get(job, ())])
                out[job] = (max(0.0, served), max(0, int(placements) - 1))
        return out
