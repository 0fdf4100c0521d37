"""The GPU offering catalogue: instance types, zones and their on-demand and spot prices.

Pure core: numbers and files in, objects out. Nothing here talks to a cloud or reads a clock;
loading reads the files named (by default the copies shipped in ``autoscaler/data/``, described
in ``autoscaler/data/prices/README.md``). Every malformed file fails with
:class:`~autoscaler.errors.TraceFormatError` naming the file, the 1-based line and the field.

Units: USD per instance-hour (``_usd_per_hour``), seconds (``_s``), gigabits per second
(``_gbps``), GiB (``_gib``).

Catalogue (:func:`load_catalog`, :class:`Catalog`, :class:`PricedOffering`)
=======================================================================

One :class:`PricedOffering` per (provider, instance type, zone), with its on-demand price and its
spot price (``None`` when the source publishes none). :meth:`Catalog.offerings` yields one
:class:`MarketOffering` per (offering, market) that has a price; its ``key`` is
``provider/instance_type/zone/market`` with market ``spot`` or ``on-demand``, the format of
:attr:`autoscaler.decide.views.OfferingRef.key`.

Rules applied when loading:

* **AWS** rows are used as they are; ``zone`` is the AWS zone *ID* (``use1-az1``).
* **GCP bundle rows** (``price_scope`` ``bundle_vm_incl_gpu``: A2, A3, G2, G4 shapes, the price
  includes the GPUs) are used as they are. Their ``zone`` is empty (the source prices per
  region): the offering's ``zone`` is then the region name, e.g. ``us-central1``.
* **GCP attached-GPU rows** (``price_scope`` ``gpu_only_add_n1_host_price``, instance type
  ``n1-*+<accelerator> x<N>``) price only the GPUs. They become whole-VM offerings by adding
  the host of :func:`n1_host_for`: **``n1-standard-(8 x N)``** (8 vCPUs and 30 GB per GPU:
  ``n1-standard-8`` for 1 GPU, ``-16`` for 2, ``-32`` for 4), priced from ``gcp_n1_host.csv`` in
  the same region, for each market (GPU + host; ``None`` if either price is missing). These
  shapes are the ones the GCP provider can launch (``providers.gcp.catalog.MACHINE_SHAPES``;
  its default T4/V100 machine is ``n1-standard-8`` with one GPU), and the offering's
  ``instance_type`` uses that provider's spelling, ``n1-standard-8+1xnvidia-tesla-t4``, so keys
  match the provider's pools.
* Rows with a fractional GPU count (GCP G4 shapes holding 1/8-1/2 of an RTX PRO 6000) are
  skipped and listed in :attr:`Catalog.skipped`: coadapt schedules whole GPUs.
* ``gpu_type`` is the file's ``gpu_model`` verbatim (``T4``, ``V100``, ``V100-32GB``, ``A100``,
  ``A100-80GB``, ``A10G``, ``L4``, ``L40S``, ``H100``, ``H100-MEGA``, ``H200``, ...).
* ``network_gbps`` comes from :data:`AWS_NETWORK_GBPS` (AWS only; ``None`` elsewhere).
* ``price_date`` is the source's snapshot date; a range the source README could only infer
  (``undated; inferred 2024-12..2025-06``) becomes ``~2024-12..2025-06``.

* An empty price cell means "no price published on that market", not an error: an empty spot
  cell is common, and the shipped AWS file has ``p5e.48xlarge`` rows without an on-demand price
  (sold through capacity blocks). A row with neither price has nothing to buy: it is skipped
  and listed in :attr:`Catalog.skipped`.

Bad input is an error naming file, line and field: a missing column (line 1), a missing
required value (names, sizes, ``price_scope`` in a file that has the column), a non-numeric,
negative or zero price or size, an unknown ``price_scope``, a duplicate offering
(:class:`~autoscaler.errors.DuplicateOfferingError`, naming both lines), an attached-GPU row
with no host row in its region.

"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from autoscaler.errors import DuplicateOfferingError, InvalidInputError
from autoscaler.market.files import CsvFile, prices_dir
from autoscaler.market.terms import MARKETS, SPOT, OfferingRef, check_market

__all__ = [
    "AWS_NETWORK_GBPS",
    "CATALOG_COLUMNS",
    "DEFAULT_CATALOG_FILES",
    "PRICE_SCOPE_BUNDLE",
    "PRICE_SCOPE_GPU_ONLY",
    "Catalog",
    "MarketOffering",
    "PricedOffering",
    "load_catalog",
    "n1_host_for",
]

#: Published network bandwidth of the AWS GPU instance types of the shipped catalogue, Gbps,
#: from AWS's instance-type specification pages. "Up to X Gbps" (burstable, sizes up to
#: 4xlarge) counts as X. Types not listed (g6e, ...) have ``network_gbps=None``.
AWS_NETWORK_GBPS: Mapping[str, float] = MappingProxyType(
    {
        # g4dn: NVIDIA T4
        "g4dn.xlarge": 25.0,  # up to 25
        "g4dn.2xlarge": 25.0,  # up to 25
        "g4dn.4xlarge": 25.0,  # up to 25
        "g4dn.8xlarge": 50.0,
        "g4dn.12xlarge": 50.0,
        "g4dn.16xlarge": 50.0,
        "g4dn.metal": 100.0,
        # p3 / p3dn: NVIDIA V100
        "p3.2xlarge": 10.0,  # up to 10
        "p3.8xlarge": 10.0,
        "p3.16xlarge": 25.0,
        "p3dn.24xlarge": 100.0,
        # p4d / p4de: 8 x NVIDIA A100 (4 x 100 Gbps EFA)
        "p4d.24xlarge": 400.0,
        "p4de.24xlarge": 400.0,
        # g5: NVIDIA A10G
        "g5.xlarge": 10.0,  # up to 10
        "g5.2xlarge": 10.0,  # up to 10
        "g5.4xlarge": 25.0,  # up to 25
        "g5.8xlarge": 25.0,
        "g5.12xlarge": 40.0,
        "g5.16xlarge": 25.0,
        "g5.24xlarge": 50.0,
        "g5.48xlarge": 100.0,
        # g6: NVIDIA L4 (same network tiers as g5)
        "g6.xlarge": 10.0,  # up to 10
        "g6.2xlarge": 10.0,  # up to 10
        "g6.4xlarge": 25.0,  # up to 25
        "g6.8xlarge": 25.0,
        "g6.12xlarge": 40.0,
        "g6.16xlarge": 25.0,
        "g6.24xlarge": 50.0,
        "g6.48xlarge": 100.0,
        # p5: 8 x NVIDIA H100 (32 x 100 Gbps EFA)
        "p5.48xlarge": 3200.0,
    }
)

#: The columns of a catalogue CSV (``aws_gpu.csv``; ``gcp_gpu.csv`` adds ``price_scope``).
CATALOG_COLUMNS: tuple[str, ...] = (
    "provider",
    "instance_type",
    "gpu_model",
    "gpu_count",
    "vcpus",
    "memory_gib",
    "region",
    "zone",
    "ondemand_usd_per_hour",
    "spot_usd_per_hour",
    "source_repo",
    "source_path",
    "source_commit_date",
)
PRICE_SCOPE_BUNDLE = "bundle_vm_incl_gpu"
PRICE_SCOPE_GPU_ONLY = "gpu_only_add_n1_host_price"
#: The catalogue files :func:`load_catalog` reads by default, in ``prices_dir()``.
DEFAULT_CATALOG_FILES: tuple[str, ...] = ("aws_gpu.csv", "gcp_gpu.csv")
_N1_HOST_FILE = "gcp_n1_host.csv"
_N1_HOST_COLUMNS = (
    "instance_type",
    "vcpus",
    "memory_gib",
    "region",
    "ondemand_usd_per_hour",
    "spot_usd_per_hour",
    "source_repo",
    "source_commit_date",
)
_GPU_ONLY_TYPE = re.compile(r"^n1-\*\+(?P<acc>[a-z0-9][a-z0-9-]*) x(?P<count>[1-9][0-9]*)$")
_N1_VCPUS_PER_GPU = 8
_N1_STANDARD_SIZES = frozenset({1, 2, 4, 8, 16, 32, 64, 96})


@dataclass(frozen=True)
class PricedOffering:
    """One instance type in one zone of one provider, with its prices.

    ``zone`` is the AWS zone ID or the GCE zone (the region name for GCP shapes priced per
    region). Prices are USD per instance-hour, > 0, or ``None`` on a market where the source
    publishes no price (no spot price; no on-demand price, e.g. AWS ``p5e.48xlarge``, sold
    through capacity blocks); at least one of the two is set. ``network_gbps`` is the
    published instance bandwidth or ``None``. ``price_source`` names where the prices come
    from and ``price_date`` the date of that snapshot (not of loading).

    Raises :class:`InvalidInputError` on an empty name, a name holding ``/`` (the key
    separator), a count < 1, a size or price <= 0, or no price at all.
    """

    provider: str
    instance_type: str
    gpu_type: str
    gpus: int
    vcpus: int
    memory_gib: float
    network_gbps: float | None
    region: str
    zone: str
    ondemand_usd_per_hour: float | None
    spot_usd_per_hour: float | None
    price_source: str
    price_date: str

    def __post_init__(self) -> None:
        for name in ("provider", "instance_type", "gpu_type", "region", "zone"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or "/" in value:
                raise InvalidInputError(
                    f"{name} must be a non-empty name without '/', got {value!r}", field=name
                )
        for name in ("gpus", "vcpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(
                    f"{name} must be an integer >= 1, got {value!r}", field=name
                )
        positive: dict[str, float | None] = {
            "memory_gib": self.memory_gib,
            "network_gbps": self.network_gbps,
            "ondemand_usd_per_hour": self.ondemand_usd_per_hour,
            "spot_usd_per_hour": self.spot_usd_per_hour,
        }
        for name, number in positive.items():
            if number is None and name != "memory_gib":
                continue
            if number is None or not (math.isfinite(number) and number > 0):
                raise InvalidInputError(
                    f"{name} must be finite and > 0, got {number!r}", field=name
                )
        if self.ondemand_usd_per_hour is None and self.spot_usd_per_hour is None:
            raise InvalidInputError(
                f"{'/'.join(self.pool)}: no price on either market", field="ondemand_usd_per_hour"
            )

    @property
    def pool(self) -> tuple[str, str, str]:
        """``(provider, instance_type, zone)``: what makes an offering unique in a catalogue."""
        return (self.provider, self.instance_type, self.zone)

    def price_usd_per_hour(self, market: str) -> float | None:
        """The price on ``market`` (``"spot"`` or ``"on-demand"``); ``None`` when unpublished."""
        if check_market(market) == SPOT:
            return self.spot_usd_per_hour
        return self.ondemand_usd_per_hour

    def ref(self, market: str) -> OfferingRef:
        """The pool reference used across plans, sizing and ledgers."""
        return OfferingRef(self.provider, self.instance_type, self.zone, check_market(market))

    def key(self, market: str) -> str:
        """``provider/instance_type/zone/market`` (= ``self.ref(market).key``)."""
        return self.ref(market).key


@dataclass(frozen=True)
class MarketOffering:
    """An offering on one market, with the price it has there (USD per instance-hour)."""

    offering: PricedOffering
    market: str
    usd_per_hour: float

    @property
    def key(self) -> str:
        """``provider/instance_type/zone/market``."""
        return self.offering.key(self.market)

    @property
    def ref(self) -> OfferingRef:
        return self.offering.ref(self.market)

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.offering.gpus


class Catalog:
    """An immutable set of :class:`PricedOffering`, at most one per (provider, type, zone).

    Iteration keeps the order the offerings were given in. ``skipped`` lists rows left out at
    load time (``"path:line: reason"``). Raises :class:`InvalidInputError` on a duplicate pool.
    """

    __slots__ = ("_by_pool", "_offerings", "skipped")

    def __init__(self, offerings: Iterable[PricedOffering], *, skipped: Sequence[str] = ()) -> None:
        items = tuple(offerings)
        by_pool: dict[tuple[str, str, str], PricedOffering] = {}
        for offering in items:
            if not isinstance(offering, PricedOffering):
                raise InvalidInputError(f"not a PricedOffering: {offering!r}", field="offerings")
            if offering.pool in by_pool:
                raise InvalidInputError(
                    f"duplicate offering {'/'.join(offering.pool)}", field="offerings"
                )
            by_pool[offering.pool] = offering
        self._offerings = items
        self._by_pool = MappingProxyType(by_pool)
        self.skipped: tuple[str, ...] = tuple(skipped)

    def __len__(self) -> int:
        return len(self._offerings)

    def __iter__(self) -> Iterator[PricedOffering]:
        return iter(self._offerings)

    def __repr__(self) -> str:
        return f"Catalog({len(self)} offerings)"

    def find(self, provider: str, instance_type: str, zone: str) -> PricedOffering | None:
        """The offering of that pool, or ``None``."""
        return self._by_pool.get((provider, instance_type, zone))

    def get(self, provider: str, instance_type: str, zone: str) -> PricedOffering:
        """The offering of that pool; :class:`InvalidInputError` when the catalogue has none."""
        found = self.find(provider, instance_type, zone)
        if found is None:
            raise InvalidInputError(
                f"no offering {provider}/{instance_type}/{zone} in the catalogue", field="offering"
            )
        return found

    def lookup(self, key: str) -> MarketOffering:
        """The priced offering named by ``provider/instance_type/zone/market``.

        :class:`InvalidInputError` when the key is malformed, names no offering, or names the
        spot market of an offering without a spot price.
        """
        parts = key.split("/")
        if len(parts) != 4 or not all(parts):
            raise InvalidInputError(
                f"offering key must be provider/instance_type/zone/market, got {key!r}",
                field="key",
            )
        provider, instance_type, zone, market = parts
        offering = self.get(provider, instance_type, zone)
        price = offering.price_usd_per_hour(market)
        if price is None:
            raise InvalidInputError(f"{key}: no {market} price published", field="market")
        return MarketOffering(offering, market, price)

    def filter(
        self,
        *,
        provider: str | None = None,
        region: str | None = None,
        zone: str | None = None,
        gpu_type: str | None = None,
        instance_type: str | None = None,
    ) -> Catalog:
        """The offerings matching every criterion given (exact names; ``gpu_type`` ignores case).

        ``instance_type`` may end in ``*`` to match a prefix (``"g4dn.*"``).
        """

        def keep(o: PricedOffering) -> bool:
            if provider is not None and o.provider != provider:
                return False
            if region is not None and o.region != region:
                return False
            if zone is not None and o.zone != zone:
                return False
            if gpu_type is not None and o.gpu_type.lower() != gpu_type.lower():
                return False
            if instance_type is not None:
                if instance_type.endswith("*"):
                    return o.instance_type.startswith(instance_type[:-1])
                return o.instance_type == instance_type
            return True

        return Catalog((o for o in self._offerings if keep(o)), skipped=self.skipped)

    def offerings(self, market: str | None = None) -> Iterator[MarketOffering]:
        """One entry per (offering, market) with a published price; ``market`` ``None`` gives
        both markets (spot first for each offering)."""
        markets = MARKETS if market is None else (check_market(market),)
        for offering in self._offerings:
            for m in markets:
                price = offering.price_usd_per_hour(m)
                if price is not None:
                    yield MarketOffering(offering, m, price)


def n1_host_for(gpus: int) -> str:
    """The N1 host shape priced with ``gpus`` attached GPUs: ``n1-standard-(8 x gpus)``.

    :class:`InvalidInputError` when no such N1 shape exists (N1 sizes: 1-96 vCPUs).
    """
    vcpus = _N1_VCPUS_PER_GPU * gpus
    if isinstance(gpus, bool) or gpus < 1 or vcpus not in _N1_STANDARD_SIZES:
        raise InvalidInputError(f"no N1 host shape for {gpus!r} attached GPUs", field="gpus")
    return f"n1-standard-{vcpus}"


def _price_date(text: str) -> str:
    """The source date as shown: ISO dates as they are, inferred ranges as ``~A..B``."""
    inferred = re.search(r"inferred\s+(\S+)", text)
    if inferred:
        return f"~{inferred[1]}"
    return text


@dataclass(frozen=True)
class _Host:
    vcpus: int
    memory_gib: float
    ondemand_usd_per_hour: float | None
    spot_usd_per_hour: float | None
    source: str
    date: str


def _load_n1_hosts(path: Path) -> dict[tuple[str, str], _Host]:
    f = CsvFile(path)
    hosts: dict[tuple[str, str], _Host] = {}
    lines: dict[tuple[str, str], int] = {}
    for line, row in f.rows(_N1_HOST_COLUMNS):
        key = (f.text(row, line, "instance_type"), f.text(row, line, "region"))
        host = _Host(
            vcpus=f.integer(row, line, "vcpus"),
            memory_gib=f.price(row, line, "memory_gib"),
            ondemand_usd_per_hour=f.number(row, line, "ondemand_usd_per_hour", optional=True),
            spot_usd_per_hour=f.number(row, line, "spot_usd_per_hour", optional=True),
            source=f.text(row, line, "source_repo"),
            date=_price_date(f.text(row, line, "source_commit_date")),
        )
        if key in lines:
            raise DuplicateOfferingError(
                f"duplicate host price {key[0]} in {key[1]} (first at {f.name}:{lines[key]})",
                path=f.name,
                line=line,
                other_path=f.name,
                other_line=lines[key],
                field="instance_type",
            )
        hosts[key] = host
        lines[key] = line
    return hosts


def _add_prices(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def load_catalog(
    paths: Sequence[str | Path] | None = None, *, n1_hosts: str | Path | None = None
) -> Catalog:
    """Load catalogue CSVs (default: the shipped ``aws_gpu.csv`` and ``gcp_gpu.csv``).

    Each file has :data:`CATALOG_COLUMNS` (``source_path`` optional) and optionally
    ``price_scope``; the rules are in the module docstring. ``n1_hosts`` is the N1 host price
    file used for attached-GPU rows (default: the shipped ``gcp_n1_host.csv``); it is read only
    if such a row occurs. Offerings keep file order. Raises :class:`TraceFormatError` naming
    file, line and field on bad input (:class:`DuplicateOfferingError` for a duplicate).
    """
    files = [prices_dir() / n for n in DEFAULT_CATALOG_FILES] if paths is None else list(paths)
    host_path = prices_dir() / _N1_HOST_FILE if n1_hosts is None else Path(n1_hosts)
    hosts: dict[tuple[str, str], _Host] | None = None
    offerings: list[PricedOffering] = []
    origin: dict[tuple[str, str, str], tuple[str, int]] = {}
    skipped: list[str] = []
    required = tuple(c for c in CATALOG_COLUMNS if c != "source_path")
    for raw_path in files:
        f = CsvFile(Path(raw_path))
        for line, row in f.rows(required):
            scope = f.text(row, line, "price_scope") if "price_scope" in row else PRICE_SCOPE_BUNDLE
            if scope not in (PRICE_SCOPE_BUNDLE, PRICE_SCOPE_GPU_ONLY):
                raise f.error(f"unknown price scope {scope!r}", line, "price_scope")
            provider = f.text(row, line, "provider")
            instance_type = f.text(row, line, "instance_type")
            gpu_type = f.text(row, line, "gpu_model")
            region = f.text(row, line, "region")
            gpu_count = f.price(row, line, "gpu_count")
            ondemand = f.number(row, line, "ondemand_usd_per_hour", optional=True)
            spot = f.number(row, line, "spot_usd_per_hour", optional=True)
            source = f.text(row, line, "source_repo")
            when = _price_date(f.text(row, line, "source_commit_date"))
            if gpu_count != int(gpu_count):
                skipped.append(f"{f.name}:{line}: {instance_type} has {gpu_count:g} GPUs")
                continue
            if ondemand is None and spot is None:
                skipped.append(f"{f.name}:{line}: {instance_type} in {region} has no price")
                continue
            gpus = int(gpu_count)
            if scope == PRICE_SCOPE_BUNDLE:
                zone = row.get("zone", "") or (region if "price_scope" in row else "")
                if not zone:
                    raise f.error("missing value", line, "zone")
                vcpus = f.integer(row, line, "vcpus")
                memory_gib = f.price(row, line, "memory_gib")
            else:
                zone = f.text(row, line, "zone")
                match = _GPU_ONLY_TYPE.match(instance_type)
                if match is None:
                    raise f.error(
                        f"attached-GPU row needs an instance type 'n1-*+<accelerator> x<N>', "
                        f"got {instance_type!r}",
                        line,
                        "instance_type",
                    )
                if int(match["count"]) != gpus:
                    raise f.error(
                        f"gpu_count {gpus} differs from the {match['count']} in {instance_type!r}",
                        line,
                        "gpu_count",
                    )
                if hosts is None:
                    hosts = _load_n1_hosts(host_path)
                host_type = n1_host_for(gpus)
                host = hosts.get((host_type, region))
                if host is None:
                    raise f.error(
                        f"no {host_type} host price for region {region!r} in {host_path}",
                        line,
                        "region",
                    )
                instance_type = f"{host_type}+{gpus}x{match['acc']}"
                vcpus, memory_gib = host.vcpus, host.memory_gib
                ondemand = _add_prices(ondemand, host.ondemand_usd_per_hour)
                spot = _add_prices(spot, host.spot_usd_per_hour)
                if ondemand is None and spot is None:
                    skipped.append(
                        f"{f.name}:{line}: {instance_type} in {zone} has no price on a market "
                        f"where its {host_type} host has one"
                    )
                    continue
                source = f"{source} (GPU) + {host.source} ({host_type} host)"
                when = f"{when} (GPU), {host.date} (host)"
            for name, value in (("provider", provider), ("instance_type", instance_type)):
                if "/" in value:
                    raise f.error(f"'/' is not allowed in a name: {value!r}", line, name)
            if "/" in zone:
                raise f.error(f"'/' is not allowed in a name: {zone!r}", line, "zone")
            pool = (provider, instance_type, zone)
            if pool in origin:
                first_path, first_line = origin[pool]
                raise DuplicateOfferingError(
                    f"duplicate offering {'/'.join(pool)} (first at {first_path}:{first_line})",
                    path=f.name,
                    line=line,
                    other_path=first_path,
                    other_line=first_line,
                    field="instance_type",
                )
            origin[pool] = (f.name, line)
            offerings.append(
                PricedOffering(
                    provider=provider,
                    instance_type=instance_type,
                    gpu_type=gpu_type,
                    gpus=gpus,
                    vcpus=vcpus,
                    memory_gib=memory_gib,
                    network_gbps=AWS_NETWORK_GBPS.get(instance_type) if provider == "aws" else None,
                    region=region,
                    zone=zone,
                    ondemand_usd_per_hour=None if ondemand is None else round(ondemand, 9),
                    spot_usd_per_hour=None if spot is None else round(spot, 9),
                    price_source=source,
                    price_date=when,
                )
            )
    return Catalog(offerings, skipped=skipped)
