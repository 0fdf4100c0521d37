"""``AwsProvider``: the provider contract (``providers.base``) on EC2.

Calls made, and why (all through ``AwsCaller``: typed errors, transient-only retries on the
injected clock):

* catalogue (once per provider, on first need): ``DescribeAvailabilityZones`` (zone names <->
  zone ids), ``DescribeInstanceTypes`` (paginated, filtered to ``AwsConfig.instance_types``,
  then client-side to types with ``GpuInfo``), ``DescribeInstanceTypeOfferings`` by zone id
  (which type exists in which zone). Offerings are keyed by **zone id** (``use1-az6``): zone
  names are shuffled per account, ids are not.
* ``spot_prices``: ``DescribeSpotPriceHistory`` (paginated, latest per type and zone).
* ``launch``: ``DescribeInstances`` by request-id tag (what already exists), then either one
  ``CreateFleet`` (type ``instant``) or ``RunInstances`` per pool, each with a deterministic
  ``ClientToken``. With ``image_id`` config, ``CreateFleet`` uses a coadapt-managed launch
  template (``DescribeLaunchTemplates``/``CreateLaunchTemplate``, once per distinct template).
* ``list_instances``: ``DescribeInstances`` filtered by the ownership tags and live states.
* ``terminate``: ``DescribeInstances`` by id (ownership check), ``TerminateInstances`` in
  batches.
* ``interruptions``: SQS ``ReceiveMessage``/``DeleteMessageBatch`` plus one ownership lookup.

Idempotency of ``launch``
-------------------------

The launch rule of ``providers.base``: the request id is a tag on every instance; a launch
first lists the live instances tagged with it and creates only ``count - found``
(``launch_shortfall``; ``found >= count`` creates nothing, and a surplus is logged as a likely
leak), placed by ``providers.capacity.walk_pools`` (``CreateFleet``: one call over the usable
pools; ``RunInstances``: pool by pool, cheapest first).

The ``ClientToken`` is a SHA-256 of (cluster, request, pools tried, instances already found,
count asked, attempt generation): a retry after a crash whose instances are not yet visible to
``DescribeInstances`` (eventual consistency) repeats the same token and EC2 answers with the
original instances instead of launching again. The generation goes up after a launch that
reported pool errors, so a later retry after capacity comes back is a new request, not a replay
of the old failure. Known gap: if a retry sees only *some* of the earlier instances (partial
visibility), the missing count differs, so does the token, and the retry may launch a few too
many; the next launch with that id then finds more than it asked for, logs it, and creates
nothing.

Tags
----

Instances carry ``providers.tags.all_tags`` (ownership + user tags). ``RunInstances`` tags the
volumes with the same tags. ``CreateFleet`` cannot tag volumes per request (instant fleets
accept only ``instance`` and ``fleet`` tag specifications); its volumes get the cluster and
managed-by tags from the managed launch template instead.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from coadapt_common.clock import Clock, SystemClock
from providers.aws.calls import AwsCaller, make_client
from providers.aws.catalog import gpu_type_name, on_demand_price_usd_per_hour
from providers.aws.config import AwsConfig, LaunchApi
from providers.aws.errors import error_from_code
from providers.aws.interruptions import SqsInterruptionQueue
from providers.base import (
    Instance,
    InstanceState,
    InterruptionNotice,
    LaunchRequest,
    LaunchResult,
    Market,
    Offering,
    SpotPrice,
    TerminateResult,
    launch_shortfall,
    offering_key,
)
from providers.capacity import Placement, UnavailableOfferings, walk_pools
from providers.errors import (
    InstanceNotFoundError,
    InsufficientCapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaExceededError,
)
from providers.retry import RetryPolicy
from providers.tags import (
    CLUSTER_ID_TAG,
    MANAGED_BY_TAG,
    MANAGED_BY_VALUE,
    REQUEST_ID_TAG,
    all_tags,
    is_owned_by,
    validate_id,
)

PROVIDER_NAME = "aws"
LIVE_EC2_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")
_STATE_MAP = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPING,
    "shutting-down": InstanceState.STOPPING,
    "terminated": InstanceState.TERMINATED,
}
_LIFECYCLE_MARKET = {"spot": Market.SPOT, "on-demand": Market.ON_DEMAND}
SPOT_PRODUCT_DESCRIPTIONS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
_INSTANCE_ID_RE = re.compile(r"^i-(?:[0-9a-f]{8}|[0-9a-f]{17})$")
_NOT_FOUND_IDS_RE = re.compile(r"i-[0-9a-zA-Z]+")
_MAX_GENERATIONS = 10_000
_TYPE_FILTER_CHUNK = 100

# Which provider method is running (for call attribution by instrumentation hooks).
_OPERATION: ContextVar[str | None] = ContextVar("coadapt_aws_operation", default=None)


def client_token(*parts: str) -> str:
    """Deterministic EC2 ``ClientToken``: SHA-256 hex of the parts (64 chars, EC2's maximum)."""
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()


def _tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def _tags_of(raw: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in raw.get("Tags", []) or []}


def _epoch_s(value: object) -> float | None:
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    return None


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True)
class _Zones:
    """Zone names <-> zone ids of the region."""

    id_by_name: Mapping[str, str]
    name_by_id: Mapping[str, str]

    def to_id(self, zone: str) -> str:
        """Zone id for a zone name or id; ``InvalidRequestError`` when neither."""
        if zone in self.name_by_id:
            return zone
        if zone in self.id_by_name:
            return self.id_by_name[zone]
        raise InvalidRequestError(f"unknown availability zone {zone!r}")


@dataclass(frozen=True)
class _Catalogue:
    """What this provider can launch: offerings by key, and where each zone's subnet is."""

    offerings: Mapping[str, Offering]
    subnet_by_zone_id: Mapping[str, str]
    zone_id_by_subnet: Mapping[str, str]


class AwsProvider:
    """EC2 behind the coadapt provider contract (see ``providers.base`` and this module).

    ``config`` says where and how to launch; the cluster id comes with every call, so one
    provider serves any number of clusters. Clients come from ``client_factory(service)``
    when given, else from ``session`` (or a default boto3 session) with ``endpoint_url``
    (tests point it at a moto server). ``clock`` drives retries, the capacity cache and price
    freshness; ``unavailable`` is the capacity cache (shared with sizing when passed in).
    """

    def __init__(
        self,
        config: AwsConfig,
        *,
        clock: Clock | None = None,
        session: Any | None = None,
        client_factory: Callable[[str], Any] | None = None,
        endpoint_url: str | None = None,
        retry_policy: RetryPolicy | None = None,
        unavailable: UnavailableOfferings | None = None,
        name: str = PROVIDER_NAME,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.unavailable = unavailable or UnavailableOfferings(self.clock)
        self._caller = AwsCaller(clock=self.clock, policy=retry_policy or RetryPolicy(), rng=rng)

        def default_factory(service: str) -> Any:
            return make_client(
                service, region=config.region, session=session, endpoint_url=endpoint_url
            )

        factory = client_factory or default_factory
        self.ec2: Any = factory("ec2")
        self.sqs: Any | None = None
        self._queue: SqsInterruptionQueue | None = None
        if config.interruption_queue_url:
            self.sqs = factory("sqs")
            self._queue = SqsInterruptionQueue(
                self.sqs,
                config.interruption_queue_url,
                caller=self._caller,
                delete_foreign=config.delete_foreign_events,
            )
        self._zones: _Zones | None = None
        self._catalogue: _Catalogue | None = None
        self._spot_prices: list[SpotPrice] | None = None
        self._spot_prices_mono_s = 0.0
        self._templates: dict[str, str] = {}
        self._generations: dict[str, int] = {}

    # ------------------------------------------------------------------ instrumentation

    def clients(self) -> tuple[Any, ...]:
        """Every botocore client this provider calls (for event-hook instrumentation)."""
        return (self.ec2,) if self.sqs is None else (self.ec2, self.sqs)

    @staticmethod
    def current_operation() -> str | None:
        """The provider method now running (``launch``, ``list``, ``terminate``, ...), if any.

        Lets ``before-call`` hooks attribute each real API call to the method that made it.
        """
        return _OPERATION.get()

    @contextlib.contextmanager
    def _operation(self, name: str) -> Iterator[None]:
        if _OPERATION.get() is not None:  # nested: attribute to the outer method
            yield
            return
        token = _OPERATION.set(name)
        try:
            yield
        finally:
            _OPERATION.reset(token)

    # ----------------------------------------------------------------------- catalogue

    def _zone_map(self) -> _Zones:
        if self._zones is None:
            response = self._caller.call(self.ec2, "describe_availability_zones", {})
            id_by_name: dict[str, str] = {}
            for zone in response.get("AvailabilityZones", []):
                if zone.get("ZoneType", "availability-zone") != "availability-zone":
                    continue  # local zones / wavelength zones: not for GPU training fleets
                if zone.get("State", "available") != "available":
                    continue
                id_by_name[zone["ZoneName"]] = zone["ZoneId"]
            self._zones = _Zones(
                id_by_name=id_by_name, name_by_id={v: k for k, v in id_by_name.items()}
            )
        return self._zones

    def zone_id_for(self, *, zone: str | None = None, subnet_id: str | None = None) -> str:
        """Zone id of a zone name/id or of a configured subnet (``InvalidRequestError`` if none).

        Needs the zone map (one ``DescribeAvailabilityZones`` on first use).
        """
        if subnet_id is not None:
            catalogue = self._load_catalogue()
            if subnet_id in catalogue.zone_id_by_subnet:
                return catalogue.zone_id_by_subnet[subnet_id]
            raise InvalidRequestError(f"subnet {subnet_id!r} is not in AwsConfig.subnets_by_zone")
        if zone is None:
            raise InvalidRequestError("zone_id_for needs a zone or a subnet id")
        return self._zone_map().to_id(zone)

    def _load_catalogue(self) -> _Catalogue:
        if self._catalogue is not None:
            return self._catalogue
        zones = self._zone_map()
        subnet_by_zone_id: dict[str, str] = {}
        for zone, subnet in self.config.subnets_by_zone.items():
            subnet_by_zone_id[zones.to_id(zone)] = subnet
        allowed_zone_ids = set(subnet_by_zone_id) or set(zones.name_by_id)

        gpu_types: dict[str, Mapping[str, Any]] = {}
        for info in self._caller.pages(
            self.ec2,
            "describe_instance_types",
            {
                "Filters": [{"Name": "instance-type", "Values": list(self.config.instance_types)}],
                "MaxResults": 100,
            },
            "InstanceTypes",
        ):
            gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
            if sum(int(g.get("Count", 0)) for g in gpus) > 0:
                gpu_types[info["InstanceType"]] = info

        zones_by_type: dict[str, set[str]] = {t: set() for t in gpu_types}
        for chunk in _chunks(sorted(gpu_types), _TYPE_FILTER_CHUNK):
            for offer in self._caller.pages(
                self.ec2,
                "describe_instance_type_offerings",
                {
                    "LocationType": "availability-zone-id",
                    "Filters": [{"Name": "instance-type", "Values": list(chunk)}],
                    "MaxResults": 1000,
                },
                "InstanceTypeOfferings",
            ):
                if offer.get("InstanceType") in zones_by_type:
                    zones_by_type[offer["InstanceType"]].add(offer["Location"])

        offerings: dict[str, Offering] = {}
        for itype in sorted(gpu_types):
            info = gpu_types[itype]
            gpus = info["GpuInfo"]["Gpus"]
            first = gpus[0]
            usage = set(info.get("SupportedUsageClasses") or ("on-demand", "spot"))
            markets = [m for m in (Market.SPOT, Market.ON_DEMAND) if m.value in usage]
            on_demand = on_demand_price_usd_per_hour(
                itype, self.config.region, self.config.on_demand_prices_usd_per_hour
            )
            for zone_id in sorted(zones_by_type[itype] & allowed_zone_ids):
                for market in markets:
                    offering = Offering(
                        provider=self.name,
                        instance_type=itype,
                        gpu_type=gpu_type_name(
                            str(first.get("Name", "unknown")),
                            (first.get("MemoryInfo") or {}).get("SizeInMiB"),
                        ),
                        gpus=sum(int(g.get("Count", 0)) for g in gpus),
                        vcpus=int(info["VCpuInfo"]["DefaultVCpus"]),
                        memory_gib=float(info["MemoryInfo"]["SizeInMiB"]) / 1024.0,
                        region=self.config.region,
                        zone=zone_id,
                        market=market,
                        price_usd_per_hour=on_demand if market is Market.ON_DEMAND else None,
                    )
                    offerings[offering.key] = offering
        self._catalogue = _Catalogue(
            offerings=offerings,
            subnet_by_zone_id=subnet_by_zone_id,
            zone_id_by_subnet={s: z for z, s in subnet_by_zone_id.items()},
        )
        return self._catalogue

    def refresh(self) -> None:
        """Forget the cached catalogue, zone map and spot prices (next call re-reads them)."""
        self._zones = None
        self._catalogue = None
        self._spot_prices = None

    def offerings(self) -> list[Offering]:
        """Every GPU pool (type x zone id x market); spot prices reused for ``spot_price_ttl_s``.

        On-demand prices come from ``providers.aws.catalog`` (``None`` when not catalogued).
        """
        with self._operation("offerings"):
            catalogue = self._load_catalogue()
            fresh = (
                self._spot_prices is not None
                and self.clock.monotonic_s() - self._spot_prices_mono_s
                < self.config.spot_price_ttl_s
            )
            prices = self._spot_prices if fresh and self._spot_prices is not None else None
            if prices is None:
                prices = self._fetch_spot_prices(catalogue)
            by_pool = {(p.instance_type, p.zone): p.price_usd_per_hour for p in prices}
            out = []
            for offering in catalogue.offerings.values():
                if offering.market is Market.SPOT:
                    price = by_pool.get((offering.instance_type, offering.zone))
                    offering = replace(offering, price_usd_per_hour=price)
                out.append(offering)
            return out

    # --------------------------------------------------------------------- spot prices

    def spot_prices(self) -> list[SpotPrice]:
        """Latest ``DescribeSpotPriceHistory`` price per (type, zone id) of the spot offerings."""
        with self._operation("spot_prices"):
            return self._fetch_spot_prices(self._load_catalogue())

    def _fetch_spot_prices(self, catalogue: _Catalogue) -> list[SpotPrice]:
        spot_pools = {
            (o.instance_type, o.zone)
            for o in catalogue.offerings.values()
            if o.market is Market.SPOT
        }
        types = sorted({t for t, _ in spot_pools})
        latest: dict[tuple[str, str], SpotPrice] = {}
        if types:
            zones = self._zone_map()
            params = {
                "InstanceTypes": types,
                "ProductDescriptions": list(SPOT_PRODUCT_DESCRIPTIONS),
                # EC2 returns the price in effect at StartTime plus any later changes.
                "StartTime": datetime.fromtimestamp(self.clock.now_s(), tz=UTC),
                "MaxResults": 1000,
            }
            for item in self._caller.pages(
                self.ec2, "describe_spot_price_history", params, "SpotPriceHistory"
            ):
                zone_id = item.get("AvailabilityZoneId")
                if not zone_id:
                    zone_name = item.get("AvailabilityZone", "")
                    zone_id = zones.id_by_name.get(zone_name)
                key = (item.get("InstanceType", ""), zone_id or "")
                if key not in spot_pools:
                    continue
                try:
                    price = float(item["SpotPrice"])
                except (KeyError, TypeError, ValueError):
                    continue
                timestamp_s = _epoch_s(item.get("Timestamp"))
                if price <= 0 or timestamp_s is None:
                    continue
                known = latest.get(key)
                if known is None or timestamp_s > known.timestamp_s:
                    latest[key] = SpotPrice(key[0], key[1], price, timestamp_s)
        prices = [latest[k] for k in sorted(latest)]
        self._spot_prices = prices
        self._spot_prices_mono_s = self.clock.monotonic_s()
        return prices

    # ------------------------------------------------------------------ instance views

    def _instance_from_aws(self, raw: Mapping[str, Any]) -> Instance:
        tags = _tags_of(raw)
        placement = raw.get("Placement") or {}
        zone_id = placement.get("AvailabilityZoneId") or self._zone_map().id_by_name.get(
            placement.get("AvailabilityZone", ""), placement.get("AvailabilityZone", "")
        )
        state_name = (raw.get("State") or {}).get("Name", "pending")
        return Instance(
            instance_id=raw["InstanceId"],
            provider=self.name,
            instance_type=raw.get("InstanceType", ""),
            zone=zone_id,
            market=Market.SPOT if raw.get("InstanceLifecycle") == "spot" else Market.ON_DEMAND,
            state=_STATE_MAP.get(state_name, InstanceState.PENDING),
            cluster_id=tags.get(CLUSTER_ID_TAG, ""),
            request_id=tags.get(REQUEST_ID_TAG, ""),
            tags=tags,
            launched_at_s=_epoch_s(raw.get("LaunchTime")),
            private_ip=raw.get("PrivateIpAddress"),
        )

    def _describe(self, filters: list[dict[str, Any]]) -> Iterator[Mapping[str, Any]]:
        params = {"Filters": filters, "MaxResults": 1000}
        for reservation in self._caller.pages(
            self.ec2, "describe_instances", params, "Reservations"
        ):
            yield from reservation.get("Instances", []) or []

    def _describe_by_ids(self, instance_ids: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        """Raw descriptions of the ids EC2 knows (any owner, any state), by id.

        Uses the ``instance-id`` *filter* (not ``InstanceIds``), so unknown ids are simply
        absent instead of failing the whole call.
        """
        found: dict[str, Mapping[str, Any]] = {}
        for chunk in _chunks(list(instance_ids), self.config.describe_batch_size):
            for raw in self._describe([{"Name": "instance-id", "Values": list(chunk)}]):
                found[raw["InstanceId"]] = raw
        return found

    def _owned_live(self, cluster_id: str, extra: list[dict[str, Any]]) -> list[Instance]:
        filters = [
            {"Name": f"tag:{CLUSTER_ID_TAG}", "Values": [cluster_id]},
            {"Name": f"tag:{MANAGED_BY_TAG}", "Values": [MANAGED_BY_VALUE]},
            {"Name": "instance-state-name", "Values": list(LIVE_EC2_STATES)},
            *extra,
        ]
        out = []
        for raw in self._describe(filters):
            if not is_owned_by(_tags_of(raw), cluster_id):  # never trust the filter alone
                continue
            if (raw.get("State") or {}).get("Name") not in LIVE_EC2_STATES:
                continue
            out.append(self._instance_from_aws(raw))
        return sorted(out, key=lambda i: i.instance_id)

    def list_instances(self, cluster_id: str) -> list[Instance]:
        """Non-terminated instances tagged for ``cluster_id`` and managed by coadapt.

        States listed: pending, running, stopping, stopped, shutting-down (stopped is shown as
        ``STOPPING``: it still exists and still costs for its volumes).
        """
        validate_id(cluster_id, field="cluster_id")
        with self._operation("list"):
            return self._owned_live(cluster_id, [])

    # ------------------------------------------------------------------------ terminate

    def terminate(
        self, cluster_id: str, instance_ids: Sequence[str], request_id: str
    ) -> TerminateResult:
        """Terminate the cluster's own instances among ``instance_ids``.

        Ownership is checked first (``DescribeInstances`` by id, in batches): ids EC2 does not
        know, malformed ids and owned instances already ``terminated`` are ``already_gone``;
        instances without this cluster's tags are ``refused`` and never sent to
        ``TerminateInstances``. The rest are terminated in batches of
        ``terminate_batch_size``; an ``InvalidInstanceID.NotFound`` (an instance vanished
        between the check and the call) is narrowed down to the missing ids, which join
        ``already_gone``. Each result tuple keeps the input order.
        """
        validate_id(cluster_id, field="cluster_id")
        validate_id(request_id, field="request_id")
        if isinstance(instance_ids, str):
            raise InvalidRequestError("instance_ids must be a sequence of ids, not one string")
        ids = list(dict.fromkeys(instance_ids))
        for iid in ids:
            if not isinstance(iid, str):
                raise InvalidRequestError(f"instance ids must be strings, got {iid!r}")
        with self._operation("terminate"):
            well_formed = [i for i in ids if _INSTANCE_ID_RE.match(i)]
            described = self._describe_by_ids(well_formed) if well_formed else {}
            gone: set[str] = set()
            refused: set[str] = set()
            to_terminate: list[str] = []
            for iid in ids:
                raw = described.get(iid)
                if raw is None:
                    gone.add(iid)
                elif not is_owned_by(_tags_of(raw), cluster_id):
                    refused.add(iid)
                elif (raw.get("State") or {}).get("Name") == "terminated":
                    gone.add(iid)
                else:
                    to_terminate.append(iid)
            terminated: set[str] = set()
            for batch in _chunks(to_terminate, self.config.terminate_batch_size):
                done, vanished = self._terminate_batch(list(batch))
                terminated |= done
                gone |= vanished
        return TerminateResult(
            request_id=request_id,
            terminated=tuple(i for i in ids if i in terminated),
            already_gone=tuple(i for i in ids if i in gone),
            refused=tuple(i for i in ids if i in refused),
        )

    def _terminate_batch(self, batch: list[str]) -> tuple[set[str], set[str]]:
        """Terminate ``batch``; returns (terminated, not found). Narrows NotFound errors."""
        terminated: set[str] = set()
        vanished: set[str] = set()
        work: list[list[str]] = [batch]
        while work:
            ids = work.pop()
            if not ids:
                continue
            try:
                response = self._caller.call(self.ec2, "terminate_instances", {"InstanceIds": ids})
            except InstanceNotFoundError as err:
                named = set(_NOT_FOUND_IDS_RE.findall(str(err))) & set(ids)
                if named:  # EC2 names the missing ids: drop them and retry the rest at once
                    vanished |= named
                    work.append([i for i in ids if i not in named])
                elif len(ids) == 1:
                    vanished.add(ids[0])
                else:  # no ids in the message: bisect to find them
                    mid = len(ids) // 2
                    work.extend([ids[:mid], ids[mid:]])
                continue
            for item in response.get("TerminatingInstances", []) or []:
                terminated.add(item["InstanceId"])
            terminated |= set(ids) - vanished  # EC2 accepted the whole call
        return terminated, vanished

    # --------------------------------------------------------------------------- launch

    def _offering_key(self, instance_type: str, zone_id: str, market: Market) -> str:
        return offering_key(self.name, instance_type, zone_id, market)

    def _resolve_offerings(self, request: LaunchRequest) -> list[Offering]:
        catalogue = self._load_catalogue()
        resolved = []
        for wanted in request.offerings:
            if wanted.provider != self.name:
                raise InvalidRequestError(
                    f"offering {wanted.key!r} belongs to provider {wanted.provider!r}, "
                    f"not {self.name!r}"
                )
            mine = catalogue.offerings.get(wanted.key)
            if mine is None:
                raise InvalidRequestError(f"unknown offering {wanted.key!r} for this provider")
            resolved.append(mine)
        return resolved

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Create up to ``request.count`` instances; see the module docstring for idempotency.

        Order: validate (``InvalidRequestError``, no call; the catalogue is read once per
        provider, so only a provider's very first call may read it) -> list instances already
        tagged with the request id -> ``walk_pools`` over the shortfall (skip pools marked
        unavailable, launch, mark pools that reported capacity errors or filled short).
        Auth failures, exhausted transient retries and requests EC2 calls malformed raise;
        capacity and quota errors are reported per pool.
        """
        request.validate()
        with self._operation("launch"):
            pools = self._resolve_offerings(request)
            if (
                self.config.launch_api is LaunchApi.CREATE_FLEET
                and self.config.launch_template is not None
                and request.user_data
            ):
                raise InvalidRequestError(
                    "user_data cannot be passed through EC2 Fleet with a user-managed launch "
                    "template; configure image_id (coadapt-managed template) instead"
                )
            tags = all_tags(request.cluster_id, request.request_id, request.tags)

            existing = self._owned_live(
                request.cluster_id,
                [{"Name": f"tag:{REQUEST_ID_TAG}", "Values": [request.request_id]}],
            )
            missing = launch_shortfall(request, existing)
            if missing == 0:
                return LaunchResult(request.request_id, request.count, tuple(existing))

            gen_key = f"{request.cluster_id}/{request.request_id}"
            generation = self._generations.get(gen_key, 0)
            if self.config.launch_api is LaunchApi.CREATE_FLEET:
                walk = walk_pools(
                    pools,
                    missing,
                    self.unavailable,
                    lambda usable, n: self._launch_fleet(
                        request, usable, n, request.count - n, tags, generation
                    ),
                    together=True,
                )
            else:
                walk = walk_pools(
                    self._by_price(pools),
                    missing,
                    self.unavailable,
                    lambda pool, n: self._run_instances(pool[0], request, n, tags, generation),
                )
            if walk.call_errors:
                self._bump_generation(gen_key)
            order = {o.key: n for n, o in enumerate(request.offerings)}
            return LaunchResult(
                request_id=request.request_id,
                requested=request.count,
                instances=tuple({i.instance_id: i for i in (*existing, *walk.created)}.values()),
                errors=tuple(sorted(walk.errors, key=lambda e: order.get(e.offering_key, 0))),
            )

    def _bump_generation(self, key: str) -> None:
        self._generations[key] = self._generations.pop(key, 0) + 1
        while len(self._generations) > _MAX_GENERATIONS:
            del self._generations[next(iter(self._generations))]

    def _token(
        self,
        request: LaunchRequest,
        offering_keys: Sequence[str],
        existing: int,
        missing: int,
        generation: int,
    ) -> str:
        return client_token(
            request.cluster_id,
            request.request_id,
            ",".join(offering_keys),
            str(existing),
            str(missing),
            str(generation),
        )

    def _placement_of(self, offering: Offering) -> dict[str, str]:
        subnet = self._load_catalogue().subnet_by_zone_id.get(offering.zone)
        if subnet is not None:
            return {"SubnetId": subnet}
        return {"AvailabilityZone": self._zone_map().name_by_id[offering.zone]}

    def _zone_of(self, *places: Mapping[str, Any]) -> str | None:
        """Zone id named by the first of ``places`` that names one (zone id, subnet, zone)."""
        for place in places:
            zone_id = place.get("AvailabilityZoneId")
            if zone_id and zone_id in self._zone_map().name_by_id:
                return str(zone_id)
            subnet = place.get("SubnetId")
            if subnet and subnet in self._load_catalogue().zone_id_by_subnet:
                return self._load_catalogue().zone_id_by_subnet[subnet]
            zone = place.get("AvailabilityZone")
            if zone and zone in self._zone_map().id_by_name:
                return self._zone_map().id_by_name[zone]
        return None

    def _whole_call_errors(
        self, err: ProviderError, pools: Sequence[Offering]
    ) -> dict[str, ProviderError]:
        """A whole-call capacity/quota error applies to every pool tried; others propagate."""
        if not isinstance(err, InsufficientCapacityError | QuotaExceededError):
            raise err
        return {o.key: type(err)(str(err), code=err.code, pool=o.key) for o in pools}

    # -- CreateFleet -----------------------------------------------------------------------

    def _launch_fleet(
        self,
        request: LaunchRequest,
        pools: Sequence[Offering],
        missing: int,
        existing: int,
        tags: Mapping[str, str],
        generation: int,
    ) -> Placement[Instance]:
        """One instant ``CreateFleet`` over the usable pools (the walk's ``together`` call)."""
        market = request.market
        template = self._fleet_template(request.cluster_id, request.user_data)
        overrides = []
        for offering in pools:
            override: dict[str, Any] = {"InstanceType": offering.instance_type}
            override.update(self._placement_of(offering))
            if market is Market.SPOT and self.config.spot_max_price_usd_per_hour is not None:
                override["MaxPrice"] = f"{self.config.spot_max_price_usd_per_hour:.5f}"
            overrides.append(override)
        params: dict[str, Any] = {
            "Type": "instant",
            "ClientToken": self._token(
                request, [o.key for o in pools], existing, missing, generation
            ),
            "LaunchTemplateConfigs": [
                {"LaunchTemplateSpecification": template, "Overrides": overrides}
            ],
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": _tag_list(tags)},
                {
                    "ResourceType": "fleet",
                    "Tags": _tag_list(
                        {k: tags[k] for k in (CLUSTER_ID_TAG, REQUEST_ID_TAG, MANAGED_BY_TAG)}
                    ),
                },
            ],
        }
        if market is Market.SPOT:
            params["TargetCapacitySpecification"] = {
                "TotalTargetCapacity": missing,
                "SpotTargetCapacity": missing,
                "DefaultTargetCapacityType": "spot",
            }
            params["SpotOptions"] = {
                "AllocationStrategy": "price-capacity-optimized",
                "InstanceInterruptionBehavior": "terminate",
            }
        else:
            params["TargetCapacitySpecification"] = {
                "TotalTargetCapacity": missing,
                "OnDemandTargetCapacity": missing,
                "DefaultTargetCapacityType": "on-demand",
            }
            params["OnDemandOptions"] = {"AllocationStrategy": "lowest-price"}
        try:
            response = self._caller.call(self.ec2, "create_fleet", params)
        except ProviderError as err:
            return Placement(errors=self._whole_call_errors(err, pools))
        created, errors = self._read_fleet_response(response, pools, market, tags)
        return Placement(tuple(created), errors=errors)

    def _read_fleet_response(
        self,
        response: Mapping[str, Any],
        pools: Sequence[Offering],
        market: Market,
        tags: Mapping[str, str],
    ) -> tuple[list[Instance], dict[str, ProviderError]]:
        """Instances and per-pool errors of a (possibly partial) instant fleet response."""
        requested = {o.key for o in pools}
        created: list[Instance] = []
        unplaced: list[str] = []
        filled: set[str] = set()
        now_s = self.clock.now_s()
        for group in response.get("Instances", []) or []:
            override = (group.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
            itype = group.get("InstanceType") or override.get("InstanceType", "")
            group_market = _LIFECYCLE_MARKET.get(group.get("Lifecycle") or "", market)
            zone_id = self._zone_of(group, override)  # where it landed, else what was asked
            for iid in group.get("InstanceIds", []) or []:
                if zone_id is None:
                    unplaced.append(iid)
                    continue
                filled.add(self._offering_key(itype, zone_id, group_market))
                created.append(
                    Instance(
                        instance_id=iid,
                        provider=self.name,
                        instance_type=itype,
                        zone=zone_id,
                        market=group_market,
                        state=InstanceState.PENDING,
                        cluster_id=tags[CLUSTER_ID_TAG],
                        request_id=tags[REQUEST_ID_TAG],
                        tags=dict(tags),
                        launched_at_s=now_s,
                    )
                )
        if unplaced:  # the response did not say where: ask EC2
            described = self._describe_by_ids(unplaced)
            for iid in unplaced:
                raw = described.get(iid)
                if raw is not None:
                    instance = self._instance_from_aws(raw)
                    created.append(replace(instance, tags={**dict(tags), **instance.tags}))
                    filled.add(instance.offering_key)

        errors: dict[str, ProviderError] = {}
        for item in response.get("Errors", []) or []:
            code, message = item.get("ErrorCode"), item.get("ErrorMessage", "")
            override = (item.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
            itype = override.get("InstanceType")
            zone_id = self._zone_of(override)
            item_market = _LIFECYCLE_MARKET.get(item.get("Lifecycle") or "", market)
            if itype and zone_id:
                keys = [self._offering_key(itype, zone_id, item_market)]
            else:  # an error without a pool applies to every pool that placed nothing
                keys = [k for k in sorted(requested) if k not in filled]
            for key in keys:
                if key not in requested:
                    continue
                err = error_from_code(code, message, pool=key)
                known = errors.get(key)
                if known is None or (
                    isinstance(err, InsufficientCapacityError)
                    and not isinstance(known, InsufficientCapacityError)
                ):
                    errors[key] = err
        return created, errors

    def _fleet_template(self, cluster_id: str, user_data: str) -> dict[str, str]:
        """The launch template spec for CreateFleet: the configured one or a managed one.

        Managed templates are named ``coadapt-<cluster>-<digest>`` after their content (image,
        user data, security groups, profile, key); created once, then found by name.
        """
        if self.config.launch_template is not None:
            return self.config.launch_template.as_spec()
        owner_tags = {CLUSTER_ID_TAG: cluster_id, MANAGED_BY_TAG: MANAGED_BY_VALUE}
        data: dict[str, Any] = {
            "ImageId": self.config.image_id,
            "InstanceInitiatedShutdownBehavior": "terminate",
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "TagSpecifications": [{"ResourceType": "volume", "Tags": _tag_list(owner_tags)}],
        }
        if user_data:
            data["UserData"] = base64.b64encode(user_data.encode("utf-8")).decode("ascii")
        if self.config.security_group_ids:
            data["SecurityGroupIds"] = list(self.config.security_group_ids)
        if self.config.iam_instance_profile_arn:
            data["IamInstanceProfile"] = {"Arn": self.config.iam_instance_profile_arn}
        if self.config.key_name:
            data["KeyName"] = self.config.key_name
        digest = client_token(cluster_id, json.dumps(data, sort_keys=True))
        name = f"coadapt-{cluster_id}-{digest[:16]}"
        template_id = self._templates.get(name)
        if template_id is None:
            template_id = self._find_template(name)
            if template_id is None:
                try:
                    response = self._caller.call(
                        self.ec2,
                        "create_launch_template",
                        {
                            "LaunchTemplateName": name,
                            "LaunchTemplateData": data,
                            "ClientToken": digest,
                            "TagSpecifications": [
                                {"ResourceType": "launch-template", "Tags": _tag_list(owner_tags)}
                            ],
                        },
                    )
                    template_id = response["LaunchTemplate"]["LaunchTemplateId"]
                except ProviderError as err:  # created concurrently by another controller
                    if err.code != "InvalidLaunchTemplateName.AlreadyExistsException":
                        raise
                    template_id = self._find_template(name)
                    if template_id is None:
                        raise
            self._templates[name] = template_id
        return {"LaunchTemplateId": template_id, "Version": "$Default"}

    def _find_template(self, name: str) -> str | None:
        try:
            response = self._caller.call(
                self.ec2, "describe_launch_templates", {"LaunchTemplateNames": [name]}
            )
        except InvalidRequestError as err:
            if err.code == "InvalidLaunchTemplateName.NotFoundException":
                return None
            raise
        templates = response.get("LaunchTemplates", []) or []
        return templates[0]["LaunchTemplateId"] if templates else None

    # -- RunInstances ----------------------------------------------------------------------

    def _by_price(self, pools: Sequence[Offering]) -> list[Offering]:
        """``pools`` cheapest known price first (unknown prices last, ties in request order)."""
        catalogue = self._load_catalogue()
        priced = {o.key: o.price_usd_per_hour for o in catalogue.offerings.values()}
        for price in self._spot_prices or []:
            priced[self._offering_key(price.instance_type, price.zone, Market.SPOT)] = (
                price.price_usd_per_hour
            )
        order = sorted(
            range(len(pools)),
            key=lambda n: (priced.get(pools[n].key) is None, priced.get(pools[n].key) or 0.0, n),
        )
        return [pools[n] for n in order]

    def _run_instances(
        self,
        offering: Offering,
        request: LaunchRequest,
        remaining: int,
        tags: Mapping[str, str],
        generation: int,
    ) -> Placement[Instance]:
        """One ``RunInstances`` (``MinCount`` 1, ``MaxCount`` ``remaining``) into one pool.

        EC2 launches as many as it can up to ``MaxCount``: a short count means the pool ran dry,
        which the walk reports as that pool's capacity error. Capacity and quota errors are
        the pool's; any other error raises.
        """
        params: dict[str, Any] = {
            "MinCount": 1,
            "MaxCount": remaining,
            "InstanceType": offering.instance_type,
            "ClientToken": self._token(
                request, [offering.key], request.count - remaining, remaining, generation
            ),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": _tag_list(tags)},
                {"ResourceType": "volume", "Tags": _tag_list(tags)},
            ],
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        }
        placement = self._placement_of(offering)
        if "SubnetId" in placement:
            params["SubnetId"] = placement["SubnetId"]
        else:
            params["Placement"] = {"AvailabilityZone": placement["AvailabilityZone"]}
        if self.config.launch_template is not None:
            params["LaunchTemplate"] = self.config.launch_template.as_spec()
        else:
            params["ImageId"] = self.config.image_id
            params["InstanceInitiatedShutdownBehavior"] = "terminate"
            if self.config.security_group_ids:
                params["SecurityGroupIds"] = list(self.config.security_group_ids)
            if self.config.iam_instance_profile_arn:
                params["IamInstanceProfile"] = {"Arn": self.config.iam_instance_profile_arn}
            if self.config.key_name:
                params["KeyName"] = self.config.key_name
        if request.user_data:
            params["UserData"] = request.user_data  # boto3 base64-encodes it
        if request.market is Market.SPOT:
            spot_options: dict[str, Any] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if self.config.spot_max_price_usd_per_hour is not None:
                spot_options["MaxPrice"] = f"{self.config.spot_max_price_usd_per_hour:.5f}"
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": spot_options,
            }
        try:
            response = self._caller.call(self.ec2, "run_instances", params, pool=offering.key)
        except ProviderError as err:
            if isinstance(err, InsufficientCapacityError | QuotaExceededError):
                return Placement(errors={offering.key: err})
            raise
        created = []
        for raw in response.get("Instances", []) or []:
            instance = self._instance_from_aws(raw)
            created.append(
                replace(
                    instance,
                    tags={**dict(tags), **instance.tags},
                    cluster_id=tags[CLUSTER_ID_TAG],
                    request_id=tags[REQUEST_ID_TAG],
                    market=request.market,
                )
            )
        return Placement(tuple(created))

    # --------------------------------------------------------------------- interruptions

    def _owned_subset(self, cluster_id: str, instance_ids: Sequence[str]) -> set[str]:
        well_formed = [i for i in instance_ids if _INSTANCE_ID_RE.match(i)]
        described = self._describe_by_ids(well_formed) if well_formed else {}
        return {i for i, raw in described.items() if is_owned_by(_tags_of(raw), cluster_id)}

    def interruptions(self, cluster_id: str) -> list[InterruptionNotice]:
        """Drain the EventBridge->SQS queue; notices for ``cluster_id``'s instances only.

        Returns nothing when no ``interruption_queue_url`` is configured (the node-side
        ``providers.aws.imds.ImdsPoller`` is then the only source).
        """
        validate_id(cluster_id, field="cluster_id")
        if self._queue is None:
            return []
        with self._operation("interruptions"):
            return self._queue.drain(
                lambda ids: self._owned_subset(cluster_id, ids), noticed_at_s=self.clock.now_s()
            )
