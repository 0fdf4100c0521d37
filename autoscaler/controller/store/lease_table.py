"""The leader lease: which of the controllers sharing a store runs the rounds.

One row (``leader_lease``, schema v12): the ``holder`` (a controller's id, e.g.
``host:pid:port``), its fencing ``epoch``, when that holder took it (``acquired_at_s``), last
renewed it and when it expires. :meth:`LeaseTable.acquire_lease` is one write transaction
(the store's writer lock: the read-check-write cannot interleave with another process's): a
controller takes the lease when there is none or it expired (the epoch + 1), renews it when it
holds it already (same epoch), and otherwise leaves it to its holder.

Fencing
    The controller's rounds write through a store object fenced at the epoch it leads with
    (:meth:`LeaseTable.fence`): each of its write transactions first checks, under the same
    lock, that the lease is still at that epoch, and fails with :class:`~autoscaler.
    controller.errors.FencedError` otherwise (nothing written; the row's ``refused_writes``
    counts it). A deposed leader that wakes up (SIGSTOP, a long GC, a network cut) so cannot
    write, and since the controller writes its intent before every cloud call (and checks the
    fence right before a call that follows no write: :meth:`LeaseTable.check_fence`), it
    cannot act on the cloud with a stale epoch either, but for the instant between its last
    check and the call's request leaving (the cloud itself knows no epoch; a launch is
    idempotent by its request id).

Clock
    The lease's times are the database's when the store is PostgreSQL (the server's
    ``clock_timestamp()``: the one clock every controller sees, whatever the machines' own
    clocks say), and the store's injected clock on SQLite (every process on one file runs on
    one machine, and tests can drive it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from autoscaler.controller.store.base import StoreBase
from autoscaler.controller.store.dialect import Connection
from autoscaler.controller.store.validate import valid_text
from autoscaler.errors import InvalidInputError

__all__ = ["MAX_HOLDER_CHARS", "Lease", "LeaseTable"]

MAX_HOLDER_CHARS: Final = 200


@dataclass(frozen=True)
class Lease:
    """The leader lease as the store holds it (times on the lease's clock: see the module
    docstring). ``refused_writes``: the writes of deposed leaders refused so far."""

    holder: str
    epoch: int
    acquired_at_s: float
    renewed_at_s: float
    expires_at_s: float
    refused_writes: int = 0


_COLUMNS: Final = "holder, epoch, acquired_at_s, renewed_at_s, expires_at_s, refused_writes"


def _lease(row: object) -> Lease:
    r = row  # a row by position
    return Lease(
        str(r[0]),  # type: ignore[index]
        int(r[1]),  # type: ignore[index]
        float(r[2]),  # type: ignore[index]
        float(r[3]),  # type: ignore[index]
        float(r[4]),  # type: ignore[index]
        int(r[5]),  # type: ignore[index]
    )


class LeaseTable(StoreBase):
    """The ``leader_lease`` row (see the module docstring)."""

    def _lease_now(self, conn: Connection) -> float:
        if self.is_postgres:
            return float(conn.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())").fetchone()[0])
        return self._now()

    def lease_now_s(self) -> float:
        """Now on the lease's clock (the database server's on PostgreSQL, else the store's)."""
        return self._lease_now(self._live())

    def acquire_lease(self, holder: str, lease_s: float, *, take: bool = False) -> Lease:
        """Take or renew the lease for ``holder`` for ``lease_s`` seconds from now, in one
        write transaction; returns the lease as it is after it (``holder`` leads when it is
        the lease's holder). Taken when there is none or it expired (epoch + 1), renewed at
        the same epoch when ``holder`` holds it, else left to its holder. ``take``: taken
        whatever its state (the embedded SQLite store, whose one ``up`` per folder is
        enforced elsewhere, leads at once after a crash)."""
        holder = valid_text(holder, "holder")
        if len(holder) > MAX_HOLDER_CHARS:
            raise InvalidInputError(
                f"a lease holder's id is at most {MAX_HOLDER_CHARS} characters", field="holder"
            )
        if not (math.isfinite(lease_s) and 0 < lease_s <= 3600):
            raise InvalidInputError(
                f"a lease lasts more than 0 s and at most 3600 s, not {lease_s}", field="lease_s"
            )
        with self._write("take or renew the leader lease", fenced=False) as conn:
            now = self._lease_now(conn)
            row = conn.execute(f"SELECT {_COLUMNS} FROM leader_lease WHERE id = 1").fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO leader_lease (id, holder, epoch, acquired_at_s, renewed_at_s, "
                    "expires_at_s) VALUES (1, ?, 1, ?, ?, ?)",
                    (holder, now, now, now + lease_s),
                )
            else:
                old = _lease(row)
                if old.holder == holder:
                    conn.execute(
                        "UPDATE leader_lease SET renewed_at_s = ?, expires_at_s = ? WHERE id = 1",
                        (now, now + lease_s),
                    )
                elif take or old.expires_at_s <= now:
                    conn.execute(
                        "UPDATE leader_lease SET holder = ?, epoch = epoch + 1, "
                        "acquired_at_s = ?, renewed_at_s = ?, expires_at_s = ? WHERE id = 1",
                        (holder, now, now, now + lease_s),
                    )
            new = conn.execute(f"SELECT {_COLUMNS} FROM leader_lease WHERE id = 1").fetchone()
        return _lease(new)

    def release_lease(self, holder: str) -> None:
        """``holder`` gives the lease up (a leader that stops): it expires now, so a standby
        takes it at its next try, not a lease later. Nothing changes if another holds it."""
        with self._write("release the leader lease", fenced=False) as conn:
            now = self._lease_now(conn)
            conn.execute(
                "UPDATE leader_lease SET expires_at_s = ? WHERE id = 1 AND holder = ?",
                (now, holder),
            )

    def lease(self) -> Lease | None:
        """The lease as the store holds it; ``None`` before any controller took it."""
        rows = self._read(f"SELECT {_COLUMNS} FROM leader_lease WHERE id = 1")
        return _lease(rows[0]) if rows else None

    def fence(self, epoch: int | None) -> None:
        """Every later write of this store object carries ``epoch`` (``None``: none), checked
        in its own transaction (:class:`~autoscaler.controller.errors.FencedError` when the
        lease has moved on). Only the rounds' store object is fenced: the API's writes
        (submissions, reports, heartbeats) are served by every controller."""
        self._fence = epoch

    @property
    def fenced_epoch(self) -> int | None:
        """The epoch this store object's writes carry (:meth:`fence`)."""
        return self._fence

    def check_fence(self) -> None:
        """Raise :class:`~autoscaler.controller.errors.FencedError` if this object is fenced
        at an epoch the lease has left (an empty write transaction): what the controller
        calls right before a cloud call that follows no write of its own."""
        if self._fence is None:
            return
        with self._write("check the leader lease"):
            pass
