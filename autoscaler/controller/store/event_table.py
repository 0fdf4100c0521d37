"""The cluster's story (``events``, v6): one row per event that matters, in order
(:mod:`autoscaler.controller.events` decides what they are)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from autoscaler.controller.store.base import StoreBase
from autoscaler.controller.store.validate import valid_count, valid_number, valid_text

__all__ = ["MAX_EVENTS_READ", "MAX_EVENT_CHARS", "EventRow", "EventTable"]

MAX_EVENT_CHARS: Final = 500
"""An event's ``message`` is cut to this many characters (and to its first line)."""
MAX_EVENTS_READ: Final = 10_000
"""The most events one :meth:`EventTable.events_after` call returns."""


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


class EventTable(StoreBase):
    """The cluster's events."""

    def add_events(self, events: Sequence[tuple[float, str, str, str]]) -> int:
        """Append ``(at_s, kind, subject, message)`` events in one transaction; returns the
        ``seq`` of the last (0 when none). ``kind`` and ``subject`` are non-empty text; each
        message is cut to its first line and :data:`MAX_EVENT_CHARS` characters."""
        rows = []
        for at_s, kind, subject, message in events:
            text = " ".join(str(message).split("\n", 1)[0].split())[:MAX_EVENT_CHARS]
            rows.append(
                (
                    valid_number(at_s, "at_s", minimum=None),
                    valid_text(kind, "kind"),
                    valid_text(subject, "subject"),
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

    def events_about(self, subject: str, limit: int = MAX_EVENTS_READ) -> tuple[EventRow, ...]:
        """The last ``limit`` (1..:data:`MAX_EVENTS_READ`) events about ``subject`` (a job or
        an instance), oldest first."""
        subject = valid_text(subject, "subject")
        limit = min(valid_count(limit, "limit", minimum=1), MAX_EVENTS_READ)
        rows = self._read(
            "SELECT seq, at_s, kind, subject, message FROM events WHERE subject = ? "
            "ORDER BY seq DESC LIMIT ?",
            (subject, limit),
        )
        return tuple(EventRow(*r) for r in reversed(rows))

    def events_after(self, cursor: int = 0, limit: int = MAX_EVENTS_READ) -> tuple[EventRow, ...]:
        """Events with ``seq`` greater than ``cursor`` (0: from the first), oldest first, at
        most ``limit`` (1..:data:`MAX_EVENTS_READ`)."""
        cursor = valid_count(cursor, "cursor")
        limit = min(valid_count(limit, "limit", minimum=1), MAX_EVENTS_READ)
        rows = self._read(
            "SELECT seq, at_s, kind, subject, message FROM events WHERE seq > ? "
            "ORDER BY seq LIMIT ?",
            (cursor, limit),
        )
        return tuple(EventRow(*r) for r in rows)

    def latest_events(self, limit: int) -> tuple[EventRow, ...]:
        """The last ``limit`` events (1..:data:`MAX_EVENTS_READ`), oldest first: the end of
        the story (what the dashboard shows)."""
        limit = min(valid_count(limit, "limit", minimum=1), MAX_EVENTS_READ)
        rows = self._read(
            "SELECT seq, at_s, kind, subject, message FROM events ORDER BY seq DESC LIMIT ?",
            (limit,),
        )
        return tuple(EventRow(*r) for r in reversed(rows))
