"""The PostgreSQL back end of the store: its URL, its connection (an adapter with the
sqlite3 connection's shape, so the tables run unchanged on it), its write transaction and the
checks that a database holds a store this code can use.

Write transactions
    ``BEGIN IMMEDIATE`` (what every write of the store begins with) becomes ``BEGIN`` (READ
    COMMITTED) followed by ``SELECT pg_advisory_xact_lock(WRITER_LOCK_KEY)``: one
    transaction-level advisory lock per database, taken before the first read of the
    transaction and released by its COMMIT or ROLLBACK. So, as with SQLite's write lock, one
    writer at a time across every process and machine on the database, and a read-check-write
    cannot interleave with another writer (under READ COMMITTED each statement after the lock
    sees every transaction committed before it). SERIALIZABLE with retries was not chosen: a
    transaction that fails to serialize must be decided again, and the store's writes are
    intents the controller acts on (the cloud is called after the COMMIT), so a write either
    commits as decided or fails with a typed error, never re-runs. Waiting for the lock is
    bounded like SQLite's busy timeout (``lock_timeout`` is
    :data:`~autoscaler.controller.store.connection.BUSY_TIMEOUT_S`): past it the write fails
    with :class:`StoreError`. A writer that stops between two statements of its transaction
    (a process frozen by SIGSTOP, a machine cut off) would hold the lock, and every other
    controller's writes, its lease included, would fail past that timeout: the server ends a
    session idle inside a transaction for :data:`STUCK_WRITER_S` (the store's transactions
    run a few statements back to back, never waiting on anything else), which rolls it back
    and frees the lock; the stopped writer finds its transaction failed when it wakes up.
    Reads outside a write run in autocommit, each statement its own
    snapshot, as SQLite's do. Optimistic versions are unchanged (the same SQL).

Durability
    Each connection sets ``synchronous_commit=on``: a COMMIT returns once the server's
    write-ahead log is flushed (the server's ``fsync`` must stay on). What SQLite's file
    checks (integrity, truncation, the ``-wal`` file's identity) give the embedded store, the
    PostgreSQL side leaves to the server (its WAL and checksums) and checks only what is
    ours: the ``meta`` row, the schema version, the tables, columns and indexes of that
    version, and, before every round (:meth:`StoreBase.ensure_present`), that the database
    still holds the same cluster's store.

Threads
    As on SQLite, one connection per store object and one store object per thread
    (:meth:`StoreBase.for_thread` opens a new connection); the in-process writer lock is keyed
    by the URL without its password. A connection broken between transactions (a restarted
    server) is opened again on its next use; one broken inside a transaction fails that
    transaction (:class:`StoreError`), which rolled back on the server.

Secrets
    A URL may carry a password; every message and error names the store by
    :func:`masked_url` (``postgresql://user:***@host:port/db``). libpq also reads
    ``PGPASSWORD`` and ``~/.pgpass``, so the URL need not carry one.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Final
from urllib.parse import urlsplit, urlunsplit

from autoscaler.controller.errors import (
    StoreCorruptError,
    StoreError,
    StoreExistsError,
    StoreMissingError,
)
from autoscaler.controller.store.connection import BUSY_TIMEOUT_S
from autoscaler.controller.store.dialect import PgError, PgIntegrityError, to_postgres
from autoscaler.controller.store.schema import SCHEMA_VERSION, apply_migrations, check_schema

__all__ = [
    "CONNECT_TIMEOUT_S",
    "EMPTY_DATABASE",
    "URL_SCHEMES",
    "WRITER_LOCK_KEY",
    "PgConnection",
    "create_database_store",
    "is_postgres_url",
    "masked_url",
    "url_without_password",
    "validate_database",
]

URL_SCHEMES: Final = ("postgresql", "postgres")
WRITER_LOCK_KEY: Final = 0x636F616461707401
"""The advisory lock every write transaction takes (``"coadapt"`` and 1 in hex; advisory
locks are per database, and a database holds one store)."""
CONNECT_TIMEOUT_S: Final = 10
STUCK_WRITER_S: Final = 2.0
"""A session idle inside a transaction this long is ended by the server, its locks released
(``idle_in_transaction_session_timeout``): see the module docstring's Write transactions."""
EMPTY_DATABASE: Final = "the database has no meta table"
"""Said by the :class:`StoreMissingError` of a database that exists but holds no store (one
can be built there), unlike one of a database that does not exist."""
_MISSING_DB: Final = "3D000"  # invalid_catalog_name: no such database


def is_postgres_url(location: object) -> bool:
    """Whether ``location`` (a path or a URL) names a PostgreSQL store."""
    return isinstance(location, str) and re.match(r"(postgresql|postgres)://", location) is not None


def masked_url(url: str) -> str:
    """``url`` with its password (if any) shown as ``***``: what messages may print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))


def url_without_password(url: str) -> str:
    """``url`` with its password (if any) removed: what a state folder may record (libpq
    then takes the password from ``PGPASSWORD`` or ``~/.pgpass``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    user = parts.netloc.rsplit("@", 1)[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}" if user else host))


def _wrap(e: Exception, url: str) -> PgError:
    import psycopg

    text = " ".join(str(e).replace(url, masked_url(url)).split())
    sqlstate = getattr(e, "sqlstate", None)
    if isinstance(e, psycopg.errors.IntegrityError):
        return PgIntegrityError(text, sqlstate)
    return PgError(text, sqlstate)


class _Row(tuple):  # type: ignore[type-arg]
    """A row read by position or by column name (like ``sqlite3.Row``)."""

    _index: ClassVar[dict[str, int]] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)


@functools.lru_cache(maxsize=256)
def _row_class(names: tuple[str, ...]) -> type[_Row]:
    return type("_Row", (_Row,), {"_index": {n: i for i, n in enumerate(names)}})


def _row_factory(cursor: Any) -> Any:
    description = cursor.description
    if description is None:
        return tuple
    return _row_class(tuple(d.name for d in description))


def _connect(url: str) -> Any:
    import psycopg

    try:
        raw = psycopg.connect(
            url, autocommit=True, row_factory=_row_factory, connect_timeout=CONNECT_TIMEOUT_S
        )
    except psycopg.Error as e:
        raise _wrap(e, url) from e
    try:
        raw.execute(f"SET lock_timeout = '{int(BUSY_TIMEOUT_S * 1000)}ms'")
        raw.execute("SET synchronous_commit = on")
        raw.execute(f"SET idle_in_transaction_session_timeout = '{int(STUCK_WRITER_S * 1000)}ms'")
        raw.execute("SET client_min_messages = warning")
    except psycopg.Error as e:
        raw.close()
        raise _wrap(e, url) from e
    return raw


class PgConnection:
    """A PostgreSQL connection with the shape the tables use
    (:class:`~autoscaler.controller.store.dialect.Connection`): SQLite SQL in, translated by
    :func:`~autoscaler.controller.store.dialect.to_postgres`; ``BEGIN IMMEDIATE`` is the write
    transaction of the module docstring; errors are :class:`PgError`."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._raw: Any = _connect(url)

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        if self._raw.closed:
            return False
        return bool(self._raw.info.transaction_status != TransactionStatus.IDLE)

    def _usable(self) -> Any:
        if (self._raw.closed or self._raw.broken) and not self.in_transaction:
            self._raw = _connect(self._url)
        return self._raw

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        import psycopg

        raw = self._usable()
        try:
            if sql == "BEGIN IMMEDIATE":
                raw.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                try:
                    return raw.execute("SELECT pg_advisory_xact_lock(%s)", (WRITER_LOCK_KEY,))
                except psycopg.Error:
                    raw.execute("ROLLBACK")  # no lock (a timeout): no transaction either
                    raise
            text, order = to_postgres(sql)
            params = tuple(parameters)
            if order is not None:
                params = tuple(params[i] for i in order)
            return raw.execute(text, params)
        except psycopg.Error as e:
            raise _wrap(e, self._url) from e

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any:
        import psycopg

        text, order = to_postgres(sql)
        rows = [tuple(p) if order is None else tuple(p[i] for i in order) for p in parameters]
        cursor = self._usable().cursor()
        try:
            cursor.executemany(text, rows)
        except psycopg.Error as e:
            raise _wrap(e, self._url) from e
        return cursor

    def close(self) -> None:
        self._raw.close()


def _has_meta(conn: PgConnection) -> bool:
    row = conn.execute("SELECT to_regclass('meta') IS NOT NULL").fetchone()
    return bool(row[0])


def open_connection(url: str) -> PgConnection:
    """A connection to the database of ``url``; :class:`StoreMissingError` if there is no
    such database, :class:`StoreError` if the server cannot be reached."""
    where = masked_url(url)
    try:
        return PgConnection(url)
    except PgError as e:
        if e.sqlstate == _MISSING_DB or re.search(r'database "[^"]*" does not exist', str(e)):
            raise StoreMissingError(f"no store at {where}: {e}", path=where) from e
        raise StoreError(f"{where}: cannot connect: {e}", path=where) from e


def validate_database(conn: PgConnection, url: str) -> tuple[int, str]:
    """Check that the database holds a store this code can open, reading only; its schema
    version and cluster id. :class:`StoreMissingError` for a database without a store
    (no ``meta`` table: nothing is created), :class:`StoreCorruptError` naming what is
    wrong."""
    where = masked_url(url)
    if not _has_meta(conn):
        raise StoreMissingError(f"no store at {where} ({EMPTY_DATABASE})", path=where)
    meta = {r[0]: r[1] for r in conn.execute("SELECT key, value FROM meta")}
    try:
        version = int(meta["schema_version"])
        cluster_id = str(meta["cluster_id"])
    except (KeyError, ValueError) as e:
        raise StoreCorruptError(
            f"{where}: its meta table lacks a valid schema_version or cluster_id ({e})",
            path=where,
        ) from e
    if version > SCHEMA_VERSION:
        raise StoreCorruptError(
            f"{where}: its schema version {version} is newer than this code knows "
            f"({SCHEMA_VERSION}): open it with a newer coadapt",
            path=where,
        )
    if version < 1:
        raise StoreCorruptError(
            f"{where}: its schema version {version} is not a version", path=where
        )
    check_schema(conn, where, version)
    return version, cluster_id


def create_database_store(conn: PgConnection, url: str, cluster_id: str) -> None:
    """Build the store in the database of ``conn`` (all migrations and the cluster id, one
    transaction under the writer lock). :class:`StoreExistsError` if it holds one already
    (it is left untouched)."""
    where = masked_url(url)
    conn.execute("BEGIN IMMEDIATE")
    try:
        if _has_meta(conn):
            raise StoreExistsError(f"{where}: the database already holds a store", path=where)
        apply_migrations(conn, 0, SCHEMA_VERSION)
        conn.execute("INSERT INTO meta (key, value) VALUES ('cluster_id', ?)", (cluster_id,))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
