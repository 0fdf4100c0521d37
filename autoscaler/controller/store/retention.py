"""Retention: what the store forgets with age, and what it never does.

A store lives as long as its cluster; three of its tables grow with that age and are read
only near their end, so :meth:`Retention.prune_old` deletes their rows older than a cutoff
(the controller passes ``now - ControllerConfig.retention_s``), a batch at a time, each
table in its own short transaction (an API write waits for one batch, never for the whole
backlog):

* ``reports``: every report older than the cutoff except each job's latest (what a
  restart, the API and the bill read: progress, gradient statistics, useful samples); what
  the older ones taught is in the job's profiles and ``models``.
* ``price_history``: every price point older than the cutoff except, per offering, the one
  in effect at the cutoff, so :meth:`~autoscaler.controller.store.Store.price_at` answers
  the same for every time from the cutoff on.
* ``events``: every event older than the cutoff (``coadapt events`` shows what is left;
  cursors stay valid, a ``seq`` is never reused).

Never pruned, whatever their age, because the bill (:mod:`autoscaler.accounting.billing`)
reads them whole or they are the cluster's identity: ``cost_records``, ``instances`` and
``instance_history`` (when each instance ran, ended, was preempted), ``assignment_history``
(the spans each job is billed on) and ``job_usage``, ``jobs``, ``job_batches``, ``models``,
``assignments`` and ``meta``. (``job_etas`` holds at most a row per running job: each
round replaces it whole.) The history tables no longer cost a round anything as they
grow: a round reads their live rows through indexes and each job's usage totals
(:mod:`~autoscaler.controller.store.assignment_table`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from autoscaler.controller.store.base import StoreBase
from autoscaler.controller.store.validate import valid_count, valid_number

__all__ = ["RETENTION_BATCH", "Pruned", "Retention"]

RETENTION_BATCH: Final = 1000
"""The most rows of one table one :meth:`Retention.prune_old` call deletes (one
transaction)."""


@dataclass(frozen=True)
class Pruned:
    """How many rows of each table one :meth:`Retention.prune_old` call deleted."""

    reports: int
    prices: int
    events: int
    limit: int = RETENTION_BATCH
    """The batch size asked for."""

    @property
    def more(self) -> bool:
        """Whether some table may hold more to prune (a batch was full)."""
        return max(self.reports, self.prices, self.events) >= self.limit


class Retention(StoreBase):
    """Pruning of the tables that grow with the cluster's age (the module docstring)."""

    def prune_old(self, before_s: float, *, limit: int = RETENTION_BATCH) -> Pruned:
        """Delete at most ``limit`` rows of each of ``reports``, ``price_history`` and
        ``events`` recorded before ``before_s``, oldest first, keeping what the module
        docstring says is kept; each table in its own transaction. A caller with a backlog
        calls again while :attr:`Pruned.more`."""
        cutoff = valid_number(before_s, "before_s", minimum=None)
        limit = valid_count(limit, "limit", minimum=1)
        with self._write("prune old reports") as conn:
            reports = conn.execute(
                "DELETE FROM reports WHERE report_id IN (SELECT report_id FROM reports AS r "
                "WHERE at_s < ? AND report_id < (SELECT max(report_id) FROM reports "
                "WHERE job_name = r.job_name) ORDER BY at_s LIMIT ?)",
                (cutoff, limit),
            ).rowcount
        with self._write("prune old prices") as conn:
            prices = conn.execute(
                "DELETE FROM price_history WHERE seq IN (SELECT seq FROM price_history AS p "
                "WHERE at_s < ?1 AND EXISTS (SELECT 1 FROM price_history AS q "
                "WHERE q.offering_key = p.offering_key AND q.at_s <= ?1 "
                "AND (q.at_s > p.at_s OR (q.at_s = p.at_s AND q.seq > p.seq))) "
                "ORDER BY at_s LIMIT ?2)",
                (cutoff, limit),
            ).rowcount
        with self._write("prune old events") as conn:
            events = conn.execute(
                "DELETE FROM events WHERE seq IN "
                "(SELECT seq FROM events WHERE at_s < ? ORDER BY at_s LIMIT ?)",
                (cutoff, limit),
            ).rowcount
        return Pruned(max(0, reports), max(0, prices), max(0, events), limit)
