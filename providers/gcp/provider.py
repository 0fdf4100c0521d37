"""``GcpProvider``: the provider contract (``providers.base``) on Google Compute Engine.

The real ``google-cloud-compute`` client over its REST transport, imported lazily on the first
API call (the import costs 2-3 s). Every call passes ``retry=None`` (the library's own default
retries sleep on the wall clock) and goes through ``providers.retry.call_with_retries`` on the
injected clock instead; operations are polled with our own ``ZoneOperationsClient`` (the
library's ``ExtendedOperation.result()`` ignores ``client_options``).

How each method works
=====================

``offerings()``
    Built-in catalogue (``providers.gcp.catalog``): configured machine shapes x zones x markets,
    with catalogue prices. With ``check_zone_availability`` one
    ``acceleratorTypes.aggregatedList`` call (cached) drops pools whose GPU the zone lacks.

``launch(request)``
    1. Validate (``InvalidRequestError`` before any call, also for an offering not in
       ``offerings()``).
    2. The launch rule of ``providers.base``: list the request's instances by label
       (``coadapt-request-id``); the ones not gone count toward ``count``
       (``launch_shortfall``). Only the missing number is created, under deterministic names
       (``providers.gcp.naming``: cluster + request + index) that neither an existing instance
       nor an earlier attempt of this provider object used.
    3. ``providers.capacity.walk_pools`` tries the pools in the request's order (the caller's
       preference); a pool in the ``UnavailableOfferings`` cache is skipped with an
       ``InsufficientCapacityError`` and no call. A pool gets one ``instances.bulkInsert``
       (``perInstanceProperties`` = the names, ``minCount`` 1, so a half-dry pool still fills
       what it can) with a UUID ``requestId`` derived from (cluster, request, pool, attempt,
       names); its zone operation is waited on (``zoneOperations.wait``, bounded by
       ``operation_timeout_s`` on the injected clock). What the pool could not place falls
       through to the next pool; names whose operation timed out count as placed (uncertain),
       so no other pool duplicates them. With ``use_bulk_insert=False`` the pool gets one
       ``instances.insert`` per name instead (the first alone, as a capacity probe), each with
       its own ``requestId``.

       Idempotency: the label lookup is what prevents duplicates; GCE's 60-minute
       ``requestId`` de-duplication only covers a retry whose instances the lookup cannot see
       yet (the same shortfall asks for the same names, hence the same ``requestId``). A
       different shortfall (an instance ended since) is a different intent, with other names
       and another ``requestId``. After a *failed* operation the attempt counter moves on, so
       a later retry of that pool is a real attempt. One provider object never reuses a name
       (so never an instance id); deterministic names make GCE refuse duplicates
       (``alreadyExists``), and existing instances carrying our labels are then adopted.
    4. A capacity error (``ZONE_RESOURCE_POOL_EXHAUSTED*``, "does not have enough resources",
       or a partial bulk fill) marks the pool unavailable; quota, invalid and transient errors
       are reported for the pool without marking it. Auth errors, and failures of the initial
       listing (cloud unreachable), raise.
    5. The result lists the request's instances that are not gone, re-read from the API after
       creating.

``list_instances(cluster_id)``
    ``instances.aggregatedList`` (all zones, paginated) filtered server-side by
    ``labels.coadapt-cluster-id`` and ``labels.coadapt-managed-by`` and checked again client
    side; instances that are gone (``TERMINATED``/``STOPPED``/``SUSPENDED``) are left out,
    ``STOPPING`` ones are returned in state ``STOPPING``.

``terminate(cluster_id, ids, request_id)``
    Ids are ``"<zone>/<name>"``. Owned = listed under the cluster's labels (an id not listed is
    read with ``instances.get``: 404 -> ``already_gone``, labels of another owner ->
    ``refused``, a malformed id -> ``refused``). One ``instances.delete`` per instance (GCE has no
    bulk delete) with a UUID ``requestId`` derived from the terminate request id; a 404 counts
    as ``already_gone``; an instance already ``STOPPING`` is not deleted again. Then the delete
    operations are awaited for at most ``delete_wait_s``: a few per zone one by one
    (``zoneOperations.wait``), many per zone by polling one ``zoneOperations.list`` (filter
    ``operationType = "delete" AND status != "DONE"``) per zone and round.

``interruptions(cluster_id)``
    Per configured zone, ``zoneOperations.list`` with ``operationType =
    "compute.instances.preempted"`` (paginated). A preemption is ours when the instance name
    carries the cluster's name prefix or the instance was seen owned (labels are gone once a
    Spot VM is deleted). Each operation is reported once per cluster (drained); operations older
    than ``preemption_lookback_s`` before the provider started are ignored. The deadline is the
    preemption time + 30 s. The node-side notice (metadata server) is
    ``providers.gcp.metadata``.

``spot_prices()``
    Catalogue spot prices stamped with the catalogue date: the Compute API has no spot price
    history (see ``providers.gcp.catalog``).

Not thread-safe: one controller thread calls a provider.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from coadapt_common.clock import Clock, SystemClock
from providers.base import (
    Instance,
    InstanceState,
    InterruptionKind,
    InterruptionNotice,
    LaunchRequest,
    LaunchResult,
    Market,
    Offering,
    SpotPrice,
    TerminateResult,
    find_offering,
    launch_shortfall,
)
from providers.capacity import Placement, UnavailableOfferings, walk_pools
from providers.errors import (
    AuthError,
    InstanceNotFoundError,
    InsufficientCapacityError,
    InvalidRequestError,
    ProviderError,
    TransientError,
)
from providers.gcp import catalog, naming
from providers.gcp.config import GcpConfig, MachineSpec
from providers.gcp.error_map import (
    ResourceAlreadyExistsError,
    error_from_http,
    error_from_operation,
)
from providers.gcp.metadata import PREEMPTION_NOTICE_S
from providers.gcp.parse import (
    PREEMPTED_OPERATION_TYPE,
    PROVIDER_NAME,
    instance_from_resource,
    instances_from_aggregated_page,
    operation_errors,
    preemptions_from_operations,
)
from providers.retry import RetryPolicy, call_with_retries
from providers.tags import (
    CLUSTER_ID_TAG,
    MANAGED_BY_TAG,
    MANAGED_BY_VALUE,
    REQUEST_ID_TAG,
    all_tags,
    is_owned_by,
    validate_id,
)

T = TypeVar("T")

WAIT_CALL_MAX_S = 120.0  # zoneOperations.wait returns within 2 minutes, DONE or not
WAIT_INDIVIDUALLY_MAX = 3  # per zone: up to this many operations are waited on one by one
SOURCE_OPERATION = "gce-operation"
DELETE_CONCURRENCY = 16  # deletes in flight at once (mutation rate limits are per second)


class _Api:
    """The google-cloud-compute clients (imported here, lazily) and their error types."""

    def __init__(self, endpoint: str | None, credentials: Any) -> None:
        import requests
        from google.api_core import exceptions as core_exceptions
        from google.api_core.client_options import ClientOptions
        from google.auth import exceptions as auth_exceptions
        from google.cloud import compute_v1
        from google.protobuf import json_format

        options = ClientOptions(api_endpoint=endpoint) if endpoint else None
        kwargs: dict[str, Any] = {
            "credentials": credentials,
            "transport": "rest",
            "client_options": options,
        }
        self.compute = compute_v1
        try:
            self.instances = compute_v1.InstancesClient(**kwargs)
            self.zone_operations = compute_v1.ZoneOperationsClient(**kwargs)
            self.accelerator_types = compute_v1.AcceleratorTypesClient(**kwargs)
        except auth_exceptions.DefaultCredentialsError as exc:
            raise AuthError(f"no GCP credentials: {exc}") from exc
        self._json_format = json_format
        self.api_error = core_exceptions.GoogleAPICallError
        self.auth_errors = (auth_exceptions.RefreshError, auth_exceptions.DefaultCredentialsError)
        self.transport_errors = (
            auth_exceptions.TransportError,
            requests.exceptions.ConnectionError,
            requests.exceptions.Timeout,
        )
        self.all_errors: tuple[type[BaseException], ...] = (
            core_exceptions.GoogleAPICallError,
            auth_exceptions.GoogleAuthError,
            requests.exceptions.RequestException,
        )

    def to_dict(self, message: Any) -> dict[str, Any]:
        """A proto-plus message in its REST JSON form (camelCase keys, enums as names)."""
        return self._json_format.MessageToDict(type(message).pb(message))

    def translate(self, exc: BaseException, pool: str | None) -> ProviderError:
        if isinstance(exc, self.api_error):
            status = int(exc.code) if isinstance(exc.code, int) else 500
            reasons = [e.get("reason", "") for e in exc.errors or () if isinstance(e, dict)]
            return error_from_http(status, str(exc.message), reasons, pool=pool)
        if isinstance(exc, self.auth_errors):
            return AuthError(f"GCP credentials: {exc}", pool=pool)
        if isinstance(exc, self.transport_errors):
            return TransientError(f"GCE unreachable: {exc}", pool=pool)
        return ProviderError(f"GCE call failed: {exc!r}", pool=pool)


@dataclass(frozen=True)
class _PoolOutcome:
    """What one pool attempt did: the names it created (or may have), and its error."""

    created: frozenset[str]
    uncertain: frozenset[str] = frozenset()
    error: ProviderError | None = None


class GcpProvider:
    """The provider contract on GCE (see the module docstring for each method's mechanics).

    ``api_endpoint`` overrides the Compute API endpoint (``http://127.0.0.1:PORT`` for the fake
    server); ``credentials`` are google-auth credentials (``None`` = application default
    credentials). ``unavailable`` is the shared capacity cache (one per provider by default).
    """

    name = PROVIDER_NAME

    def __init__(
        self,
        config: GcpConfig,
        *,
        clock: Clock | None = None,
        retry_policy: RetryPolicy | None = None,
        unavailable: UnavailableOfferings | None = None,
        api_endpoint: str | None = None,
        credentials: Any = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._clock: Clock = clock or SystemClock()
        self._retry = retry_policy or RetryPolicy()
        self.unavailable = unavailable or UnavailableOfferings(self._clock)
        self._endpoint = api_endpoint
        self._credentials = credentials
        self._rng = rng or random.Random()
        self._api_client: _Api | None = None
        self._offerings: tuple[Offering, ...] | None = None
        self._started_at_s = self._clock.now_s()
        self._reported: dict[str, set[str]] = {}
        self._seen_owned: dict[str, set[str]] = {}
        self._attempt_salt: dict[tuple[str, str], int] = {}
        self._used_names: dict[tuple[str, str], set[str]] = {}

    # ---------------------------------------------------------------- plumbing

    def warm_up(self) -> None:
        """Build the API clients now (imports google-cloud-compute, 2-3 s) rather than on the
        first call. Makes no API call."""
        _ = self._api

    @property
    def _api(self) -> _Api:
        if self._api_client is None:
            self._api_client = _Api(self._endpoint, self._credentials)
        return self._api_client

    def _call(self, fn: Callable[[], T], *, pool: str | None = None) -> T:
        """Run one API call, typed errors out, transient ones retried on the injected clock."""
        api = self._api

        def attempt() -> T:
            try:
                return fn()
            except api.all_errors as exc:
                raise api.translate(exc, pool) from exc

        return call_with_retries(attempt, clock=self._clock, policy=self._retry, rng=self._rng)

    @property
    def _timeout_s(self) -> float:
        return self.config.http_timeout_s

    def _pages(self, method: Callable[..., Any], request: Any) -> Iterator[dict[str, Any]]:
        """Each page of a list call, as JSON; every page is its own retried call."""
        token = ""
        while True:
            request.page_token = token
            page = self._call(
                lambda: next(
                    iter(method(request=request, retry=None, timeout=self._timeout_s).pages)
                )
            )
            data = self._api.to_dict(page)
            yield data
            token = data.get("nextPageToken", "")
            if not token:
                return

    # ---------------------------------------------------------------- offerings

    def offerings(self) -> Sequence[Offering]:
        """Configured machine shapes x zones x markets (see the module docstring)."""
        if self._offerings is None:
            available = self._zone_accelerators() if self.config.check_zone_availability else None
            out: list[Offering] = []
            for machine in self.config.machines:
                shape = catalog.machine_shape(machine.machine_type)
                for zone in self.config.zones:
                    if available is not None and machine.gpu_accelerator not in available.get(
                        zone, ()
                    ):
                        continue
                    for market in self.config.markets:
                        out.append(
                            Offering(
                                provider=self.name,
                                instance_type=machine.instance_type,
                                gpu_type=machine.gpu_type,
                                gpus=machine.gpus,
                                vcpus=shape.vcpus,
                                memory_gib=shape.memory_gib,
                                region=catalog.region_of(zone),
                                zone=zone,
                                market=market,
                                price_usd_per_hour=self._price(machine, market),
                            )
                        )
            self._offerings = tuple(out)
        return list(self._offerings)

    def _price(self, machine: MachineSpec, market: Market) -> float | None:
        override = self.config.price_overrides.get(f"{machine.instance_type}/{market.value}")
        return float(override) if override is not None else machine.price_usd_per_hour(market)

    def _zone_accelerators(self) -> dict[str, set[str]]:
        request = self._api.compute.AggregatedListAcceleratorTypesRequest(
            project=self.config.project, max_results=self.config.list_page_size
        )
        out: dict[str, set[str]] = {}
        for page in self._pages(self._api.accelerator_types.aggregated_list, request):
            for scope, scoped in (page.get("items") or {}).items():
                zone = naming.last_segment(scope)
                for acc in scoped.get("acceleratorTypes") or []:
                    out.setdefault(zone, set()).add(str(acc.get("name")))
        return out

    def spot_prices(self) -> Sequence[SpotPrice]:
        """Catalogue spot prices (GCE has no spot price history API; see ``catalog``)."""
        return [
            SpotPrice(
                o.instance_type, o.zone, o.price_usd_per_hour, catalog.PRICES_RECORDED_EPOCH_S
            )
            for o in self.offerings()
            if o.market is Market.SPOT and o.price_usd_per_hour is not None
        ]

    # ---------------------------------------------------------------- listing

    def _label_filter(self, cluster_id: str, request_id: str | None = None) -> str:
        terms = [
            f'(labels.{CLUSTER_ID_TAG} = "{cluster_id}")',
            f'(labels.{MANAGED_BY_TAG} = "{MANAGED_BY_VALUE}")',
        ]
        if request_id is not None:
            terms.append(f'(labels.{REQUEST_ID_TAG} = "{request_id}")')
        return " AND ".join(terms)

    def _list_owned(self, cluster_id: str, request_id: str | None = None) -> list[Instance]:
        """Every instance labelled for the cluster (and request), any state, all zones."""
        request = self._api.compute.AggregatedListInstancesRequest(
            project=self.config.project,
            filter=self._label_filter(cluster_id, request_id),
            max_results=self.config.list_page_size,
        )
        out: list[Instance] = []
        for page in self._pages(self._api.instances.aggregated_list, request):
            for resource in instances_from_aggregated_page(page):
                instance = instance_from_resource(resource)
                if not is_owned_by(instance.tags, cluster_id):
                    continue  # never trust the server-side filter alone
                if request_id is not None and instance.request_id != request_id:
                    continue
                out.append(instance)
        self._seen_owned.setdefault(cluster_id, set()).update(i.instance_id for i in out)
        return out

    def list_instances(self, cluster_id: str) -> Sequence[Instance]:
        """Owned instances that are not gone (pending, running or stopping), all zones."""
        validate_id(cluster_id, field="cluster_id")
        return [i for i in self._list_owned(cluster_id) if i.state is not InstanceState.TERMINATED]

    # ---------------------------------------------------------------- launch

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """The launch rule of ``providers.base``: create only the shortfall of the request's
        live instances, found by label (see the module docstring)."""
        request.validate()
        catalogue = self.offerings()
        pools = [find_offering(catalogue, wanted) for wanted in request.offerings]
        labels = all_tags(request.cluster_id, request.request_id, request.tags)

        existing = self._list_owned(request.cluster_id, request.request_id)
        found = [i for i in existing if i.state is not InstanceState.TERMINATED]
        missing = launch_shortfall(request, found)
        if missing == 0:
            return LaunchResult(request.request_id, request.count, tuple(found))

        used = self._used_names.setdefault((request.cluster_id, request.request_id), set())
        taken = used | {naming.parse_instance_id(i.instance_id)[1] for i in existing}
        names: list[str] = []
        index = 0
        while len(names) < missing:
            name = naming.instance_name(request.cluster_id, request.request_id, index)
            if name not in taken:
                names.append(name)
            index += 1

        def place(batch: Sequence[Offering], wanted: int) -> Placement[str]:
            (pool,) = batch
            chunk = names[:wanted]
            outcome = self._launch_pool(pool, request, labels, chunk)
            used.update(outcome.created | outcome.uncertain)
            names[:] = [n for n in names if n not in outcome.created | outcome.uncertain]
            errors = {} if outcome.error is None else {pool.key: outcome.error}
            return Placement(tuple(sorted(outcome.created)), len(outcome.uncertain), errors)

        walk = walk_pools(pools, missing, self.unavailable, place)
        if walk.called:
            existing = self._list_owned(request.cluster_id, request.request_id)
            found = [i for i in existing if i.state is not InstanceState.TERMINATED]
        return LaunchResult(request.request_id, request.count, tuple(found), walk.errors)

    def _scheduling(self, market: Market) -> Any:
        compute = self._api.compute
        if market is Market.SPOT:
            return compute.Scheduling(
                provisioning_model="SPOT",
                instance_termination_action="DELETE",
                on_host_maintenance="TERMINATE",
                automatic_restart=False,
            )
        return compute.Scheduling(
            provisioning_model="STANDARD", on_host_maintenance="TERMINATE", automatic_restart=True
        )

    def _instance_fields(
        self, pool: Offering, labels: Mapping[str, str], user_data: str, *, bulk: bool
    ) -> dict[str, Any]:
        """Fields shared by ``Instance`` (insert) and ``InstanceProperties`` (bulkInsert).

        ``instances.insert`` takes zonal partial URLs for machine/accelerator/disk types;
        ``instanceProperties`` of a bulkInsert takes bare names.
        """
        compute = self._api.compute
        machine = self.config.machine_for(pool.instance_type)
        if machine is None:  # offerings() only has configured shapes
            raise InvalidRequestError(f"unknown instance type {pool.instance_type!r}")
        zonal = "" if bulk else f"zones/{pool.zone}/"
        fields: dict[str, Any] = {
            "machine_type": f"{zonal}{'machineTypes/' if zonal else ''}{machine.machine_type}",
            "labels": dict(labels),
            "scheduling": self._scheduling(pool.market),
            "disks": [
                compute.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute.AttachedDiskInitializeParams(
                        source_image=self.config.image,
                        disk_size_gb=self.config.disk_size_gb,
                        disk_type=(
                            f"{zonal}{'diskTypes/' if zonal else ''}{self.config.disk_type}"
                        ),
                    ),
                )
            ],
            "network_interfaces": [
                compute.NetworkInterface(
                    network=self.config.network,
                    subnetwork=self.config.subnetwork or None,
                    access_configs=(
                        [compute.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
                        if self.config.external_ip
                        else []
                    ),
                )
            ],
        }
        if machine.accelerator_type is not None:
            prefix = f"{zonal}acceleratorTypes/" if zonal else ""
            fields["guest_accelerators"] = [
                compute.AcceleratorConfig(
                    accelerator_type=f"{prefix}{machine.accelerator_type}",
                    accelerator_count=machine.accelerator_count,
                )
            ]
        if self.config.network_tags:
            fields["tags"] = compute.Tags(items=list(self.config.network_tags))
        if user_data:
            fields["metadata"] = compute.Metadata(
                items=[compute.Items(key="startup-script", value=user_data)]
            )
        if self.config.service_account_email:
            fields["service_accounts"] = [
                compute.ServiceAccount(
                    email=self.config.service_account_email,
                    scopes=["https://www.googleapis.com/auth/cloud-platform"],
                )
            ]
        return fields

    def _salt(self, request: LaunchRequest, pool: Offering) -> str:
        return str(self._attempt_salt.get((request.request_id, pool.key), 0))

    def _bump_salt(self, request: LaunchRequest, pool: Offering) -> None:
        """After a failed operation, the next attempt must not replay it by requestId."""
        key = (request.request_id, pool.key)
        self._attempt_salt[key] = self._attempt_salt.get(key, 0) + 1

    def _launch_pool(
        self,
        pool: Offering,
        request: LaunchRequest,
        labels: Mapping[str, str],
        names: list[str],
    ) -> _PoolOutcome:
        try:
            if self.config.use_bulk_insert:
                return self._bulk_insert(pool, request, labels, names)
            return self._insert_each(pool, request, labels, names)
        except InstanceNotFoundError as err:  # zone/network/image unknown to the project
            return _PoolOutcome(
                frozenset(), error=InvalidRequestError(str(err), code=err.code, pool=pool.key)
            )
        except AuthError:
            raise
        except ProviderError as err:
            return _PoolOutcome(frozenset(), error=err)

    def _bulk_insert(
        self,
        pool: Offering,
        request: LaunchRequest,
        labels: Mapping[str, str],
        names: list[str],
    ) -> _PoolOutcome:
        compute = self._api.compute
        body = compute.BulkInsertInstanceResource(
            count=len(names),
            min_count=1,
            per_instance_properties={
                n: compute.BulkInsertInstanceResourcePerInstanceProperties(name=n) for n in names
            },
            instance_properties=compute.InstanceProperties(
                **self._instance_fields(pool, labels, request.user_data, bulk=True)
            ),
        )
        request_id = naming.operation_request_id(
            "bulkInsert",
            request.cluster_id,
            request.request_id,
            pool.key,
            self._salt(request, pool),
            *names,  # another shortfall is another intent, not a replay of this one
        )
        api_request = compute.BulkInsertInstanceRequest(
            project=self.config.project,
            zone=pool.zone,
            bulk_insert_instance_resource_resource=body,
            request_id=request_id,
        )
        try:
            op = self._call(
                lambda: self._api.instances.bulk_insert_unary(
                    request=api_request, retry=None, timeout=self._timeout_s
                ),
                pool=pool.key,
            )
        except ResourceAlreadyExistsError:
            # Another attempt of this request got there first: see what exists now.
            return self._adopt_existing(pool, request, names)
        try:
            done = self._wait_operation(pool.zone, self._api.to_dict(op), pool=pool.key)
        except TransientError as err:  # timed out: the pool may still create them
            return _PoolOutcome(frozenset(), uncertain=frozenset(names), error=err)
        failures = operation_errors(done)
        if failures:
            self._bump_salt(request, pool)
            error = error_from_operation(failures, done.get("httpErrorStatusCode"), pool=pool.key)
            if isinstance(error, ResourceAlreadyExistsError):
                return self._adopt_existing(pool, request, names)
            return _PoolOutcome(frozenset(), error=error)
        status = (
            (done.get("instancesBulkInsertOperationMetadata") or {})
            .get("perLocationStatus", {})
            .get(f"zones/{pool.zone}", {})
        )
        created_count = int(status.get("createdVmCount", len(names)))
        if created_count >= len(names):
            return _PoolOutcome(frozenset(names))
        self._bump_salt(request, pool)
        created = self._names_present(pool, request, names)
        return _PoolOutcome(
            created,
            error=InsufficientCapacityError(
                f"{pool.key}: only {len(created)} of {len(names)} instances could be created",
                code="PARTIAL_FILL",
                pool=pool.key,
            ),
        )

    def _names_present(
        self, pool: Offering, request: LaunchRequest, names: list[str]
    ) -> frozenset[str]:
        wanted = set(names)
        present = set()
        for instance in self._list_owned(request.cluster_id, request.request_id):
            zone, name = naming.parse_instance_id(instance.instance_id)
            if zone == pool.zone and name in wanted:
                present.add(name)
        return frozenset(present)

    def _adopt_existing(
        self, pool: Offering, request: LaunchRequest, names: list[str]
    ) -> _PoolOutcome:
        """Some names already exist in the zone: ours are adopted, foreign ones are an error.

        Names of ``names`` that do not exist were not created by the refused call (GCE refuses
        a bulkInsert with a taken name as a whole): a transient error for the pool, not a
        capacity signal, and the walk moves them on to the next pool.
        """
        present = self._names_present(pool, request, names)
        if present and len(present) < len(names):
            return _PoolOutcome(
                present,
                error=TransientError(
                    f"{pool.key}: {len(names) - len(present)} instance names of request "
                    f"{request.request_id} were taken concurrently; not created",
                    code="alreadyExists",
                    pool=pool.key,
                ),
            )
        if present:
            return _PoolOutcome(present)
        return _PoolOutcome(
            frozenset(),
            error=InvalidRequestError(
                f"{pool.key}: instance names of request {request.request_id} are taken by "
                "instances that are not ours",
                code="alreadyExists",
                pool=pool.key,
            ),
        )

    def _insert_each(
        self,
        pool: Offering,
        request: LaunchRequest,
        labels: Mapping[str, str],
        names: list[str],
    ) -> _PoolOutcome:
        """One ``instances.insert`` per name; the first alone, as a capacity probe."""
        compute = self._api.compute
        fields = self._instance_fields(pool, labels, request.user_data, bulk=False)
        created: set[str] = set()
        uncertain: set[str] = set()
        error: ProviderError | None = None

        def insert(name: str) -> dict[str, Any] | None:
            api_request = compute.InsertInstanceRequest(
                project=self.config.project,
                zone=pool.zone,
                instance_resource=compute.Instance(name=name, **fields),
                request_id=naming.operation_request_id(
                    "insert",
                    request.cluster_id,
                    request.request_id,
                    pool.zone,
                    name,
                    self._salt(request, pool),
                ),
            )
            try:
                op = self._call(
                    lambda: self._api.instances.insert_unary(
                        request=api_request, retry=None, timeout=self._timeout_s
                    ),
                    pool=pool.key,
                )
            except ResourceAlreadyExistsError:
                return None
            return self._api.to_dict(op)

        def settle(name: str, op: dict[str, Any] | None) -> ProviderError | None:
            if op is None:  # alreadyExists: ours if it carries our labels
                if self._adopt_existing(pool, request, [name]).created:
                    created.add(name)
                    return None
                return InvalidRequestError(
                    f"{pool.zone}/{name} exists and is not ours", pool=pool.key
                )
            try:
                done = self._wait_operation(pool.zone, op, pool=pool.key)
            except TransientError as err:
                uncertain.add(name)
                return err
            failures = operation_errors(done)
            if failures:
                return error_from_operation(
                    failures, done.get("httpErrorStatusCode"), pool=pool.key
                )
            created.add(name)
            return None

        first, rest = names[0], names[1:]
        error = settle(first, insert(first))
        if error is None and rest:
            ops = [(n, insert(n)) for n in rest]
            for name, op in ops:
                err = settle(name, op)
                error = error or err
        if error is not None and not isinstance(error, TransientError):
            self._bump_salt(request, pool)
        return _PoolOutcome(frozenset(created), frozenset(uncertain), error)

    def _wait_operation(
        self, zone: str, op: Mapping[str, Any], *, pool: str | None = None
    ) -> dict[str, Any]:
        """Wait for a zone operation to be DONE (bounded by ``operation_timeout_s``)."""
        deadline = self._clock.monotonic_s() + self.config.operation_timeout_s
        current = dict(op)
        while current.get("status") != "DONE":
            if self._clock.monotonic_s() >= deadline:
                raise TransientError(
                    f"operation {current.get('name')} in {zone} not done after "
                    f"{self.config.operation_timeout_s:.0f} s",
                    pool=pool,
                )
            current = self._wait_call(zone, str(current.get("name")), pool=pool)
            if current.get("status") != "DONE":
                self._clock.sleep(self.config.operation_poll_interval_s)
        return current

    def _wait_call(self, zone: str, operation: str, *, pool: str | None = None) -> dict[str, Any]:
        """One ``zoneOperations.wait`` (GCE holds it up to 2 minutes, until DONE)."""
        request = self._api.compute.WaitZoneOperationRequest(
            project=self.config.project, zone=zone, operation=operation
        )
        result = self._call(
            lambda: self._api.zone_operations.wait(
                request=request, retry=None, timeout=self._timeout_s + WAIT_CALL_MAX_S
            ),
            pool=pool,
        )
        return self._api.to_dict(result)

    # ---------------------------------------------------------------- terminate

    def terminate(
        self, cluster_id: str, instance_ids: Sequence[str], request_id: str
    ) -> TerminateResult:
        """Delete owned instances (see the module docstring); idempotent."""
        validate_id(cluster_id, field="cluster_id")
        validate_id(request_id, field="request_id")
        ids = list(dict.fromkeys(instance_ids))
        terminated: list[str] = []
        already_gone: list[str] = []
        refused: list[str] = []
        if not ids:
            return TerminateResult(request_id)

        owned = {i.instance_id: i for i in self._list_owned(cluster_id)}
        to_delete: list[tuple[str, str, str]] = []
        for instance_id in ids:
            try:
                zone, name = naming.parse_instance_id(instance_id)
            except InvalidRequestError:
                refused.append(instance_id)
                continue
            instance = owned.get(instance_id)
            if instance is None:
                instance = self._get_instance(zone, name)
                if instance is None:
                    already_gone.append(instance_id)
                    continue
                if not is_owned_by(instance.tags, cluster_id):
                    refused.append(instance_id)
                    continue
            if instance.state is InstanceState.TERMINATED:
                already_gone.append(instance_id)
            elif instance.state is InstanceState.STOPPING:
                terminated.append(instance_id)  # being deleted already
            else:
                to_delete.append((instance_id, zone, name))

        # The Compute API has no bulk delete: one call per instance, issued concurrently
        # (bounded) so 500 instances take seconds, not minutes. Results in request order; an
        # unexpected error is raised after every issued delete has returned.
        workers = max(1, min(DELETE_CONCURRENCY, len(to_delete)))
        with ThreadPoolExecutor(workers, thread_name_prefix="gcp-delete") as pool:
            futures = [
                pool.submit(self._delete, cluster_id, request_id, zone, name)
                for _, zone, name in to_delete
            ]
        pending: dict[str, set[str]] = {}
        for (instance_id, zone, _name), future in zip(to_delete, futures, strict=True):
            op = future.result()
            if op is None:
                already_gone.append(instance_id)
                continue
            terminated.append(instance_id)
            if op.get("status") != "DONE":
                pending.setdefault(zone, set()).add(str(op.get("name")))
        self._await_operations(pending)

        order = {iid: k for k, iid in enumerate(ids)}
        return TerminateResult(
            request_id,
            terminated=tuple(sorted(terminated, key=order.__getitem__)),
            already_gone=tuple(sorted(already_gone, key=order.__getitem__)),
            refused=tuple(sorted(refused, key=order.__getitem__)),
        )

    def _get_instance(self, zone: str, name: str) -> Instance | None:
        request = self._api.compute.GetInstanceRequest(
            project=self.config.project, zone=zone, instance=name
        )
        try:
            resource = self._call(
                lambda: self._api.instances.get(
                    request=request, retry=None, timeout=self._timeout_s
                )
            )
        except InstanceNotFoundError:
            return None
        return instance_from_resource(self._api.to_dict(resource))

    def _delete(
        self, cluster_id: str, request_id: str, zone: str, name: str
    ) -> dict[str, Any] | None:
        """Issue one delete; the operation as JSON, or ``None`` when the instance is gone."""
        api_request = self._api.compute.DeleteInstanceRequest(
            project=self.config.project,
            zone=zone,
            instance=name,
            request_id=naming.operation_request_id("delete", cluster_id, request_id, zone, name),
        )
        try:
            op = self._call(
                lambda: self._api.instances.delete_unary(
                    request=api_request, retry=None, timeout=self._timeout_s
                )
            )
        except InstanceNotFoundError:
            return None
        return self._api.to_dict(op)

    def _await_operations(self, pending: dict[str, set[str]]) -> None:
        """Wait (at most ``delete_wait_s``) until the named zone operations are DONE.

        Per zone: up to ``WAIT_INDIVIDUALLY_MAX`` operations are waited on one by one; more are
        polled together with one filtered ``zoneOperations.list`` per round. Operations still
        running at the deadline are left to finish on their own.
        """
        if self.config.delete_wait_s <= 0:
            return
        deadline = self._clock.monotonic_s() + self.config.delete_wait_s
        compute = self._api.compute
        pending = {zone: set(names) for zone, names in pending.items() if names}
        while pending:
            for zone in list(pending):
                names = pending[zone]
                if len(names) <= WAIT_INDIVIDUALLY_MAX:
                    for name in sorted(names):
                        if self._wait_call(zone, name).get("status") == "DONE":
                            names.discard(name)
                else:
                    list_request = compute.ListZoneOperationsRequest(
                        project=self.config.project,
                        zone=zone,
                        filter='(operationType = "delete") AND (status != "DONE")',
                        max_results=self.config.list_page_size,
                    )
                    running = {
                        str(op.get("name"))
                        for page in self._pages(self._api.zone_operations.list, list_request)
                        for op in page.get("items") or []
                    }
                    names &= running
                if not names:
                    del pending[zone]
            if not pending or self._clock.monotonic_s() >= deadline:
                return
            self._clock.sleep(self.config.operation_poll_interval_s)

    # ---------------------------------------------------------------- interruptions

    def _is_ours(self, cluster_id: str, instance_id: str) -> bool:
        if instance_id in self._seen_owned.get(cluster_id, ()):
            return True
        _, _, name = instance_id.partition("/")
        return naming.has_cluster_prefix(name, cluster_id)

    def interruptions(self, cluster_id: str) -> Sequence[InterruptionNotice]:
        """Preemptions of owned instances not reported before (see the module docstring)."""
        validate_id(cluster_id, field="cluster_id")
        reported = self._reported.setdefault(cluster_id, set())
        cutoff_s = self._started_at_s - self.config.preemption_lookback_s
        now_s = self._clock.now_s()
        notices: list[InterruptionNotice] = []
        compute = self._api.compute
        for zone in self.config.zones:
            request = compute.ListZoneOperationsRequest(
                project=self.config.project,
                zone=zone,
                filter=f'operationType = "{PREEMPTED_OPERATION_TYPE}"',
                max_results=self.config.list_page_size,
            )
            for page in self._pages(self._api.zone_operations.list, request):
                for event in preemptions_from_operations(page.get("items") or []):
                    key = f"{event.zone}/{event.operation_name}"
                    if key in reported or not self._is_ours(cluster_id, event.instance_id):
                        continue
                    reported.add(key)
                    when_s = event.preempted_at_s if event.preempted_at_s is not None else now_s
                    if when_s < cutoff_s:
                        continue  # history from before this controller's time
                    notices.append(
                        InterruptionNotice(
                            instance_id=event.instance_id,
                            kind=InterruptionKind.PREEMPTED,
                            deadline_s=when_s + PREEMPTION_NOTICE_S,
                            source=SOURCE_OPERATION,
                            noticed_at_s=now_s,
                        )
                    )
        return notices


__all__ = ["GcpProvider"]
