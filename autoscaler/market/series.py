"""Spot price series: a price over simulated time, for the simulated cloud and its bill.

Pure core; loading reads the files named (by default the copies in ``autoscaler/data/prices``).
Units: USD per instance-hour (``_usd_per_hour``), seconds (``_s``).


All implement :class:`PriceSeries`: ``price_at(t_s)`` and ``change_points(start_s, end_s)``.
:class:`ConstantPrice`; :class:`StepPriceSeries` (a step function; :class:`CsvPriceSeries` reads
one from ``time_s,usd_per_hour``); :class:`GcpHistorySeries` (real GCP price changes from
``gcp_gpu_price_history.csv``); :class:`StochasticSpotPrice` (seeded mean-reverting log price
with jumps).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from autoscaler.errors import InvalidInputError
from autoscaler.market.catalog import PricedOffering
from autoscaler.market.files import CsvFile, prices_dir
from autoscaler.market.terms import SPOT, check_market

__all__ = [
    "ConstantPrice",
    "CsvPriceSeries",
    "GcpHistorySeries",
    "GcpPriceHistory",
    "PriceSeries",
    "StepPriceSeries",
    "StochasticSpotPrice",
    "check_window",
    "load_gcp_price_history",
    "seed_int",
]

_GCP_HISTORY_FILE = "gcp_gpu_price_history.csv"


@runtime_checkable
class PriceSeries(Protocol):
    """A price over simulated time (USD per instance-hour, ``t_s`` in seconds).

    ``change_points(start_s, end_s)`` returns ``[(t_s, usd_per_hour), ...]``: first
    ``(start_s, price_at(start_s))``, then every time in ``(start_s, end_s)`` at which the price
    changes, with the new price; times strictly increase. A simulator records these to bill
    an instance exactly.
    """

    def price_at(self, t_s: float) -> float: ...

    def change_points(self, start_s: float, end_s: float) -> list[tuple[float, float]]: ...


def check_window(start_s: float, end_s: float) -> None:
    """:class:`InvalidInputError` unless ``start_s <= end_s``, both finite (a query window)."""
    if not (math.isfinite(start_s) and math.isfinite(end_s)) or end_s < start_s:
        raise InvalidInputError(
            f"need finite start_s <= end_s, got {start_s!r}, {end_s!r}", field="end_s"
        )


def _check_price(value: float, name: str = "usd_per_hour") -> None:
    if isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise InvalidInputError(f"{name} must be finite and > 0, got {value!r}", field=name)


@dataclass(frozen=True)
class ConstantPrice:
    """The same price at every time."""

    usd_per_hour: float

    def __post_init__(self) -> None:
        _check_price(self.usd_per_hour)

    def price_at(self, t_s: float) -> float:
        return self.usd_per_hour

    def change_points(self, start_s: float, end_s: float) -> list[tuple[float, float]]:
        check_window(start_s, end_s)
        return [(start_s, self.usd_per_hour)]


@dataclass(frozen=True)
class StepPriceSeries:
    """A step function: ``usd_per_hour[i]`` holds from ``times_s[i]`` until ``times_s[i+1]``.

    The last price holds forever; before ``times_s[0]`` the first price holds (the series is
    extended backwards rather than left undefined). ``times_s`` strictly increase; prices > 0.
    """

    times_s: tuple[float, ...]
    usd_per_hour: tuple[float, ...]

    def __post_init__(self) -> None:
        times, prices = tuple(self.times_s), tuple(self.usd_per_hour)
        object.__setattr__(self, "times_s", times)
        object.__setattr__(self, "usd_per_hour", prices)
        if not times or len(times) != len(prices):
            raise InvalidInputError(
                "a step series needs as many prices as times, at least one", field="times_s"
            )
        for i, t in enumerate(times):
            if not math.isfinite(t) or (i and t <= times[i - 1]):
                raise InvalidInputError(
                    f"times must be finite and strictly increasing (at index {i}: {t!r})",
                    field="times_s",
                )
        for p in prices:
            _check_price(p)

    @classmethod
    def from_points(cls, points: Iterable[tuple[float, float]]) -> StepPriceSeries:
        """From ``(t_s, usd_per_hour)`` pairs in time order."""
        pairs = list(points)
        return cls(tuple(t for t, _ in pairs), tuple(p for _, p in pairs))

    def price_at(self, t_s: float) -> float:
        i = bisect.bisect_right(self.times_s, t_s) - 1
        return self.usd_per_hour[max(i, 0)]

    def change_points(self, start_s: float, end_s: float) -> list[tuple[float, float]]:
        check_window(start_s, end_s)
        current = self.price_at(start_s)
        out = [(start_s, current)]
        i = bisect.bisect_right(self.times_s, start_s)
        while i < len(self.times_s) and self.times_s[i] < end_s:
            price = self.usd_per_hour[i]
            if price != current:
                out.append((self.times_s[i], price))
                current = price
            i += 1
        return out


@dataclass(frozen=True)
class CsvPriceSeries(StepPriceSeries):
    """A step series read from a CSV file with columns ``time_s,usd_per_hour`` (see
    :meth:`load`); ``path`` names the file."""

    path: str = ""

    @classmethod
    def load(cls, path: str | Path) -> CsvPriceSeries:
        """Read ``path``: a header, then rows with strictly increasing finite ``time_s`` and a
        price > 0. :class:`TraceFormatError` names file, line and field otherwise."""
        f = CsvFile(Path(path))
        times: list[float] = []
        prices: list[float] = []
        for line, row in f.rows(("time_s", "usd_per_hour")):
            text = f.text(row, line, "time_s")
            try:
                t = float(text)
            except ValueError:
                raise f.error(f"not a number: {text!r}", line, "time_s") from None
            if not math.isfinite(t):
                raise f.error(f"not finite: {text!r}", line, "time_s")
            if times and t <= times[-1]:
                raise f.error(f"time {text} is not after the previous row's", line, "time_s")
            times.append(t)
            prices.append(f.price(row, line, "usd_per_hour"))
        if not times:
            raise f.error("no data rows")
        return cls(tuple(times), tuple(prices), path=f.name)


@dataclass(frozen=True)
class GcpHistorySeries(StepPriceSeries):
    """A real GCP VM price over time (one instance type, region and market), from
    :class:`GcpPriceHistory`. ``times_s`` are seconds since ``start_date`` 00:00 UTC."""

    instance_type: str = ""
    region: str = ""
    market: str = SPOT
    start_date: str = ""

    @classmethod
    def load(
        cls,
        instance_type: str,
        region: str,
        *,
        market: str = SPOT,
        start_date: date | str | None = None,
        path: str | Path | None = None,
    ) -> GcpHistorySeries:
        """Shorthand for ``load_gcp_price_history(path).series(...)``."""
        history = load_gcp_price_history(path)
        return history.series(instance_type, region, market=market, start_date=start_date)


@dataclass(frozen=True)
class _HistoryRow:
    day: date
    line: int
    ondemand_usd_per_hour: float
    spot_usd_per_hour: float | None


class GcpPriceHistory:
    """The change points of ``gcp_gpu_price_history.csv``, per (instance type, region).

    A row holds from its ``snapshot_date`` until the next row of the same (instance type,
    region). Two rows of one key on the same date (two source commits that day): the later row
    in the file wins. The spot column is empty before spot prices were published (2023-05):
    such rows do not enter spot series.
    """

    __slots__ = ("_rows", "first_date", "path")

    def __init__(self, path: str, rows: Mapping[tuple[str, str], Sequence[_HistoryRow]]) -> None:
        self.path = path
        self._rows = {k: tuple(v) for k, v in rows.items()}
        self.first_date: date = min(r.day for v in self._rows.values() for r in v)

    def series_keys(self) -> list[tuple[str, str]]:
        """Every ``(instance_type, region)`` with a history, sorted."""
        return sorted(self._rows)

    def series(
        self,
        instance_type: str,
        region: str,
        *,
        market: str = SPOT,
        start_date: date | str | None = None,
    ) -> GcpHistorySeries:
        """The price series of one key on ``market``, time 0 = ``start_date`` 00:00 UTC
        (default: the file's first snapshot date, the same origin for every series).

        :class:`InvalidInputError` for an unknown key, a key without any ``market`` price, or a
        malformed ``start_date``.
        """
        check_market(market)
        start = self.first_date if start_date is None else _as_date(start_date)
        rows = self._rows.get((instance_type, region))
        if rows is None:
            raise InvalidInputError(
                f"no price history for {instance_type} in {region} in {self.path}",
                field="instance_type",
            )
        points: list[tuple[float, float]] = []
        for row in rows:
            price = row.spot_usd_per_hour if market == SPOT else row.ondemand_usd_per_hour
            if price is None:
                continue
            t_s = (row.day - start).days * 86400.0
            if points and points[-1][0] == t_s:
                points[-1] = (t_s, price)  # same date: the later row wins
            elif not points or points[-1][1] != price:
                points.append((t_s, price))
        if not points:
            raise InvalidInputError(
                f"{instance_type} in {region} has no {market} price in {self.path}", field="market"
            )
        # Equal neighbours can remain after a same-date replacement: merge them.
        merged = [points[0]]
        for t_s, price in points[1:]:
            if price != merged[-1][1]:
                merged.append((t_s, price))
        return GcpHistorySeries(
            tuple(t for t, _ in merged),
            tuple(p for _, p in merged),
            instance_type=instance_type,
            region=region,
            market=market,
            start_date=start.isoformat(),
        )


def _as_date(value: date | str) -> date:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(value)
    except (TypeError, ValueError):
        raise InvalidInputError(
            f"start_date must be an ISO date YYYY-MM-DD, got {value!r}", field="start_date"
        ) from None


def load_gcp_price_history(path: str | Path | None = None) -> GcpPriceHistory:
    """Parse a GCP price history CSV (default: the shipped one; cached per resolved path).

    Columns used: ``snapshot_date,instance_type,region,ondemand_usd_per_hour,
    spot_usd_per_hour`` (spot may be empty). Rows are ordered by date per key (file order
    breaks ties). :class:`TraceFormatError` names file, line and field on bad input.
    """
    target = prices_dir() / _GCP_HISTORY_FILE if path is None else Path(path)
    return _load_gcp_history_cached(str(target.resolve()))


@functools.lru_cache(maxsize=4)
def _load_gcp_history_cached(path: str) -> GcpPriceHistory:
    f = CsvFile(Path(path))
    rows: dict[tuple[str, str], list[_HistoryRow]] = {}
    columns = ("snapshot_date", "instance_type", "region", "ondemand_usd_per_hour")
    for line, row in f.rows((*columns, "spot_usd_per_hour")):
        text = f.text(row, line, "snapshot_date")
        try:
            day = date.fromisoformat(text)
        except ValueError:
            raise f.error(f"not an ISO date: {text!r}", line, "snapshot_date") from None
        key = (f.text(row, line, "instance_type"), f.text(row, line, "region"))
        rows.setdefault(key, []).append(
            _HistoryRow(
                day=day,
                line=line,
                ondemand_usd_per_hour=f.price(row, line, "ondemand_usd_per_hour"),
                spot_usd_per_hour=f.number(row, line, "spot_usd_per_hour", optional=True),
            )
        )
    if not rows:
        raise f.error("no data rows")
    for series in rows.values():
        series.sort(key=lambda r: (r.day, r.line))
    return GcpPriceHistory(f.name, rows)


def seed_int(*parts: object) -> int:
    """A 64-bit seed from the parts' text (stable across runs and platforms, unlike hash())."""
    digest = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class _Walk:
    """The memoised path of a :class:`StochasticSpotPrice` (its only mutable part)."""

    __slots__ = ("prices", "rng", "x")

    def __init__(self) -> None:
        self.prices: list[float] = []
        self.rng: random.Random | None = None
        self.x = 0.0


@dataclass(frozen=True)
class StochasticSpotPrice:
    """A seeded synthetic spot price: mean-reverting log price with upward jumps.

    The log price ``x`` moves once per ``step_s`` (default hourly) as an exactly discretised
    Ornstein-Uhlenbeck process around ``mu = ln(base_usd_per_hour)``::

        x[k+1] = mu + (x[k] - mu) * a + s * Z + J,   a = exp(-theta * dt_h),
        s = sigma * sqrt((1 - a^2) / (2 * theta)),   Z ~ N(0, 1)

    ``theta = reversion_per_hour`` (0.05: half-life ~14 h), ``sigma =
    volatility_per_sqrt_hour`` (0.03: stationary spread of the log price ~0.095, i.e. ~10%).
    ``J`` is a jump, present with probability ``1 - exp(-jumps_per_hour * dt_h)`` (0.01/h: one
    every ~4 days), of size ``N(jump_mean_log, jump_sd_log)`` (0.25, 0.10: ~+28%, spot spikes
    when capacity tightens) that then decays at the reversion rate. The price is ``exp(x)``
    rounded to ``tick_usd`` (AWS quotes spot to 0.0001 USD), capped at ``cap_usd_per_hour`` (e.g.
    the on-demand price) and never below ``floor_fraction * base_usd_per_hour``. ``x[0] = mu``.

    Deterministic: the path is drawn from ``random.Random(seed)`` step by step from step 0, so
    a given seed gives the same prices whatever times are queried, in any order. Times before
    0 have the step-0 price.
    """

    base_usd_per_hour: float
    seed: int = 0
    step_s: float = 3600.0
    reversion_per_hour: float = 0.05
    volatility_per_sqrt_hour: float = 0.03
    jumps_per_hour: float = 0.01
    jump_mean_log: float = 0.25
    jump_sd_log: float = 0.10
    floor_fraction: float = 0.3
    cap_usd_per_hour: float | None = None
    tick_usd: float = 0.0001
    _walk: _Walk = field(default_factory=lambda: _Walk(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_price(self.base_usd_per_hour, "base_usd_per_hour")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InvalidInputError(f"seed must be an integer, got {self.seed!r}", field="seed")
        for name in ("step_s", "tick_usd"):
            _check_price(getattr(self, name), name)
        for name in (
            "reversion_per_hour",
            "volatility_per_sqrt_hour",
            "jumps_per_hour",
            "jump_sd_log",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidInputError(
                    f"{name} must be finite and >= 0, got {value!r}", field=name
                )
        if not math.isfinite(self.jump_mean_log):
            raise InvalidInputError("jump_mean_log must be finite", field="jump_mean_log")
        if not (0 < self.floor_fraction <= 1):
            raise InvalidInputError(
                f"floor_fraction must be in (0, 1], got {self.floor_fraction!r}",
                field="floor_fraction",
            )
        if self.cap_usd_per_hour is not None:
            _check_price(self.cap_usd_per_hour, "cap_usd_per_hour")
            if self.cap_usd_per_hour < self.floor_usd_per_hour:
                raise InvalidInputError("cap below the floor", field="cap_usd_per_hour")

    @classmethod
    def for_offering(
        cls, offering: PricedOffering, seed: int = 0, **params: Any
    ) -> StochasticSpotPrice:
        """A model around the offering's spot price, capped at its on-demand price, seeded by
        ``seed`` and the offering's spot key (so offerings move independently)."""
        if offering.spot_usd_per_hour is None:
            raise InvalidInputError(f"{offering.key(SPOT)}: no spot price", field="offering")
        return cls(
            base_usd_per_hour=offering.spot_usd_per_hour,
            seed=seed_int(seed, offering.key(SPOT)),
            cap_usd_per_hour=None
            if offering.ondemand_usd_per_hour is None
            else max(offering.ondemand_usd_per_hour, offering.spot_usd_per_hour),
            **params,
        )

    @property
    def floor_usd_per_hour(self) -> float:
        return self.floor_fraction * self.base_usd_per_hour

    def _price_of(self, x: float) -> float:
        price = round(math.exp(x) / self.tick_usd) * self.tick_usd
        if self.cap_usd_per_hour is not None:
            price = min(price, self.cap_usd_per_hour)
        return round(max(price, self.floor_usd_per_hour), 10)

    def _extend(self, k: int) -> None:
        """Draw the path up to step ``k`` (memoised; always from step 0, in order)."""
        walk = self._walk
        mu = math.log(self.base_usd_per_hour)
        if walk.rng is None:
            walk.rng = random.Random(self.seed)
            walk.x = mu
            walk.prices.append(self._price_of(mu))
        if len(walk.prices) > k:
            return
        dt_h = self.step_s / 3600.0
        theta = self.reversion_per_hour
        a = math.exp(-theta * dt_h)
        s = (
            self.volatility_per_sqrt_hour * math.sqrt((1 - a * a) / (2 * theta))
            if theta > 0
            else self.volatility_per_sqrt_hour * math.sqrt(dt_h)
        )
        p_jump = 1.0 - math.exp(-self.jumps_per_hour * dt_h)
        rng, x = walk.rng, walk.x
        while len(walk.prices) <= k:
            z = rng.gauss(0.0, 1.0)
            u = rng.random()
            jump = rng.gauss(self.jump_mean_log, self.jump_sd_log)
            x = mu + (x - mu) * a + s * z + (jump if u < p_jump else 0.0)
            walk.prices.append(self._price_of(x))
        walk.x = x

    def _step(self, t_s: float) -> int:
        if not math.isfinite(t_s):
            raise InvalidInputError(f"time must be finite, got {t_s!r}", field="t_s")
        return max(0, math.floor(t_s / self.step_s))

    def price_at(self, t_s: float) -> float:
        k = self._step(t_s)
        self._extend(k)
        return self._walk.prices[k]

    def change_points(self, start_s: float, end_s: float) -> list[tuple[float, float]]:
        check_window(start_s, end_s)
        current = self.price_at(start_s)
        out = [(start_s, current)]
        k = self._step(start_s) + 1
        while k * self.step_s < end_s:
            self._extend(k)
            price = self._walk.prices[k]
            if price != current:
                out.append((k * self.step_s, price))
                current = price
            k += 1
        return out
