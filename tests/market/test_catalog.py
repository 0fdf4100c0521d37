"""The price catalogue: the shipped AWS and GCP files, N1 composition, keys, and bad input.

Expected figures are read from the raw shipped CSVs with the ``csv`` module in the tests
themselves, so the tests check the loader's rules, not its own output.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from autoscaler.decide.views import OfferingRef
from autoscaler.errors import DuplicateOfferingError, InvalidInputError, TraceFormatError
from autoscaler.market.catalog import (
    AWS_NETWORK_GBPS,
    CATALOG_COLUMNS,
    Catalog,
    PricedOffering,
    load_catalog,
    n1_host_for,
)
from autoscaler.market.files import prices_dir
from autoscaler.market.terms import ON_DEMAND, SPOT

AWS_CSV = prices_dir() / "aws_gpu.csv"
GCP_CSV = prices_dir() / "gcp_gpu.csv"
N1_CSV = prices_dir() / "gcp_n1_host.csv"


def _raw(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def test_shipped_aws_g4dn_12xlarge_us_east_1(catalog: Catalog) -> None:
    offerings = list(
        catalog.filter(provider="aws", region="us-east-1", instance_type="g4dn.12xlarge")
    )
    assert len(offerings) == 5  # use1-az1, -az2, -az4, -az5, -az6
    for o in offerings:
        assert o.ondemand_usd_per_hour == 3.912
        assert o.spot_usd_per_hour is not None  # the data README's "1.27-1.52", to the cent:
        assert 1.27 <= round(o.spot_usd_per_hour, 2) <= 1.52
        assert (o.gpu_type, o.gpus, o.vcpus, o.memory_gib) == ("T4", 4, 48, 192.0)
        assert o.network_gbps == 50.0
        assert o.price_source == "skypilot-org/skypilot-catalog"
        assert o.price_date == "~2024-12..2025-06"
    az6 = catalog.get("aws", "g4dn.12xlarge", "use1-az6")
    assert az6.spot_usd_per_hour == 1.2684


def test_every_priced_raw_row_is_loaded(catalog: Catalog) -> None:
    """Rows are kept unless the GPU count is fractional or no price at all is published."""
    expected = 0
    for path in (AWS_CSV, GCP_CSV):
        for row in _raw(path):
            whole = float(row["gpu_count"]) == int(float(row["gpu_count"]))
            priced = bool(row["ondemand_usd_per_hour"] or row["spot_usd_per_hour"])
            expected += whole and priced
    assert len(catalog) == expected
    assert len(catalog) + len(catalog.skipped) == len(_raw(AWS_CSV)) + len(_raw(GCP_CSV))
    assert any("g4-standard-6 has 0.125 GPUs" in s for s in catalog.skipped)
    assert any("p5e.48xlarge in eu-north-1 has no price" in s for s in catalog.skipped)


def test_offering_without_on_demand_price_has_only_spot(catalog: Catalog) -> None:
    o = catalog.get("aws", "p5e.48xlarge", "use2-az1")
    assert o.ondemand_usd_per_hour is None and o.spot_usd_per_hour == 16.3895
    entries = list(Catalog([o]).offerings())
    assert [(e.market, e.usd_per_hour) for e in entries] == [(SPOT, 16.3895)]
    with pytest.raises(InvalidInputError):
        Catalog([o]).lookup(o.key(ON_DEMAND))


def test_gcp_bundle_rows_are_priced_per_region(catalog: Catalog) -> None:
    (raw,) = [
        r
        for r in _raw(GCP_CSV)
        if r["instance_type"] == "a2-highgpu-1g" and r["region"] == "us-central1"
    ]
    o = catalog.get("gcp", "a2-highgpu-1g", "us-central1")
    assert o.zone == o.region == "us-central1"
    assert o.ondemand_usd_per_hour == pytest.approx(float(raw["ondemand_usd_per_hour"]))
    assert o.spot_usd_per_hour == pytest.approx(float(raw["spot_usd_per_hour"]))
    assert (o.gpu_type, o.gpus, o.vcpus) == ("A100", 1, 12)
    assert o.price_date == "2026-07-30" and o.network_gbps is None


@pytest.mark.parametrize(
    ("gpus", "host"), [(1, "n1-standard-8"), (2, "n1-standard-16"), (4, "n1-standard-32")]
)
def test_gcp_attached_gpus_get_an_n1_host_from_the_same_region(
    catalog: Catalog, gpus: int, host: str
) -> None:
    assert n1_host_for(gpus) == host
    gpu_rows = [
        r
        for r in _raw(GCP_CSV)
        if r["instance_type"] == f"n1-*+nvidia-tesla-t4 x{gpus}" and r["zone"] == "us-central1-a"
    ]
    (gpu_row,) = gpu_rows
    (host_row,) = [
        r for r in _raw(N1_CSV) if r["instance_type"] == host and r["region"] == "us-central1"
    ]
    o = catalog.get("gcp", f"{host}+{gpus}xnvidia-tesla-t4", "us-central1-a")
    want_od = float(gpu_row["ondemand_usd_per_hour"]) + float(host_row["ondemand_usd_per_hour"])
    want_spot = float(gpu_row["spot_usd_per_hour"]) + float(host_row["spot_usd_per_hour"])
    assert o.ondemand_usd_per_hour == pytest.approx(want_od, abs=1e-9)
    assert o.spot_usd_per_hour == pytest.approx(want_spot, abs=1e-9)
    assert (o.gpus, o.gpu_type, o.region) == (gpus, "T4", "us-central1")
    assert (o.vcpus, o.memory_gib) == (int(host_row["vcpus"]), float(host_row["memory_gib"]))
    assert "n1-standard" in o.price_source and "(host)" in o.price_date


def test_every_attached_gpu_row_is_composed(catalog: Catalog) -> None:
    gpu_only = [r for r in _raw(GCP_CSV) if r["price_scope"] == "gpu_only_add_n1_host_price"]
    composed = [o for o in catalog if o.provider == "gcp" and o.instance_type.startswith("n1-")]
    assert len(composed) == len(gpu_only) == 166
    assert all(o.vcpus == 8 * o.gpus for o in composed)


def test_n1_host_rule_rejects_counts_without_a_shape() -> None:
    for bad in (0, 3, 13):
        with pytest.raises(InvalidInputError):
            n1_host_for(bad)


def test_keys_follow_offering_ref_and_look_up(catalog: Catalog) -> None:
    entries = list(catalog.filter(region="us-east-1", gpu_type="t4").offerings())
    assert entries and {e.market for e in entries} == {SPOT, ON_DEMAND}
    for e in entries:
        o = e.offering
        assert e.key == OfferingRef(o.provider, o.instance_type, o.zone, e.market).key
        assert e.key == f"{o.provider}/{o.instance_type}/{o.zone}/{e.market}"
        assert catalog.lookup(e.key) == e
        assert e.usd_per_gpu_hour == pytest.approx(e.usd_per_hour / o.gpus)
    assert catalog.lookup("aws/g4dn.12xlarge/use1-az1/on-demand").usd_per_hour == 3.912
    for bad in ("aws/g4dn.12xlarge/use1-az1", "aws/nope/use1-az1/spot", "a/b/c/d/e"):
        with pytest.raises(InvalidInputError):
            catalog.lookup(bad)
    with pytest.raises(InvalidInputError):
        catalog.lookup("aws/g4dn.12xlarge/use1-az1/reserved")


def test_filters(catalog: Catalog) -> None:
    t4 = catalog.filter(gpu_type="T4", provider="aws", zone="use1-az4")
    assert len(t4) > 0 and all(o.gpu_type == "T4" and o.zone == "use1-az4" for o in t4)
    g5 = catalog.filter(instance_type="g5.*", region="eu-west-1")
    assert len(g5) > 0 and all(o.instance_type.startswith("g5.") for o in g5)
    assert len(catalog.filter(provider="azure")) == 0
    spot_only = list(catalog.filter(provider="aws").offerings(SPOT))
    assert spot_only and all(e.market == SPOT for e in spot_only)


def test_network_bandwidth_table(catalog: Catalog) -> None:
    assert AWS_NETWORK_GBPS["g4dn.xlarge"] == 25.0  # "up to 25" counts as 25
    assert catalog.get("aws", "p4d.24xlarge", "use1-az2").network_gbps == 400.0
    g6e = next(iter(catalog.filter(instance_type="g6e.xlarge")))
    assert g6e.network_gbps is None
    families = ("g4dn.", "g5.", "g6.", "p3.", "p3dn.", "p4d.", "p4de.", "p5.")
    covered = [o for o in catalog.filter(provider="aws") if o.instance_type.startswith(families)]
    assert covered and all(o.network_gbps is not None for o in covered)


def test_catalog_rejects_duplicates_and_bad_offerings(catalog: Catalog) -> None:
    o = catalog.get("aws", "g4dn.xlarge", "use1-az1")
    with pytest.raises(InvalidInputError):
        Catalog([o, o])
    fields = {
        "gpus": 0,
        "zone": "a/b",
        "ondemand_usd_per_hour": -1.0,
        "spot_usd_per_hour": math.nan,
        "memory_gib": 0.0,
    }
    for name, value in fields.items():
        args = {**o.__dict__, name: value}
        with pytest.raises(InvalidInputError) as err:
            PricedOffering(**args)
        assert err.value.field == name
    with pytest.raises(InvalidInputError):
        PricedOffering(**{**o.__dict__, "ondemand_usd_per_hour": None, "spot_usd_per_hour": None})


# ------------------------------------------------------------------------------ bad input

AWS_ROW = {
    "provider": "aws",
    "instance_type": "g4dn.xlarge",
    "gpu_model": "T4",
    "gpu_count": "1",
    "vcpus": "4",
    "memory_gib": "16",
    "region": "us-east-1",
    "zone": "use1-az1",
    "ondemand_usd_per_hour": "0.526",
    "spot_usd_per_hour": "0.2",
    "source_repo": "test",
    "source_path": "test",
    "source_commit_date": "2025-01-01",
}


def _write(path: Path, rows: list[dict[str, str]], columns: list[str] | None = None) -> Path:
    columns = columns or list(rows[0])
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _second_row(**changes: str) -> list[dict[str, str]]:
    """A good row (line 2) and the row under test (line 3), on another zone."""
    return [AWS_ROW, {**AWS_ROW, "zone": "use1-az2", **changes}]


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"ondemand_usd_per_hour": "abc"}, "ondemand_usd_per_hour", "not a number"),
        ({"ondemand_usd_per_hour": "-3.9"}, "ondemand_usd_per_hour", "negative"),
        ({"spot_usd_per_hour": "-0.1"}, "spot_usd_per_hour", "negative"),
        ({"spot_usd_per_hour": "x1"}, "spot_usd_per_hour", "not a number"),
        ({"ondemand_usd_per_hour": "0"}, "ondemand_usd_per_hour", "must be > 0"),
        ({"spot_usd_per_hour": "inf"}, "spot_usd_per_hour", "not finite"),
        ({"gpu_count": ""}, "gpu_count", "missing value"),
        ({"vcpus": "4.5"}, "vcpus", "not an integer"),
        ({"zone": ""}, "zone", "missing value"),
        ({"provider": ""}, "provider", "missing value"),
        ({"instance_type": "g4dn/x"}, "instance_type", "not allowed"),
    ],
)
def test_bad_cells_name_file_line_and_field(
    tmp_path: Path, changes: dict[str, str], field: str, message: str
) -> None:
    path = _write(tmp_path / "prices.csv", _second_row(**changes))
    with pytest.raises(TraceFormatError) as err:
        load_catalog([path])
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 3, field)
    assert message in str(err.value)
    assert f"{path}:3 [{field}]" in str(err.value)


def test_empty_spot_cell_is_no_spot_price(tmp_path: Path) -> None:
    path = _write(tmp_path / "prices.csv", _second_row(spot_usd_per_hour=""))
    book = load_catalog([path])
    assert book.get("aws", "g4dn.xlarge", "use1-az2").spot_usd_per_hour is None
    assert [e.market for e in book.offerings()] == [SPOT, ON_DEMAND, ON_DEMAND]


@pytest.mark.parametrize("missing", ["spot_usd_per_hour", "zone", "source_commit_date"])
def test_missing_column_is_reported_on_line_1(tmp_path: Path, missing: str) -> None:
    columns = [c for c in CATALOG_COLUMNS if c != missing]
    path = _write(tmp_path / "prices.csv", [AWS_ROW], columns)
    with pytest.raises(TraceFormatError) as err:
        load_catalog([path])
    assert (err.value.line, err.value.field) == (1, missing)
    assert "missing column" in str(err.value)


def test_duplicate_offering_names_both_lines(tmp_path: Path) -> None:
    path = _write(tmp_path / "prices.csv", [AWS_ROW, {**AWS_ROW, "zone": "use1-az2"}, AWS_ROW])
    with pytest.raises(DuplicateOfferingError) as err:
        load_catalog([path])
    e = err.value
    assert (e.path, e.line, e.other_path, e.other_line) == (str(path), 4, str(path), 2)
    assert "aws/g4dn.xlarge/use1-az1" in str(e) and f"{path}:2" in str(e)


def test_duplicate_across_files(tmp_path: Path) -> None:
    first = _write(tmp_path / "a.csv", [AWS_ROW])
    second = _write(tmp_path / "b.csv", [{**AWS_ROW, "ondemand_usd_per_hour": "0.6"}])
    with pytest.raises(DuplicateOfferingError) as err:
        load_catalog([first, second])
    assert (err.value.path, err.value.line) == (str(second), 2)
    assert (err.value.other_path, err.value.other_line) == (str(first), 2)


GCP_GPU_ROW = {
    **AWS_ROW,
    "provider": "gcp",
    "instance_type": "n1-*+nvidia-tesla-t4 x1",
    "vcpus": "",
    "memory_gib": "",
    "region": "us-central1",
    "zone": "us-central1-a",
    "ondemand_usd_per_hour": "0.35",
    "spot_usd_per_hour": "0.14",
    "price_scope": "gpu_only_add_n1_host_price",
}
HOST_ROW = {
    "provider": "gcp",
    "instance_type": "n1-standard-8",
    "vcpus": "8",
    "memory_gib": "30",
    "region": "us-central1",
    "ondemand_usd_per_hour": "0.38",
    "spot_usd_per_hour": "",
    "source_repo": "host-source",
    "source_path": "x",
    "source_commit_date": "2026-07-30",
}


def test_composition_with_custom_host_file(tmp_path: Path) -> None:
    hosts = _write(tmp_path / "hosts.csv", [HOST_ROW])
    bundle = {**GCP_GPU_ROW, "instance_type": "g2-standard-4", "gpu_model": "L4", "vcpus": "4"}
    bundle |= {"memory_gib": "16", "zone": "", "price_scope": "bundle_vm_incl_gpu"}
    path = _write(tmp_path / "gcp.csv", [GCP_GPU_ROW, bundle])
    book = load_catalog([path], n1_hosts=hosts)
    o = book.get("gcp", "n1-standard-8+1xnvidia-tesla-t4", "us-central1-a")
    assert o.ondemand_usd_per_hour == pytest.approx(0.73)
    assert o.spot_usd_per_hour is None  # the host has no spot price
    assert book.get("gcp", "g2-standard-4", "us-central1").zone == "us-central1"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"price_scope": "per_gpu"}, "price_scope"),
        ({"price_scope": ""}, "price_scope"),
        ({"instance_type": "n1-standard-8"}, "instance_type"),
        ({"gpu_count": "2"}, "gpu_count"),
        ({"region": "mars-north1", "zone": "mars-north1-a"}, "region"),
        ({"zone": ""}, "zone"),
    ],
)
def test_bad_gcp_rows(tmp_path: Path, changes: dict[str, str], field: str) -> None:
    hosts = _write(tmp_path / "hosts.csv", [HOST_ROW])
    path = _write(tmp_path / "gcp.csv", [{**GCP_GPU_ROW, **changes}])
    with pytest.raises(TraceFormatError) as err:
        load_catalog([path], n1_hosts=hosts)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 2, field)


def test_bad_host_file_is_named(tmp_path: Path) -> None:
    hosts = _write(tmp_path / "hosts.csv", [HOST_ROW, {**HOST_ROW, "vcpus": "eight"}])
    path = _write(tmp_path / "gcp.csv", [GCP_GPU_ROW])
    with pytest.raises(TraceFormatError) as err:
        load_catalog([path], n1_hosts=hosts)
    assert (err.value.path, err.value.line, err.value.field) == (str(hosts), 3, "vcpus")
    dup = _write(tmp_path / "dup.csv", [HOST_ROW, HOST_ROW])
    with pytest.raises(DuplicateOfferingError) as err2:
        load_catalog([path], n1_hosts=dup)
    assert (err2.value.line, err2.value.other_line) == (3, 2)


def test_unreadable_or_empty_files(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError) as err:
        load_catalog([tmp_path / "nope.csv"])
    assert "cannot read" in str(err.value)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(TraceFormatError) as err:
        load_catalog([empty])
    assert err.value.line == 1
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00provider")
    with pytest.raises(TraceFormatError):
        load_catalog([binary])
