"""What every table of the store stands on: the file, the connection, the transactions.

:class:`StoreBase` opens, creates and closes the file and gives the tables their write
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
        self, conn: sqlite3.Connection, path: Path, clock: Clock, cluster_id: str, version: int
    ) -> None:
        """Use :meth:`create` or :meth:`open`."""
        self._conn: sqlite3.Connection | None = conn
        self._path = path
        self._clock = clock
        self._cluster_id = cluster_id
        self._schema_version = version
        self._identity = file_identity(path)
        self._wal_identity = file_identity(wal_path(path))
        self._writer = writer_lock(path)
        self._read_only = False  # opened with open_read_only: no write is tried
        self._planned = False  # the meta row planned_at_s is known to exist

    def ensure_present(self) -> None:
        """Raise :class:`StoreMissingError` if the file this store opened, or its
        write-ahead log (``-wal``), was deleted or replaced since (an open SQLite handle would
        go on writing to the unlinked file, and everything written would be lost). The
        controller checks it before every round, so it never acts on a store that no longer
        exists."""
        if file_identity(self._path) != self._identity:
            raise StoreMissingError(
                f"the store at {self._path} was deleted or replaced while in use",
                path=str(self._path),
            )
        wal = wal_path(self._path)
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
    def create(cls, path: str | Path, cluster_id: str, clock: Clock) -> Self:
        """Create a new store at ``path`` for ``cluster_id``, readable by its owner only
        (0600: it holds job specs and commands; missing parent folders are made). Refuses
        with :class:`StoreExistsError` if anything exists at ``path``; a failure part-way
        removes the file it created."""
        cluster_id = valid_text(cluster_id, "cluster_id")
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
        """
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
        it; a read does not) or whose write-ahead log cannot be read."""
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
        closed; it is not used."""
        self.ensure_present()
        conn = connect(self._path)
        store = type(self)(conn, self._path, self._clock, self._cluster_id, self._schema_version)
        store._identity = self._identity  # the file checked when this store was opened
        try:
            store.ensure_present()  # replaced between the check above and the connect
            configure(conn, self._path)
            # This connection's write-ahead log (SQLite deletes it when the last connection
            # closes and makes a new one for the next: it is never replaced under an open one)
            store._wal_identity = file_identity(wal_path(self._path))
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transactions ----------------------------------------------------------------------

    def _live(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"{self._path}: the store is closed", path=str(self._path))
        return self._conn

    def _fail(self, e: sqlite3.Error, doing: str) -> StoreError:
        kind = StoreCorruptError if is_corruption(e) else StoreError
        if is_unwritable(e):
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
        return valid_number(self._clock.now_s(), "clock.now_s()", minimum=None)

    def set_durable(self, durable: bool) -> None:
        """Whether each commit waits for the disk (``synchronous=FULL``, the default) or not
        (``OFF``: a crash of the machine may lose the last commits, never corrupt the file).
        Only for a store nobody needs after a power cut: the simulator's, thrown away at the
        end of its run."""
        self._live().execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")

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
