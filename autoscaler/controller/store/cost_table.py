"""What each instance cost (``cost_records``, v2): the bill's records, never rounded."""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.controller.errors import StoreError, UnknownRowError
from autoscaler.controller.store.base import StoreBase
from autoscaler.controller.store.validate import valid_number

__all__ = ["CostRecordRow", "CostTable"]


@dataclass(frozen=True)
class CostRecordRow:
    """What instance ``instance_key`` cost from ``start_s`` to ``end_s``: ``usd`` at
    ``price_usd_per_hour`` (unrounded)."""

    record_id: int
    instance_key: str
    start_s: float
    end_s: float
    price_usd_per_hour: float
    usd: float


class CostTable(StoreBase):
    """The instances' cost records."""

    def add_cost_record(
        self,
        instance_key: str,
        start_s: float,
        end_s: float,
        price_usd_per_hour: float,
        usd: float | None = None,
    ) -> CostRecordRow:
        """Append what an instance cost over ``[start_s, end_s]``. ``usd`` defaults to
        ``price_usd_per_hour * (end_s - start_s) / 3600`` (per-second billing); a caller that
        bills otherwise (a minimum billed duration) passes its own. Nothing is rounded."""
        start = valid_number(start_s, "start_s", minimum=None)
        end = valid_number(end_s, "end_s", minimum=start)
        price = valid_number(price_usd_per_hour, "price_usd_per_hour")
        amount = price * (end - start) / 3600.0 if usd is None else valid_number(usd, "usd")
        with self._write("add a cost record") as conn:
            found = conn.execute(
                "SELECT 1 FROM instances WHERE instance_key = ?", (instance_key,)
            ).fetchone()
            if found is None:
                raise UnknownRowError("instances", instance_key)
            cursor = conn.execute(
                "INSERT INTO cost_records (instance_key, start_s, end_s, price_usd_per_hour, usd) "
                "VALUES (?, ?, ?, ?, ?) RETURNING record_id",
                (instance_key, start, end, price, amount),
            )
            record_id = cursor.fetchone()[0]
        if record_id is None:  # pragma: no cover - an INSERT into a rowid table always sets it
            raise StoreError(f"{self._path}: no id for the cost record", path=str(self._path))
        return CostRecordRow(record_id, instance_key, start, end, price, amount)

    def cost_records(self, instance_key: str | None = None) -> tuple[CostRecordRow, ...]:
        """Cost records (of one instance when given), in the order they were added."""
        sql = (
            "SELECT record_id, instance_key, start_s, end_s, price_usd_per_hour, usd "
            "FROM cost_records"
        )
        params: tuple[str, ...] = ()
        if instance_key is not None:
            sql += " WHERE instance_key = ?"
            params = (instance_key,)
        return tuple(CostRecordRow(*r) for r in self._read(sql + " ORDER BY record_id", params))

    def total_cost_usd(self, instance_key: str | None = None) -> float:
        """The sum of the cost records (of one instance when given), unrounded (``fsum``)."""
        return math.fsum(r.usd for r in self.cost_records(instance_key))
