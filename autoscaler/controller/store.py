"""The controller's store: one SQLite file holding what the controller knows and intends.

One :class:`Store` per file and process. It holds the jobs, the instance rows with their
status history, the jobs' assignments to instances, the plans of past rounds and, from schema
version 2, the trainer reports, the fitted goodput models, the price history and the cost
records. The cloud is never called from here.

Intent first
    The controller writes what it is about to do (a launch with its request id, a terminate)
    and only then calls the cloud; after a crash the store says what may exist in the cloud.
    So every change is **one transaction**, begun with ``BEGIN IMMEDIATE`` (the write lock is
    taken before the row is read, so a read-check-write cannot interleave with another
    writer) and committed only when every statement of it succeeded: a process killed at any
    point leaves the old state or the new one, never a row without its history entry.

Durability
    ``journal_mode=WAL`` (readers never block the writer) with ``synchronous=FULL``: every
    commit is fsynced to the WAL before the call returns. ``NORMAL`` would survive a killed
    process too, but a power loss or kernel crash could undo the last commits; an intent that
    the cloud already acted on must not be undone (it would turn a launch into an unknown
    instance, found only later as a leak). The cost is one fsync per transaction, and a round
    makes a few dozen. Foreign keys are enforced (``PRAGMA foreign_keys=ON``, per connection).

Optimistic concurrency
    Rows that are read, decided on and written back (jobs, instances) carry a ``version``,
    1 when created and incremented by every change. A change names the version it was
    decided on (``expected_version``); if the row has moved on, :class:`StaleVersionError`
    says so (with the actual version) and nothing is changed: re-read, decide again.

Instance status
    :meth:`Store.transition` is the only writer of ``instances.status`` (besides
    :meth:`Store.add_instance`, which creates a row ``queued``). It checks the version and the
    lifecycle table (:func:`autoscaler.controller.lifecycle.check_transition`) in the same
    transaction, and appends the change to ``instance_history``. History times never go
    backwards: an entry is stamped ``max(now, previous entry)``, so a clock stepped back cannot
    reorder a row's history. ``request_tries`` is kept by the store: the number of
    ``requested -> queued`` retries in the history.

Money
    Prices (``*_usd_per_hour``) and amounts (``usd``) are stored as SQLite REAL, which is an
    IEEE-754 double and round-trips a Python float bit for bit: nothing is rounded when
    written. Totals are summed in Python with ``math.fsum`` (not SQL ``SUM``), and dollars are
    rounded to the cent only when reported, with :func:`autoscaler.accounting.costs.usd_to_cents` —
    the cost ledger's rule, so the store and the ledger give the same figures.

Schema versions
    :data:`MIGRATIONS` lists the forward migrations in order, ``MIGRATIONS[n]`` taking a store
    from version ``n`` to ``n + 1``; :data:`SCHEMA_VERSION` is their count. A new store is
    built by applying all of them, and :meth:`Store.open` applies those a store lacks, in one
    transaction. A migration, once released, is never edited: a change is a new migration.
    (One that rebuilds a table must run with foreign keys off, which SQLite allows only
    outside a transaction; none does yet.)

    * v1: ``meta`` (``schema_version``, ``cluster_id``), ``jobs``, ``instances``,
      ``instance_history``, ``assignments``, ``plans``.
    * v2: what a cost-aware controller adds: ``reports`` (trainer reports), ``models``
      (goodput fits per job and GPU type), ``price_history``, ``cost_records``. Reports are
      not all kept: once the controller has read them into its profiles, a job's older
      reports beyond a bounded history are deleted (:meth:`Store.prune_reports`).
    * v3: ``assignment_history`` (who held which instance's GPUs when).
    * v4: ``jobs.reason`` (why a job was refused or failed) and ``job_batches`` (each job's
      planned batch, what the API answers its trainer).
    * v5: an index of the jobs in submission order (a page of the job list reads only its
      rows).
    * v6: ``events``, the cluster's story (:mod:`autoscaler.controller.events`): launches,
      notices, rescales, completions, ... one row each, in order.
    * v7: ``jobs.deadline_s``, a job's deadline (the clock's time; ``NULL``: none), resolved
      once at submission from the spec's ``deadline`` (a duration or a time).

Opening
    :meth:`Store.open` touches nothing but the file (and SQLite's ``-wal``/``-shm`` files
    beside it); it never creates one. It refuses, with :class:`StoreCorruptError` naming the
    path, a file that is not an SQLite database, fails ``PRAGMA integrity_check`` or the
    foreign-key check, lacks the ``meta`` table, has a schema version newer than this code
    knows, or whose tables differ from what its version's migrations create.

The clock is injected: every stored time (``*_at_s``) is the clock's ``now_s()``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, TypeVar

from autoscaler.controller.errors import (
    DuplicateRowError,
    StaleVersionError,
    StoreCorruptError,
    StoreError,
    StoreExistsError,
    StoreMissingError,
    StoreUnwritableError,
    UnknownRowError,
)
from autoscaler.controller.lifecycle import InstanceStatus, StatusChange, check_transition
from autoscaler.controller.records import InstanceRow, JobBatch, JobRow, JobStatus, ReportRow
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import Clock
from providers.base import Market
from providers.errors import InvalidRequestError
from providers.tags import validate_id

__all__ = [
    "BUSY_TIMEOUT_S",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AssignmentRow",
    "AssignmentSpan",
    "CostRecordRow",
    "EventRow",
    "InstanceRow",
    "JobBatch",
    "JobRow",
    "JobStatus",
    "Migration",
    "ModelRow",
    "PlanRow",
    "PricePoint",
    "ReportRow",
    "Store",
    "apply_migrations",
    "schema_of",
]

BUSY_TIMEOUT_S: Final = 5.0
"""How long a write waits for another connection's write lock before it fails (StoreError)."""

_WRITERS: dict[Path, threading.RLock] = {}
_WRITERS_LOCK = threading.Lock()


def _writer_lock(path: Path) -> threading.RLock:
    """The in-process lock every :class:`Store` of one file takes around its write
    transactions: threads of one process (the API's, the rounds') queue for it instead of
    spinning in SQLite's busy handler, whose sleeps starve some writers past
    ``BUSY_TIMEOUT_S`` under load. Other processes still meet SQLite's own lock."""
    key = path.resolve()
    with _WRITERS_LOCK:
        lock = _WRITERS.get(key)
        if lock is None:
            lock = _WRITERS[key] = threading.RLock()
        return lock


# ---- schema --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Migration:
    """One schema step: the statements that take a store to ``version`` from the one before.
    They run inside the caller's transaction (DDL is transactional in SQLite)."""

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
)

SCHEMA_VERSION: Final = len(MIGRATIONS)


def apply_migrations(conn: sqlite3.Connection, from_version: int, to_version: int) -> None:
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
def _reference_schema(version: int) -> tuple[tuple[str, str, str, str], ...]:
    """The schema that the first ``version`` migrations create (built in memory)."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.execute("BEGIN")
        apply_migrations(conn, 0, version)
        conn.execute("COMMIT")
        return schema_of(conn)
    finally:
        conn.close()


# ---- rows ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventRow:
    """One event of the cluster's story (:mod:`autoscaler.controller.events`): at ``at_s``
    (Unix time), of ``kind``, about ``subject`` (a job or an instance), said in ``message``
    (one line, at most :data:`MAX_EVENT_CHARS` characters). ``seq`` orders events."""

    seq: int
    at_s: float
    kind: str
    subject: str
    message: str


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


@dataclass(frozen=True)
class PlanRow:
    """The plan of one round (a JSON object)."""

    round_id: int
    at_s: float
    plan_json: str


@dataclass(frozen=True)
class ModelRow:
    """The latest goodput fit of one job on one GPU type (parameters as a JSON object)."""

    job_name: str
    gpu_type: str
    params_json: str
    fitted_at_s: float


@dataclass(frozen=True)
class PricePoint:
    """The price of an offering from ``at_s`` on."""

    offering_key: str
    at_s: float
    price_usd_per_hour: float
    market: Market


@dataclass(frozen=True)
class CostRecordRow:
    """What instance ``instance_key`` cost from ``start_s`` to ``end_s``: ``usd`` at
    ``price_usd_per_hour`` (unrounded)."""

    record_id: int
    instance_key: str
    start_s: float
    end_s: float
    price_usd_per_hour: float
    usd: float


_INSTANCE_COLUMNS: Final = (
    "instance_key, request_id, offering_key, provider, instance_type, zone, market, gpu_type, "
    "gpus, price_usd_per_hour, provider_instance_id, status, request_tries, last_heartbeat_s, "
    "created_at_s, updated_at_s, version"
)
_JOB_COLUMNS: Final = (
    "name, spec_json, status, retries, submitted_at_s, updated_at_s, version, reason, deadline_s"
)
_BATCH_COLUMNS: Final = "job_name, global_batch_size, local_batch_size, accum_steps, gpus, at_s"
MAX_EVENT_CHARS: Final = 500
"""An event's ``message`` is cut to this many characters (and to its first line)."""
MAX_EVENTS_READ: Final = 10_000
"""The most events one :meth:`Store.events_after` call returns."""
MAX_REASON_CHARS: Final = 500
"""A job's ``reason`` is cut to this many characters."""
_INSTANCE_FIELDS: Final = frozenset({"provider_instance_id", "last_heartbeat_s"})
"""Instance fields a caller may change besides the status (transition or not)."""
_JOB_FIELDS: Final = frozenset({"spec_json", "status", "retries", "reason"})


def _instance_row(r: sqlite3.Row) -> InstanceRow:
    return InstanceRow(
        instance_key=r["instance_key"],
        request_id=r["request_id"],
        offering_key=r["offering_key"],
        provider=r["provider"],
        instance_type=r["instance_type"],
        zone=r["zone"],
        market=Market(r["market"]),
        gpu_type=r["gpu_type"],
        gpus=r["gpus"],
        price_usd_per_hour=r["price_usd_per_hour"],
        provider_instance_id=r["provider_instance_id"],
        status=InstanceStatus(r["status"]),
        request_tries=r["request_tries"],
        last_heartbeat_s=r["last_heartbeat_s"],
        created_at_s=r["created_at_s"],
        updated_at_s=r["updated_at_s"],
        version=r["version"],
    )


_JOB_STATUSES: Final = {s.value: s for s in JobStatus}


def _job_row(r: sqlite3.Row) -> JobRow:
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


# ---- validation ----------------------------------------------------------------------------

_E = TypeVar("_E", bound=StrEnum)


def _text(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{field} must be a non-empty string, got {value!r}", field=field)
    return value


def _json_object(value: object, field: str) -> str:
    text = _text(value, field)
    try:
        parsed = json.loads(text)
    except ValueError as e:
        raise InvalidInputError(f"{field} is not JSON: {e}", field=field) from e
    if not isinstance(parsed, dict):
        raise InvalidInputError(f"{field} must be a JSON object", field=field)
    return text


def _number(value: object, field: str, *, minimum: float | None = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInputError(f"{field} must be a finite number, got {value!r}", field=field)
    if minimum is not None and value < minimum:
        raise InvalidInputError(f"{field} must be >= {minimum}, got {value!r}", field=field)
    return float(value)


def _count(value: object, field: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInputError(
            f"{field} must be an integer >= {minimum}, got {value!r}", field=field
        )
    return value


def _version(value: object) -> int:
    return _count(value, "expected_version", minimum=1)


def _enum(kind: type[_E], value: object, field: str) -> _E:
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    known = ", ".join(m.value for m in kind)
    raise InvalidInputError(f"{field} must be one of {known}; got {value!r}", field=field)


def _request_id(value: object) -> str:
    try:
        return validate_id(_text(value, "request_id"), field="request_id")
    except InvalidRequestError as e:
        raise InvalidInputError(str(e), field="request_id") from e


def _is_unwritable(e: sqlite3.Error) -> bool:
    """A read-only database or file system, or a full disk."""
    code = getattr(e, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_FULL)


def _wal_path(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _is_corruption(e: sqlite3.Error) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


# ---- the store -----------------------------------------------------------------------------


class Store:
    """The controller's SQLite store (see the module docstring). Build it with
    :meth:`create` or :meth:`open`; close it with :meth:`close` or a ``with`` block. One
    object per thread (SQLite connections are not shared across threads); several objects,
    in one process or several, may use one file: their writes are serialized and each
    versioned change is checked against the version it was decided on."""

    def __init__(
        self, conn: sqlite3.Connection, path: Path, clock: Clock, cluster_id: str, version: int
    ) -> None:
        """Use :meth:`create` or :meth:`open`."""
        self._conn: sqlite3.Connection | None = conn
        self._path = path
        self._clock = clock
        self._cluster_id = cluster_id
        self._schema_version = version
        self._identity = _file_identity(path)
        self._wal_identity = _file_identity(_wal_path(path))
        self._writer = _writer_lock(path)
        self._read_only = False  # opened with open_read_only: no write is tried

    def ensure_present(self) -> None:
        """Raise :class:`StoreMissingError` if the file this store opened, or its
        write-ahead log (``-wal``), was deleted or replaced since (an open SQLite handle would
        go on writing to the unlinked file, and everything written would be lost). The
        controller checks it before every round, so it never acts on a store that no longer
        exists."""
        if _file_identity(self._path) != self._identity:
            raise StoreMissingError(
                f"the store at {self._path} was deleted or replaced while in use",
                path=str(self._path),
            )
        wal = _wal_path(self._path)
        if (
            self._conn is not None  # a closed store's log is SQLite's to delete
            and self._wal_identity is not None
            and _file_identity(wal) != self._wal_identity
        ):
            raise StoreMissingError(
                f"the store's write-ahead log {wal} was deleted or replaced while in use (what "
                "it held since the last checkpoint is lost to every new reader)",
                path=str(self._path),
            )

    def check_writable(self) -> None:
        """Raise :class:`StoreUnwritableError` if the store cannot be written now (a
        read-only file or file system, a full disk): a write is tried, then rolled back, so
        nothing changes. An SQLite file that cannot be written still opens (read-only)."""
        conn = self._live()
        with self._writer:
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE meta SET value = value WHERE key = 'cluster_id'")
            except sqlite3.Error as e:
                raise self._fail(e, "check that it can be written") from e
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")

    # ---- opening ---------------------------------------------------------------------------

    @classmethod
    def create(cls, path: str | Path, cluster_id: str, clock: Clock) -> Store:
        """Create a new store at ``path`` for ``cluster_id``, readable by its owner only
        (0600: it holds job specs and commands; missing parent folders are made). Refuses
        with :class:`StoreExistsError` if anything exists at ``path``; a failure part-way
        removes the file it created."""
        cluster_id = _text(cluster_id, "cluster_id")
        try:
            validate_id(cluster_id, field="cluster_id")
        except InvalidRequestError as e:
            raise InvalidInputError(str(e), field="cluster_id") from e
        p = Path(path)
        if os.path.lexists(p):
            raise StoreExistsError(f"{p}: a file already exists there", path=str(p))
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # jobs, commands
        except FileExistsError as e:
            raise StoreExistsError(f"{p}: a file already exists there", path=str(p)) from e
        except OSError as e:
            raise StoreError(f"{p}: cannot create the store: {e}", path=str(p)) from e
        os.close(fd)
        conn: sqlite3.Connection | None = None
        try:
            conn = _connect(p)
            _configure(conn, p)
            conn.execute("BEGIN IMMEDIATE")
            apply_migrations(conn, 0, SCHEMA_VERSION)
            conn.execute("INSERT INTO meta (key, value) VALUES ('cluster_id', ?)", (cluster_id,))
            conn.execute("COMMIT")
        except BaseException as e:
            if conn is not None:
                conn.close()
            for leftover in (p, p.with_name(p.name + "-wal"), p.with_name(p.name + "-shm")):
                leftover.unlink(missing_ok=True)
            if isinstance(e, sqlite3.Error):
                raise StoreError(f"{p}: cannot create the store: {e}", path=str(p)) from e
            raise
        return cls(conn, p, clock, cluster_id, SCHEMA_VERSION)

    @classmethod
    def open(cls, path: str | Path, clock: Clock) -> Store:
        """Open the existing store at ``path``, migrating it forward to
        :data:`SCHEMA_VERSION` in one transaction if it is older.

        :class:`StoreMissingError` if nothing is there (nothing is created);
        :class:`StoreCorruptError`, naming the path, for a file that is not a store this code
        can use (see the module docstring). Either way the file is left as it was.
        """
        p = Path(path)
        if not os.path.lexists(p):
            raise StoreMissingError(f"no store at {p}", path=str(p))
        if not p.is_file():
            raise StoreCorruptError(f"{p} is not a regular file, so not a store", path=str(p))
        conn = _connect(p)
        try:
            version, cluster_id = _validate(conn, p)
            _configure(conn, p)
            if version < SCHEMA_VERSION:
                version = _migrate(conn, p)
        except sqlite3.Error as e:
            conn.close()
            if _is_corruption(e):
                raise StoreCorruptError(f"{p}: the database is damaged: {e}", path=str(p)) from e
            if _is_unwritable(e):
                raise StoreUnwritableError(f"{p}: cannot write the store: {e}", path=str(p)) from e
            raise StoreError(f"{p}: cannot open the store: {e}", path=str(p)) from e
        except BaseException:
            conn.close()
            raise
        return cls(conn, p, clock, cluster_id, version)

    @classmethod
    def open_read_only(cls, path: str | Path, clock: Clock) -> Store:
        """Open the existing store at ``path`` to read it only (the read commands: ``events``,
        ``logs``, ``cost report``), whether or not a controller runs on it, also where its
        folder or file may not be written: nothing is created, migrated or changed, and
        every write raises :class:`StoreUnwritableError`.

        SQLite's read-only mode still needs the write-ahead log's index (``-shm``) beside
        the file; where it is missing and cannot be made (a read-only folder), and no
        write-ahead log holds anything (a cluster that is not up), the file itself is read
        as it is (SQLite's ``immutable``). The same refusals as :meth:`open`, and
        :class:`StoreError` for a store of an older schema version (``coadapt up`` migrates
        it; a read does not) or whose write-ahead log cannot be read."""
        p = Path(path)
        if not os.path.lexists(p):
            raise StoreMissingError(f"no store at {p}", path=str(p))
        if not p.is_file():
            raise StoreCorruptError(f"{p} is not a regular file, so not a store", path=str(p))
        conn = _connect(p, "ro")
        try:
            try:
                version, cluster_id = _validate(conn, p)
            except sqlite3.OperationalError as e:
                code = getattr(e, "sqlite_errorcode", 0) & 0xFF
                if code not in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
                    raise
                wal = _wal_path(p)
                if wal.exists() and wal.stat().st_size > 0:
                    raise StoreError(
                        f"{p}: cannot read the store's write-ahead log {wal} ({e}); read it "
                        "as a user who may write its folder, or once coadapt up has stopped",
                        path=str(p),
                    ) from e
                conn.close()
                conn = _connect(p, "ro&immutable=1")
                version, cluster_id = _validate(conn, p)
            conn.execute("PRAGMA query_only=ON")
        except sqlite3.Error as e:
            conn.close()
            if _is_corruption(e):
                raise StoreCorruptError(f"{p}: the database is damaged: {e}", path=str(p)) from e
            raise StoreError(f"{p}: cannot read the store: {e}", path=str(p)) from e
        except BaseException:
            conn.close()
            raise
        if version < SCHEMA_VERSION:
            conn.close()
            raise StoreError(
                f"{p}: the store is of schema version {version}, older than this coadapt's "
                f"{SCHEMA_VERSION}; coadapt up --state-dir {p.parent} brings it up to date "
                "(a read does not change it)",
                path=str(p),
            )
        store = cls(conn, p, clock, cluster_id, version)
        store._read_only = True
        return store

    def for_thread(self) -> Store:
        """A new store object on this store's file, for the calling thread (a store is bound to
        the thread that made it), with the same clock. The file was checked when this store
        was opened, so only its identity is checked again (:class:`StoreMissingError` if it
        was deleted or replaced since), not the integrity, schema and foreign-key checks of
        :meth:`open`, which read the whole file: a server that makes one store per request
        thread calls this, not :meth:`open`. Close it like any store. This store may be
        closed; it is not used."""
        self.ensure_present()
        conn = _connect(self._path)
        store = Store(conn, self._path, self._clock, self._cluster_id, self._schema_version)
        store._identity = self._identity  # the file checked when this store was opened
        try:
            store.ensure_present()  # replaced between the check above and the connect
            _configure(conn, self._path)
            # This connection's write-ahead log (SQLite deletes it when the last connection
            # closes and makes a new one for the next: it is never replaced under an open one)
            store._wal_identity = _file_identity(_wal_path(self._path))
        except sqlite3.Error as e:
            store.close()
            raise self._fail(e, "open the store for another thread") from e
        except BaseException:
            store.close()
            raise
        return store

    @property
    def path(self) -> Path:
        return self._path

    @property
    def cluster_id(self) -> str:
        """The cluster this store belongs to (fixed when it was created)."""
        return self._cluster_id

    @property
    def schema_version(self) -> int:
        return self._schema_version

    def close(self) -> None:
        """Close the file; later calls raise :class:`StoreError`. Closing twice is fine."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transactions ----------------------------------------------------------------------

    def _live(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self._path}: the store is closed", path=str(self._path))
        return self._conn

    def _fail(self, e: sqlite3.Error, doing: str) -> StoreError:
        kind = StoreCorruptError if _is_corruption(e) else StoreError
        if _is_unwritable(e):
            kind = StoreUnwritableError
        return kind(f"{self._path}: {doing}: {e}", path=str(self._path))

    @contextmanager
    def _write(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One write transaction: ``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any
        exception (which propagates; an ``sqlite3`` one as :class:`StoreError`)."""
        conn = self._live()
        if self._read_only:
            raise StoreUnwritableError(
                f"{self._path}: {doing}: the store was opened read-only", path=str(self._path)
            )
        with self._writer:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise self._fail(e, doing) from e
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as e:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise self._fail(e, doing) from e
                raise

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self._live().execute(sql, tuple(params)).fetchall()
        except sqlite3.Error as e:
            raise self._fail(e, "read") from e

    def _now(self) -> float:
        return _number(self._clock.now_s(), "clock.now_s()", minimum=None)

    # ---- the fleet's release ---------------------------------------------------------------

    def set_released(self, released: bool) -> None:
        """Mark the fleet released (``coadapt destroy``: the service terminates every instance
        and launches none, across restarts) or not (launching resumes)."""
        with self._write("mark the fleet released") as conn:
            if released:
                conn.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('released_at_s', ?)",
                    (repr(self._now()),),
                )
            else:
                conn.execute("DELETE FROM meta WHERE key IN ('released_at_s', 'release_listing')")

    def record_release_listing(self, instance_ids: Sequence[str], error: str | None) -> None:
        """What the cloud listed after the service's last release pass (``error``: the
        listing failed, so what is left is unknown)."""
        doc = json.dumps({"at_s": self._now(), "instances": sorted(instance_ids), "error": error})
        with self._write("record the release listing") as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('release_listing', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (doc,),
            )

    def release_listing(self) -> dict[str, Any] | None:
        """The last :meth:`record_release_listing` (``at_s``, ``instances``, ``error``)."""
        rows = self._read("SELECT value FROM meta WHERE key = 'release_listing'")
        return dict(json.loads(rows[0][0])) if rows else None

    def released_at_s(self) -> float | None:
        """When the fleet was released (:meth:`set_released`); ``None`` when it is not."""
        rows = self._read("SELECT value FROM meta WHERE key = 'released_at_s'")
        return float(rows[0][0]) if rows else None

    # ---- jobs ------------------------------------------------------------------------------

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
        name = _text(name, "name")
        spec_json = _json_object(spec_json, "spec_json")
        status = _enum(JobStatus, status, "status")
        now = self._now()
        deadline: float | None = None
        if deadline_at_s is not None:
            deadline = _number(deadline_at_s, "deadline_at_s", minimum=None)
        elif deadline_after_s is not None:
            deadline = now + _number(deadline_after_s, "deadline_after_s")
        with self._write("add a job") as conn:
            try:
                conn.execute(
                    "INSERT INTO jobs (name, spec_json, status, retries, submitted_at_s, "
                    "updated_at_s, version, deadline_s) VALUES (?, ?, ?, 0, ?, ?, 1, ?)",
                    (name, spec_json, status.value, now, now, deadline),
                )
            except sqlite3.IntegrityError as e:
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
            params = [_enum(JobStatus, s, "statuses").value for s in statuses]
            sql += f" WHERE status IN ({', '.join('?' * len(params))})"
        sql += " ORDER BY submitted_at_s, name"
        return tuple(_job_row(r) for r in self._read(sql, params))

    def list_jobs_page(self, after: tuple[float, str] | None, limit: int) -> tuple[JobRow, ...]:
        """At most ``limit`` jobs in submission order (``(submitted_at_s, name)``, the order
        of :meth:`list_jobs`), those after the job keyed ``after`` (``None``: from the
        first). A job's key never changes, so paging by the last key of each page sees every
        job that existed when it began exactly once."""
        limit = _count(limit, "limit", minimum=1)
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs"
        params: list[object] = []
        if after is not None:  # a row value: the submission index serves it (schema v5)
            at_s, name = after
            sql += " WHERE (submitted_at_s, name) > (?, ?)"
            params = [_number(at_s, "after", minimum=None), _text(name, "after")]
        sql += " ORDER BY submitted_at_s, name LIMIT ?"
        return tuple(_job_row(r) for r in self._read(sql, [*params, limit]))

    def update_job(self, name: str, expected_version: int, **changes: object) -> JobRow:
        """Change ``spec_json``, ``status``, ``retries`` and/or ``reason`` of job ``name``,
        written against ``expected_version``; returns the new row (version + 1). A ``reason``
        is kept on one line, cut to :data:`MAX_REASON_CHARS`.

        :class:`UnknownRowError`, :class:`StaleVersionError` (nothing changed), or
        :class:`InvalidInputError` for an unknown field or value.
        """
        expected_version = _version(expected_version)
        unknown = sorted(set(changes) - _JOB_FIELDS)
        if unknown or not changes:
            raise InvalidInputError(
                f"job fields that can change: {sorted(_JOB_FIELDS)}; got {sorted(changes)}",
                field=unknown[0] if unknown else "changes",
            )
        if "spec_json" in changes:
            changes["spec_json"] = _json_object(changes["spec_json"], "spec_json")
        if "status" in changes:
            changes["status"] = _enum(JobStatus, changes["status"], "status").value
        if "retries" in changes:
            changes["retries"] = _count(changes["retries"], "retries")
        if changes.get("reason") is not None:
            reason = " ".join(_text(changes["reason"], "reason").split())
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

    def _job(self, conn: sqlite3.Connection, name: str) -> JobRow:
        row = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise UnknownRowError("jobs", name)
        return _job_row(row)

    def _job_at(self, conn: sqlite3.Connection, name: str, expected_version: int) -> JobRow:
        job = self._job(conn, name)
        if job.version != expected_version:
            raise StaleVersionError("jobs", name, expected_version, job.version)
        return job

    # ---- instances -------------------------------------------------------------------------

    def add_instance(
        self,
        *,
        instance_key: str,
        request_id: str,
        offering_key: str,
        provider: str,
        instance_type: str,
        zone: str,
        market: Market | str,
        gpu_type: str,
        gpus: int,
        price_usd_per_hour: float,
        reason: str = "wanted by the plan",
    ) -> InstanceRow:
        """Add an instance row, ``queued`` at version 1, with its first history entry, in one
        transaction. :class:`DuplicateRowError` if the key or the request id is taken."""
        values = (
            _text(instance_key, "instance_key"),
            _request_id(request_id),
            _text(offering_key, "offering_key"),
            _text(provider, "provider"),
            _text(instance_type, "instance_type"),
            _text(zone, "zone"),
            _enum(Market, market, "market").value,
            _text(gpu_type, "gpu_type"),
            _count(gpus, "gpus"),
            _number(price_usd_per_hour, "price_usd_per_hour"),
        )
        reason = _text(reason, "reason")
        now = self._now()
        with self._write("add an instance") as conn:
            try:
                conn.execute(
                    "INSERT INTO instances (instance_key, request_id, offering_key, provider, "
                    "instance_type, zone, market, gpu_type, gpus, price_usd_per_hour, "
                    "provider_instance_id, status, request_tries, last_heartbeat_s, "
                    "created_at_s, updated_at_s, version) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, 0, NULL, ?, ?, 1)",
                    (*values, InstanceStatus.QUEUED.value, now, now),
                )
            except sqlite3.IntegrityError as e:
                raise DuplicateRowError(
                    "instances", instance_key, f"instance key or request id {request_id!r}"
                ) from e
            self._append_history(conn, instance_key, InstanceStatus.QUEUED, now, reason)
            return self._instance(conn, instance_key)

    def get_instance(self, instance_key: str) -> InstanceRow:
        """The instance row ``instance_key``; :class:`UnknownRowError` if there is none."""
        rows = self._read(
            f"SELECT {_INSTANCE_COLUMNS} FROM instances WHERE instance_key = ?", (instance_key,)
        )
        if not rows:
            raise UnknownRowError("instances", instance_key)
        return _instance_row(rows[0])

    def get_by_request_id(self, request_id: str) -> InstanceRow | None:
        """The row whose launch carries ``request_id``, or ``None`` (no row of ours does: an
        instance listed under it is not ours to keep)."""
        rows = self._read(
            f"SELECT {_INSTANCE_COLUMNS} FROM instances WHERE request_id = ?", (request_id,)
        )
        return _instance_row(rows[0]) if rows else None

    def list_instances(
        self, statuses: Iterable[InstanceStatus] | None = None
    ) -> tuple[InstanceRow, ...]:
        """Instance rows (those in ``statuses`` when given), by instance key."""
        sql = f"SELECT {_INSTANCE_COLUMNS} FROM instances"
        params: list[str] = []
        if statuses is not None:
            params = [_enum(InstanceStatus, s, "statuses").value for s in statuses]
            sql += f" WHERE status IN ({', '.join('?' * len(params))})"
        sql += " ORDER BY instance_key"
        return tuple(_instance_row(r) for r in self._read(sql, params))

    def terminal_request_ids(self, among: Iterable[str] | None = None) -> frozenset[str]:
        """Request ids of rows in a terminal status: an instance listed under one is a leak
        (of ``among`` only, when given: the ids the cloud lists, so that a round reads what
        it needs, not the whole history of the fleet)."""
        sql = "SELECT request_id FROM instances WHERE status = ?"
        if among is None:
            rows = self._read(sql, (InstanceStatus.TERMINATED.value,))
            return frozenset(r[0] for r in rows)
        out: set[str] = set()
        ids = sorted(set(among))
        for i in range(0, len(ids), 500):  # SQLite's bound on parameters
            chunk = ids[i : i + 500]
            marks = ", ".join("?" * len(chunk))
            rows = self._read(
                f"{sql} AND request_id IN ({marks})", (InstanceStatus.TERMINATED.value, *chunk)
            )
            out.update(r[0] for r in rows)
        return frozenset(out)

    def transition(
        self,
        instance_key: str,
        expected_version: int,
        to_status: InstanceStatus,
        *,
        reason: str,
        **field_changes: object,
    ) -> InstanceRow:
        """Move instance ``instance_key`` to ``to_status`` because of ``reason``, written
        against ``expected_version``; returns the new row (version + 1).

        In one transaction: the version is checked (:class:`StaleVersionError`, with the
        actual version), then the lifecycle edge (:class:`IllegalTransitionError`), then the
        row is updated with ``field_changes`` (``provider_instance_id``,
        ``last_heartbeat_s``) and ``(to_status, now, reason)`` is appended to its history. On
        ``requested -> queued`` the store counts the retry in ``request_tries``; a caller may
        restate that count (``request_tries=row.request_tries + 1``) but not set another.
        A refused transition changes nothing.
        """
        expected_version = _version(expected_version)
        to_status = _enum(InstanceStatus, to_status, "to_status")
        reason = _text(reason, "reason")
        restated_tries = field_changes.pop("request_tries", None)
        changes = _instance_changes(field_changes)
        now = self._now()
        with self._write("change an instance's status") as conn:
            old = self._instance_at(conn, instance_key, expected_version)
            check_transition(instance_key, old.status, to_status)
            tries = old.request_tries
            if old.status is InstanceStatus.REQUESTED and to_status is InstanceStatus.QUEUED:
                tries += 1
            if restated_tries is not None and restated_tries != tries:
                raise InvalidInputError(
                    f"instance {instance_key}: request_tries is kept by the store "
                    f"({tries} after this transition), not {restated_tries!r}",
                    field="request_tries",
                )
            provider_id, heartbeat = _merged(old, changes)
            self._check_owner(conn, old, provider_id)
            at = self._history_time(conn, instance_key, now)
            cursor = conn.execute(
                "UPDATE instances SET status = ?, provider_instance_id = ?, last_heartbeat_s = ?, "
                "request_tries = ?, updated_at_s = ?, version = version + 1 "
                "WHERE instance_key = ? AND version = ?",
                (
                    to_status.value,
                    provider_id,
                    heartbeat,
                    tries,
                    at,
                    instance_key,
                    expected_version,
                ),
            )
            self._check_updated(conn, cursor, "instances", instance_key, expected_version)
            self._append_history(conn, instance_key, to_status, at, reason)
            return self._instance(conn, instance_key)

    def update_instance_fields(
        self, instance_key: str, expected_version: int, **changes: object
    ) -> InstanceRow:
        """Change ``provider_instance_id`` and/or ``last_heartbeat_s`` of an instance row,
        written against ``expected_version`` (no status change, no history entry); returns
        the new row (version + 1). A recorded ``provider_instance_id`` never changes to
        another value. Errors as for :meth:`transition`."""
        expected_version = _version(expected_version)
        if not changes:
            raise InvalidInputError("nothing to change", field="changes")
        fields = _instance_changes(changes)
        now = self._now()
        with self._write("update an instance") as conn:
            old = self._instance_at(conn, instance_key, expected_version)
            provider_id, heartbeat = _merged(old, fields)
            self._check_owner(conn, old, provider_id)
            cursor = conn.execute(
                "UPDATE instances SET provider_instance_id = ?, last_heartbeat_s = ?, "
                "updated_at_s = ?, version = version + 1 WHERE instance_key = ? AND version = ?",
                (provider_id, heartbeat, now, instance_key, expected_version),
            )
            self._check_updated(conn, cursor, "instances", instance_key, expected_version)
            return self._instance(conn, instance_key)

    def record_heartbeat(self, instance_key: str, at_s: float) -> None:
        """The instance's agent was alive at ``at_s``: ``last_heartbeat_s`` becomes the later
        of its value and ``at_s``. Unversioned on purpose: a heartbeat (from the agent, any
        time) never conflicts with the loop's versioned writes, and it only moves forward.
        :class:`UnknownRowError` if no such row."""
        at_s = _number(at_s, "at_s", minimum=None)
        with self._write("record a heartbeat") as conn:
            cursor = conn.execute(
                "UPDATE instances SET last_heartbeat_s = max(coalesce(last_heartbeat_s, ?1), ?1) "
                "WHERE instance_key = ?2",
                (at_s, instance_key),
            )
            if cursor.rowcount != 1:
                raise UnknownRowError("instances", instance_key)

    def history(self, instance_key: str) -> tuple[StatusChange, ...]:
        """The status history of an instance row, oldest first (its first entry is
        ``queued``, its last the row's status); :class:`UnknownRowError` if no such row."""
        rows = self._read(
            "SELECT status, at_s, reason FROM instance_history WHERE instance_key = ? ORDER BY seq",
            (instance_key,),
        )
        if not rows:
            raise UnknownRowError("instances", instance_key)
        return tuple(StatusChange(InstanceStatus(r[0]), r[1], r[2]) for r in rows)

    def status_times(self, instance_key: str) -> tuple[float, float | None]:
        """``(since_s, started_s)`` of an instance row: when it entered its status (or last
        retried in it: its last history entry) and when it became ``running`` (``None``:
        never). :class:`UnknownRowError` if no such row."""
        rows = self._read(
            "SELECT (SELECT at_s FROM instance_history WHERE instance_key = ?1 "
            "ORDER BY seq DESC LIMIT 1), "
            "(SELECT at_s FROM instance_history WHERE instance_key = ?1 AND status = ?2 "
            "ORDER BY seq LIMIT 1)",
            (instance_key, InstanceStatus.RUNNING.value),
        )
        since, started = rows[0][0], rows[0][1]
        if since is None:
            raise UnknownRowError("instances", instance_key)
        return since, started

    def _instance(self, conn: sqlite3.Connection, key: str) -> InstanceRow:
        row = conn.execute(
            f"SELECT {_INSTANCE_COLUMNS} FROM instances WHERE instance_key = ?", (key,)
        ).fetchone()
        if row is None:
            raise UnknownRowError("instances", key)
        return _instance_row(row)

    def _instance_at(
        self, conn: sqlite3.Connection, key: str, expected_version: int
    ) -> InstanceRow:
        row = self._instance(conn, key)
        if row.version != expected_version:
            raise StaleVersionError("instances", key, expected_version, row.version)
        return row

    @staticmethod
    def _check_owner(conn: sqlite3.Connection, row: InstanceRow, provider_id: str | None) -> None:
        """No other row owns cloud instance ``provider_id`` (the UNIQUE index is the backstop;
        this names the other row)."""
        if provider_id is None or provider_id == row.provider_instance_id:
            return
        other = conn.execute(
            "SELECT instance_key FROM instances WHERE provider = ? AND provider_instance_id = ? "
            "AND instance_key != ?",
            (row.provider, provider_id, row.instance_key),
        ).fetchone()
        if other is not None:
            raise DuplicateRowError(
                "instances",
                row.instance_key,
                f"cloud instance {provider_id} already belongs to row {other[0]}",
            )

    def _history_time(self, conn: sqlite3.Connection, key: str, now: float) -> float:
        last = conn.execute(
            "SELECT max(at_s) FROM instance_history WHERE instance_key = ?", (key,)
        ).fetchone()[0]
        return now if last is None else max(now, last)

    @staticmethod
    def _append_history(
        conn: sqlite3.Connection, key: str, status: InstanceStatus, at_s: float, reason: str
    ) -> None:
        conn.execute(
            "INSERT INTO instance_history (instance_key, status, at_s, reason) VALUES (?, ?, ?, ?)",
            (key, status.value, at_s, reason),
        )

    @staticmethod
    def _check_updated(
        conn: sqlite3.Connection, cursor: sqlite3.Cursor, table: str, key: str, expected: int
    ) -> None:
        """The versioned UPDATE hit its row (it always does under the write lock taken before
        the read; this keeps the rule true even if that ever changes)."""
        if cursor.rowcount == 1:
            return
        column = "name" if table == "jobs" else "instance_key"
        row = conn.execute(f"SELECT version FROM {table} WHERE {column} = ?", (key,)).fetchone()
        if row is None:
            raise UnknownRowError(table, key)
        raise StaleVersionError(table, key, expected, row[0])

    # ---- assignments -----------------------------------------------------------------------

    def set_assignments(self, job_name: str, gpus_by_instance: Mapping[str, int]) -> None:
        """Make ``gpus_by_instance`` the whole of job ``job_name``'s assignments, atomically:
        pairs not in it are removed, new ones added (version 1), changed GPU counts updated
        (version + 1), unchanged ones left as they are. Zero counts mean "not assigned".
        :class:`UnknownRowError` for an unknown job or instance (nothing changed)."""
        wanted: dict[str, int] = {}
        for key, gpus in gpus_by_instance.items():
            count = _count(gpus, f"gpus on {key}")
            if count:
                wanted[_text(key, "instance_key")] = count
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
                conn.execute(  # the span that ends now
                    "UPDATE assignment_history SET to_s = ? "
                    "WHERE job_name = ? AND instance_key = ? AND to_s IS NULL",
                    (now, job_name, key),
                )
                if key in wanted:
                    conn.execute(
                        "INSERT INTO assignment_history "
                        "(job_name, instance_key, gpus, from_s, to_s) VALUES (?, ?, ?, ?, NULL)",
                        (job_name, key, wanted[key], now),
                    )

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
            conn.execute(
                "UPDATE assignment_history SET to_s = ? "
                "WHERE job_name = ? AND instance_key = ? AND to_s IS NULL",
                (now, job_name, instance_key),
            )
            conn.execute(
                "INSERT INTO assignment_history "
                "(job_name, instance_key, gpus, from_s, to_s) VALUES (?, ?, ?, ?, NULL)",
                (job_name, instance_key, row[0], now),
            )
        return True

    def assignment_history(self, job: str | None = None) -> tuple[AssignmentSpan, ...]:
        """Every span in which a job held GPUs of an instance (``to_s`` ``None``: still
        holds them), oldest first; of one job if ``job`` is given."""
        sql = "SELECT job_name, instance_key, gpus, from_s, to_s FROM assignment_history"
        params: tuple[str, ...] = ()
        if job is not None:
            sql += " WHERE job_name = ?"
            params = (job,)
        return tuple(AssignmentSpan(*r) for r in self._read(sql + " ORDER BY seq", params))

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
        names = list(dict.fromkeys(jobs))
        for i in range(0, len(names), 500):  # SQLite's bound on parameters
            chunk = names[i : i + 500]
            marks = ", ".join("?" * len(chunk))
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
            "global_batch_size": _count(global_batch_size, "global_batch_size", minimum=1),
            "local_batch_size": _count(local_batch_size, "local_batch_size", minimum=1),
            "accum_steps": _count(accum_steps, "accum_steps", minimum=1),
            "gpus": _count(gpus, "gpus", minimum=1),
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
        names = list(dict.fromkeys(jobs))
        for i in range(0, len(names), 500):  # SQLite's bound on parameters
            chunk = names[i : i + 500]
            marks = ", ".join("?" * len(chunk))
            rows = self._read(
                f"SELECT {_BATCH_COLUMNS} FROM job_batches WHERE job_name IN ({marks})", chunk
            )
            out.update((r[0], JobBatch(*r)) for r in rows)
        return dict(sorted(out.items()))

    def restart_counts(self, jobs: Iterable[str]) -> dict[str, int]:
        """How many times each job (of ``jobs``) was placed again after its first start: the
        instants its assignments changed to a new placement, less the first (a change opens
        its spans at one instant). Jobs never placed are left out."""
        return {name: restarts for name, (_, restarts) in self.usage(jobs, 0.0).items()}

    def usage(self, jobs: Iterable[str], now_s: float) -> dict[str, tuple[float, int]]:
        """Each job's (GPU-seconds it has held, restarts) from the assignment history, to
        ``now_s``: the attained service a policy weighs, and :meth:`restart_counts`. Jobs
        never placed are left out."""
        out: dict[str, tuple[float, int]] = {}
        names = list(dict.fromkeys(jobs))
        for i in range(0, len(names), 500):
            chunk = names[i : i + 500]
            marks = ", ".join("?" * len(chunk))
            rows = self._read(
                "SELECT job_name, total(gpus * (coalesce(to_s, ?) - from_s)), "
                "count(DISTINCT from_s) FROM assignment_history "
                f"WHERE job_name IN ({marks}) GROUP BY job_name",
                [now_s, *chunk],
            )
            out.update((r[0], (max(0.0, float(r[1])), max(0, int(r[2]) - 1))) for r in rows)
        return out

    def set_durable(self, durable: bool) -> None:
        """Whether each commit waits for the disk (``synchronous=FULL``, the default) or not
        (``OFF``: a crash of the machine may lose the last commits, never corrupt the file).
        Only for a store nobody needs after a power cut: the simulator's, thrown away at the
        end of its run."""
        self._live().execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")

    @staticmethod
    def _batch(conn: sqlite3.Connection, job_name: str) -> JobBatch | None:
        row = conn.execute(
            f"SELECT {_BATCH_COLUMNS} FROM job_batches WHERE job_name = ?", (job_name,)
        ).fetchone()
        return None if row is None else JobBatch(*row)

    # ---- plans -----------------------------------------------------------------------------

    def record_plan(self, plan_json: str) -> PlanRow:
        """Record a round's plan (a JSON object); its ``round_id`` is the next one."""
        plan_json = _json_object(plan_json, "plan_json")
        now = self._now()
        with self._write("record a plan") as conn:
            cursor = conn.execute(
                "INSERT INTO plans (at_s, plan_json) VALUES (?, ?)", (now, plan_json)
            )
            round_id = cursor.lastrowid
        if round_id is None:  # pragma: no cover - an INSERT into a rowid table always sets it
            raise StoreError(f"{self._path}: no round id for the plan", path=str(self._path))
        return PlanRow(round_id, now, plan_json)

    def latest_plan(self) -> PlanRow | None:
        """The last recorded plan, or ``None``."""
        rows = self._read(
            "SELECT round_id, at_s, plan_json FROM plans ORDER BY round_id DESC LIMIT 1"
        )
        return PlanRow(rows[0][0], rows[0][1], rows[0][2]) if rows else None

    # ---- v2: reports -----------------------------------------------------------------------

    def add_report(self, job_name: str, payload_json: str) -> ReportRow:
        """Append a trainer report (a JSON object) of a known job."""
        payload_json = _json_object(payload_json, "payload_json")
        now = self._now()
        with self._write("add a report") as conn:
            if conn.execute("SELECT 1 FROM jobs WHERE name = ?", (job_name,)).fetchone() is None:
                raise UnknownRowError("jobs", job_name)
            cursor = conn.execute(
                "INSERT INTO reports (job_name, at_s, payload_json) VALUES (?, ?, ?)",
                (job_name, now, payload_json),
            )
            report_id = cursor.lastrowid
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
            names = list(dict.fromkeys(jobs))
            out: dict[str, ReportRow] = {}
            for i in range(0, len(names), 500):  # SQLite's bound on parameters
                chunk = names[i : i + 500]
                marks = ", ".join("?" * len(chunk))
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
        cursor = _count(cursor, "cursor")
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
        through_id = _count(through_id, "through_id")
        keep_per_job = _count(keep_per_job, "keep_per_job", minimum=1)
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
            (job, _text(gpu_type, "gpu_type"), _json_object(params, "params_json"))
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

    def list_models(self, job_name: str | None = None) -> tuple[ModelRow, ...]:
        """Every fit (of one job when given), by job and GPU type."""
        sql = "SELECT job_name, gpu_type, params_json, fitted_at_s FROM models"
        params: tuple[str, ...] = ()
        if job_name is not None:
            sql += " WHERE job_name = ?"
            params = (job_name,)
        return tuple(ModelRow(*r) for r in self._read(sql + " ORDER BY job_name, gpu_type", params))

    # ---- v2: prices ------------------------------------------------------------------------

    def record_price(
        self,
        offering_key: str,
        price_usd_per_hour: float,
        market: Market | str,
        *,
        at_s: float | None = None,
    ) -> PricePoint:
        """Append a price of an offering, in effect from ``at_s`` (default: now; a price feed
        passes the time the price was published)."""
        point = PricePoint(
            _text(offering_key, "offering_key"),
            self._now() if at_s is None else _number(at_s, "at_s", minimum=None),
            _number(price_usd_per_hour, "price_usd_per_hour"),
            _enum(Market, market, "market"),
        )
        with self._write("record a price") as conn:
            conn.execute(
                "INSERT INTO price_history (offering_key, at_s, price_usd_per_hour, market) "
                "VALUES (?, ?, ?, ?)",
                (point.offering_key, point.at_s, point.price_usd_per_hour, point.market.value),
            )
        return point

    def price_at(self, offering_key: str, at_s: float) -> float | None:
        """The offering's price in effect at ``at_s``: the latest recorded at or before it
        (of two recorded for the same time, the later recorded). ``None`` before the first."""
        rows = self._read(
            "SELECT price_usd_per_hour FROM price_history WHERE offering_key = ? AND at_s <= ? "
            "ORDER BY at_s DESC, seq DESC LIMIT 1",
            (offering_key, at_s),
        )
        return rows[0][0] if rows else None

    def prices(self, offering_key: str) -> tuple[PricePoint, ...]:
        """An offering's price history, oldest first."""
        rows = self._read(
            "SELECT offering_key, at_s, price_usd_per_hour, market FROM price_history "
            "WHERE offering_key = ? ORDER BY at_s, seq",
            (offering_key,),
        )
        return tuple(PricePoint(r[0], r[1], r[2], Market(r[3])) for r in rows)

    # ---- v6: events ------------------------------------------------------------------------

    def add_events(self, events: Sequence[tuple[float, str, str, str]]) -> int:
        """Append ``(at_s, kind, subject, message)`` events in one transaction; returns the
        ``seq`` of the last (0 when none). ``kind`` and ``subject`` are non-empty text; each
        message is cut to its first line and :data:`MAX_EVENT_CHARS` characters."""
        rows = []
        for at_s, kind, subject, message in events:
            text = " ".join(str(message).split("\n", 1)[0].split())[:MAX_EVENT_CHARS]
            rows.append(
                (
                    _number(at_s, "at_s", minimum=None),
                    _text(kind, "kind"),
                    _text(subject, "subject"),
                    text,
                )
            )
        if not rows:
            return 0
        with self._write("add events") as conn:
            conn.executemany(
                "INSERT INTO events (at_s, kind, subject, message) VALUES (?, ?, ?, ?)", rows
            )
            last = conn.execute("SELECT max(seq) FROM events").fetchone()[0]
        return int(last)

    def events_after(self, cursor: int = 0, limit: int = MAX_EVENTS_READ) -> tuple[EventRow, ...]:
        """Events with ``seq`` greater than ``cursor`` (0: from the first), oldest first, at
        most ``limit`` (1..:data:`MAX_EVENTS_READ`)."""
        cursor = _count(cursor, "cursor")
        limit = min(_count(limit, "limit", minimum=1), MAX_EVENTS_READ)
        rows = self._read(
            "SELECT seq, at_s, kind, subject, message FROM events WHERE seq > ? "
            "ORDER BY seq LIMIT ?",
            (cursor, limit),
        )
        return tuple(EventRow(*r) for r in rows)

    def history_after(self, cursor: int) -> tuple[tuple[int, str, StatusChange], ...]:
        """Instance status changes recorded after history row ``cursor`` (0: all), oldest
        first, as ``(seq, instance_key, change)``."""
        cursor = _count(cursor, "cursor")
        rows = self._read(
            "SELECT seq, instance_key, status, at_s, reason FROM instance_history "
            "WHERE seq > ? ORDER BY seq",
            (cursor,),
        )
        return tuple((r[0], r[1], StatusChange(InstanceStatus(r[2]), r[3], r[4])) for r in rows)

    # ---- v2: cost records ------------------------------------------------------------------

    def add_cost_record(
        self,
        instance_key: str,
        start_s: float,
        end_s: float,
        price_usd_per_hour: float,
        usd: float | None = None,
    ) -> CostRecordRow:
        """Append what an instance cost over ``[start_s, end_s]``. ``usd`` defaults to
        ``price_usd_per_hour * (end_s - start_s) / 3600`` (per-second billing); a caller that
        bills otherwise (a minimum billed duration) passes its own. Nothing is rounded."""
        start = _number(start_s, "start_s", minimum=None)
        end = _number(end_s, "end_s", minimum=start)
        price = _number(price_usd_per_hour, "price_usd_per_hour")
        amount = price * (end - start) / 3600.0 if usd is None else _number(usd, "usd")
        with self._write("add a cost record") as conn:
            found = conn.execute(
                "SELECT 1 FROM instances WHERE instance_key = ?", (instance_key,)
            ).fetchone()
            if found is None:
                raise UnknownRowError("instances", instance_key)
            cursor = conn.execute(
                "INSERT INTO cost_records (instance_key, start_s, end_s, price_usd_per_hour, usd) "
                "VALUES (?, ?, ?, ?, ?)",
                (instance_key, start, end, price, amount),
            )
            record_id = cursor.lastrowid
        if record_id is None:  # pragma: no cover - an INSERT into a rowid table always sets it
            raise StoreError(f"{self._path}: no id for the cost record", path=str(self._path))
        return CostRecordRow(record_id, instance_key, start, end, price, amount)

    def cost_records(self, instance_key: str | None = None) -> tuple[CostRecordRow, ...]:
        """Cost records (of one instance when given), in the order they were added."""
        sql = (
            "SELECT record_id, instance_key, start_s, end_s, price_usd_per_hour, usd "
            "FROM cost_records"
        )
        params: tuple[str, ...] = ()
        if instance_key is not None:
            sql += " WHERE instance_key = ?"
            params = (instance_key,)
        return tuple(CostRecordRow(*r) for r in self._read(sql + " ORDER BY record_id", params))

    def total_cost_usd(self, instance_key: str | None = None) -> float:
        """The sum of the cost records (of one instance when given), unrounded (``fsum``)."""
        return math.fsum(r.usd for r in self.cost_records(instance_key))


# ---- opening helpers -----------------------------------------------------------------------


def _file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``, ``None`` if it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _connect(path: Path, mode: str = "rw") -> sqlite3.Connection:
    """A connection to the existing file ``path`` (``mode=rw``: SQLite never creates it;
    ``ro``: it never writes). Transactions are explicit (``isolation_level=None``: no
    implicit BEGIN)."""
    uri = path.resolve().as_uri() + "?mode=" + mode
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as e:
        raise StoreError(f"{path}: cannot open: {e}", path=str(path)) from e
    conn.row_factory = sqlite3.Row
    return conn


def _configure(conn: sqlite3.Connection, path: Path) -> None:
    """WAL, ``synchronous=FULL`` and foreign keys (see the module docstring)."""
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(f"{path}: cannot use WAL journaling (got {mode!r})", path=str(path))
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")


def _validate(conn: sqlite3.Connection, path: Path) -> tuple[int, str]:
    """Check that ``path`` holds a store this code can open, reading only; return its schema
    version and cluster id. Raises :class:`StoreCorruptError` naming what is wrong."""

    def corrupt(why: str) -> StoreCorruptError:
        return StoreCorruptError(f"{path}: {why}", path=str(path))

    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        problems = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError) and not _is_corruption(e):
            raise  # e.g. locked: not the file's fault
        raise corrupt(f"not an SQLite database, or a damaged one ({e})") from e
    if problems != ["ok"]:
        raise corrupt("fails its integrity check: " + "; ".join(problems[:5]))
    # SQLite writes the main file in whole pages; a cut in a page can pass the integrity check
    # when the lost bytes were zeros, so the size is checked too.
    size = path.stat().st_size
    if size % page_size:
        raise corrupt(f"truncated: {size} bytes is not a whole number of {page_size}-byte pages")
    if not tables:
        raise corrupt("an empty database, not a coadapt store")
    if "meta" not in tables:
        raise corrupt("not a coadapt store: it has no meta table")
    meta = {r[0]: r[1] for r in conn.execute("SELECT key, value FROM meta")}
    try:
        version = int(meta["schema_version"])
        cluster_id = str(meta["cluster_id"])
    except (KeyError, ValueError) as e:
        raise corrupt(f"its meta table lacks a valid schema_version or cluster_id ({e})") from e
    if version > SCHEMA_VERSION:
        raise corrupt(
            f"its schema version {version} is newer than this code knows ({SCHEMA_VERSION}): "
            "open it with a newer coadapt"
        )
    if version < 1:
        raise corrupt(f"its schema version {version} is not a version")
    _check_schema(conn, path, version)
    if conn.execute("PRAGMA foreign_key_check").fetchall():
        raise corrupt("rows refer to rows that do not exist (foreign key check)")
    return version, cluster_id


def _check_schema(conn: sqlite3.Connection, path: Path, version: int) -> None:
    """The file's tables and indexes are exactly those of its version's migrations."""
    have, want = set(schema_of(conn)), set(_reference_schema(version))
    if have != want:
        missing = sorted(f"{t} {n}" for t, n, _, _ in want - have)
        extra = sorted(f"{t} {n}" for t, n, _, _ in have - want)
        raise StoreCorruptError(
            f"{path}: its tables differ from schema version {version}: "
            f"missing or changed {missing or 'nothing'}, unexpected {extra or 'nothing'}",
            path=str(path),
        )


def _migrate(conn: sqlite3.Connection, path: Path) -> int:
    """Bring the store to :data:`SCHEMA_VERSION` in one transaction; returns it. Another
    process may have migrated it meanwhile: the version is read again under the lock."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0])
        if version < SCHEMA_VERSION:
            apply_migrations(conn, version, SCHEMA_VERSION)
            _check_schema(conn, path, SCHEMA_VERSION)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION


@dataclass(frozen=True)
class _FieldChanges:
    """Validated instance field changes; ``None``: unchanged."""

    provider_instance_id: str | None = None
    last_heartbeat_s: float | None = None


def _instance_changes(changes: Mapping[str, object]) -> _FieldChanges:
    """Validate instance field changes (``provider_instance_id``, ``last_heartbeat_s``)."""
    unknown = sorted(set(changes) - _INSTANCE_FIELDS)
    if unknown:
        hint = " (status changes go through transition)" if "status" in unknown else ""
        raise InvalidInputError(
            f"instance fields that can change: {sorted(_INSTANCE_FIELDS)}; got {unknown}{hint}",
            field=unknown[0],
        )
    provider_id = changes.get("provider_instance_id")
    heartbeat = changes.get("last_heartbeat_s")
    return _FieldChanges(
        None if provider_id is None else _text(provider_id, "provider_instance_id"),
        None if heartbeat is None else _number(heartbeat, "last_heartbeat_s", minimum=None),
    )


def _merged(old: InstanceRow, changes: _FieldChanges) -> tuple[str | None, float | None]:
    """The row's provider id and heartbeat after ``changes``; a recorded provider id never
    changes to another one (a row owns one cloud instance)."""
    provider_id = changes.provider_instance_id or old.provider_instance_id
    if old.provider_instance_id is not None and provider_id != old.provider_instance_id:
        raise InvalidInputError(
            f"instance {old.instance_key} already owns cloud instance "
            f"{old.provider_instance_id}, not {provider_id!r}",
            field="provider_instance_id",
        )
    heartbeat = changes.last_heartbeat_s
    return provider_id, old.last_heartbeat_s if heartbeat is None else heartbeat
