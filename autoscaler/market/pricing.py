"""Price books: the GPU offering catalogue, spot price series and preemption models.

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
:attr:`autoscaler.decide.jobs.OfferingRef.key`.

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

Spot price series
=================

All implement :class:`PriceSeries`: ``price_at(t_s)`` and ``change_points(start_s, end_s)``.
:class:`ConstantPrice`; :class:`StepPriceSeries` (a step function; :class:`CsvPriceSeries` reads
one from ``time_s,usd_per_hour``); :class:`GcpHistorySeries` (real GCP price changes from
``gcp_gpu_price_history.csv``); :class:`StochasticSpotPrice` (seeded mean-reverting log price
with jumps).

Preemption
==========

:class:`AvailabilityTrace` replays the Bamboo spot availability traces (both formats, detected
from the file); :class:`SpotHazardModel` turns the AWS Spot Instance Advisor's interruption bands
into a per-instance-hour hazard and samples preemption times deterministically per (seed,
instance id). Notice times and billing rules are constants below.
"""

from __future__ import annotations

import bisect
import csv
import functools
import hashlib
import math
import random
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from autoscaler.decide.jobs import OfferingRef
from autoscaler.errors import DuplicateOfferingError, InvalidInputError, TraceFormatError

__all__ = [
    "AWS_NETWORK_GBPS",
    "AWS_SPOT_NOTICE_S",
    "BAMBOO_TRACES",
    "BILLING_INCREMENT_S",
    "BILLING_MINIMUM_S",
    "CATALOG_COLUMNS",
    "COUNT_TRACE",
    "DEFAULT_CATALOG_FILES",
    "EVENT_TRACE",
    "GCP_SPOT_NOTICE_S",
    "HOURS_PER_MONTH",
    "INTERRUPTION_BAND_FRACTIONS",
    "MARKETS",
    "ON_DEMAND",
    "PRICE_SCOPE_BUNDLE",
    "PRICE_SCOPE_GPU_ONLY",
    "SPOT",
    "SPOT_NOTICE_S",
    "AvailabilityTrace",
    "Catalog",
    "ConstantPrice",
    "CsvPriceSeries",
    "GcpHistorySeries",
    "GcpPriceHistory",
    "InterruptionBand",
    "MarketOffering",
    "PriceSeries",
    "PricedOffering",
    "SpotHazardModel",
    "StepPriceSeries",
    "StochasticSpotPrice",
    "bamboo_trace_path",
    "band_hazard_per_hour",
    "billed_seconds",
    "instance_cost_usd",
    "load_availability_trace",
    "load_catalog",
    "load_gcp_price_history",
    "load_hazard_model",
    "n1_host_for",
    "prices_dir",
    "spot_dir",
]

# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

SPOT = "spot"
ON_DEMAND = "on-demand"
#: The two markets, as spelled in offering keys (``providers.base.Market`` values).
MARKETS: tuple[str, ...] = (SPOT, ON_DEMAND)

#: Warning an AWS spot instance gets before EC2 reclaims it (the 2-minute interruption notice).
AWS_SPOT_NOTICE_S = 120.0
#: Time between a GCP Spot VM's preemption notice (soft off) and its hard off.
GCP_SPOT_NOTICE_S = 30.0
#: Spot preemption notice per provider.
SPOT_NOTICE_S: Mapping[str, float] = MappingProxyType(
    {"aws": AWS_SPOT_NOTICE_S, "gcp": GCP_SPOT_NOTICE_S}
)

#: Billing granularity of both AWS (Linux instances) and GCP VMs: per second ...
BILLING_INCREMENT_S = 1.0
#: ... with a minimum charge of one minute per instance launched.
BILLING_MINIMUM_S = 60.0

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
_GCP_HISTORY_FILE = "gcp_gpu_price_history.csv"
_SPOT_ADVISOR_FILE = "aws_spot_advisor_gpu.csv"
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

#: Fraction of capacity reclaimed per trailing month assumed for each AWS Spot Instance Advisor
#: interruption band: the band's midpoint; the open band ">20%" counts as 25%.
INTERRUPTION_BAND_FRACTIONS: Mapping[str, float] = MappingProxyType(
    {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25}
)
#: Length of the advisor's "trailing month": 30 days.
HOURS_PER_MONTH = 720.0

#: The Bamboo availability traces shipped in ``spot_dir()/bamboo``.
BAMBOO_TRACES: tuple[str, ...] = (
    "g4dn-trace.csv",
    "p3-trace.csv",
    "gcloud/a100x1-east1b.txt",
    "gcloud/v100x1-east1c.txt",
)


def prices_dir() -> Path:
    """The shipped price files (``autoscaler/data/prices``)."""
    return Path(__file__).resolve().parents[1] / "data" / "prices"


def spot_dir() -> Path:
    """The shipped spot availability traces (``autoscaler/data/spot``)."""
    return Path(__file__).resolve().parents[1] / "data" / "spot"


def bamboo_trace_path(name: str) -> Path:
    """Path of a shipped Bamboo trace, ``name`` one of :data:`BAMBOO_TRACES`."""
    if name not in BAMBOO_TRACES:
        raise InvalidInputError(
            f"unknown Bamboo trace {name!r}; shipped: {', '.join(BAMBOO_TRACES)}", field="name"
        )
    return spot_dir() / "bamboo" / name


def billed_seconds(runtime_s: float) -> float:
    """Seconds billed for an instance that ran ``runtime_s``: whole seconds, at least
    :data:`BILLING_MINIMUM_S` once it ran at all (``0`` for ``runtime_s <= 0``)."""
    if not math.isfinite(runtime_s):
        raise InvalidInputError(f"runtime must be finite, got {runtime_s!r}", field="runtime_s")
    if runtime_s <= 0:
        return 0.0
    return max(BILLING_MINIMUM_S, math.ceil(runtime_s / BILLING_INCREMENT_S) * BILLING_INCREMENT_S)


def instance_cost_usd(usd_per_hour: float, runtime_s: float) -> float:
    """What one instance at a constant ``usd_per_hour`` costs for ``runtime_s`` of life."""
    if not (math.isfinite(usd_per_hour) and usd_per_hour >= 0):
        raise InvalidInputError(
            f"price must be finite and >= 0, got {usd_per_hour!r}", field="usd_per_hour"
        )
    return usd_per_hour * billed_seconds(runtime_s) / 3600.0


def _check_market(market: str) -> str:
    if market not in MARKETS:
        raise InvalidInputError(
            f"market must be one of {', '.join(MARKETS)}, got {market!r}", field="market"
        )
    return str(market)


# --------------------------------------------------------------------------------------------
# Catalogue
# --------------------------------------------------------------------------------------------


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
        if _check_market(market) == SPOT:
            return self.spot_usd_per_hour
        return self.ondemand_usd_per_hour

    def ref(self, market: str) -> OfferingRef:
        """The pool reference used across plans, sizing and ledgers."""
        return OfferingRef(self.provider, self.instance_type, self.zone, _check_market(market))

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
        markets = MARKETS if market is None else (_check_market(market),)
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


class _CsvFile:
    """Rows of one CSV file with a header: ``(line, {column: stripped text})``, and the
    field checks that make a :class:`TraceFormatError` name the file, line and field."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)

    def error(
        self, message: str, line: int | None = None, field: str | None = None
    ) -> TraceFormatError:
        return TraceFormatError(message, path=self.name, line=line, field=field)

    def rows(self, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
        try:
            handle = open(self.path, newline="", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as e:
            raise self.error(f"cannot read file: {e.strerror}") from e
        try:
            reader = csv.reader(handle)
            try:
                header = [name.strip() for name in next(reader)]
            except StopIteration:
                raise self.error("empty file (no header)", 1) from None
            for name in required:
                if name not in header:
                    raise self.error(
                        f"missing column {name!r} (header: {','.join(header)})", 1, name
                    )
            for cells in reader:
                if not cells or all(not c.strip() for c in cells):
                    continue
                row = {
                    name: (cells[i].strip() if i < len(cells) else "")
                    for i, name in enumerate(header)
                }
                yield reader.line_num, row
        except (UnicodeDecodeError, csv.Error) as e:
            raise self.error(f"not a CSV text file ({e})") from e
        finally:
            handle.close()

    def text(self, row: Mapping[str, str], line: int, name: str) -> str:
        value = row.get(name, "")
        if not value:
            raise self.error("missing value", line, name)
        return value

    def number(
        self, row: Mapping[str, str], line: int, name: str, *, optional: bool = False
    ) -> float | None:
        """A finite number > 0; ``None`` for an empty cell when ``optional``."""
        text = row.get(name, "")
        if not text:
            if optional:
                return None
            raise self.error("missing value", line, name)
        try:
            value = float(text)
        except ValueError:
            raise self.error(f"not a number: {text!r}", line, name) from None
        if not math.isfinite(value):
            raise self.error(f"not finite: {text!r}", line, name)
        if value < 0:
            raise self.error(f"negative: {text!r}", line, name)
        if value == 0:
            raise self.error(f"must be > 0: {text!r}", line, name)
        return value

    def price(self, row: Mapping[str, str], line: int, name: str) -> float:
        value = self.number(row, line, name)
        assert value is not None  # not optional
        return value

    def integer(self, row: Mapping[str, str], line: int, name: str) -> int:
        value = self.price(row, line, name)
        if value != int(value):
            raise self.error(f"not an integer: {row[name]!r}", line, name)
        return int(value)


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
    f = _CsvFile(path)
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
        f = _CsvFile(Path(raw_path))
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


# --------------------------------------------------------------------------------------------
# Price series
# --------------------------------------------------------------------------------------------


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


def _check_window(start_s: float, end_s: float) -> None:
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
        _check_window(start_s, end_s)
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
        _check_window(start_s, end_s)
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
        f = _CsvFile(Path(path))
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
        _check_market(market)
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
    f = _CsvFile(Path(path))
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


def _seed_int(*parts: object) -> int:
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
            seed=_seed_int(seed, offering.key(SPOT)),
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
        _check_window(start_s, end_s)
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


# --------------------------------------------------------------------------------------------
# Availability traces (Bamboo)
# --------------------------------------------------------------------------------------------

_EVENT_LINE = re.compile(r"^\s*\d+(?:\.\d+)?\s*,\s*(?:add|remove)\s*,\s*\S.*$")
_COUNT_LINE = re.compile(r"^\s*\d{4}-\d{2}-\d{2}\s*,\s*\d{1,2}:\d{2}:\d{2}\s*,\s*\d+\s*$")
_EVENT_HEADER = ("time_ms", "event", "node")
_COUNT_HEADER = ("date", "time", "count")
#: :attr:`AvailabilityTrace.kind` of event-list traces and of count traces.
EVENT_TRACE = "events"
COUNT_TRACE = "counts"


@dataclass(frozen=True)
class AvailabilityTrace:
    """How many spot instances of one pool were alive over time, and when some were lost.

    ``times_s[i]`` (strictly increasing, seconds from the trace's origin) is a change point:
    from it on ``capacity[i]`` instances are alive; ``added[i]`` were granted and
    ``preempted[i]`` reclaimed at that instant (``capacity[i] = capacity[i-1] + added[i] -
    preempted[i]``, capacity 0 before the first point). ``instances[i]`` is the set of node
    names alive from ``times_s[i]`` for event traces, ``None`` for count traces (which only
    know the net change: a drop of n counts as n preemptions, a rise as n additions).
    """

    source: str
    kind: str
    times_s: tuple[float, ...]
    capacity: tuple[int, ...]
    added: tuple[int, ...]
    preempted: tuple[int, ...]
    instances: tuple[frozenset[str], ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.times_s)
        if self.kind not in (EVENT_TRACE, COUNT_TRACE):
            raise InvalidInputError(f"unknown trace kind {self.kind!r}", field="kind")
        if n == 0 or not (len(self.capacity) == len(self.added) == len(self.preempted) == n):
            raise InvalidInputError("a trace needs equal, non-empty columns", field="times_s")
        if self.instances is not None and len(self.instances) != n:
            raise InvalidInputError("one instance set per change point", field="instances")
        before = 0
        for i in range(n):
            if not math.isfinite(self.times_s[i]) or (i and self.times_s[i] <= self.times_s[i - 1]):
                raise InvalidInputError("times must be finite and increasing", field="times_s")
            if min(self.capacity[i], self.added[i], self.preempted[i]) < 0:
                raise InvalidInputError("counts must be >= 0", field="capacity")
            if self.capacity[i] != before + self.added[i] - self.preempted[i]:
                raise InvalidInputError(
                    f"capacity at index {i} is not the previous plus added minus preempted",
                    field="capacity",
                )
            if self.instances is not None and len(self.instances[i]) != self.capacity[i]:
                raise InvalidInputError(
                    "instance set size differs from capacity", field="instances"
                )
            before = self.capacity[i]

    @property
    def start_s(self) -> float:
        return self.times_s[0]

    @property
    def end_s(self) -> float:
        """The last change point (the trace says nothing after it; capacity stays)."""
        return self.times_s[-1]

    def _index(self, t_s: float) -> int:
        return bisect.bisect_right(self.times_s, t_s) - 1

    def capacity_at(self, t_s: float) -> int:
        """Instances alive at ``t_s`` (changes at ``t_s`` included); 0 before the trace."""
        i = self._index(t_s)
        return 0 if i < 0 else self.capacity[i]

    def instances_at(self, t_s: float) -> frozenset[str]:
        """Names of the instances alive at ``t_s`` (event traces only)."""
        if self.instances is None:
            raise InvalidInputError(
                f"{self.source}: a count trace has no instance names", field="kind"
            )
        i = self._index(t_s)
        return frozenset() if i < 0 else self.instances[i]

    def _sum_between(self, column: tuple[int, ...], t0_s: float, t1_s: float) -> int:
        _check_window(t0_s, t1_s)
        lo = bisect.bisect_left(self.times_s, t0_s)
        hi = bisect.bisect_left(self.times_s, t1_s)
        return sum(column[lo:hi])

    def preemptions_between(self, t0_s: float, t1_s: float) -> int:
        """Instances reclaimed at times in ``[t0_s, t1_s)``."""
        return self._sum_between(self.preempted, t0_s, t1_s)

    def additions_between(self, t0_s: float, t1_s: float) -> int:
        """Instances granted at times in ``[t0_s, t1_s)``."""
        return self._sum_between(self.added, t0_s, t1_s)

    def preemption_times(self, t0_s: float, t1_s: float) -> list[tuple[float, int]]:
        """``(t_s, instances reclaimed)`` for each preemption in ``[t0_s, t1_s)``."""
        _check_window(t0_s, t1_s)
        lo = bisect.bisect_left(self.times_s, t0_s)
        hi = bisect.bisect_left(self.times_s, t1_s)
        return [(self.times_s[i], self.preempted[i]) for i in range(lo, hi) if self.preempted[i]]


def load_availability_trace(path: str | Path) -> AvailabilityTrace:
    """Parse a spot availability trace, detecting its format from the first data line.

    * **Events** (Bamboo ``p3-trace.csv``, ``g4dn-trace.csv``): ``time_ms,add|remove,node``,
      no header (a ``time_ms,event,node`` header is accepted). Times are **milliseconds**
      (every value in the shipped files is a multiple of 60 000, and the traces span ~10.8 h
      and ~11.4 h: read as seconds they would span over a year), converted to seconds; events
      at one time are applied together. Adding a node already alive, removing one not alive, or
      a time going backwards is an error.
    * **Counts** (Bamboo ``gcloud/*.txt``): ``YYYY-MM-DD, HH:MM:SS, count`` (a
      ``date,time,count`` header is accepted), read as UTC; times in seconds from the earliest
      retained sample. The logger repeats each sample for up to two minutes, and a new sample can
      be stamped before those repeats: the count at time t is that of **the last line in the
      file whose time is <= t** (a line that goes back in time overrides what earlier lines
      said from its time on).

    Anything else is a :class:`TraceFormatError` naming the file and line (and the field when
    one cell is bad).
    """
    p = Path(path)
    name = str(p)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceFormatError(f"cannot read file: {e.strerror}", path=name) from e
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"not a text file ({e})", path=name) from e
    lines = [(i + 1, raw) for i, raw in enumerate(text.splitlines()) if raw.strip()]
    if not lines:
        raise TraceFormatError("empty trace", path=name, line=1)
    first_no, first = lines[0]
    header = tuple(c.strip().lower() for c in first.split(","))
    if header in (_EVENT_HEADER, _COUNT_HEADER):
        lines = lines[1:]
        kind = EVENT_TRACE if header == _EVENT_HEADER else COUNT_TRACE
        if not lines:
            raise TraceFormatError("no data lines after the header", path=name, line=first_no)
    elif _EVENT_LINE.match(first):
        kind = EVENT_TRACE
    elif _COUNT_LINE.match(first):
        kind = COUNT_TRACE
    else:
        raise TraceFormatError(
            "unknown availability trace format: expected 'time_ms,add|remove,node' or "
            f"'YYYY-MM-DD, HH:MM:SS, count', got {first.strip()[:60]!r}",
            path=name,
            line=first_no,
        )
    if kind == EVENT_TRACE:
        return _parse_events(name, lines)
    return _parse_counts(name, lines)


def _cells(name: str, line: int, raw: str, fields: tuple[str, ...]) -> list[str]:
    cells = [c.strip() for c in raw.split(",")]
    if len(cells) != len(fields):
        raise TraceFormatError(
            f"expected {len(fields)} comma-separated fields ({','.join(fields)}), got {len(cells)}",
            path=name,
            line=line,
        )
    for cell, fname in zip(cells, fields, strict=True):
        if not cell:
            raise TraceFormatError("missing value", path=name, line=line, field=fname)
    return cells


def _parse_events(name: str, lines: list[tuple[int, str]]) -> AvailabilityTrace:
    alive: set[str] = set()
    times: list[float] = []
    capacity: list[int] = []
    added: list[int] = []
    preempted: list[int] = []
    instances: list[frozenset[str]] = []
    last_ms = -math.inf
    for line, raw in lines:
        t_text, event, node = _cells(name, line, raw, _EVENT_HEADER)
        try:
            t_ms = float(t_text)
        except ValueError:
            raise TraceFormatError(
                f"not a number: {t_text!r}", path=name, line=line, field="time_ms"
            ) from None
        if not math.isfinite(t_ms) or t_ms < 0:
            raise TraceFormatError(
                f"time must be finite and >= 0: {t_text!r}", path=name, line=line, field="time_ms"
            )
        if t_ms < last_ms:
            raise TraceFormatError(
                f"time {t_text} ms is before the previous line's",
                path=name,
                line=line,
                field="time_ms",
            )
        event = event.lower()
        if event == "add":
            if node in alive:
                raise TraceFormatError(
                    f"node {node!r} added while alive", path=name, line=line, field="node"
                )
            alive.add(node)
        elif event == "remove":
            if node not in alive:
                raise TraceFormatError(
                    f"node {node!r} removed while not alive", path=name, line=line, field="node"
                )
            alive.discard(node)
        else:
            raise TraceFormatError(
                f"event must be add or remove, got {event!r}", path=name, line=line, field="event"
            )
        t_s = t_ms / 1000.0
        if not times or t_ms > last_ms:
            times.append(t_s)
            added.append(0)
            preempted.append(0)
            capacity.append(0)
            instances.append(frozenset())
        if event == "add":
            added[-1] += 1
        else:
            preempted[-1] += 1
        capacity[-1] = len(alive)
        instances[-1] = frozenset(alive)
        last_ms = t_ms
    return AvailabilityTrace(
        name,
        EVENT_TRACE,
        tuple(times),
        tuple(capacity),
        tuple(added),
        tuple(preempted),
        tuple(instances),
    )


def _parse_counts(name: str, lines: list[tuple[int, str]]) -> AvailabilityTrace:
    stack: list[tuple[datetime, int]] = []  # retained samples, time increasing
    for line, raw in lines:
        day, clock, count_text = _cells(name, line, raw, _COUNT_HEADER)
        try:
            when = datetime.fromisoformat(f"{day} {clock}").replace(tzinfo=UTC)
        except ValueError:
            field_name = "date"
            try:
                date.fromisoformat(day)
                field_name = "time"
            except ValueError:
                pass
            raise TraceFormatError(
                f"bad date/time {day!r} {clock!r}", path=name, line=line, field=field_name
            ) from None
        if not count_text.isdigit():
            raise TraceFormatError(
                f"count must be an integer >= 0, got {count_text!r}",
                path=name,
                line=line,
                field="count",
            )
        while stack and stack[-1][0] >= when:
            stack.pop()  # this line overrides earlier lines from its time on
        stack.append((when, int(count_text)))
    origin = stack[0][0]
    times: list[float] = []
    capacity: list[int] = []
    added: list[int] = []
    preempted: list[int] = []
    before = 0
    for when, count in stack:
        if times and count == before:
            continue
        times.append((when - origin).total_seconds())
        capacity.append(count)
        added.append(max(0, count - before))
        preempted.append(max(0, before - count))
        before = count
    return AvailabilityTrace(
        name, COUNT_TRACE, tuple(times), tuple(capacity), tuple(added), tuple(preempted), None
    )


# --------------------------------------------------------------------------------------------
# Spot interruption hazard (AWS Spot Instance Advisor)
# --------------------------------------------------------------------------------------------


def band_hazard_per_hour(label: str) -> float:
    """Per-instance-hour preemption hazard of an advisor interruption band.

    With ``f`` = :data:`INTERRUPTION_BAND_FRACTIONS` [label] read as the probability that an
    instance running for a month (:data:`HOURS_PER_MONTH`) is interrupted, and a constant
    hazard: ``lambda = -ln(1 - f) / 720``. ``<5%`` gives 3.5e-5/h (mean life ~3.3 years),
    ``>20%`` 4.0e-4/h (~104 days).
    """
    fraction = INTERRUPTION_BAND_FRACTIONS.get(label.strip())
    if fraction is None:
        raise InvalidInputError(
            f"unknown interruption band {label!r}; known: {', '.join(INTERRUPTION_BAND_FRACTIONS)}",
            field="interruption_frequency_label",
        )
    return -math.log1p(-fraction) / HOURS_PER_MONTH


@dataclass(frozen=True)
class InterruptionBand:
    """The advisor's figures for one (region, instance type)."""

    region: str
    instance_type: str
    label: str
    savings_vs_ondemand_pct: float
    source_date: str

    @property
    def monthly_fraction(self) -> float:
        return INTERRUPTION_BAND_FRACTIONS[self.label]

    @property
    def hazard_per_hour(self) -> float:
        return band_hazard_per_hour(self.label)


@dataclass(frozen=True)
class SpotHazardModel:
    """Spot preemptions as a constant per-instance hazard from the advisor's bands.

    ``bands`` maps ``(region, instance_type)`` to its band. An offering with no band uses
    ``default_band`` (a label such as ``"5-10%"``) or, if that is ``None``, is an error. The
    on-demand market has hazard 0.
    """

    bands: Mapping[tuple[str, str], InterruptionBand]
    seed: int = 0
    default_band: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "bands", MappingProxyType(dict(self.bands)))
        if self.default_band is not None:
            band_hazard_per_hour(self.default_band)

    def hazard_per_hour(self, offering: PricedOffering | MarketOffering) -> float:
        """Preemptions per instance-hour of ``offering`` on the spot market (0 for a
        :class:`MarketOffering` on the on-demand market)."""
        if isinstance(offering, MarketOffering):
            if offering.market == ON_DEMAND:
                return 0.0
            offering = offering.offering
        band = self.bands.get((offering.region, offering.instance_type))
        if band is not None:
            return band.hazard_per_hour
        if self.default_band is None:
            raise InvalidInputError(
                f"no interruption band for {offering.instance_type} in {offering.region} "
                "(give default_band)",
                field="instance_type",
            )
        return band_hazard_per_hour(self.default_band)

    def survival(self, offering: PricedOffering | MarketOffering, duration_s: float) -> float:
        """Probability that an instance lives ``duration_s`` without preemption."""
        if not (math.isfinite(duration_s) and duration_s >= 0):
            raise InvalidInputError("duration must be finite and >= 0", field="duration_s")
        return math.exp(-self.hazard_per_hour(offering) * duration_s / 3600.0)

    def sample_preemption_s(
        self, offering: PricedOffering | MarketOffering, instance_id: str, launched_at_s: float
    ) -> float:
        """When the instance ``instance_id`` launched at ``launched_at_s`` is preempted.

        An exponential draw with the offering's hazard, from a generator seeded by
        (``seed``, ``instance_id``): the same arguments always give the same time, and
        different instances get independent draws. ``math.inf`` when the hazard is 0.
        """
        if not instance_id:
            raise InvalidInputError("instance id must not be empty", field="instance_id")
        if not math.isfinite(launched_at_s):
            raise InvalidInputError("launch time must be finite", field="launched_at_s")
        rate = self.hazard_per_hour(offering)
        if rate <= 0:
            return math.inf
        u = random.Random(_seed_int(self.seed, instance_id)).random()
        return launched_at_s - math.log1p(-u) / rate * 3600.0


def load_hazard_model(
    path: str | Path | None = None, *, seed: int = 0, default_band: str | None = None
) -> SpotHazardModel:
    """A :class:`SpotHazardModel` from an advisor CSV (default: the shipped
    ``aws_spot_advisor_gpu.csv``; columns ``region,instance_type,savings_vs_ondemand_pct,
    interruption_frequency_label,source_commit_date``). Bad rows and duplicate (region, type)
    pairs are a :class:`TraceFormatError` naming file, line and field."""
    f = _CsvFile(prices_dir() / _SPOT_ADVISOR_FILE if path is None else Path(path))
    columns = (
        "region",
        "instance_type",
        "savings_vs_ondemand_pct",
        "interruption_frequency_label",
        "source_commit_date",
    )
    bands: dict[tuple[str, str], InterruptionBand] = {}
    lines: dict[tuple[str, str], int] = {}
    for line, row in f.rows(columns):
        key = (f.text(row, line, "region"), f.text(row, line, "instance_type"))
        label = f.text(row, line, "interruption_frequency_label")
        if label not in INTERRUPTION_BAND_FRACTIONS:
            raise f.error(
                f"unknown interruption band {label!r}", line, "interruption_frequency_label"
            )
        savings_text = f.text(row, line, "savings_vs_ondemand_pct")
        try:
            savings = float(savings_text)
        except ValueError:
            raise f.error(
                f"not a number: {savings_text!r}", line, "savings_vs_ondemand_pct"
            ) from None
        if key in lines:
            raise DuplicateOfferingError(
                f"duplicate advisor row for {key[1]} in {key[0]} (first at {f.name}:{lines[key]})",
                path=f.name,
                line=line,
                other_path=f.name,
                other_line=lines[key],
                field="instance_type",
            )
        lines[key] = line
        bands[key] = InterruptionBand(
            key[0], key[1], label, savings, f.text(row, line, "source_commit_date")
        )
    return SpotHazardModel(bands, seed=seed, default_band=default_band)
