"""What the ``meta`` table says about the fleet: whether this store has ever planned one (so
owns what it launched), and its release: ``coadapt destroy`` marks the fleet released (the
service terminates every instance and launches none, across restarts) and the service
records what the cloud listed after its last release pass; and whether ``coadapt down``
brought the cluster down (the next ``up`` relaunches its unfinished jobs only when told to)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from autoscaler.controller.store.base import StoreBase

__all__ = ["FleetMeta"]


class FleetMeta(StoreBase):
    """The fleet's plan mark and release (rows of ``meta``)."""

    def mark_planned(self) -> None:
        """Record that this store planned a fleet (a round's plan, written before its first
        launch: a store that never planned owns no instance). The first call writes the time
        (``planned_at_s``); later ones change nothing and, once this object has seen the mark,
        write nothing (a round calls it every time)."""
        if self._planned:
            return
        with self._write("mark the store planned") as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('planned_at_s', ?) ON CONFLICT DO NOTHING",
                (repr(self._now()),),
            )
        self._planned = True

    def planned_at_s(self) -> float | None:
        """When this store first planned a fleet (:meth:`mark_planned`); ``None``: never (it
        has launched nothing, so what the cloud lists under its cluster is not its own)."""
        rows = self._read("SELECT value FROM meta WHERE key = 'planned_at_s'")
        if rows:
            self._planned = True
        return float(rows[0][0]) if rows else None

    def set_released(self, released: bool) -> None:
        """Mark the fleet released (``coadapt destroy``: the service terminates every instance
        and launches none, across restarts) or not (launching resumes)."""
        with self._write("mark the fleet released") as conn:
            if released:
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('released_at_s', ?) "
                    "ON CONFLICT DO NOTHING",
                    (repr(self._now()),),
                )
            else:
                conn.execute("DELETE FROM meta WHERE key IN ('released_at_s', 'release_listing')")

    def record_release_listing(self, instance_ids: Sequence[str], error: str | None) -> None:
        """What the cloud listed after the service's last release pass (``error``: the
        listing failed, so what is left is unknown)."""
        doc = json.dumps({"at_s": self._now(), "instances": sorted(instance_ids), "error": error})
        with self._write("record the release listing") as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('release_listing', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (doc,),
            )

    def release_listing(self) -> dict[str, Any] | None:
        """The last :meth:`record_release_listing` (``at_s``, ``instances``, ``error``)."""
        rows = self._read("SELECT value FROM meta WHERE key = 'release_listing'")
        return dict(json.loads(rows[0][0])) if rows else None

    def released_at_s(self) -> float | None:
        """When the fleet was released (:meth:`set_released`); ``None`` when it is not."""
        rows = self._read("SELECT value FROM meta WHERE key = 'released_at_s'")
        return float(rows[0][0]) if rows else None

    def set_down(self, down: bool) -> None:
        """Mark the cluster brought down (``coadapt down`` released its fleet: its unfinished
        jobs wait until an ``up --resume`` relaunches them) or up again. The first mark keeps
        its time (:meth:`down_at_s`)."""
        with self._write("mark the cluster down") as conn:
            if down:
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('down_at_s', ?) ON CONFLICT DO NOTHING",
                    (repr(self._now()),),
                )
            else:
                conn.execute("DELETE FROM meta WHERE key = 'down_at_s'")

    def down_at_s(self) -> float | None:
        """When ``coadapt down`` brought the cluster down (:meth:`set_down`); ``None`` when it
        is not down (never brought down, or started again since)."""
        rows = self._read("SELECT value FROM meta WHERE key = 'down_at_s'")
        return float(rows[0][0]) if rows else None
