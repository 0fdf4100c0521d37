"""Opening an SQLite file as a store: the connection, its pragmas, the checks that the file
is a store this code can use, and the in-process writer lock (see the package docstring for
the rules: WAL, ``synchronous=FULL``, foreign keys)."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Final

from autoscaler.controller.errors import StoreCorruptError, StoreError
from autoscaler.controller.store.dialect import PgError
from autoscaler.controller.store.schema import SCHEMA_VERSION, check_schema

__all__ = [
    "BUSY_TIMEOUT_S",
    "configure",
    "connect",
    "file_identity",
    "is_corruption",
    "is_unwritable",
    "validate_file",
    "wal_path",
    "writer_lock",
]

BUSY_TIMEOUT_S: Final = 5.0
"""How long a write waits for another connection's write lock before it fails (StoreError)."""

_WRITERS: dict[Path | str, threading.RLock] = {}
_WRITERS_LOCK = threading.Lock()


def writer_lock(path: Path | str) -> threading.RLock:
    """The in-process lock every :class:`Store` of one file takes around its write
    transactions: threads of one process (the API's, the rounds') queue for it instead of
    spinning in SQLite's busy handler, whose sleeps starve some writers past
    ``BUSY_TIMEOUT_S`` under load. Other processes still meet SQLite's own lock. A
    PostgreSQL store's key is its URL without the password (a ``str``); other processes meet
    its advisory lock."""
    key = path.resolve() if isinstance(path, Path) else path
    with _WRITERS_LOCK:
        lock = _WRITERS.get(key)
        if lock is None:
            lock = _WRITERS[key] = threading.RLock()
        return lock


def is_unwritable(e: BaseException) -> bool:
    """A read-only database or file system, or a full disk (on PostgreSQL: a read-only
    transaction, a full disk, or no right to write)."""
    if isinstance(e, PgError):
        return e.sqlstate in ("25006", "53100", "42501")
    code = getattr(e, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_FULL)


def wal_path(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def is_corruption(e: BaseException) -> bool:
    """A damaged database (on PostgreSQL: data or an index the server found corrupted)."""
    if isinstance(e, PgError):
        return e.sqlstate in ("XX001", "XX002")
    code = getattr(e, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def file_identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``, ``None`` if it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def connect(path: Path, mode: str = "rw") -> sqlite3.Connection:
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


def configure(conn: sqlite3.Connection, path: Path) -> None:
    """WAL, ``synchronous=FULL`` and foreign keys (see the module docstring)."""
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreError(f"{path}: cannot use WAL journaling (got {mode!r})", path=str(path))
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")


def validate_file(conn: sqlite3.Connection, path: Path) -> tuple[int, str]:
    """Check that ``path`` holds a store this code can open, reading only; return its schema
    version and cluster id. Raises :class:`StoreCorruptError` naming what is wrong."""

    def corrupt(why: str) -> StoreCorruptError:
        return StoreCorruptError(f"{path}: {why}", path=str(path))

    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        problems = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError) and not is_corruption(e):
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
    check_schema(conn, path, version)
    if conn.execute("PRAGMA foreign_key_check").fetchall():
        raise corrupt("rows refer to rows that do not exist (foreign key check)")
    return version, cluster_id
