"""The controller's store: one SQLite file holding what the controller knows and intends.

One :class:`Store` per file and process. It holds the jobs, the instance rows with their
status history, the jobs' assignments to instances with their history and usage totals, the
trainer reports, the fitted goodput models, the price history, the cost records and the
cluster's events. The cloud is never called from here.

Intent first
    The controller writes what it is about to do (a launch with its request id, a terminate)
    and only then calls the cloud; after a crash the store says what may exist in the cloud.
    So every change is **one transaction**, begun with ``BEGIN IMMEDIATE`` (the write lock is
    taken before the row is read, so a read-check-write cannot interleave with another
    writer) and committed only when every statement of it succeeded: a process killed at any
    point leaves the old state or the new one, never a row without its history entry.

Durability
    ``journal_mode=WAL`` (readers never block the writer) with ``synchronous=FULL``: every
    commit is fsynced to the WAL before the call returns. ``NORMAL`` would survive a killed
    process too, but a power loss or kernel crash could undo the last commits; an intent that
    the cloud already acted on must not be undone (it would turn a launch into an unknown
    instance, found only later as a leak). The cost is one fsync per transaction, and a round
    makes a few dozen. Foreign keys are enforced (``PRAGMA foreign_keys=ON``, per connection).

Optimistic concurrency
    Rows that are read, decided on and written back (jobs, instances) carry a ``version``,
    1 when created and incremented by every change. A change names the version it was
    decided on (``expected_version``); if the row has moved on, :class:`StaleVersionError`
    says so (with the actual version) and nothing is changed: re-read, decide again.

Instance status
    :meth:`Store.transition` is the only writer of ``instances.status`` (besides
    :meth:`Store.add_instance`, which creates a row ``queued``). It checks the version and the
    lifecycle table (:func:`autoscaler.controller.lifecycle.check_transition`) in the same
    transaction, and appends the change to ``instance_history``. History times never go
    backwards: an entry is stamped ``max(now, previous entry)``, so a clock stepped back cannot
    reorder a row's history. ``request_tries`` is kept by the store: the number of
    ``requested -> queued`` retries in the history.

Money
    Prices (``*_usd_per_hour``) and amounts (``usd``) are stored as SQLite REAL, which is an
    IEEE-754 double and round-trips a Python float bit for bit: nothing is rounded when
    written. Totals are summed in Python with ``math.fsum`` (not SQL ``SUM``), and dollars are
    rounded to the cent only when reported, with :func:`autoscaler.accounting.costs.usd_to_cents` —
    the cost ledger's rule, so the store and the ledger give the same figures.

Schema versions
    :mod:`~autoscaler.controller.store.schema` lists the migrations (one per version, never
    edited once released); :meth:`Store.open` applies those a store lacks, in one transaction.

Opening
    :meth:`Store.open` touches nothing but the file (and SQLite's ``-wal``/``-shm`` files
    beside it); it never creates one. It refuses, with :class:`StoreCorruptError` naming the
    path, a file that is not an SQLite database, fails ``PRAGMA integrity_check`` or the
    foreign-key check, lacks the ``meta`` table, has a schema version newer than this code
    knows, or whose tables differ from what its version's migrations create.

The clock is injected: every stored time (``*_at_s``) is the clock's ``now_s()``.

Layout
    This module is the package's face: :class:`Store` and the row types, imported from here.
    :mod:`.base` holds the file and its transactions (:class:`~.base.StoreBase`); each table
    group is a subclass of it in its own module (:mod:`.job_table`, :mod:`.instance_table`,
    :mod:`.assignment_table`, :mod:`.report_table`, :mod:`.price_table`, :mod:`.cost_table`,
    :mod:`.event_table`, :mod:`.fleet_meta`, :mod:`.lease_table`, :mod:`.credential_meta`),
    and :class:`Store` is all of them.
    :mod:`.retention` says what is pruned with age and what never is, :mod:`.schema` holds
    the migrations, :mod:`.connection` the opening checks, :mod:`.validate` the checks of
    what callers pass in.
"""

from __future__ import annotations

from autoscaler.controller.records import (
    InstanceRow,
    JobBatch,
    JobEta,
    JobRow,
    JobStatus,
    ReportRow,
)
from autoscaler.controller.store.assignment_table import (
    AssignmentRow,
    AssignmentSpan,
    AssignmentTable,
)
from autoscaler.controller.store.connection import BUSY_TIMEOUT_S
from autoscaler.controller.store.cost_table import CostRecordRow, CostTable
from autoscaler.controller.store.credential_meta import CredentialMeta
from autoscaler.controller.store.event_table import (
    MAX_EVENT_CHARS,
    MAX_EVENTS_READ,
    EventRow,
    EventTable,
)
from autoscaler.controller.store.fleet_meta import FleetMeta
from autoscaler.controller.store.instance_table import InstanceTable
from autoscaler.controller.store.job_table import (
    DELETED_MARK,
    ENDED_JOB_STATUSES,
    MAX_REASON_CHARS,
    JobTable,
    is_deleted_name,
)
from autoscaler.controller.store.lease_table import Lease, LeaseTable
from autoscaler.controller.store.placements import placement_instants
from autoscaler.controller.store.price_table import PricePoint, PriceTable
from autoscaler.controller.store.report_table import ModelRow, TrainerReportTable
from autoscaler.controller.store.retention import RETENTION_BATCH, Pruned, Retention
from autoscaler.controller.store.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Migration,
    apply_migrations,
    schema_of,
)

__all__ = [
    "BUSY_TIMEOUT_S",
    "DELETED_MARK",
    "ENDED_JOB_STATUSES",
    "MAX_EVENTS_READ",
    "MAX_EVENT_CHARS",
    "MAX_REASON_CHARS",
    "MIGRATIONS",
    "RETENTION_BATCH",
    "SCHEMA_VERSION",
    "AssignmentRow",
    "AssignmentSpan",
    "CostRecordRow",
    "EventRow",
    "InstanceRow",
    "JobBatch",
    "JobEta",
    "JobRow",
    "JobStatus",
    "Lease",
    "Migration",
    "ModelRow",
    "PricePoint",
    "Pruned",
    "ReportRow",
    "Store",
    "apply_migrations",
    "is_deleted_name",
    "placement_instants",
    "schema_of",
]


class Store(
    FleetMeta,
    JobTable,
    InstanceTable,
    AssignmentTable,
    TrainerReportTable,
    PriceTable,
    EventTable,
    CostTable,
    Retention,
    LeaseTable,
    CredentialMeta,
):
    """The controller's SQLite store (see the package docstring). Build it with
    :meth:`create` or :meth:`open`; close it with :meth:`close` or a ``with`` block. One
    object per thread (SQLite connections are not shared across threads); several objects,
    in one process or several, may use one file: their writes are serialized and each
    versioned change is checked against the version it was decided on."""
