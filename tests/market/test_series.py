"""Spot price series: constant, step (and CSV), the real GCP history, the stochastic model."""

from __future__ import annotations

import csv
import itertools
import math
import statistics
from datetime import date
from pathlib import Path

import pytest

from autoscaler.errors import InvalidInputError, TraceFormatError
from autoscaler.market.catalog import load_catalog
from autoscaler.market.files import prices_dir
from autoscaler.market.series import (
    ConstantPrice,
    CsvPriceSeries,
    GcpHistorySeries,
    PriceSeries,
    StepPriceSeries,
    StochasticSpotPrice,
    load_gcp_price_history,
)
from autoscaler.market.terms import ON_DEMAND, SPOT

DAY_S = 86400.0


def test_constant_price() -> None:
    p = ConstantPrice(0.5)
    assert isinstance(p, PriceSeries)
    assert p.price_at(-1e9) == p.price_at(1e9) == 0.5
    assert p.change_points(10.0, 1000.0) == [(10.0, 0.5)]
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(InvalidInputError):
            ConstantPrice(bad)
    with pytest.raises(InvalidInputError):
        p.change_points(5.0, 1.0)


def test_step_semantics() -> None:
    s = StepPriceSeries.from_points([(0.0, 1.0), (100.0, 2.0), (200.0, 2.0), (300.0, 0.5)])
    assert isinstance(s, PriceSeries)
    assert s.price_at(-50.0) == 1.0  # the first price holds backwards
    assert s.price_at(0.0) == 1.0
    assert s.price_at(99.999) == 1.0
    assert s.price_at(100.0) == 2.0  # a change takes effect at its own time
    assert s.price_at(299.0) == 2.0 and s.price_at(1e12) == 0.5
    # First point at the window start; then only real changes inside [start, end).
    assert s.change_points(50.0, 300.0) == [(50.0, 1.0), (100.0, 2.0)]
    assert s.change_points(50.0, 300.001) == [(50.0, 1.0), (100.0, 2.0), (300.0, 0.5)]
    assert s.change_points(100.0, 100.0) == [(100.0, 2.0)]
    for times, prices in [
        ((), ()),
        ((0.0, 0.0), (1.0, 1.0)),
        ((1.0, 0.0), (1.0, 2.0)),
        ((0.0,), (0.0,)),
    ]:
        with pytest.raises(InvalidInputError):
            StepPriceSeries(times, prices)


def _csv(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_csv_price_series(tmp_path: Path) -> None:
    path = _csv(tmp_path / "p.csv", "time_s,usd_per_hour\n0,0.30\n3600,0.42\n\n7200,0.35\n")
    s = CsvPriceSeries.load(path)
    assert s.path == str(path)
    assert [s.price_at(t) for t in (0, 3599, 3600, 7199, 7200)] == [0.30, 0.30, 0.42, 0.42, 0.35]
    assert s.change_points(0, 10_000) == [(0, 0.30), (3600.0, 0.42), (7200.0, 0.35)]


@pytest.mark.parametrize(
    ("body", "line", "field", "message"),
    [
        ("0,0.3\n0,0.4\n", 3, "time_s", "not after"),
        ("0,0.3\n10,-0.4\n", 3, "usd_per_hour", "negative"),
        ("0,0.3\n10,cheap\n", 3, "usd_per_hour", "not a number"),
        ("0,0.3\n10,\n", 3, "usd_per_hour", "missing value"),
        ("zero,0.3\n", 2, "time_s", "not a number"),
        ("0,0\n", 2, "usd_per_hour", "must be > 0"),
    ],
)
def test_csv_series_errors(tmp_path: Path, body: str, line: int, field: str, message: str) -> None:
    path = _csv(tmp_path / "p.csv", "time_s,usd_per_hour\n" + body)
    with pytest.raises(TraceFormatError) as err:
        CsvPriceSeries.load(path)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), line, field)
    assert message in str(err.value)


def test_csv_series_missing_column_or_rows(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError) as err:
        CsvPriceSeries.load(_csv(tmp_path / "a.csv", "t,usd_per_hour\n0,1\n"))
    assert (err.value.line, err.value.field) == (1, "time_s")
    with pytest.raises(TraceFormatError) as err:
        CsvPriceSeries.load(_csv(tmp_path / "b.csv", "time_s,usd_per_hour\n"))
    assert "no data rows" in str(err.value)


# --------------------------------------------------------------------------- GCP history

HISTORY = prices_dir() / "gcp_gpu_price_history.csv"


def _raw_price(instance_type: str, region: str, when: date, column: str) -> float:
    """The recorded price in effect on ``when``: the last row of that key dated <= when
    (file order breaks ties), skipping empty cells."""
    best: tuple[str, float] | None = None
    with open(HISTORY, newline="") as handle:
        for row in csv.DictReader(handle):
            if row["instance_type"] != instance_type or row["region"] != region:
                continue
            in_effect = row[column] and row["snapshot_date"] <= when.isoformat()
            if in_effect and (best is None or row["snapshot_date"] >= best[0]):
                best = (row["snapshot_date"], float(row[column]))
    assert best is not None
    return best[1]


def test_gcp_history_returns_recorded_spot_prices() -> None:
    start = date(2023, 1, 1)
    s = GcpHistorySeries.load("a2-highgpu-1g", "us-central1", market=SPOT, start_date=start)
    assert (s.instance_type, s.region, s.market, s.start_date) == (
        "a2-highgpu-1g",
        "us-central1",
        SPOT,
        "2023-01-01",
    )
    # The row of 2023-06-22 (1.21219 USD/h) holds until the next row, of 2023-08-10.
    july = (date(2023, 7, 1) - start).days * DAY_S
    assert s.price_at(july) == 1.21219
    assert s.price_at(july) == _raw_price(
        "a2-highgpu-1g", "us-central1", date(2023, 7, 1), "spot_usd_per_hour"
    )
    june22 = (date(2023, 6, 22) - start).days * DAY_S
    assert s.price_at(june22) == 1.21219 and s.price_at(june22 - 1) == 1.1020155
    for day in (date(2024, 3, 1), date(2025, 6, 30), date(2026, 7, 29)):
        t = (day - start).days * DAY_S
        assert s.price_at(t) == _raw_price("a2-highgpu-1g", "us-central1", day, "spot_usd_per_hour")
    # Spot prices start in 2023-05: that is the first point of the series.
    assert s.times_s[0] == (date(2023, 5, 8) - start).days * DAY_S
    points = s.change_points(june22 - DAY_S, (date(2023, 10, 1) - start).days * DAY_S)
    assert [p for _, p in points] == [1.1020155, 1.21219, 1.45467, 1.469355]


def test_gcp_history_on_demand_and_default_origin() -> None:
    history = load_gcp_price_history()
    assert history.first_date == date(2022, 2, 9)
    s = history.series("a2-highgpu-1g", "us-central1", market=ON_DEMAND)
    assert s.times_s[0] == 0.0 and s.usd_per_hour[0] == 3.558986
    assert s.price_at(7 * DAY_S) == 3.673385  # the 2022-02-16 row
    assert load_gcp_price_history() is history  # parsed once
    assert ("g2-standard-4", "us-central1") in history.series_keys()


def test_gcp_history_unknown_key_or_bad_date() -> None:
    history = load_gcp_price_history()
    with pytest.raises(InvalidInputError):
        history.series("n1-standard-8", "us-central1")
    with pytest.raises(InvalidInputError):
        history.series("a2-highgpu-1g", "us-central1", start_date="July 2023")
    with pytest.raises(InvalidInputError):
        history.series("a2-highgpu-1g", "us-central1", market="reserved")


HISTORY_HEADER = (
    "snapshot_date,commit,instance_type,gpu_model,gpu_count,vcpus,memory_gib,region,"
    "ondemand_usd_per_hour,spot_usd_per_hour\n"
)


def test_gcp_history_same_date_later_row_wins(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text(
        HISTORY_HEADER
        + "2024-01-01,a,x-1g,L4,1,4,16,r1,1.0,\n"
        + "2024-01-08,b,x-1g,L4,1,4,16,r1,1.0,0.30\n"
        + "2024-01-08,c,x-1g,L4,1,4,16,r1,1.0,0.31\n"
        + "2024-01-15,d,x-1g,L4,1,4,16,r1,1.1,0.31\n"
        + "2024-01-22,e,x-1g,L4,1,4,16,r1,1.1,0.25\n"
    )
    history = load_gcp_price_history(path)
    spot = history.series("x-1g", "r1", start_date="2024-01-01")
    assert spot.times_s == (7 * DAY_S, 21 * DAY_S)
    assert spot.usd_per_hour == (0.31, 0.25)
    od = history.series("x-1g", "r1", market=ON_DEMAND, start_date=date(2024, 1, 1))
    assert od.change_points(0, 30 * DAY_S) == [(0, 1.0), (14 * DAY_S, 1.1)]


def test_gcp_history_bad_rows(tmp_path: Path) -> None:
    for row, field in [
        ("2024-13-01,a,x-1g,L4,1,4,16,r1,1.0,\n", "snapshot_date"),
        ("2024-01-01,a,x-1g,L4,1,4,16,r1,,0.3\n", "ondemand_usd_per_hour"),
        ("2024-01-01,a,x-1g,L4,1,4,16,r1,1.0,-0.3\n", "spot_usd_per_hour"),
    ]:
        path = tmp_path / f"{field}.csv"
        path.write_text(HISTORY_HEADER + "2024-01-01,a,x-1g,L4,1,4,16,r1,1.0,\n" + row)
        with pytest.raises(TraceFormatError) as err:
            load_gcp_price_history(path)
        assert (err.value.line, err.value.field) == (3, field)


# ------------------------------------------------------------------------ stochastic model


def test_stochastic_is_deterministic_per_seed_and_query_order() -> None:
    a = StochasticSpotPrice(1.0, seed=7)
    b = StochasticSpotPrice(1.0, seed=7)
    late_first = [b.price_at(t) for t in (50 * 3600.0, 3 * 3600.0, 0.0)]
    assert late_first == [a.price_at(t) for t in (50 * 3600.0, 3 * 3600.0, 0.0)]
    assert a.change_points(0, 100 * 3600) == b.change_points(0, 100 * 3600)
    c = StochasticSpotPrice(1.0, seed=8)
    assert a.change_points(0, 100 * 3600) != c.change_points(0, 100 * 3600)
    assert a == b and isinstance(a, PriceSeries)


def test_stochastic_steps_floor_cap_and_level() -> None:
    s = StochasticSpotPrice(2.0, seed=1)
    assert s.price_at(-100.0) == s.price_at(0.0) == 2.0
    points = s.change_points(1800.0, 48 * 3600.0)
    assert points[0] == (1800.0, 2.0)
    assert all(t % 3600 == 0 for t, _ in points[1:])
    assert all(s.price_at(t) == p for t, p in points)
    assert all(p1 != p0 for (_, p0), (_, p1) in itertools.pairwise(points))
    # Over a long run the price stays around its base (mean reversion).
    prices = [s.price_at(h * 3600.0) for h in range(5000)]
    geo = math.exp(statistics.fmean(math.log(p) for p in prices))
    assert 0.9 * 2.0 < geo < 1.2 * 2.0
    # Wild parameters: the floor and the cap still hold, prices are on the tick grid.
    wild = StochasticSpotPrice(
        1.0, seed=3, volatility_per_sqrt_hour=0.8, floor_fraction=0.5, cap_usd_per_hour=1.6
    )
    wild_prices = [wild.price_at(h * 3600.0) for h in range(2000)]
    assert min(wild_prices) == 0.5 and max(wild_prices) == 1.6
    assert all(abs(p * 10_000 - round(p * 10_000)) < 1e-6 for p in wild_prices)


def test_stochastic_for_offering_and_validation() -> None:
    o = load_catalog().get("aws", "g4dn.12xlarge", "use1-az1")
    s = StochasticSpotPrice.for_offering(o, seed=0)
    assert s.base_usd_per_hour == o.spot_usd_per_hour and s.cap_usd_per_hour == 3.912
    other = load_catalog().get("aws", "g4dn.12xlarge", "use1-az2")
    t = StochasticSpotPrice.for_offering(other, seed=0)
    assert s.seed != t.seed  # each offering moves on its own
    with pytest.raises(InvalidInputError):
        StochasticSpotPrice(1.0, floor_fraction=0.0)
    with pytest.raises(InvalidInputError):
        StochasticSpotPrice(1.0, cap_usd_per_hour=0.1)
    with pytest.raises(InvalidInputError):
        StochasticSpotPrice(1.0, volatility_per_sqrt_hour=-1.0)
    with pytest.raises(InvalidInputError):
        s.price_at(math.nan)
