"""Fixtures of the controller's tests: the store on both of its back ends.

``store_location`` is parametrised over ``sqlite`` (a file in the test's folder) and
``postgres`` (a fresh database of a real PostgreSQL server, :class:`emulators.postgres_server
.PostgresServer`, started once per session and stopped at its end). Where the server binaries
or psycopg are absent, the PostgreSQL half is skipped with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from emulators.postgres_server import PostgresServer, postgres_unavailable

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One private PostgreSQL server for the session (skips when none can start here)."""
    why = postgres_unavailable()
    if why is not None:
        pytest.skip(f"PostgreSQL back end not tested: {why}")
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a new, empty database (dropped after the test)."""
    url = postgres_server.create_database()
    yield url
    postgres_server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture(params=BACKENDS)
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a test's store goes: ``tmp_path / "store.db"``, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "store.db"
    url: str = request.getfixturevalue("postgres_url")
    return url
