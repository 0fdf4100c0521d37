"""Which of the ``coadapt up`` processes sharing one store leads: the leader lease, taken,
renewed and lost (the lease itself and its fencing: :mod:`autoscaler.controller.store.
lease_table`).

Every process serves the API; only the lease's holder runs rounds and calls the cloud. The
holder renews the lease at the start of every round and every half interval between rounds;
a lease lasts :data:`DEFAULT_LEASE_INTERVALS` round intervals, and a standby tries to take it
:data:`STANDBY_TRIES_PER_INTERVAL` times per interval, so a standby takes over a dead
leader's lease at most ``1.5 + 0.25`` intervals after its last renewal (below two intervals).
A leader that is gone longer than its lease (SIGSTOP, a network cut from the database) is
deposed: the next process's epoch fences its writes, and it stands by when it wakes up.

:func:`leader_state` is the one reading of who leads, for ``coadapt status``, the API and the
metrics (``coadapt_leader``, ``coadapt_leader_epoch``).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Final

from autoscaler.controller.store import Lease, Store

__all__ = [
    "DEFAULT_LEASE_INTERVALS",
    "STANDBY_TRIES_PER_INTERVAL",
    "Election",
    "LeaderState",
    "holder_id",
    "leader_state",
]

DEFAULT_LEASE_INTERVALS: Final = 1.5
"""How many round intervals a lease lasts from its last renewal (``coadapt up``'s default)."""
STANDBY_TRIES_PER_INTERVAL: Final = 4
"""How often per round interval a standby tries to take the lease."""


def holder_id(port: int, pid: int) -> str:
    """A controller's id in the lease: ``host:pid:port`` (unique on a machine while it runs;
    a restarted process is a new holder)."""
    return f"{socket.gethostname()}:{pid}:{port}"


@dataclass(frozen=True)
class LeaderState:
    """Who leads, as the store says now. ``leading``: ``me`` holds the lease and it has not
    expired (``False`` when no ``me`` was given); ``holder``, ``epoch``, ``since_s`` (when
    that holder took the lease), ``expires_at_s`` (the lease's clock: the database server's on
    PostgreSQL) are ``None`` before any controller led; ``refused_writes`` counts the writes
    of deposed leaders the store refused; ``shared``: the store is one several controllers
    may share (PostgreSQL), so who leads is worth saying."""

    leading: bool
    holder: str | None
    epoch: int | None
    since_s: float | None
    expires_at_s: float | None
    refused_writes: int
    shared: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "leading": self.leading,
            "holder": self.holder,
            "epoch": self.epoch,
            "since_s": self.since_s,
            "expires_at_s": self.expires_at_s,
            "refused_writes": self.refused_writes,
            "shared": self.shared,
        }


def leader_state(store: Store, me: str | None = None) -> LeaderState:
    """Who leads the controllers on ``store`` (see :class:`LeaderState`); ``me``: this
    process's holder id, for ``leading``. Reads only."""
    lease = store.lease()
    if lease is None:
        return LeaderState(False, None, None, None, None, 0, store.is_postgres)
    leading = me is not None and lease.holder == me and lease.expires_at_s > store.lease_now_s()
    return LeaderState(
        leading,
        lease.holder,
        lease.epoch,
        lease.acquired_at_s,
        lease.expires_at_s,
        lease.refused_writes,
        store.is_postgres,
    )


class Election:
    """One process's side of the lease on ``store`` (the rounds' store object, which it fences
    at the epoch it leads with): :meth:`try_lead` takes or renews it, :meth:`release` gives it
    up. ``take``: the first try takes the lease whatever its state (the embedded SQLite store:
    one ``up`` per state folder, so the one process leads at once, also after a crash)."""

    def __init__(self, store: Store, holder: str, lease_s: float, *, take: bool = False) -> None:
        self.store = store
        self.holder = holder
        self.lease_s = lease_s
        self._take = take
        self.epoch: int | None = None  # the epoch this process leads with; None: standing by
        self.lease: Lease | None = None

    @property
    def leading(self) -> bool:
        return self.epoch is not None

    def try_lead(self) -> Lease:
        """Take or renew the lease (one transaction); fences the store at the epoch led with,
        or unfences it when another holds the lease. Store errors propagate."""
        lease = self.store.acquire_lease(self.holder, self.lease_s, take=self._take)
        self._take = False
        self.lease = lease
        if lease.holder == self.holder:
            self.epoch = lease.epoch
        else:
            self.epoch = None
        self.store.fence(self.epoch)
        return lease

    def deposed(self) -> None:
        """A write was refused (:class:`~autoscaler.controller.errors.FencedError`): this
        process no longer leads."""
        self.epoch = None
        self.store.fence(None)

    def release(self) -> None:
        """Give the lease up (a leader that stops): a standby takes it at its next try."""
        if self.epoch is not None:
            self.store.release_lease(self.holder)
            self.epoch = None
            self.store.fence(None)
