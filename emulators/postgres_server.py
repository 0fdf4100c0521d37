"""A private PostgreSQL server for tests and benchmarks: started in a temporary folder on a free
port of ``127.0.0.1``, stopped (and its folder removed) by :meth:`PostgresServer.stop`.

It runs the machine's own PostgreSQL binaries (``pg_config --bindir``, e.g. Debian's
``postgresql`` package). PostgreSQL refuses to run as root, so as root the folder is given to
the ``postgres`` user and ``initdb``/``pg_ctl`` run through ``runuser -u postgres``; as anyone
else they run directly. Authentication is ``trust`` on the loopback only: a test server, never
a deployment. :func:`postgres_binaries` says why none can start (``None`` when one can)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Final

__all__ = ["PostgresServer", "postgres_binaries", "postgres_unavailable"]

START_TIMEOUT_S: Final = 60.0


def postgres_binaries() -> Path | None:
    """The folder of ``initdb``/``pg_ctl`` (``pg_config --bindir``), ``None`` if absent."""
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    try:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    bindir = Path(out.stdout.strip())
    return bindir if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file() else None


def postgres_unavailable() -> str | None:
    """Why no test server can start here (``None``: one can)."""
    if postgres_binaries() is None:
        return "PostgreSQL server binaries not found (no pg_config, or no initdb/pg_ctl beside it)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'coadapt[postgres]')"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One private server (see the module docstring); :meth:`start` it, :meth:`stop` it."""

    def __init__(self) -> None:
        bindir = postgres_binaries()
        if bindir is None:
            raise RuntimeError(postgres_unavailable() or "no PostgreSQL")
        self._bin = bindir
        self._dir = Path(tempfile.mkdtemp(prefix="coadapt-pg-"))
        self._as_root = os.geteuid() == 0
        self.port = _free_port()
        self.user = "postgres"

    def _run(self, *args: str) -> None:
        cmd = list(args)
        if self._as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=START_TIMEOUT_S)

    def start(self) -> PostgresServer:
        """initdb (about 2 s) and start the server; returns itself."""
        if self._as_root:
            shutil.chown(self._dir, "postgres", "postgres")
        data = self._dir / "data"
        self._run(str(self._bin / "initdb"), "-D", str(data), "-A", "trust", "-U", self.user)
        options = (
            f"-p {self.port} -k {self._dir} -c listen_addresses=127.0.0.1 "
            "-c max_connections=300 -c fsync=on"
        )
        self._run(
            str(self._bin / "pg_ctl"), "-D", str(data), "-o", options,
            "-l", str(self._dir / "log"), "-w", "-t", str(int(START_TIMEOUT_S)), "start",
        )  # fmt: skip
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new, empty database (from ``template0``); returns its URL."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name``, ending its connections first."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its folder."""
        data = self._dir / "data"
        if (data / "postmaster.pid").exists():
            try:
                self._run(str(self._bin / "pg_ctl"), "-D", str(data), "-w", "-m", "fast", "stop")
            except subprocess.SubprocessError:
                time.sleep(0.5)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
