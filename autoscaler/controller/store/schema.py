"""The store's schema: its forward migrations, and the check that a file's tables are those
of its version.

:data:`MIGRATIONS` lists the forward migrations in order, ``MIGRATIONS[n]`` taking a store
from version ``n`` to ``n + 1``; :data:`SCHEMA_VERSION` is their count. A new store is built
by applying all of them, and :meth:`Store.open <autoscaler.controller.store.Store.open>`
applies those a store lacks, in one transaction. A migration, once released, is never edited:
a change is a new migration. (One that rebuilds a table must run with foreign keys off, which
SQLite allows only outside a transaction; none does yet.)

* v1: ``meta`` (``schema_version``, ``cluster_id``), ``jobs``, ``instances``,
  ``instance_history``, ``assignments``, ``plans``.
* v2: what a cost-aware controller adds: ``reports`` (trainer reports), ``models`` (goodput
  fits per job and GPU type), ``price_history``, ``cost_records``. Reports are not all kept:
  once the controller has read them into its profiles, a job's older reports beyond a
  bounded history are deleted (:meth:`Store.prune_reports
  <autoscaler.controller.store.Store.prune_reports>`).
* v3: ``assignment_history`` (who held which instance's GPUs when).
* v4: ``jobs.reason`` (why a job was refused or failed) and ``job_batches`` (each job's
  planned batch, what the API answers its trainer).
* v5: an index of the jobs in submission order (a page of the job list reads only its rows).
* v6: ``events``, the cluster's story (:mod:`autoscaler.controller.events`): launches,
  notices, rescales, completions, ... one row each, in order.
* v7: ``jobs.deadline_s``, a job's deadline (the clock's time; ``NULL``: none), resolved once
  at submission from the spec's ``deadline`` (a duration or a time).
* v8: a round's cost does not grow with the cluster's age. ``job_usage``: each job's attained
  service of closed spans and its placements, kept by the store as spans open and close and
  back-filled from ``assignment_history`` (whose open spans get a partial index). ``plans``
  is dropped: the one thing read from it, "has this store ever planned", is the ``meta`` row
  ``planned_at_s`` (the first plan's time). Time indexes on ``reports``, ``events`` and
  ``price_history`` serve retention (:meth:`Store.prune_old
  <autoscaler.controller.store.Store.prune_old>`).
* v9: ``instance_history.preemption``: whether the provider took the instance back, recorded
  by the round that saw it (back-filled from the reason strings that said it before).
* v10: one offering key format, :func:`providers.base.offering_key`'s
  ``provider/instance_type/zone/market`` (it was ``provider/zone/instance_type/market``):
  ``instances.offering_key`` is rebuilt from the row's own columns, ``price_history``'s keys
  have their two middle parts swapped.
* v11: ``job_etas``: when each running job will be done by its fitted model (``eta_s``, the
  clock's time) and when the round estimated it (``eta_at_s``); a row only while the job
  runs with a declared length and a model (:meth:`Store.record_etas
  <autoscaler.controller.store.Store.record_etas>`).
* v12: ``leader_lease``, one row: which controller leads (``holder``), its fencing ``epoch``
  (+1 at every change of holder), when that holder took it, last renewed it and when it
  expires, and how many writes of deposed leaders were refused (``refused_writes``)
  (:mod:`~autoscaler.controller.store.lease_table`).
"""

from __future__ import annotations

import functools
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from autoscaler.controller.errors import StoreCorruptError
from autoscaler.controller.store.dialect import Connection
from autoscaler.errors import InvalidInputError

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
    "apply_migrations",
    "check_schema",
    "migrate",
    "reference_layout",
    "reference_schema",
    "schema_of",
]


def _old_key_to_new(column: str) -> str:
    """SQL for the v10 key of an old ``provider/zone/instance_type/market`` key in ``column``:
    ``provider/instance_type/zone/market`` (the two middle parts swapped)."""
    tail = f"substr({column}, instr({column}, '/') + 1)"  # zone/type/market
    zone = f"substr({tail}, 1, instr({tail}, '/') - 1)"
    rest = f"substr({tail}, instr({tail}, '/') + 1)"  # type/market
    instance_type = f"substr({rest}, 1, instr({rest}, '/') - 1)"
    market = f"substr({rest}, instr({rest}, '/') + 1)"
    provider = f"substr({column}, 1, instr({column}, '/') - 1)"
    return f"{provider} || '/' || {instance_type} || '/' || {zone} || '/' || {market}"


@dataclass(frozen=True)
class Migration:
    """One schema step: the statements that take a store to ``version`` from the one before.
    They run inside the caller's transaction (DDL is transactional in SQLite and in
    PostgreSQL, which runs them through the translation of
    :func:`~autoscaler.controller.store.dialect.to_postgres`)."""

    version: int
    summary: str
    statements: tuple[str, ...]


MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        1,
        "the core: meta, jobs, instances and their history, assignments, plans",
        (
            """CREATE TABLE meta (
                key TEXT PRIMARY KEY,
                value TEXT NOT NULL
            )""",
            """CREATE TABLE jobs (
                name TEXT PRIMARY KEY,
                spec_json TEXT NOT NULL,
                status TEXT NOT NULL,
                retries INTEGER NOT NULL DEFAULT 0,
                submitted_at_s REAL NOT NULL,
                updated_at_s REAL NOT NULL,
                version INTEGER NOT NULL DEFAULT 1
            )""",
            "CREATE INDEX jobs_by_status ON jobs (status)",
            """CREATE TABLE instances (
                instance_key TEXT PRIMARY KEY,
                request_id TEXT NOT NULL UNIQUE,
                offering_key TEXT NOT NULL,
                provider TEXT NOT NULL,
                instance_type TEXT NOT NULL,
                zone TEXT NOT NULL,
                market TEXT NOT NULL,
                gpu_type TEXT NOT NULL,
                gpus INTEGER NOT NULL,
                price_usd_per_hour REAL NOT NULL,
                provider_instance_id TEXT,
                status TEXT NOT NULL,
                request_tries INTEGER NOT NULL DEFAULT 0,
                last_heartbeat_s REAL,
                created_at_s REAL NOT NULL,
                updated_at_s REAL NOT NULL,
                version INTEGER NOT NULL DEFAULT 1,
                UNIQUE (provider, provider_instance_id)
            )""",
            "CREATE INDEX instances_by_status ON instances (status)",
            """CREATE TABLE instance_history (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                instance_key TEXT NOT NULL REFERENCES instances (instance_key),
                status TEXT NOT NULL,
                at_s REAL NOT NULL,
                reason TEXT NOT NULL
            )""",
            "CREATE INDEX instance_history_by_instance ON instance_history (instance_key, seq)",
            """CREATE TABLE assignments (
                job_name TEXT NOT NULL REFERENCES jobs (name),
                instance_key TEXT NOT NULL REFERENCES instances (instance_key),
                gpus INTEGER NOT NULL CHECK (gpus > 0),
                version INTEGER NOT NULL DEFAULT 1,
                PRIMARY KEY (job_name, instance_key)
            )""",
            "CREATE INDEX assignments_by_instance ON assignments (instance_key)",
            """CREATE TABLE plans (
                round_id INTEGER PRIMARY KEY AUTOINCREMENT,
                at_s REAL NOT NULL,
                plan_json TEXT NOT NULL
            )""",
        ),
    ),
    Migration(
        2,
        "cost-aware controller: trainer reports, goodput models, price history, cost records",
        (
            """CREATE TABLE reports (
                report_id INTEGER PRIMARY KEY AUTOINCREMENT,
                job_name TEXT NOT NULL REFERENCES jobs (name),
                at_s REAL NOT NULL,
                payload_json TEXT NOT NULL
            )""",
            "CREATE INDEX reports_by_job ON reports (job_name, report_id)",
            """CREATE TABLE models (
                job_name TEXT NOT NULL REFERENCES jobs (name),
                gpu_type TEXT NOT NULL,
                params_json TEXT NOT NULL,
                fitted_at_s REAL NOT NULL,
                PRIMARY KEY (job_name, gpu_type)
            )""",
            """CREATE TABLE price_history (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                offering_key TEXT NOT NULL,
                at_s REAL NOT NULL,
                price_usd_per_hour REAL NOT NULL,
                market TEXT NOT NULL
            )""",
            "CREATE INDEX price_history_by_offering ON price_history (offering_key, at_s)",
            """CREATE TABLE cost_records (
                record_id INTEGER PRIMARY KEY AUTOINCREMENT,
                instance_key TEXT NOT NULL REFERENCES instances (instance_key),
                start_s REAL NOT NULL,
                end_s REAL NOT NULL,
                price_usd_per_hour REAL NOT NULL,
                usd REAL NOT NULL
            )""",
            "CREATE INDEX cost_records_by_instance ON cost_records (instance_key)",
        ),
    ),
    Migration(
        3,
        "assignment history: who held which instance's GPUs when (per-job cost)",
        (
            """CREATE TABLE assignment_history (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                job_name TEXT NOT NULL REFERENCES jobs (name),
                instance_key TEXT NOT NULL REFERENCES instances (instance_key),
                gpus INTEGER NOT NULL CHECK (gpus > 0),
                from_s REAL NOT NULL,
                to_s REAL
            )""",
            "CREATE INDEX assignment_history_by_job ON assignment_history (job_name, seq)",
            # Assignments held when the store is migrated start at its last plan.
            """INSERT INTO assignment_history (job_name, instance_key, gpus, from_s, to_s)
               SELECT job_name, instance_key, gpus,
                      coalesce((SELECT max(at_s) FROM plans), 0.0), NULL
               FROM assignments ORDER BY job_name, instance_key""",
        ),
    ),
    Migration(
        4,
        "the whole plan: why a job was refused or failed, and each job's planned batch",
        (
            "ALTER TABLE jobs ADD COLUMN reason TEXT",
            """CREATE TABLE job_batches (
                job_name TEXT PRIMARY KEY REFERENCES jobs (name),
                global_batch_size INTEGER NOT NULL CHECK (global_batch_size > 0),
                local_batch_size INTEGER NOT NULL CHECK (local_batch_size > 0),
                accum_steps INTEGER NOT NULL CHECK (accum_steps > 0),
                gpus INTEGER NOT NULL CHECK (gpus > 0),
                at_s REAL NOT NULL
            )""",
        ),
    ),
    Migration(
        5,
        "jobs listed a page at a time: an index in submission order",
        ("CREATE INDEX jobs_by_submission ON jobs (submitted_at_s, name)",),
    ),
    Migration(
        6,
        "the cluster's story: one row per event that matters (launch, notice, rescale, ...)",
        (
            """CREATE TABLE events (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                at_s REAL NOT NULL,
                kind TEXT NOT NULL,
                subject TEXT NOT NULL,
                message TEXT NOT NULL
            )""",
        ),
    ),
    Migration(
        7,
        "deadlines: when a job must be done (the clock's time), fixed at submission",
        ("ALTER TABLE jobs ADD COLUMN deadline_s REAL",),
    ),
    Migration(
        8,
        "a round's cost does not grow with the cluster's age: usage totals, no plans table",
        (
            # Each job's attained service and placements, kept as its spans open and close
            # (the job_usage rule is assignment_table's); back-filled from the history.
            """CREATE TABLE job_usage (
                job_name TEXT PRIMARY KEY REFERENCES jobs (name),
                closed_gpu_s REAL NOT NULL,
                placements INTEGER NOT NULL CHECK (placements > 0),
                last_placed_at_s REAL NOT NULL
            )""",
            """INSERT INTO job_usage (job_name, closed_gpu_s, placements, last_placed_at_s)
               SELECT job_name,
                      total(CASE WHEN to_s IS NULL THEN 0.0 ELSE gpus * (to_s - from_s) END),
                      count(DISTINCT from_s), max(from_s)
               FROM assignment_history GROUP BY job_name ORDER BY job_name""",
            # The spans still open: what a round reads, however long the history.
            """CREATE INDEX assignment_history_open ON assignment_history (job_name, instance_key)
               WHERE to_s IS NULL""",
            # A plan row was written every round and read only as "has this store planned";
            # that is now one meta row, the time of the first plan.
            """INSERT INTO meta (key, value)
               SELECT 'planned_at_s', printf('%!.17g', t) FROM (SELECT min(at_s) AS t FROM plans)
               WHERE t IS NOT NULL""",
            "DROP TABLE plans",
            # Retention reads the oldest rows first, by time.
            "CREATE INDEX reports_by_time ON reports (at_s)",
            "CREATE INDEX events_by_time ON events (at_s)",
            "CREATE INDEX price_history_by_time ON price_history (at_s)",
        ),
    ),
    Migration(
        9,
        "preemptions typed: a history entry records whether the provider took the instance back",
        (
            "ALTER TABLE instance_history ADD COLUMN preemption INTEGER NOT NULL DEFAULT 0",
            # What the reason strings said before: a spot notice, or vanishing from the
            # listing while running or draining (the entry before it).
            """UPDATE instance_history SET preemption = 1
               WHERE reason = 'spot interruption notice'
                  OR (reason = 'no longer listed by the cloud' AND (
                      SELECT h.status FROM instance_history AS h
                      WHERE h.instance_key = instance_history.instance_key
                        AND h.seq < instance_history.seq
                      ORDER BY h.seq DESC LIMIT 1) IN ('running', 'draining'))""",
        ),
    ),
    Migration(
        10,
        "one offering key format: provider/instance_type/zone/market",
        (
            """UPDATE instances SET offering_key =
               provider || '/' || instance_type || '/' || zone || '/' || market""",
            f"""UPDATE price_history SET offering_key = {_old_key_to_new("offering_key")}
               WHERE length(offering_key) - length(replace(offering_key, '/', '')) = 3""",
        ),
    ),
    Migration(
        11,
        "ETAs: when each running job will be done by its fitted model, and when it was said",
        (
            """CREATE TABLE job_etas (
                job_name TEXT PRIMARY KEY REFERENCES jobs (name),
                eta_s REAL NOT NULL,
                eta_at_s REAL NOT NULL
            )""",
        ),
    ),
    Migration(
        12,
        "the leader lease: one controller leads, every write of its rounds carries its epoch",
        (
            """CREATE TABLE leader_lease (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                holder TEXT NOT NULL,
                epoch INTEGER NOT NULL,
                acquired_at_s REAL NOT NULL,
                renewed_at_s REAL NOT NULL,
                expires_at_s REAL NOT NULL,
                refused_writes INTEGER NOT NULL DEFAULT 0
            )""",
        ),
    ),
)

SCHEMA_VERSION: Final = len(MIGRATIONS)


def apply_migrations(conn: Connection, from_version: int, to_version: int) -> None:
    """Apply ``MIGRATIONS[from_version:to_version]`` on ``conn`` inside the caller's
    transaction, recording each new version in ``meta``. :meth:`Store.create` and
    :meth:`Store.open` use it; tests use it to build stores of past versions."""
    if not 0 <= from_version <= to_version <= SCHEMA_VERSION:
        raise InvalidInputError(
            f"cannot migrate from version {from_version} to {to_version} "
            f"(known: 0..{SCHEMA_VERSION})",
            field="to_version",
        )
    for migration in MIGRATIONS[from_version:to_version]:
        for statement in migration.statements:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(migration.version),),
        )


def schema_of(conn: sqlite3.Connection) -> tuple[tuple[str, str, str, str], ...]:
    """The schema of a database, normalized for comparison: ``(type, name, table, sql)`` of
    every table and index SQLite did not make itself, sorted, whitespace collapsed."""
    rows = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master "
        "WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY type, name"
    ).fetchall()
    return tuple((r[0], r[1], r[2], " ".join((r[3] or "").split())) for r in rows)


@functools.cache
def reference_schema(version: int) -> tuple[tuple[str, str, str, str], ...]:
    """The schema that the first ``version`` migrations create (built in memory)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute("BEGIN")
        apply_migrations(conn, 0, version)
        conn.execute("COMMIT")
        return schema_of(conn)
    finally:
        conn.close()


Layout = frozenset[tuple[str, str, frozenset[str]]]
"""``(kind, name, columns)`` of every table (its columns) and index (no columns) a store has."""


@functools.cache
def reference_layout(version: int) -> Layout:
    """The tables with their columns and the indexes that the first ``version`` migrations
    create: what a PostgreSQL store of that version must have (PostgreSQL keeps no statement
    text to compare, as SQLite's ``sqlite_master`` does)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute("BEGIN")
        apply_migrations(conn, 0, version)
        conn.execute("COMMIT")
        out: set[tuple[str, str, frozenset[str]]] = set()
        for kind, name, _, sql in schema_of(conn):
            if kind == "table":
                columns = frozenset(r[1] for r in conn.execute(f"PRAGMA table_info({name})"))
                out.add(("table", name, columns))
            elif kind == "index" and sql:
                out.add(("index", name, frozenset()))
        return frozenset(out)
    finally:
        conn.close()


def layout_of(conn: Connection) -> Layout:
    """The tables (with their columns) and the explicitly created indexes of a PostgreSQL
    store's schema (those backing a primary key or UNIQUE constraint are the tables')."""
    columns: dict[str, set[str]] = {}
    for table, column in conn.execute(
        "SELECT c.table_name, c.column_name FROM information_schema.columns AS c "
        "JOIN information_schema.tables AS t ON t.table_schema = c.table_schema "
        "AND t.table_name = c.table_name WHERE c.table_schema = current_schema() "
        "AND t.table_type = 'BASE TABLE'"
    ).fetchall():
        columns.setdefault(table, set()).add(column)
    indexes = conn.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND indexname "
        "NOT IN (SELECT conname FROM pg_constraint WHERE connamespace = "
        "current_schema()::regnamespace)"
    ).fetchall()
    return frozenset(
        {("table", t, frozenset(c)) for t, c in columns.items()}
        | {("index", r[0], frozenset()) for r in indexes}
    )


def check_schema(conn: Connection, path: Path | str, version: int) -> None:
    """The store's tables and indexes are exactly those of its version's migrations: on
    SQLite, their statements; on PostgreSQL, their names and the tables' columns."""
    if isinstance(conn, sqlite3.Connection):
        have, want = set(schema_of(conn)), set(reference_schema(version))
        missing = sorted(f"{t} {n}" for t, n, _, _ in want - have)
        extra = sorted(f"{t} {n}" for t, n, _, _ in have - want)
    else:
        got, expected = layout_of(conn), reference_layout(version)
        missing = sorted(f"{t} {n}" for t, n, _ in expected - got)
        extra = sorted(f"{t} {n}" for t, n, _ in got - expected)
    if missing or extra:
        raise StoreCorruptError(
            f"{path}: its tables differ from schema version {version}: "
            f"missing or changed {missing or 'nothing'}, unexpected {extra or 'nothing'}",
            path=str(path),
        )


def migrate(conn: Connection, path: Path | str) -> int:
    """Bring the store to :data:`SCHEMA_VERSION` in one transaction; returns it. Another
    process may have migrated it meanwhile: the version is read again under the lock."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0])
        if version < SCHEMA_VERSION:
            apply_migrations(conn, version, SCHEMA_VERSION)
            check_schema(conn, path, SCHEMA_VERSION)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION
