"""``coadapt prices``: show the GPU price catalogue; refresh AWS prices from AWS's APIs.

* ``coadapt prices list`` prints the shipped catalogue (``autoscaler.market.catalog.load_catalog``),
  one line per (offering, market), cheapest GPU-hour first, with each price's date and source.
* ``coadapt prices refresh --provider aws`` reads today's prices from AWS and writes a catalogue
  CSV in the columns of the shipped ``aws_gpu.csv`` (``autoscaler.market.catalog.CATALOG_COLUMNS``):
  spot prices from EC2 ``DescribeSpotPriceHistory`` (every page, the latest price per
  instance type and zone), on-demand prices from the AWS Price List API (``pricing``
  ``GetProducts``, served from us-east-1 whatever the region priced), zones from
  ``DescribeInstanceTypeOfferings`` and ``DescribeAvailabilityZones`` (the file holds zone
  IDs). Instance sizes (GPUs, vCPUs, memory) come from the shipped catalogue, so the types
  refreshed are the AWS types it knows. Rows are stamped with today's date (UTC) and the source
  ``aws-api``.

  ``--provider gcp`` is refused (exit status 2): GCP publishes prices through the Cloud
  Billing Catalog API, which ``google-cloud-compute`` does not include.

Cloud SDKs are imported only inside the refresh command. Errors: bad input exits with status
2 and one line on stderr; a failed AWS call exits with status 1.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from autoscaler.cli.common import fail
from autoscaler.cli.tables import Column, render_table

if TYPE_CHECKING:
    from autoscaler.market.catalog import MarketOffering, PricedOffering

__all__ = [
    "PRICING_API_REGION",
    "REFRESH_SOURCE",
    "MarketChoice",
    "ProviderChoice",
    "aws_catalog_rows",
    "ec2_client",
    "latest_spot_prices",
    "ondemand_prices",
    "parse_price_list_item",
    "prices_app",
    "pricing_client",
]

#: The AWS Price List API is served from a few regions only; coadapt uses this one.
PRICING_API_REGION = "us-east-1"
#: ``source_repo`` of refreshed rows.
REFRESH_SOURCE = "aws-api"
_REFRESH_SOURCE_PATH = "ec2:DescribeSpotPriceHistory; pricing:GetProducts"
_SPOT_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
# Price List attributes of a plain Linux, shared-tenancy, on-demand instance.
_LINUX_SHARED = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "licenseModel": "No License required",
}
_GCP_REFUSAL = (
    "refresh --provider gcp is not supported: GCP publishes VM prices through the Cloud Billing "
    "Catalog API (cloudbilling.googleapis.com), which google-cloud-compute does not include "
    "and which this tool cannot reach or test offline. The shipped gcp_gpu.csv "
    "(see autoscaler/data/prices/README.md) is used instead."
)

prices_app = typer.Typer(
    rich_markup_mode=None,  # plain help: option names whole at 80 columns
    name="prices",
    help="GPU prices: list the shipped catalogue (on-demand and spot), refresh AWS prices.",
    no_args_is_help=True,
    add_completion=False,
)


class MarketChoice(StrEnum):
    ALL = "all"
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class ProviderChoice(StrEnum):
    AWS = "aws"
    GCP = "gcp"


def _usage_error(message: str) -> NoReturn:
    typer.echo(f"coadapt: {message}", err=True)
    raise typer.Exit(code=2)


# ------------------------------------------------------------------------------------- list


@prices_app.command("list")
def list_prices(
    provider: ProviderChoice | None = typer.Option(
        None, "--provider", help="The cloud: aws or gcp."
    ),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type, e.g. T4, A100, H100."),
    region: str | None = typer.Option(None, "--region", help="Region, e.g. us-east-1."),
    market: MarketChoice = typer.Option(
        MarketChoice.ALL, "--market", help="The market: spot, on-demand or all."
    ),
    max_usd_per_gpu_hour: float | None = typer.Option(
        None, "--max-usd-per-gpu-hour", help="Only offerings at most this price per GPU-hour."
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Show the cheapest N only."),
    catalog: list[Path] | None = typer.Option(
        None,
        "--catalog",
        help="Catalogue CSV to read instead of the shipped ones (repeatable), e.g. the output "
        "of 'prices refresh'.",
    ),
    json_output: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    wide: bool = typer.Option(
        False, "--wide", help="Show every column, however wide the terminal."
    ),
) -> None:
    """List priced GPU offerings, cheapest GPU-hour first, with each price's date and source."""
    from autoscaler.market.catalog import load_catalog
    from coadapt_common.errors import CoadaptError

    if max_usd_per_gpu_hour is not None and not (
        math.isfinite(max_usd_per_gpu_hour) and max_usd_per_gpu_hour > 0
    ):
        _usage_error(f"--max-usd-per-gpu-hour must be > 0, got {max_usd_per_gpu_hour}")
    try:
        book = load_catalog(catalog or None)
    except CoadaptError as e:
        _usage_error(str(e))
    selected = book.filter(
        provider=None if provider is None else provider.value, region=region, gpu_type=gpu
    )
    entries = list(selected.offerings(None if market is MarketChoice.ALL else market.value))
    if max_usd_per_gpu_hour is not None:
        entries = [e for e in entries if e.usd_per_gpu_hour <= max_usd_per_gpu_hour]
    entries.sort(key=lambda e: (e.usd_per_gpu_hour, e.usd_per_hour, e.key))
    total = len(entries)
    if total == 0:
        _no_match(
            book,
            None if provider is None else provider.value,
            gpu,
            region,
            market.value,
            max_usd_per_gpu_hour,
        )
    if limit is not None:
        entries = entries[:limit]
    if json_output:
        typer.echo(json.dumps([_entry_json(e) for e in entries], indent=2))
        return
    _print_table(entries, total, wide=wide)


def _entry_json(entry: MarketOffering) -> dict[str, Any]:
    o = entry.offering
    return {
        "key": entry.key,
        "provider": o.provider,
        "instance_type": o.instance_type,
        "gpu_type": o.gpu_type,
        "gpus": o.gpus,
        "vcpus": o.vcpus,
        "memory_gib": o.memory_gib,
        "network_gbps": o.network_gbps,
        "region": o.region,
        "zone": o.zone,
        "market": entry.market,
        "usd_per_hour": entry.usd_per_hour,
        "usd_per_gpu_hour": entry.usd_per_gpu_hour,
        "price_source": o.price_source,
        "price_date": o.price_date,
    }


PRICE_COLUMNS = (  # drop_rank: the order in which a narrow terminal leaves columns out
    Column("$/GPU-h", numeric=True),
    Column("$/h", numeric=True, drop_rank=6),
    Column("market"),
    Column("provider", drop_rank=3),
    Column("instance"),
    Column("GPUs", drop_rank=5),
    Column("region", drop_rank=4),
    Column("zone"),
    Column("Gbps", numeric=True, drop_rank=2),
    Column("price date", drop_rank=1),
    Column("source", drop_rank=0),
)


def _print_table(entries: Sequence[MarketOffering], total: int, *, wide: bool) -> None:
    """The offerings at the terminal's width: $/GPU-hour, market, instance and zone always,
    whole; the other columns while they fit (``wide``: all of them)."""
    from rich.console import Console

    rows = [
        [
            f"{e.usd_per_gpu_hour:.4f}",
            f"{e.usd_per_hour:.4f}",
            e.market,
            e.offering.provider,
            e.offering.instance_type,
            f"{e.offering.gpus}x {e.offering.gpu_type}",
            e.offering.region,
            e.offering.zone,
            "" if e.offering.network_gbps is None else f"{e.offering.network_gbps:g}",
            e.offering.price_date,
            e.offering.price_source,
        ]
        for e in entries
    ]
    render_table(
        Console(),
        PRICE_COLUMNS,
        rows,
        title="GPU offerings, cheapest GPU-hour first",
        caption=f"{len(entries)} of {total} shown. USD per hour, Linux. Dates are those of the "
        "source snapshot (~: inferred), not of today.",
        wide=wide,
    )


def _no_match(
    book: Any,
    provider: str | None,
    gpu: str | None,
    region: str | None,
    market: str,
    max_usd: float | None,
) -> NoReturn:
    """Nothing matched the filters: say which filter matched nothing and what it could be."""
    given = (("provider", provider), ("gpu", gpu), ("region", region))
    asked = [f"--{k} {v}" for k, v in given if v is not None]
    asked += [] if market == "all" else [f"--market {market}"]
    asked += [] if max_usd is None else [f"--max-usd-per-gpu-hour {max_usd:g}"]
    every = list(book.filter())
    hints = []
    if gpu is not None and not any(o.gpu_type.lower() == gpu.lower() for o in every):
        types = sorted({o.gpu_type for o in every})
        hints.append(f"--gpu takes one of {', '.join(types)}")
    if region is not None and not any(o.region == region for o in every):
        hints.append("--region takes a region such as us-east-1 or us-central1")
    fix = "; ".join(hints) or "loosen a filter"
    fail(f"no offering matches {' '.join(asked) or 'the filters'}; {fix}")


# ---------------------------------------------------------------------------------- refresh


def ec2_client(session: Any, region: str, endpoint_url: str | None) -> Any:
    """The EC2 client the refresh reads spot prices and zones from."""
    return session.client("ec2", region_name=region, endpoint_url=endpoint_url)


def pricing_client(session: Any) -> Any:
    """The AWS Price List API client (always the us-east-1 endpoint)."""
    return session.client("pricing", region_name=PRICING_API_REGION)


def latest_spot_prices(
    ec2: Any, instance_types: Sequence[str], *, now: datetime
) -> dict[tuple[str, str], float]:
    """Latest Linux spot price per ``(instance_type, zone name)`` from every page of
    ``DescribeSpotPriceHistory`` starting at ``now`` (EC2 then returns the price in effect at
    ``now`` and any later change). Items without a positive price or a timestamp are ignored."""
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    paginator = ec2.get_paginator("describe_spot_price_history")
    pages = paginator.paginate(
        InstanceTypes=list(instance_types),
        ProductDescriptions=list(_SPOT_PRODUCTS),
        StartTime=now,
    )
    for page in pages:
        for item in page.get("SpotPriceHistory", []) or []:
            try:
                price = float(item["SpotPrice"])
                key = (str(item["InstanceType"]), str(item["AvailabilityZone"]))
                stamp = item["Timestamp"]
            except (KeyError, TypeError, ValueError):
                continue
            if not (math.isfinite(price) and price > 0) or not isinstance(stamp, datetime):
                continue
            known = latest.get(key)
            if known is None or stamp > known[0]:
                latest[key] = (stamp, price)
    return {key: price for key, (_, price) in latest.items()}


def parse_price_list_item(item: str | Mapping[str, Any]) -> tuple[str, float] | None:
    """``(instance_type, usd_per_hour)`` of one Price List API product (a JSON string as
    ``GetProducts`` returns it), or ``None`` if it is not a Linux, shared-tenancy, on-demand
    instance price. With several hourly on-demand terms, the latest ``effectiveDate`` wins."""
    data = json.loads(item) if isinstance(item, str) else item
    attributes = (data.get("product") or {}).get("attributes") or {}
    instance_type = attributes.get("instanceType")
    if not instance_type:
        return None
    for name, wanted in _LINUX_SHARED.items():
        if name in attributes and attributes[name] != wanted:
            return None
    best: tuple[str, float] | None = None
    for term in ((data.get("terms") or {}).get("OnDemand") or {}).values():
        for dimension in (term.get("priceDimensions") or {}).values():
            if dimension.get("unit") != "Hrs":
                continue
            try:
                usd = float((dimension.get("pricePerUnit") or {})["USD"])
            except (KeyError, TypeError, ValueError):
                continue
            effective = str(term.get("effectiveDate", ""))
            if math.isfinite(usd) and usd > 0 and (best is None or effective > best[0]):
                best = (effective, usd)
    return None if best is None else (str(instance_type), best[1])


def ondemand_prices(pricing: Any, region: str, instance_types: Iterable[str]) -> dict[str, float]:
    """On-demand Linux price per instance type in ``region`` from ``GetProducts`` (all pages;
    one query per type, filtered on region, type, OS, tenancy, software and capacity status)."""
    out: dict[str, float] = {}
    paginator = pricing.get_paginator("get_products")
    for instance_type in instance_types:
        terms = {"regionCode": region, "instanceType": instance_type, **_LINUX_SHARED}
        filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()]
        for page in paginator.paginate(
            ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1"
        ):
            for item in page.get("PriceList", []) or []:
                parsed = parse_price_list_item(item)
                if parsed is not None and parsed[0] == instance_type:
                    out[instance_type] = parsed[1]
    return out


def _zone_ids(ec2: Any) -> dict[str, str]:
    zones = ec2.describe_availability_zones().get("AvailabilityZones", []) or []
    return {z["ZoneName"]: z.get("ZoneId") or z["ZoneName"] for z in zones if "ZoneName" in z}


def _zone_names(ec2: Any, instance_types: Sequence[str]) -> set[tuple[str, str]]:
    paginator = ec2.get_paginator("describe_instance_type_offerings")
    pools: set[tuple[str, str]] = set()
    pages = paginator.paginate(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": list(instance_types)}],
    )
    for page in pages:
        for item in page.get("InstanceTypeOfferings", []) or []:
            pools.add((str(item["InstanceType"]), str(item["Location"])))
    return pools


def _number(value: float) -> str:
    """A price as plain decimal text (``0.00001``, not ``1e-05``), to 10 decimals."""
    return f"{value:.10f}".rstrip("0").rstrip(".")


def aws_catalog_rows(
    ec2: Any,
    pricing: Any,
    *,
    region: str,
    specs: Mapping[str, PricedOffering],
    today: date,
    now: datetime,
) -> list[dict[str, str]]:
    """Catalogue rows (``CATALOG_COLUMNS``) for every zone of ``region`` offering one of the
    types in ``specs`` (sizes taken from there), sorted by type and zone ID. A row has an empty
    spot (on-demand) cell when AWS returned no such price; pools with neither are left out."""
    types = sorted(specs)
    spot = latest_spot_prices(ec2, types, now=now)
    ondemand = ondemand_prices(pricing, region, types)
    zone_ids = _zone_ids(ec2)
    pools = _zone_names(ec2, types) | set(spot)
    rows = []
    for instance_type, zone_name in sorted(pools, key=lambda p: (p[0], zone_ids.get(p[1], p[1]))):
        spec = specs.get(instance_type)
        if spec is None:
            continue
        spot_price = spot.get((instance_type, zone_name))
        ondemand_price = ondemand.get(instance_type)
        if spot_price is None and ondemand_price is None:
            continue
        rows.append(
            {
                "provider": "aws",
                "instance_type": instance_type,
                "gpu_model": spec.gpu_type,
                "gpu_count": str(spec.gpus),
                "vcpus": str(spec.vcpus),
                "memory_gib": f"{spec.memory_gib:g}",
                "region": region,
                "zone": zone_ids.get(zone_name, zone_name),
                "ondemand_usd_per_hour": "" if ondemand_price is None else _number(ondemand_price),
                "spot_usd_per_hour": "" if spot_price is None else _number(spot_price),
                "source_repo": REFRESH_SOURCE,
                "source_path": _REFRESH_SOURCE_PATH,
                "source_commit_date": today.isoformat(),
            }
        )
    return rows


def _csv_text(rows: Sequence[Mapping[str, str]], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


@prices_app.command("refresh")
def refresh(
    provider: ProviderChoice = typer.Option(
        ..., "--provider", help="The cloud: aws (gcp: not supported)."
    ),
    region: str = typer.Option("us-east-1", "--region", help="AWS region to price."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write the catalogue CSV here (default: standard output)."
    ),
    endpoint_url: str | None = typer.Option(
        None,
        "--endpoint-url",
        help="EC2 endpoint URL (e.g. a local emulator). The Price List API always uses its "
        "us-east-1 endpoint.",
    ),
    instance_types: list[str] | None = typer.Option(
        None,
        "--instance-type",
        help="Refresh only this type (repeatable; default: every AWS type of the shipped "
        "catalogue).",
    ),
) -> None:
    """Read current AWS GPU prices (spot: EC2 price history; on-demand: Price List API) and
    write a catalogue CSV in the shipped columns, dated today, source 'aws-api'."""
    if provider is ProviderChoice.GCP:
        _usage_error(_GCP_REFUSAL)
    from autoscaler.market.catalog import CATALOG_COLUMNS, load_catalog

    if out is not None and (
        out.is_dir() or not (out.parent if str(out.parent) else Path(".")).is_dir()
    ):
        _usage_error(f"--out {out}: not a file in an existing folder")
    known: dict[str, PricedOffering] = {}
    for offering in load_catalog().filter(provider="aws"):
        known.setdefault(offering.instance_type, offering)
    wanted = list(dict.fromkeys(instance_types or sorted(known)))
    unknown = [t for t in wanted if t not in known]
    if unknown:
        _usage_error(
            f"--instance-type {', '.join(unknown)}: not an AWS GPU type of the shipped catalogue"
        )
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    now = datetime.now(UTC)
    try:
        session = boto3.session.Session(region_name=region)
        rows = aws_catalog_rows(
            ec2_client(session, region, endpoint_url),
            pricing_client(session),
            region=region,
            specs={t: known[t] for t in wanted},
            today=now.date(),
            now=now,
        )
    except (BotoCoreError, ClientError) as e:
        typer.echo(
            f"coadapt: an AWS call failed: {e}; check the credentials, --region and --endpoint-url",
            err=True,
        )
        raise typer.Exit(code=1) from None
    text = _csv_text(rows, CATALOG_COLUMNS)
    with_spot = sum(1 for r in rows if r["spot_usd_per_hour"])
    summary = f"{len(rows)} offerings in {region} ({with_spot} with a spot price)"
    if out is None:
        typer.echo(text, nl=False)
        typer.echo(summary, err=True)
        return
    from coadapt_common.atomic import write_text_atomic

    write_text_atomic(out, text)
    typer.echo(f"wrote {summary} to {out}", err=True)
