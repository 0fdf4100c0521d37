"""The API's credentials on a shared store: one ``meta`` row (``api_credentials``) holding the
document :meth:`ApiCredentials.to_json <autoscaler.controller.credentials.ApiCredentials.
to_json>` writes, so that every controller process of the store checks the same tokens.

The store keeps the document as text and knows nothing of its content (the credentials module
parses and checks it). Only a shared (PostgreSQL) store holds the row: the embedded SQLite
store's controller keeps its credentials in ``<state>/tokens.json`` alone. The row needs no
schema change (``meta`` is a key-value table since v1).

The secrets are kept as they are, not as hashes: a controller must mint agent and report
credentials (an HMAC with the agent key), write the users' token into the ``tokens.json`` its
machine's CLI reads, and publish it where the deployer reads it (SSM, Secret Manager); a hash
serves none of these. Whoever reads this row can do what the database credential already lets
them do (rewrite any job or instance row), so the database credential stays the secret that
opens the store, and it is kept where only the controllers read it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from autoscaler.controller.store.base import StoreBase
from autoscaler.errors import InvalidInputError

__all__ = ["API_CREDENTIALS_KEY", "CredentialMeta"]

API_CREDENTIALS_KEY: Final = "api_credentials"
MAX_CREDENTIALS_DOC_CHARS: Final = 64 * 1024


class CredentialMeta(StoreBase):
    """The ``api_credentials`` row of ``meta`` (see the module docstring)."""

    def api_credentials_doc(self) -> str | None:
        """The credentials document the store holds; ``None`` before any controller made it."""
        rows = self._read("SELECT value FROM meta WHERE key = ?", (API_CREDENTIALS_KEY,))
        return str(rows[0][0]) if rows else None

    def create_api_credentials_doc(self, doc: str) -> str:
        """Store ``doc`` unless the store holds one already (the first controller of a store
        wins, in one write transaction); returns the document the store holds after it."""
        _check_doc(doc)
        with self._write("store the API credentials", fenced=False) as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (API_CREDENTIALS_KEY, doc),
            )
            row = conn.execute(
                "SELECT value FROM meta WHERE key = ?", (API_CREDENTIALS_KEY,)
            ).fetchone()
        return str(row[0])

    def update_api_credentials_doc(self, change: Callable[[str | None], str]) -> str:
        """Replace the credentials document with ``change(the one held)`` (``None``: none yet)
        in one write transaction, so two rotations on two machines cannot lose one; returns
        the new document. An exception of ``change`` writes nothing and propagates."""
        with self._write("rotate the API credentials", fenced=False) as conn:
            row = conn.execute(
                "SELECT value FROM meta WHERE key = ?", (API_CREDENTIALS_KEY,)
            ).fetchone()
            doc = change(None if row is None else str(row[0]))
            _check_doc(doc)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (API_CREDENTIALS_KEY, doc),
            )
        return doc


def _check_doc(doc: object) -> None:
    if not isinstance(doc, str) or not 0 < len(doc) <= MAX_CREDENTIALS_DOC_CHARS:
        raise InvalidInputError(
            f"a credentials document is 1-{MAX_CREDENTIALS_DOC_CHARS} characters", field="doc"
        )
