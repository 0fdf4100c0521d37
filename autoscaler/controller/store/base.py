"""What every table of the store stands on: the file or database, the connection, the
transactions.

:class:`StoreBase` opens, creates and closes the store (an SQLite file, or a PostgreSQL
database named by a ``postgresql://`` URL: :mod:`.postgres`) and gives the tables their write
transaction (:meth:`StoreBase._write`), their reads and the clock; each table group is a
subclass of it in its own module, and :class:`~autoscaler.controller.store.Store` is all of
them together. No table is defined here.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from autoscaler.controller.errors import (
    FencedError,
    StaleVersionError,
    StoreCorruptError,
    StoreError,
    StoreExistsError,
    StoreMissingError,
    StoreUnwritableError,
    UnknownRowError,
)
from autoscaler.controller.store.connection import (
    configure,
    connect,
    file_identity,
    is_corruption,
    is_unwritable,
    validate_file,
    wal_path,
    writer_lock,
)
from autoscaler.controller.store.dialect import DB_ERRORS, Connection, Cursor
from autoscaler.controller.store.postgres import (
    create_database_store,
    is_postgres_url,
    masked_url,
    open_connection,
    validate_database,
)
from autoscaler.controller.store.schema import SCHEMA_VERSION, apply_migrations, migrate
from autoscaler.controller.store.validate import valid_number, valid_text
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import Clock
from providers.errors import InvalidRequestError
from providers.tags import validate_id

__all__ = ["IN_CHUNK", "StoreBase", "in_chunks"]

IN_CHUNK = 500
"""The most names one ``IN (...)`` of a read binds (SQLite's bound on parameters is 999 in
old builds)."""


def in_chunks(names: Iterable[str]) -> Iterator[tuple[list[str], str]]:
    """``names`` (duplicates dropped, in their order) in chunks of at most :data:`IN_CHUNK`,
    each with its placeholders (``"?, ?, ?"``) for an ``IN (...)`` of a read."""
    unique = list(dict.fromkeys(names))
    for i in range(0, len(unique), IN_CHUNK):
        chunk = unique[i : i + IN_CHUNK]
        yield chunk, ", ".join("?" * len(chunk))


class StoreBase:
    """The file and its transactions (see the package docstring); the tables subclass it."""

    def __init__(
        self,
        conn: Connection,
        path: Path | None,
        clock: Clock,
        cluster_id: str,
        version: int,
        url: str | None = None,
    ) -> None:
        """Use :meth:`create` or :meth:`open`: ``path`` for an SQLite store, ``url`` (and
        no path) for a PostgreSQL one."""
        self._conn: Connection | None = conn
        self._file = path
        self._url = url
        self._path: Path | str = path if path is not None else masked_url(url or "")
        self._clock = clock
        self._cluster_id = cluster_id
        self._schema_version = version
        if path is not None:
            self._identity = file_identity(path)
            self._wal_identity = file_identity(wal_path(path))
            self._writer = writer_lock(path)
        else:
            self._identity = self._wal_identity = None
            self._writer = writer_lock(str(self._path))
        self._read_only = False  # opened with open_read_only: no write is tried
        self._planned = False  # the meta row planned_at_s is known to exist
        self._fence: int | None = None  # the lease epoch every write must carry (fence())

    def ensure_present(self) -> None:
        """Raise :class:`StoreMissingError` if the file this store opened, or its
        write-ahead log (``-wal``), was deleted or replaced since (an open SQLite handle would
        go on writing to the unlinked file, and everything written would be lost). The
        controller checks it before every round, so it never acts on a store that no longer
        exists. A PostgreSQL store has no file: there the database must still hold this
        cluster's store (its ``meta`` row)."""
        if self._file is None:
            self._ensure_database()
            return
        if file_identity(self._file) != self._identity:
            raise StoreMissingError(
                f"the store at {self._path} was deleted or replaced while in use",
                path=str(self._path),
            )
        wal = wal_path(self._file)
        if (
            self._conn is not None  # a closed store's log is SQLite's to delete
            and self._wal_identity is not None
            and file_identity(wal) != self._wal_identity
        ):
            raise StoreMissingError(
                f"the store's write-ahead log {wal} was deleted or replaced while in use (what "
                "it held since the last checkpoint is lost to every new reader)",
                path=str(self._path),
            )

    def _ensure_database(self) -> None:
        if self._conn is None:
            return
        try:
            rows = (
                self._live().execute("SELECT value FROM meta WHERE key = 'cluster_id'").fetchall()
            )
        except DB_ERRORS as e:
            if getattr(e, "sqlstate", None) == "42P01":  # undefined_table: meta is gone
                rows = []
            else:
                raise self._fail(e, "check that the store is still there") from e
        if not rows or rows[0][0] != self._cluster_id:
            raise StoreMissingError(
                f"the store at {self._path} was deleted or replaced while in use",
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
            except DB_ERRORS as e:
                raise self._fail(e, "check that it can be written") from e
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")

    # ---- opening ---------------------------------------------------------------------------

    @classmethod
    def create(cls, path: str | Path, cluster_id: str, clock: Clock) -> Self:
        """Create a new store at ``path`` for ``cluster_id``, readable by its owner only
        (0600: it holds job specs and commands; missing parent folders are made). Refuses
        with :class:`StoreExistsError` if anything exists at ``path``; a failure part-way
        removes the file it created.

        ``path`` may be a ``postgresql://`` URL instead: the store is built in that
        (existing) database, in one transaction; :class:`StoreExistsError` if it holds one
        already, :class:`StoreMissingError` if there is no such database."""
        cluster_id = valid_text(cluster_id, "cluster_id")
        try:
            validate_id(cluster_id, field="cluster_id")
        except InvalidRequestError as e:
            raise InvalidInputError(str(e), field="cluster_id") from e
        if is_postgres_url(path):
            url = str(path)
            pg = open_connection(url)
            try:
                create_database_store(pg, url, cluster_id)
            except BaseException as e:
                pg.close()
                if isinstance(e, DB_ERRORS):
                    where = masked_url(url)
                    raise StoreError(f"{where}: cannot create the store: {e}", path=where) from e
                raise
            return cls(pg, None, clock, cluster_id, SCHEMA_VERSION, url=url)
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
            conn = connect(p)
            configure(conn, p)
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
    def open(cls, path: str | Path, clock: Clock) -> Self:
        """Open the existing store at ``path``, migrating it forward to
        :data:`SCHEMA_VERSION` in one transaction if it is older.

        :class:`StoreMissingError` if nothing is there (nothing is created);
        :class:`StoreCorruptError`, naming the path, for a file that is not a store this code
        can use (see the module docstring). Either way the file is left as it was.

        ``path`` may be a ``postgresql://`` URL instead: :class:`StoreMissingError` when the
        database does not exist or holds no store (nothing is created),
        :class:`StoreCorruptError` when its store is not one this code can use
        (:func:`~autoscaler.controller.store.postgres.validate_database`).
        """
        if is_postgres_url(path):
            return cls._open_database(str(path), clock, read_only=False)
        p = Path(path)
        if not os.path.lexists(p):
            raise StoreMissingError(f"no store at {p}", path=str(p))
        if not p.is_file():
            raise StoreCorruptError(f"{p} is not a regular file, so not a store", path=str(p))
        conn = connect(p)
        try:
            version, cluster_id = validate_file(conn, p)
            configure(conn, p)
            if version < SCHEMA_VERSION:
                version = migrate(conn, p)
        except sqlite3.Error as e:
            conn.close()
            if is_corruption(e):
                raise StoreCorruptError(f"{p}: the database is damaged: {e}", path=str(p)) from e
            if is_unwritable(e):
                raise StoreUnwritableError(f"{p}: cannot write the store: {e}", path=str(p)) from e
            raise StoreError(f"{p}: cannot open the store: {e}", path=str(p)) from e
        except BaseException:
            conn.close()
            raise
        return cls(conn, p, clock, cluster_id, version)

    @classmethod
    def _open_database(cls, url: str, clock: Clock, *, read_only: bool) -> Self:
        pg = open_connection(url)
        where = masked_url(url)
        try:
            if read_only:
                pg.execute("SET default_transaction_read_only = on")
            version, cluster_id = validate_database(pg, url)
            if version < SCHEMA_VERSION:
                if read_only:
                    raise StoreError(
                        f"{where}: the store is of schema version {version}, older than this "
                        f"coadapt's {SCHEMA_VERSION}; coadapt up --store brings it up to date "
                        "(a read does not change it)",
                        path=where,
                    )
                version = migrate(pg, where)
        except DB_ERRORS as e:
            pg.close()
            raise StoreError(f"{where}: cannot open the store: {e}", path=where) from e
        except BaseException:
            pg.close()
            raise
        store = cls(pg, None, clock, cluster_id, version, url=url)
        store._read_only = read_only
        return store

    @classmethod
    def open_read_only(cls, path: str | Path, clock: Clock) -> Self:
        """Open the existing store at ``path`` to read it only (the read commands: ``events``,
        ``logs``, ``cost report``), whether or not a controller runs on it, also where its
        folder or file may not be written: nothing is created, migrated or changed, and
        every write raises :class:`StoreUnwritableError`.

        SQLite's read-only mode still needs the write-ahead log's index (``-shm``) beside
        the file; where it is missing and cannot be made (a read-only folder), and no
        write-ahead log holds anything (a cluster that is not up), the file itself is read
        as it is (SQLite's ``immutable``). The same refusals as :meth:`open`, and
        :class:`StoreError` for a store of an older schema version (``coadapt up`` migrates
        it; a read does not) or whose write-ahead log cannot be read. A ``postgresql://``
        URL opens that database's store in read-only transactions."""
        if is_postgres_url(path):
            return cls._open_database(str(path), clock, read_only=True)
        p = Path(path)
        if not os.path.lexists(p):
            raise StoreMissingError(f"no store at {p}", path=str(p))
        if not p.is_file():
            raise StoreCorruptError(f"{p} is not a regular file, so not a store", path=str(p))
        conn = connect(p, "ro")
        try:
            try:
                version, cluster_id = validate_file(conn, p)
            except sqlite3.OperationalError as e:
                code = getattr(e, "sqlite_errorcode", 0) & 0xFF
                if code not in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
                    raise
                wal = wal_path(p)
                if wal.exists() and wal.stat().st_size > 0:
                    raise StoreError(
                        f"{p}: cannot read the store's write-ahead log {wal} ({e}); read it "
                        "as a user who may write its folder, or once coadapt up has stopped",
                        path=str(p),
                    ) from e
                conn.close()
                conn = connect(p, "ro&immutable=1")
                version, cluster_id = validate_file(conn, p)
            conn.execute("PRAGMA query_only=ON")
        except sqlite3.Error as e:
            conn.close()
            if is_corruption(e):
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

    def for_thread(self) -> Self:
        """A new store object on this store's file, for the calling thread (a store is bound to
        the thread that made it), with the same clock. The file was checked when this store
        was opened, so only its identity is checked again (:class:`StoreMissingError` if it
        was deleted or replaced since), not the integrity, schema and foreign-key checks of
        :meth:`open`, which read the whole file: a server that makes one store per request
        thread calls this, not :meth:`open`. Close it like any store. This store may be
        closed; it is not used. On PostgreSQL: a new connection to the same database."""
        if self._url is not None:
            pg = open_connection(self._url)
            store = type(self)(
                pg, None, self._clock, self._cluster_id, self._schema_version, url=self._url
            )
            store._read_only = self._read_only
            if self._read_only:
                pg.execute("SET default_transaction_read_only = on")
            return store
        file = self.path
        self.ensure_present()
        conn = connect(file)
        store = type(self)(conn, file, self._clock, self._cluster_id, self._schema_version)
        store._identity = self._identity  # the file checked when this store was opened
        try:
            store.ensure_present()  # replaced between the check above and the connect
            configure(conn, file)
            # This connection's write-ahead log (SQLite deletes it when the last connection
            # closes and makes a new one for the next: it is never replaced under an open one)
            store._wal_identity = file_identity(wal_path(file))
        except sqlite3.Error as e:
            store.close()
            raise self._fail(e, "open the store for another thread") from e
        except BaseException:
            store.close()
            raise
        return store

    @property
    def path(self) -> Path:
        """The store's SQLite file; a PostgreSQL store has none (:class:`StoreError`):
        :attr:`location` names either."""
        if self._file is None:
            raise StoreError(f"{self._path}: a PostgreSQL store has no file", path=self.location)
        return self._file

    @property
    def location(self) -> str:
        """Where the store is, for messages: its file, or its URL with the password masked."""
        return str(self._path)

    @property
    def is_postgres(self) -> bool:
        return self._url is not None

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transactions ----------------------------------------------------------------------

    def _live(self) -> Connection:
        if self._conn is None:
            raise StoreError(f"{self._path}: the store is closed", path=str(self._path))
        return self._conn

    def _fail(self, e: Exception, doing: str) -> StoreError:
        kind = StoreCorruptError if is_corruption(e) else StoreError
        if is_unwritable(e):
            kind = StoreUnwritableError
        return kind(f"{self._path}: {doing}: {e}", path=str(self._path))

    @contextmanager
    def _write(self, doing: str, *, fenced: bool = True) -> Iterator[Connection]:
        """One write transaction: ``BEGIN IMMEDIATE`` ... ``COMMIT`` (on PostgreSQL, BEGIN
        and the writer's advisory lock: :mod:`.postgres`), rolled back on any exception
        (which propagates; a database one as :class:`StoreError`).

        A store object fenced at an epoch (:meth:`~.lease_table.LeaseTable.fence`: the
        controller's rounds) first checks, under that lock, that the leader lease is still at
        that epoch: :class:`FencedError` otherwise, nothing written, and the lease row's
        ``refused_writes`` counts it. ``fenced=False``: the lease's own writes."""
        conn = self._live()
        if self._read_only:
            raise StoreUnwritableError(
                f"{self._path}: {doing}: the store was opened read-only", path=str(self._path)
            )
        with self._writer:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except DB_ERRORS as e:
                raise self._fail(e, doing) from e
            try:
                if fenced and self._fence is not None:
                    self._check_epoch(conn, self._fence)
                yield conn
                conn.execute("COMMIT")
            except BaseException as e:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except DB_ERRORS:
                        if not isinstance(e, DB_ERRORS):
                            raise
                if isinstance(e, FencedError):
                    self._count_refused(conn)
                if isinstance(e, DB_ERRORS):
                    raise self._fail(e, doing) from e
                raise

    @staticmethod
    def _check_epoch(conn: Connection, epoch: int) -> None:
        row = conn.execute("SELECT epoch, holder FROM leader_lease WHERE id = 1").fetchone()
        if row is None or int(row[0]) != epoch:
            raise FencedError(epoch, None if row is None else int(row[0]),
                              None if row is None else str(row[1]))  # fmt: skip

    @staticmethod
    def _count_refused(conn: Connection) -> None:
        """One more refused write on the lease row (its own transaction: the refused one
        rolled back). Best effort: a failure to count never hides the refusal."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE leader_lease SET refused_writes = refused_writes + 1")
            conn.execute("COMMIT")
        except DB_ERRORS:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        try:
            return list(self._live().execute(sql, tuple(params)).fetchall())
        except DB_ERRORS as e:
            raise self._fail(e, "read") from e

    def _now(self) -> float:
        return valid_number(self._clock.now_s(), "clock.now_s()", minimum=None)

    def set_durable(self, durable: bool) -> None:
        """Whether each commit waits for the disk (``synchronous=FULL``, the default) or not
        (``OFF``: a crash of the machine may lose the last commits, never corrupt the file).
        Only for a store nobody needs after a power cut: the simulator's, thrown away at the
        end of its run. On PostgreSQL: ``synchronous_commit`` on or off (a server crash may
        lose the last commits, never corrupt the database)."""
        if self._url is not None:
            self._live().execute(f"SET synchronous_commit = {'on' if durable else 'off'}")
            return
        self._live().execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")

    @staticmethod
    def _check_updated(
        conn: Connection, cursor: Cursor, table: str, key: str, expected: int
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
