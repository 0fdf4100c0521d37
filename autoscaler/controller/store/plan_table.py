"""The plans of past rounds (``plans``)."""

from __future__ import annotations

from dataclasses import dataclass

from autoscaler.controller.errors import StoreError
from autoscaler.controller.store.base import StoreBase
from autoscaler.controller.store.validate import valid_json_object

__all__ = ["PlanRow", "PlanTable"]


@dataclass(frozen=True)
class PlanRow:
    """The plan of one round (a JSON object)."""

    round_id: int
    at_s: float
    plan_json: str


class PlanTable(StoreBase):
    """The plans of past rounds."""

    def record_plan(self, plan_json: str) -> PlanRow:
        """Record a round's plan (a JSON object); its ``round_id`` is the next one."""
        plan_json = valid_json_object(plan_json, "plan_json")
        now = self._now()
        with self._write("record a plan") as conn:
            cursor = conn.execute(
                "INSERT INTO plans (at_s, plan_json) VALUES (?, ?)", (now, plan_json)
            )
            round_id = cursor.lastrowid
        if round_id is None:  # pragma: no cover - an INSERT into a rowid table always sets it
            raise StoreError(f"{self._path}: no round id for the plan", path=str(self._path))
        return PlanRow(round_id, now, plan_json)

    def latest_plan(self) -> PlanRow | None:
        """The last recorded plan, or ``None``."""
        rows = self._read(
            "SELECT round_id, at_s, plan_json FROM plans ORDER BY round_id DESC LIMIT 1"
        )
        return PlanRow(rows[0][0], rows[0][1], rows[0][2]) if rows else None
