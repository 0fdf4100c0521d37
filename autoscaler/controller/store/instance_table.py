"""The instance rows (``instances``) and their status history (``instance_history``).

:meth:`InstanceTable.transition` is the only writer of ``instances.status`` (besides
:meth:`InstanceTable.add_instance`, which creates a row ``queued``); see the package docstring.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from autoscaler.controller.errors import DuplicateRowError, StaleVersionError, UnknownRowError
from autoscaler.controller.lifecycle import InstanceStatus, StatusChange, check_transition
from autoscaler.controller.records import InstanceRow
from autoscaler.controller.store.base import StoreBase
from autoscaler.controller.store.dialect import INTEGRITY_ERRORS, Connection
from autoscaler.controller.store.validate import (
    valid_count,
    valid_enum,
    valid_number,
    valid_request_id,
    valid_text,
    valid_version,
)
from autoscaler.errors import InvalidInputError
from providers.base import Market

__all__ = ["InstanceTable"]

_INSTANCE_COLUMNS: Final = (
    "instance_key, request_id, offering_key, provider, instance_type, zone, market, gpu_type, "
    "gpus, price_usd_per_hour, provider_instance_id, status, request_tries, last_heartbeat_s, "
    "created_at_s, updated_at_s, version"
)
_INSTANCE_FIELDS: Final = frozenset({"provider_instance_id", "last_heartbeat_s"})
"""Instance fields a caller may change besides the status (transition or not)."""


def _instance_row(r: Any) -> InstanceRow:
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


class InstanceTable(StoreBase):
    """The instance rows and their status history."""

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
            valid_text(instance_key, "instance_key"),
            valid_request_id(request_id),
            valid_text(offering_key, "offering_key"),
            valid_text(provider, "provider"),
            valid_text(instance_type, "instance_type"),
            valid_text(zone, "zone"),
            valid_enum(Market, market, "market").value,
            valid_text(gpu_type, "gpu_type"),
            valid_count(gpus, "gpus"),
            valid_number(price_usd_per_hour, "price_usd_per_hour"),
        )
        reason = valid_text(reason, "reason")
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
            except INTEGRITY_ERRORS as e:
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
            params = [valid_enum(InstanceStatus, s, "statuses").value for s in statuses]
            sql += f" WHERE status IN ({', '.join('?' * len(params))})"
        sql += " ORDER BY instance_key"
        return tuple(_instance_row(r) for r in self._read(sql, params))

    def instance_counts(
        self, statuses: Iterable[InstanceStatus]
    ) -> dict[tuple[str, Market, InstanceStatus], int]:
        """How many instance rows in ``statuses`` there are per ``(offering key, market,
        status)`` (one grouped read; combinations with none left out)."""
        params = [valid_enum(InstanceStatus, s, "statuses").value for s in statuses]
        if not params:
            return {}
        sql = (
            "SELECT offering_key, market, status, COUNT(*) FROM instances "
            f"WHERE status IN ({', '.join('?' * len(params))}) "
            "GROUP BY offering_key, market, status"
        )
        return {
            (r[0], Market(r[1]), InstanceStatus(r[2])): int(r[3]) for r in self._read(sql, params)
        }

    def terminal_request_ids(self, among: Iterable[str] | None = None) -> frozenset[str]:
        """Request ids of rows in a terminal status: an instance listed under one is a leak
        (of ``among`` only, when given: the ids the cloud lists, so that a round reads what
        it needs, not the whole history of the fleet)."""
        sql = "SELECT request_id FROM instances WHERE status = ?"
        if among is None:
            rows = self._read(sql, (InstanceStatus.TERMINATED.value,))
            return frozenset(r[0] for r in rows)
        # ``+status``: not through the status index, which would read every terminated row
        # the cluster ever had; the request ids' own index reads only those asked about.
        sql = "SELECT request_id FROM instances WHERE +status = ?"
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
        preemption: bool = False,
        **field_changes: object,
    ) -> InstanceRow:
        """Move instance ``instance_key`` to ``to_status`` because of ``reason``, written
        against ``expected_version``; returns the new row (version + 1).

        In one transaction: the version is checked (:class:`StaleVersionError`, with the
        actual version), then the lifecycle edge (:class:`IllegalTransitionError`), then the
        row is updated with ``field_changes`` (``provider_instance_id``,
        ``last_heartbeat_s``) and ``(to_status, now, reason, preemption)`` is appended to its
        history (``preemption``: the provider is taking it back, as the round's reconcile
        decided: :attr:`~autoscaler.controller.reconcile.Transition.preemption`). On
        ``requested -> queued`` the store counts the retry in ``request_tries``; a caller may
        restate that count (``request_tries=row.request_tries + 1``) but not set another.
        A refused transition changes nothing.
        """
        expected_version = valid_version(expected_version)
        to_status = valid_enum(InstanceStatus, to_status, "to_status")
        reason = valid_text(reason, "reason")
        if not isinstance(preemption, bool):
            raise InvalidInputError("preemption must be a bool", field="preemption")
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
            self._append_history(conn, instance_key, to_status, at, reason, preemption)
            return self._instance(conn, instance_key)

    def update_instance_fields(
        self, instance_key: str, expected_version: int, **changes: object
    ) -> InstanceRow:
        """Change ``provider_instance_id`` and/or ``last_heartbeat_s`` of an instance row,
        written against ``expected_version`` (no status change, no history entry); returns
        the new row (version + 1). A recorded ``provider_instance_id`` never changes to
        another value. Errors as for :meth:`transition`."""
        expected_version = valid_version(expected_version)
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
        at_s = valid_number(at_s, "at_s", minimum=None)
        with self._write("record a heartbeat") as conn:
            cursor = conn.execute(
                "UPDATE instances SET last_heartbeat_s = CASE WHEN last_heartbeat_s IS NULL "
                "OR last_heartbeat_s < ?1 THEN ?1 ELSE last_heartbeat_s END "
                "WHERE instance_key = ?2",
                (at_s, instance_key),
            )
            if cursor.rowcount != 1:
                raise UnknownRowError("instances", instance_key)

    def history(self, instance_key: str) -> tuple[StatusChange, ...]:
        """The status history of an instance row, oldest first (its first entry is
        ``queued``, its last the row's status); :class:`UnknownRowError` if no such row."""
        rows = self._read(
            "SELECT status, at_s, reason, preemption FROM instance_history "
            "WHERE instance_key = ? ORDER BY seq",
            (instance_key,),
        )
        if not rows:
            raise UnknownRowError("instances", instance_key)
        return tuple(StatusChange(InstanceStatus(r[0]), r[1], r[2], bool(r[3])) for r in rows)

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

    def _instance(self, conn: Connection, key: str) -> InstanceRow:
        row = conn.execute(
            f"SELECT {_INSTANCE_COLUMNS} FROM instances WHERE instance_key = ?", (key,)
        ).fetchone()
        if row is None:
            raise UnknownRowError("instances", key)
        return _instance_row(row)

    def _instance_at(self, conn: Connection, key: str, expected_version: int) -> InstanceRow:
        row = self._instance(conn, key)
        if row.version != expected_version:
            raise StaleVersionError("instances", key, expected_version, row.version)
        return row

    @staticmethod
    def _check_owner(conn: Connection, row: InstanceRow, provider_id: str | None) -> None:
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

    def _history_time(self, conn: Connection, key: str, now: float) -> float:
        last = conn.execute(
            "SELECT max(at_s) FROM instance_history WHERE instance_key = ?", (key,)
        ).fetchone()[0]
        return now if last is None else max(now, last)

    @staticmethod
    def _append_history(
        conn: Connection,
        key: str,
        status: InstanceStatus,
        at_s: float,
        reason: str,
        preemption: bool = False,
    ) -> None:
        conn.execute(
            "INSERT INTO instance_history (instance_key, status, at_s, reason, preemption) "
            "VALUES (?, ?, ?, ?, ?)",
            (key, status.value, at_s, reason, int(preemption)),
        )

    def history_after(self, cursor: int) -> tuple[tuple[int, str, StatusChange], ...]:
        """Instance status changes recorded after history row ``cursor`` (0: all), oldest
        first, as ``(seq, instance_key, change)``."""
        cursor = valid_count(cursor, "cursor")
        rows = self._read(
            "SELECT seq, instance_key, status, at_s, reason, preemption FROM instance_history "
            "WHERE seq > ? ORDER BY seq",
            (cursor,),
        )
        return tuple(
            (r[0], r[1], StatusChange(InstanceStatus(r[2]), r[3], r[4], bool(r[5]))) for r in rows
        )


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
        None if provider_id is None else valid_text(provider_id, "provider_instance_id"),
        None if heartbeat is None else valid_number(heartbeat, "last_heartbeat_s", minimum=None),
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
