"""``coadapt prices list`` and ``coadapt prices refresh`` (typer's CliRunner).

The AWS refresh runs against a real moto server process for EC2 (zones, instance type
offerings, ``DescribeSpotPriceHistory``; moto serves every spot price as 0.00001 dated 2006,
which is what the written file must then hold). moto has no Price List API (it answers 404), so
``pricing:GetProducts`` goes through botocore's ``Stubber`` on a real ``pricing`` client, with
responses shaped like AWS's (JSON price-list strings with OnDemand terms and hourly price
dimensions), over two pages.
"""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autoscaler.cli import prices as cli_prices
from autoscaler.cli.main import app
from autoscaler.market.catalog import CATALOG_COLUMNS, load_catalog

runner = CliRunner()


def _json(args: list[str]) -> list[dict[str, Any]]:
    result = runner.invoke(app, ["prices", "list", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_list_json_filters_and_sorts() -> None:
    rows = _json(["--provider", "aws", "--gpu", "t4", "--region", "us-east-1"])
    assert rows and all(r["gpu_type"] == "T4" and r["region"] == "us-east-1" for r in rows)
    per_gpu = [r["usd_per_gpu_hour"] for r in rows]
    assert per_gpu == sorted(per_gpu)
    (od,) = [r for r in rows if r["key"] == "aws/g4dn.12xlarge/use1-az1/on-demand"]
    assert od["usd_per_hour"] == 3.912 and od["usd_per_gpu_hour"] == pytest.approx(0.978)
    assert od["network_gbps"] == 50.0 and od["price_date"] == "~2024-12..2025-06"
    assert od["price_source"] == "skypilot-org/skypilot-catalog"
    spot = _json(["--gpu", "A100", "--market", "spot", "--max-usd-per-gpu-hour", "1.0"])
    assert spot and all(r["market"] == "spot" and r["usd_per_gpu_hour"] <= 1.0 for r in spot)
    assert {r["provider"] for r in spot} <= {"aws", "gcp"}
    assert len(_json(["--limit", "3"])) == 3


def test_list_table_shows_date_and_source() -> None:
    result = runner.invoke(
        app,
        ["prices", "list", "--gpu", "T4", "--region", "us-central1", "--limit", "5", "--wide"],
        env={"COLUMNS": "80"},
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "cheapest GPU-hour first" in out and "5 of" in out
    assert "n1-standard-8+1xnvidia-tesla-t4" in out
    assert "2026-07-30 (host)" in out and "skypilot-org/skypilot-catalog" in out


def test_list_reports_bad_input() -> None:
    result = runner.invoke(app, ["prices", "list", "--max-usd-per-gpu-hour", "0"])
    assert result.exit_code == 2 and "must be > 0" in result.stderr


def test_list_bad_catalogue_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        ",".join(CATALOG_COLUMNS) + "\naws,g4dn.xlarge,T4,1,4,16,us-east-1,use1-az1,"
        "cheap,,r,p,2025-01-01\n"
    )
    result = runner.invoke(app, ["prices", "list", "--catalog", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:2 [ondemand_usd_per_hour]" in result.stderr


def test_refresh_gcp_is_refused() -> None:
    result = runner.invoke(app, ["prices", "refresh", "--provider", "gcp"])
    assert result.exit_code == 2
    assert "Cloud Billing Catalog API" in result.stderr
    assert "google-cloud-compute" in result.stderr


def test_refresh_unknown_type_is_refused() -> None:
    result = runner.invoke(
        app, ["prices", "refresh", "--provider", "aws", "--instance-type", "m5.large"]
    )
    assert result.exit_code == 2 and "m5.large" in result.stderr


# --------------------------------------------------------------------- Price List API


def _product(instance_type: str, usd: str, sku: str, **attributes: str) -> str:
    """One ``GetProducts`` price-list item as AWS returns it: a JSON document in a string."""
    attrs = {
        "instanceType": instance_type,
        "regionCode": "us-east-1",
        "location": "US East (N. Virginia)",
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "licenseModel": "No License required",
        "instanceFamily": "GPU instance",
        "servicecode": "AmazonEC2",
        **attributes,
    }
    term = f"{sku}.JRTCKXETXF"
    return json.dumps(
        {
            "product": {"productFamily": "Compute Instance", "attributes": attrs, "sku": sku},
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    term: {
                        "priceDimensions": {
                            f"{term}.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "endRange": "Inf",
                                "description": f"${usd} per On Demand Linux {instance_type} "
                                "Instance Hour",
                                "appliesTo": [],
                                "rateCode": f"{term}.6YS6EN2CT7",
                                "beginRange": "0",
                                "pricePerUnit": {"USD": usd},
                            }
                        },
                        "sku": sku,
                        "effectiveDate": "2025-06-01T00:00:00Z",
                        "offerTermCode": "JRTCKXETXF",
                        "termAttributes": {},
                    }
                },
                "Reserved": {},
            },
            "version": "20250601000000",
            "publicationDate": "2025-06-01T00:00:00Z",
        }
    )


def _filters(instance_type: str) -> list[dict[str, str]]:
    terms = {
        "regionCode": "us-east-1",
        "instanceType": instance_type,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "licenseModel": "No License required",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()]


def _stubbed_pricing(prices: dict[str, str]) -> tuple[Any, Any]:
    """A real pricing client with a Stubber: for each type, two pages (the second page holds
    the price, the first an unrelated Windows product that must be ignored)."""
    import boto3
    from botocore.stub import Stubber

    session = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    )
    client = session.client("pricing", region_name="us-east-1")
    stub = Stubber(client)
    for i, (instance_type, usd) in enumerate(sorted(prices.items())):
        base = {
            "ServiceCode": "AmazonEC2",
            "Filters": _filters(instance_type),
            "FormatVersion": "aws_v1",
        }
        windows = _product(instance_type, "9.99", f"WIN{i}", operatingSystem="Windows")
        stub.add_response(
            "get_products",
            {"FormatVersion": "aws_v1", "PriceList": [windows], "NextToken": f"page2-{i}"},
            base,
        )
        stub.add_response(
            "get_products",
            {"FormatVersion": "aws_v1", "PriceList": [_product(instance_type, usd, f"SKU{i}")]},
            {**base, "NextToken": f"page2-{i}"},
        )
    stub.activate()
    return client, stub


def test_ondemand_prices_from_stubbed_price_list() -> None:
    client, stub = _stubbed_pricing({"g4dn.xlarge": "0.5260000000", "p4d.24xlarge": "21.9576"})
    prices = cli_prices.ondemand_prices(client, "us-east-1", ["g4dn.xlarge", "p4d.24xlarge"])
    assert prices == {"g4dn.xlarge": 0.526, "p4d.24xlarge": 21.9576}
    stub.assert_no_pending_responses()


def test_parse_price_list_item() -> None:
    assert cli_prices.parse_price_list_item(_product("g5.xlarge", "1.006", "A")) == (
        "g5.xlarge",
        1.006,
    )
    assert (
        cli_prices.parse_price_list_item(_product("g5.xlarge", "1.0", "B", tenancy="Dedicated"))
        is None
    )
    assert cli_prices.parse_price_list_item(_product("g5.xlarge", "0.0", "C")) is None
    assert cli_prices.parse_price_list_item(json.dumps({"product": {}})) is None


# ------------------------------------------------------------------- moto-backed refresh


@pytest.fixture(scope="module")
def moto_url() -> str:
    from emulators.aws_moto import shared_moto_server

    return shared_moto_server().url


@pytest.mark.slow
def test_refresh_aws_against_moto(
    moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emulators.aws_moto import admin_client

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    client, stub = _stubbed_pricing(
        {"g4dn.12xlarge": "3.9120000000", "g4dn.xlarge": "0.5260000000"}
    )
    monkeypatch.setattr(cli_prices, "pricing_client", lambda session: client)
    out = tmp_path / "aws-now.csv"
    result = runner.invoke(
        app,
        [
            "prices",
            "refresh",
            "--provider",
            "aws",
            "--region",
            "us-east-1",
            "--endpoint-url",
            moto_url,
            "--instance-type",
            "g4dn.xlarge",
            "--instance-type",
            "g4dn.12xlarge",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    stub.assert_no_pending_responses()
    today = datetime.now(UTC).date().isoformat()

    # What moto holds, asked independently of the command.
    ec2 = admin_client(moto_url, "ec2")
    ids = {
        z["ZoneName"]: z["ZoneId"] for z in ec2.describe_availability_zones()["AvailabilityZones"]
    }
    offered = ec2.describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": ["g4dn.xlarge", "g4dn.12xlarge"]}],
    )["InstanceTypeOfferings"]
    pools = {(o["InstanceType"], ids[o["Location"]]) for o in offered}
    assert pools

    with open(out, newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == CATALOG_COLUMNS
        rows = list(reader)
    assert {(r["instance_type"], r["zone"]) for r in rows} == pools
    for r in rows:
        assert r["spot_usd_per_hour"] == "0.00001"  # moto's price
        want = "3.912" if r["instance_type"] == "g4dn.12xlarge" else "0.526"
        assert r["ondemand_usd_per_hour"] == want
        assert (r["source_repo"], r["source_commit_date"], r["region"]) == (
            "aws-api",
            today,
            "us-east-1",
        )
    big = [r for r in rows if r["instance_type"] == "g4dn.12xlarge"]
    assert all(
        (r["gpu_model"], r["gpu_count"], r["vcpus"], r["memory_gib"]) == ("T4", "4", "48", "192")
        for r in big
    )
    assert f"wrote {len(rows)} offerings" in result.stderr

    # The file is a catalogue the loader (and `prices list --catalog`) reads.
    book = load_catalog([out])
    assert len(book) == len(rows)
    entry = book.lookup(f"aws/g4dn.12xlarge/{ids['us-east-1a']}/spot")
    assert entry.usd_per_hour == 0.00001 and entry.offering.price_date == today
    listed = _json(["--catalog", str(out), "--market", "on-demand"])
    assert {r["usd_per_hour"] for r in listed} == {3.912, 0.526}
