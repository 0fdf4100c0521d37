"""The price history of the offerings (``price_history``, v2)."""

from __future__ import annotations

from dataclasses import dataclass

from autoscaler.controller.store.base import StoreBase
from autoscaler.controller.store.validate import valid_enum, valid_number, valid_text
from providers.base import Market

__all__ = ["PricePoint", "PriceTable"]


@dataclass(frozen=True)
class PricePoint:
    """The price of an offering from ``at_s`` on."""

    offering_key: str
    at_s: float
    price_usd_per_hour: float
    market: Market


class PriceTable(StoreBase):
    """The offerings' price history."""

    def record_price(
        self,
        offering_key: str,
        price_usd_per_hour: float,
        market: Market | str,
        *,
        at_s: float | None = None,
    ) -> PricePoint:
        """Append a price of an offering, in effect from ``at_s`` (default: now; a price feed
        passes the time the price was published)."""
        point = PricePoint(
            valid_text(offering_key, "offering_key"),
            self._now() if at_s is None else valid_number(at_s, "at_s", minimum=None),
            valid_number(price_usd_per_hour, "price_usd_per_hour"),
            valid_enum(Market, market, "market"),
        )
        with self._write("record a price") as conn:
            conn.execute(
                "INSERT INTO price_history (offering_key, at_s, price_usd_per_hour, market) "
                "VALUES (?, ?, ?, ?)",
                (point.offering_key, point.at_s, point.price_usd_per_hour, point.market.value),
            )
        return point

    def price_at(self, offering_key: str, at_s: float) -> float | None:
        """The offering's price in effect at ``at_s``: the latest recorded at or before it
        (of two recorded for the same time, the later recorded). ``None`` before the first."""
        rows = self._read(
            "SELECT price_usd_per_hour FROM price_history WHERE offering_key = ? AND at_s <= ? "
            "ORDER BY at_s DESC, seq DESC LIMIT 1",
            (offering_key, at_s),
        )
        return rows[0][0] if rows else None

    def prices(self, offering_key: str) -> tuple[PricePoint, ...]:
        """An offering's price history, oldest first."""
        rows = self._read(
            "SELECT offering_key, at_s, price_usd_per_hour, market FROM price_history "
            "WHERE offering_key = ? ORDER BY at_s, seq",
            (offering_key,),
        )
        return tuple(PricePoint(r[0], r[1], r[2], Market(r[3])) for r in rows)
