"""The controller's errors, rooted at ``ControllerError``.

``ControllerError`` derives from :class:`autoscaler.errors.AutoscalerError` (and so from
``coadapt_common.errors.CoadaptError``). Bad arguments are refused with
:class:`autoscaler.errors.InvalidInputError`, as everywhere in ``autoscaler``; the classes
here name what went wrong with the controller's *state*:

* :class:`IllegalTransitionError` — an instance status change that the lifecycle table
  (:data:`autoscaler.controller.lifecycle.TRANSITIONS`) does not allow;
* :class:`StaleVersionError` — an optimistic-concurrency conflict: the row changed since the
  caller read it (re-read, re-decide, retry);
* :class:`UnknownFleetError` — a store that has never planned meets a cloud already holding
  instances of its cluster (a deleted or swapped store): the controller touches none;
* :class:`RoundError` — a round could not be decided: the policy or the fleet sizing failed
  and no single job could be blamed (a job that can be blamed is failed, and the round goes
  on without it);
* :class:`StoreError` — the store itself: :class:`StoreMissingError`,
  :class:`StoreExistsError`, :class:`StoreCorruptError`, :class:`StoreUnwritableError`,
  :class:`UnknownRowError`,
  :class:`DuplicateRowError`, :class:`FencedError` (a write of a controller that no longer
  holds the leader lease), or a plain ``StoreError`` for an SQLite failure (locked past the
  busy timeout, disk I/O) with the ``sqlite3`` exception as its ``__cause__``.

Every error that refuses a change leaves the store as it was.
"""

from __future__ import annotations

from autoscaler.errors import AutoscalerError

__all__ = [
    "ControllerError",
    "DuplicateRowError",
    "FencedError",
    "IllegalTransitionError",
    "RoundError",
    "StaleVersionError",
    "StoreCorruptError",
    "StoreError",
    "StoreExistsError",
    "StoreMissingError",
    "StoreUnwritableError",
    "UnknownFleetError",
    "UnknownRowError",
]


class ControllerError(AutoscalerError):
    """Root of the errors of the controller package (``autoscaler.controller``)."""


class IllegalTransitionError(ControllerError):
    """An instance status change the lifecycle table does not allow; nothing was changed."""

    def __init__(self, instance_id: str, from_status: str, to_status: str) -> None:
        super().__init__(
            f"instance {instance_id}: illegal status transition {from_status} -> {to_status}"
        )
        self.instance_id = instance_id
        self.from_status = from_status
        self.to_status = to_status


class StaleVersionError(ControllerError):
    """The row's version is not the one the update was written against; nothing was changed.

    ``expected`` is the version the caller read, ``actual`` the one the store holds now.
    """

    def __init__(self, table: str, key: str, expected: int, actual: int) -> None:
        super().__init__(
            f"{table} row {key!r} is at version {actual}, not {expected}: "
            "it changed since it was read (re-read it and decide again)"
        )
        self.table = table
        self.key = key
        self.expected = expected
        self.actual = actual


class StoreError(ControllerError):
    """Root of the store's errors. ``path`` is the store file, when the error concerns it."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class StoreMissingError(StoreError):
    """``Store.open`` of a path where no file exists (nothing was created)."""


class StoreExistsError(StoreError):
    """``Store.create`` of a path where something already exists (it was left untouched)."""


class StoreUnwritableError(StoreError):
    """The store can be read but not written: a read-only file or file system, or a full
    disk. Nothing was changed."""


class StoreCorruptError(StoreError):
    """The file is not a store this code can use: not an SQLite database, failing its
    integrity check, missing tables, or written by a newer schema version."""


class UnknownRowError(StoreError):
    """A row looked up by its key does not exist. ``table`` and ``key`` name it."""

    def __init__(self, table: str, key: str) -> None:
        super().__init__(f"no {table} row {key!r}")
        self.table = table
        self.key = key


class DuplicateRowError(StoreError):
    """An insert would repeat a unique key (a job name, an instance key, a request id, a
    provider instance id). ``table`` and ``key`` name the row."""

    def __init__(self, table: str, key: str, detail: str = "") -> None:
        super().__init__(f"{table} row {key!r} already exists" + (f" ({detail})" if detail else ""))
        self.table = table
        self.key = key


class FencedError(StoreError):
    """A write of the rounds of a controller whose leader lease is no longer current: the
    store's lease is at ``current_epoch`` (held by ``holder``), the write carried ``epoch``.
    Checked inside the write's own transaction, so nothing was changed; the controller stops
    its round at once and stands by (:mod:`autoscaler.controller.leader`)."""

    def __init__(self, epoch: int, current_epoch: int | None, holder: str | None) -> None:
        who = "no lease" if current_epoch is None else f"epoch {current_epoch}, held by {holder}"
        super().__init__(
            f"write refused: this controller led at epoch {epoch}, the leader lease is now at {who}"
        )
        self.epoch = epoch
        self.current_epoch = current_epoch
        self.holder = holder


class UnknownFleetError(ControllerError):
    """The cloud holds instances of this cluster that a store which has never planned does not
    know: most likely the store was deleted or replaced. Adopting or terminating them would be
    a guess, so the controller refuses to act (``instance_ids`` names them)."""

    def __init__(self, cluster_id: str, instance_ids: tuple[str, ...], path: str) -> None:
        shown = ", ".join(instance_ids[:5]) + (" ..." if len(instance_ids) > 5 else "")
        super().__init__(
            f"the cloud holds {len(instance_ids)} instance(s) of cluster {cluster_id!r} "
            f"({shown}) that the store at {path} has never seen: was the store deleted or "
            "replaced? Nothing was touched; restore the store, or release them explicitly"
        )
        self.cluster_id = cluster_id
        self.instance_ids = instance_ids


class RoundError(ControllerError):
    """A round could not be decided, and no single job can be blamed (see the module
    docstring). The message is one line; the service logs it and tries again next round."""
