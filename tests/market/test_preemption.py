"""Preemption models: Bamboo availability traces (both formats) and the advisor hazard model.

Expected counts are computed here from the raw trace files with plain Python, independently of
the parser: event traces by counting add/remove lines, count traces with the documented rule
"the count at time t is that of the last line in the file whose time is <= t".
"""

from __future__ import annotations

import csv
import math
import statistics
from datetime import UTC, datetime
from pathlib import Path

import pytest

from autoscaler.errors import DuplicateOfferingError, InvalidInputError, TraceFormatError
from autoscaler.market.catalog import Catalog, MarketOffering, load_catalog
from autoscaler.market.preemption import (
    BAMBOO_TRACES,
    HOURS_PER_MONTH,
    AvailabilityTrace,
    SpotHazardModel,
    bamboo_trace_path,
    band_hazard_per_hour,
    load_availability_trace,
    load_hazard_model,
)
from autoscaler.market.terms import (
    AWS_SPOT_NOTICE_S,
    BILLING_MINIMUM_S,
    GCP_SPOT_NOTICE_S,
    ON_DEMAND,
    SPOT,
    SPOT_NOTICE_S,
    billed_seconds,
    instance_cost_usd,
)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


# ------------------------------------------------------------------------- event traces


@pytest.mark.parametrize("name", ["g4dn-trace.csv", "p3-trace.csv"])
def test_event_traces_agree_with_the_raw_events(name: str) -> None:
    path = bamboo_trace_path(name)
    events = [(int(t), e, n) for t, e, n in csv.reader(path.read_text().splitlines())]
    trace = load_availability_trace(path)
    assert trace.kind == "events" and trace.instances is not None
    for t_ms in sorted({t for t, _, _ in events}):
        adds = sum(1 for t, e, _ in events if t <= t_ms and e == "add")
        removes = sum(1 for t, e, _ in events if t <= t_ms and e == "remove")
        assert trace.capacity_at(t_ms / 1000) == adds - removes
        alive = {n for t, e, n in events if t <= t_ms and e == "add"} - {
            n for t, e, n in events if t <= t_ms and e == "remove"
        }
        assert trace.instances_at(t_ms / 1000) == alive
    total_removes = sum(1 for _, e, _ in events if e == "remove")
    assert trace.preemptions_between(0.0, 1e9) == total_removes
    assert trace.additions_between(0.0, 1e9) == len(events) - total_removes
    # Half-open windows [t0, t1) in seconds.
    t0, t1 = 3600.0, 4 * 3600.0
    in_window = sum(1 for t, e, _ in events if e == "remove" and t0 <= t / 1000 < t1)
    assert trace.preemptions_between(t0, t1) == in_window
    assert sum(n for _, n in trace.preemption_times(t0, t1)) == in_window
    assert trace.capacity_at(-1.0) == 0
    # Milliseconds: the last event is at time_ms / 1000 seconds.
    assert trace.end_s == events[-1][0] / 1000


def test_g4dn_trace_facts() -> None:
    trace = load_availability_trace(bamboo_trace_path("g4dn-trace.csv"))
    assert trace.start_s == 480.0  # 480000 ms: node1 joins after 8 minutes
    assert trace.end_s == 38_760.0  # ~10.8 h
    assert max(trace.capacity) == 24


# ------------------------------------------------------------------------- count traces


def _count_lines(path: Path) -> list[tuple[datetime, int]]:
    out = []
    for raw in path.read_text().splitlines():
        if raw.strip():
            day, clock, count = (c.strip() for c in raw.split(","))
            out.append((datetime.fromisoformat(f"{day}T{clock}").replace(tzinfo=UTC), int(count)))
    return out


@pytest.mark.parametrize("name", ["gcloud/a100x1-east1b.txt", "gcloud/v100x1-east1c.txt"])
def test_count_traces_agree_with_the_raw_samples(name: str) -> None:
    path = bamboo_trace_path(name)
    lines = _count_lines(path)
    origin = min(t for t, _ in lines)
    trace = load_availability_trace(path)
    assert trace.kind == "counts" and trace.instances is None

    def expected(t: datetime) -> int:
        return [c for when, c in lines if when <= t][-1]  # last line in file order

    instants = sorted({t for t, _ in lines})
    drops = 0
    previous = None
    for t in instants:
        want = expected(t)
        assert trace.capacity_at((t - origin).total_seconds()) == want
        if previous is not None and want < previous:
            drops += previous - want
        previous = want
    assert trace.preemptions_between(0.0, 1e9) == drops
    assert trace.capacity_at(0.0) == lines[0][1]


def test_count_trace_reads_overlapping_samples() -> None:
    """The first v100 lines: 80 at 13:07:45, then 70 stamped 13:08:45 (before the repeats of 80
    at 13:08:45 and 13:09:45), then 60 at 13:09:45, 58 at 13:10:58."""
    trace = load_availability_trace(bamboo_trace_path("gcloud/v100x1-east1c.txt"))
    assert trace.times_s[:4] == (0.0, 60.0, 120.0, 193.0)
    assert trace.capacity[:4] == (80, 70, 60, 58)
    assert trace.preempted[:4] == (0, 10, 10, 2)


# ------------------------------------------------------------------------- bad traces


def _trace(tmp_path: Path, text: str, name: str = "trace.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_unknown_format_names_file_and_line(tmp_path: Path) -> None:
    path = _trace(tmp_path, "\n\n1638000000;+1;node\n")
    with pytest.raises(TraceFormatError) as err:
        load_availability_trace(path)
    assert (err.value.path, err.value.line) == (str(path), 3)
    assert "unknown availability trace format" in str(err.value)
    with pytest.raises(TraceFormatError) as err:
        load_availability_trace(_trace(tmp_path, "", "empty.txt"))
    assert err.value.line == 1


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("0,add,a\n60000,explode,a\n", 2, "event"),
        ("0,add,a\n60000,remove,b\n", 2, "node"),
        ("0,add,a\n60000,add,a\n", 2, "node"),
        ("60000,add,a\n0,add,b\n", 2, "time_ms"),
        ("0,add,a\nsoon,add,b\n", 2, "time_ms"),
        ("0,add,a\n60000,add,\n", 2, "node"),
        ("0,add,a\n60000,add\n", 2, None),
        ("2021-12-10, 13:07:45, 80\n2021-12-10, 13:08:45, many\n", 2, "count"),
        ("2021-12-10, 13:07:45, 80\n2021-12-10, 25:08:45, 3\n", 2, "time"),
        ("2021-12-10, 13:07:45, 80\n2021-13-10, 13:08:45, 3\n", 2, "date"),
    ],
)
def test_bad_trace_lines(tmp_path: Path, text: str, line: int, field: str | None) -> None:
    path = _trace(tmp_path, text)
    with pytest.raises(TraceFormatError) as err:
        load_availability_trace(path)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), line, field)


def test_headers_are_accepted(tmp_path: Path) -> None:
    events = load_availability_trace(
        _trace(tmp_path, "time_ms,event,node\n0,add,a\n0,add,b\n1000,remove,a\n")
    )
    assert events.times_s == (0.0, 1.0) and events.capacity == (2, 1)
    assert events.added == (2, 0) and events.preempted == (0, 1)
    counts = load_availability_trace(
        _trace(tmp_path, "date,time,count\n2021-12-10, 00:00:00, 5\n2021-12-10, 00:01:00, 3\n")
    )
    assert counts.times_s == (0.0, 60.0) and counts.preemptions_between(0, 61) == 2
    with pytest.raises(InvalidInputError):
        counts.instances_at(0.0)


def test_trace_invariants_are_checked() -> None:
    with pytest.raises(InvalidInputError):
        AvailabilityTrace("x", "counts", (0.0, 1.0), (2, 3), (2, 0), (0, 0))
    with pytest.raises(InvalidInputError):
        AvailabilityTrace("x", "counts", (1.0, 0.0), (2, 2), (2, 0), (0, 0))
    with pytest.raises(InvalidInputError):
        bamboo_trace_path("nope.csv")
    assert all(bamboo_trace_path(n).is_file() for n in BAMBOO_TRACES)


# ------------------------------------------------------------------------- hazard model


def test_band_conversion() -> None:
    assert band_hazard_per_hour("<5%") == pytest.approx(-math.log(1 - 0.025) / 720)
    assert band_hazard_per_hour(">20%") == pytest.approx(-math.log(1 - 0.25) / 720)
    rates = [band_hazard_per_hour(b) for b in ("<5%", "5-10%", "10-15%", "15-20%", ">20%")]
    assert rates == sorted(rates)
    with pytest.raises(InvalidInputError):
        band_hazard_per_hour("rare")


def test_hazard_from_the_shipped_advisor(catalog: Catalog) -> None:
    model = load_hazard_model(seed=3)
    o = catalog.get("aws", "g4dn.12xlarge", "use1-az1")
    band = model.bands[("us-east-1", "g4dn.12xlarge")]
    assert (band.label, band.source_date) == ("10-15%", "2025-06-28")
    assert model.hazard_per_hour(o) == pytest.approx(-math.log(1 - 0.125) / HOURS_PER_MONTH)
    assert model.hazard_per_hour(MarketOffering(o, SPOT, 1.5)) == model.hazard_per_hour(o)
    on_demand = MarketOffering(o, ON_DEMAND, 3.912)
    assert model.hazard_per_hour(on_demand) == 0.0
    assert model.sample_preemption_s(on_demand, "i-1", 0.0) == math.inf
    assert model.survival(o, 30 * 86400.0) == pytest.approx(1 - 0.125)


def test_sampler_is_deterministic_per_seed_and_instance(catalog: Catalog) -> None:
    o = catalog.get("aws", "g4dn.12xlarge", "use1-az1")
    a, b = load_hazard_model(seed=1), load_hazard_model(seed=1)
    assert a.sample_preemption_s(o, "i-0abc", 100.0) == b.sample_preemption_s(o, "i-0abc", 100.0)
    t = a.sample_preemption_s(o, "i-0abc", 100.0)
    assert a.sample_preemption_s(o, "i-0abc", 200.0) == t + 100.0  # relative to the launch
    assert a.sample_preemption_s(o, "i-0abd", 100.0) != t
    assert load_hazard_model(seed=2).sample_preemption_s(o, "i-0abc", 100.0) != t


def test_sampled_rate_matches_the_band(catalog: Catalog) -> None:
    o = catalog.get("aws", "g4dn.12xlarge", "use1-az1")  # 10-15%: 12.5% a month
    model = load_hazard_model(seed=11)
    rate = model.hazard_per_hour(o)
    lives_h = [model.sample_preemption_s(o, f"node-{i}", 0.0) / 3600 for i in range(20_000)]
    # Mean life 1/rate (~5,400 h); its standard error with 20,000 draws is ~0.7%.
    assert statistics.fmean(lives_h) == pytest.approx(1 / rate, rel=0.03)
    within_month = sum(1 for h in lives_h if h <= HOURS_PER_MONTH) / len(lives_h)
    assert within_month == pytest.approx(0.125, abs=0.01)


def test_offerings_without_a_band(catalog: Catalog) -> None:
    gcp = catalog.get("gcp", "a2-highgpu-1g", "us-central1")
    with pytest.raises(InvalidInputError):
        load_hazard_model().hazard_per_hour(gcp)
    model = load_hazard_model(default_band="5-10%")
    assert model.hazard_per_hour(gcp) == band_hazard_per_hour("5-10%")
    with pytest.raises(InvalidInputError):
        SpotHazardModel({}, default_band="often")
    with pytest.raises(InvalidInputError):
        model.sample_preemption_s(gcp, "", 0.0)


ADVISOR_HEADER = (
    "region,os,instance_type,vcpus,memory_gib,savings_vs_ondemand_pct,interruption_range_index,"
    "interruption_frequency_label,source_repo,source_path,source_commit_date\n"
)
ADVISOR_ROW = "us-east-1,Linux,g4dn.xlarge,4,16.0,70,1,5-10%,r,p,2025-06-28\n"


def test_bad_advisor_files(tmp_path: Path) -> None:
    path = tmp_path / "adv.csv"
    path.write_text(ADVISOR_HEADER + ADVISOR_ROW + ADVISOR_ROW)
    with pytest.raises(DuplicateOfferingError) as dup:
        load_hazard_model(path)
    assert (dup.value.line, dup.value.other_line) == (3, 2)
    path.write_text(ADVISOR_HEADER + ADVISOR_ROW.replace("5-10%", "sometimes"))
    with pytest.raises(TraceFormatError) as err:
        load_hazard_model(path)
    assert (err.value.line, err.value.field) == (2, "interruption_frequency_label")


# ------------------------------------------------------------------------- constants


def test_notice_and_billing_constants() -> None:
    assert AWS_SPOT_NOTICE_S == SPOT_NOTICE_S["aws"] == 120.0
    assert GCP_SPOT_NOTICE_S == SPOT_NOTICE_S["gcp"] == 30.0
    assert BILLING_MINIMUM_S == 60.0
    assert billed_seconds(0.0) == 0.0
    assert billed_seconds(0.5) == 60.0
    assert billed_seconds(61.2) == 62.0
    assert instance_cost_usd(3.6, 30.0) == pytest.approx(0.06)
    assert instance_cost_usd(3.6, 3600.0) == pytest.approx(3.6)
    with pytest.raises(InvalidInputError):
        billed_seconds(math.inf)
