"""Unit and integration tests of the GCP adapter (``providers.gcp``).

Pure parts (error mapping, parsers, naming, config, the fake's filter language) are tested
directly; the adapter is tested with the real google-cloud-compute REST client against the fake
Compute server (``emulators.gce_server``), asserting on what the server saw (request
shapes, counters) and on what the cloud holds afterwards. No mocks of our own code.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coadapt_common.clock import FakeClock, SystemClock
from emulators.gce_server import FakeGceServer, parse_filter
from emulators.gcp_env import TEST_PROJECT, FakeGcpEnv, anonymous_credentials
from providers.base import (
    InstanceState,
    InterruptionKind,
    LaunchRequest,
    Market,
    Offering,
)
from providers.errors import (
    AuthError,
    InstanceNotFoundError,
    InsufficientCapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaExceededError,
    TransientError,
)
from providers.gcp import catalog, naming
from providers.gcp.config import GcpConfig, MachineSpec, parse_instance_type
from providers.gcp.error_map import (
    ResourceAlreadyExistsError,
    error_from_http,
    error_from_operation,
)
from providers.gcp.metadata import PreemptionWatcher, discover_instance_id
from providers.gcp.parse import (
    instance_from_resource,
    instance_type_of,
    instances_from_aggregated_page,
    market_of,
    parse_preempted_value,
    parse_timestamp_s,
    preemption_from_operation,
    state_from_status,
)
from providers.gcp.provider import GcpProvider
from providers.retry import RetryPolicy
from providers.tags import CLUSTER_ID_TAG, MANAGED_BY_TAG, REQUEST_ID_TAG

ZONE_A, ZONE_B, ZONE_C = "us-central1-a", "us-central1-b", "us-east1-c"

# ============================================================================ pure: errors


@pytest.mark.parametrize(
    ("status", "reasons", "message", "expected"),
    [
        (404, ["notFound"], "The resource 'x' was not found", InstanceNotFoundError),
        (409, ["alreadyExists"], "The resource 'x' already exists", ResourceAlreadyExistsError),
        (409, ["conflict"], "operation in progress", TransientError),
        (429, ["rateLimitExceeded"], "slow down", TransientError),
        (500, ["backendError"], "boom", TransientError),
        (503, [], "unavailable", TransientError),
        (401, ["authError"], "Invalid Credentials", AuthError),
        (403, ["forbidden"], "Required 'compute.instances.create' permission", AuthError),
        (403, ["rateLimitExceeded"], "Rate Limit Exceeded", TransientError),
        (403, ["userRateLimitExceeded"], "User Rate Limit Exceeded", TransientError),
        (403, ["quotaExceeded"], "Quota 'CPUS' exceeded", QuotaExceededError),
        (400, ["invalid"], "Invalid value for field 'resource.name'", InvalidRequestError),
        (400, ["resourceNotReady"], "The resource is not ready", TransientError),
        (
            503,
            ["ZONE_RESOURCE_POOL_EXHAUSTED"],
            "The zone 'z' does not have enough resources available",
            InsufficientCapacityError,
        ),
        (400, [], "zone does not have enough resources available", InsufficientCapacityError),
    ],
)
def test_http_errors_map_to_typed_errors(
    status: int, reasons: list[str], message: str, expected: type[ProviderError]
) -> None:
    err = error_from_http(status, message, reasons, pool="gcp/z/t/spot")
    assert type(err) is expected
    assert err.pool == "gcp/z/t/spot"
    assert message in str(err)


@pytest.mark.parametrize(
    ("errors", "http_status", "expected"),
    [
        ([("ZONE_RESOURCE_POOL_EXHAUSTED", "no room")], 503, InsufficientCapacityError),
        (
            [("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "no room (resource type:compute)")],
            503,
            InsufficientCapacityError,
        ),
        (
            [("RESOURCE_AVAILABILITY", "The zone does not have enough resources available")],
            None,
            InsufficientCapacityError,
        ),
        ([("QUOTA_EXCEEDED", "Quota 'NVIDIA_T4_GPUS' exceeded")], 403, QuotaExceededError),
        ([("RESOURCE_ALREADY_EXISTS", "exists")], 409, ResourceAlreadyExistsError),
        ([("RESOURCE_NOT_FOUND", "gone")], 404, InstanceNotFoundError),
        ([("RESOURCE_OPERATION_RATE_EXCEEDED", "slow down")], 403, TransientError),
        ([("SOMETHING_NEW", "?")], 400, InvalidRequestError),
        ([("SOMETHING_NEW", "?")], 503, TransientError),
        ([("SOMETHING_NEW", "?")], None, ProviderError),
    ],
)
def test_operation_errors_map_by_code_before_status(
    errors: list[tuple[str, str]], http_status: int | None, expected: type[ProviderError]
) -> None:
    err = error_from_operation(errors, http_status, pool="p")
    assert type(err) is expected
    assert err.code == errors[0][0]
    assert err.pool == "p"


# ============================================================================ pure: parsers

INSTANCE_JSON = {
    "kind": "compute#instance",
    "id": "4567890123456789012",
    "creationTimestamp": "2024-05-01T10:00:00.500-07:00",
    "name": "ca-1a2b3c4d-0f1e2d3c4b-0003",
    "zone": "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a",
    "machineType": "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-a/"
    "machineTypes/n1-standard-8",
    "status": "RUNNING",
    "labels": {CLUSTER_ID_TAG: "c1", REQUEST_ID_TAG: "r1", MANAGED_BY_TAG: "coadapt", "team": "ml"},
    "scheduling": {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    },
    "guestAccelerators": [
        {
            "acceleratorType": "https://www.googleapis.com/compute/v1/projects/p/zones/"
            "us-central1-a/acceleratorTypes/nvidia-tesla-t4",
            "acceleratorCount": 1,
        }
    ],
    "networkInterfaces": [{"name": "nic0", "networkIP": "10.128.0.7"}],
}


def test_instance_from_resource_reads_every_field() -> None:
    inst = instance_from_resource(INSTANCE_JSON)
    assert inst.instance_id == "us-central1-a/ca-1a2b3c4d-0f1e2d3c4b-0003"
    assert inst.provider == "gcp"
    assert inst.instance_type == "n1-standard-8+1xnvidia-tesla-t4"
    assert inst.zone == "us-central1-a"
    assert inst.market is Market.SPOT
    assert inst.state is InstanceState.RUNNING
    assert (inst.cluster_id, inst.request_id) == ("c1", "r1")
    assert inst.tags["team"] == "ml"
    assert inst.launched_at_s == pytest.approx(1714582800.5)
    assert inst.private_ip == "10.128.0.7"
    assert inst.offering_key == "gcp/n1-standard-8+1xnvidia-tesla-t4/us-central1-a/spot"


def test_unlabelled_instance_parses_with_empty_ownership() -> None:
    bare = {"name": "x", "zone": "zones/us-east1-c", "machineType": "g2-standard-4"}
    inst = instance_from_resource(bare)
    assert (inst.cluster_id, inst.request_id, inst.market) == ("", "", Market.ON_DEMAND)
    assert inst.launched_at_s is None and inst.private_ip is None


def test_builtin_gpus_do_not_change_the_instance_type() -> None:
    a2 = {
        "machineType": "zones/z/machineTypes/a2-highgpu-1g",
        "guestAccelerators": [{"acceleratorType": "nvidia-tesla-a100", "acceleratorCount": 1}],
    }
    assert instance_type_of(a2) == "a2-highgpu-1g"
    assert market_of({"scheduling": {"preemptible": True}}) is Market.SPOT
    assert market_of({"scheduling": {"provisioningModel": "STANDARD"}}) is Market.ON_DEMAND


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("PROVISIONING", InstanceState.PENDING),
        ("STAGING", InstanceState.PENDING),
        ("RUNNING", InstanceState.RUNNING),
        ("REPAIRING", InstanceState.RUNNING),
        ("STOPPING", InstanceState.STOPPING),
        ("SUSPENDING", InstanceState.STOPPING),
        ("STOPPED", InstanceState.TERMINATED),
        ("SUSPENDED", InstanceState.TERMINATED),
        ("TERMINATED", InstanceState.TERMINATED),
        ("SOMETHING_NEW", InstanceState.PENDING),
    ],
)
def test_status_mapping(status: str, state: InstanceState) -> None:
    assert state_from_status(status) is state


def test_timestamps_honour_offsets() -> None:
    assert parse_timestamp_s("2024-01-01T00:00:00Z") == 1704067200.0
    assert parse_timestamp_s("2023-12-31T16:00:00.000-08:00") == 1704067200.0
    assert parse_timestamp_s("2024-01-01T00:00:00") is None  # no zone: ambiguous
    assert parse_timestamp_s("yesterday") is None
    assert parse_timestamp_s(None) is None


def test_aggregated_page_skips_warning_scopes() -> None:
    page = {
        "items": {
            "zones/us-central1-a": {"instances": [{"name": "a"}, {"name": "b"}]},
            "zones/us-east1-c": {"warning": {"code": "NO_RESULTS_ON_PAGE"}},
            "zones/europe-west4-a": {"instances": [{"name": "c"}]},
        },
        "nextPageToken": "t",
    }
    assert [r["name"] for r in instances_from_aggregated_page(page)] == ["a", "b", "c"]
    assert instances_from_aggregated_page({}) == []


PREEMPTED_OP = {
    "kind": "compute#operation",
    "name": "systemevent-1714582800000-5f1b2c3d4e5f6",
    "zone": "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-b",
    "operationType": "compute.instances.preempted",
    "targetLink": "https://www.googleapis.com/compute/v1/projects/p/zones/us-central1-b/"
    "instances/ca-1a2b3c4d-0f1e2d3c4b-0000",
    "status": "DONE",
    "user": "system",
    "statusMessage": "Instance was preempted.",
    "insertTime": "2024-05-01T10:00:00.000-07:00",
}


def test_preemption_operation_parses() -> None:
    event = preemption_from_operation(PREEMPTED_OP)
    assert event is not None
    assert event.instance_id == "us-central1-b/ca-1a2b3c4d-0f1e2d3c4b-0000"
    assert event.zone == "us-central1-b"
    assert event.operation_name == PREEMPTED_OP["name"]
    assert event.preempted_at_s == 1714582800.0


@pytest.mark.parametrize(
    "op",
    [
        {**PREEMPTED_OP, "operationType": "delete"},
        {**PREEMPTED_OP, "targetLink": "https://x/projects/p/zones/z/disks/d"},
        {**PREEMPTED_OP, "targetLink": ""},
    ],
)
def test_non_preemption_operations_are_ignored(op: dict[str, str]) -> None:
    assert preemption_from_operation(op) is None


def test_preempted_value_parsing_is_strict() -> None:
    assert parse_preempted_value("TRUE") is True
    assert parse_preempted_value("FALSE\n") is False
    with pytest.raises(ValueError):
        parse_preempted_value("<html>proxy error</html>")


# ============================================================================ pure: naming

ids = st.from_regex(r"[a-z0-9][a-z0-9-]{0,62}", fullmatch=True)


@given(cluster=ids, request=ids, index=st.integers(min_value=0, max_value=99_999))
def test_instance_names_are_valid_deterministic_and_invertible(
    cluster: str, request: str, index: int
) -> None:
    name = naming.instance_name(cluster, request, index)
    assert name == naming.instance_name(cluster, request, index)
    assert len(name) <= 63
    assert naming.parse_instance_id(naming.format_instance_id(ZONE_A, name)) == (ZONE_A, name)
    assert naming.instance_index(name, cluster, request) == index
    assert naming.has_cluster_prefix(name, cluster)
    assert naming.instance_index(name, cluster, request + "x") is None


@given(parts=st.lists(st.text(max_size=20), min_size=1, max_size=5))
def test_request_ids_are_uuids_and_deterministic(parts: list[str]) -> None:
    rid = naming.operation_request_id(*parts)
    assert str(uuid.UUID(rid)) == rid
    assert naming.operation_request_id(*parts) == rid
    assert naming.operation_request_id(*parts, "other") != rid


@pytest.mark.parametrize(
    "bad", ["no-slash", "us-central1-a/", "/name", "us-central1-a/Upper", "zone/name", 7]
)
def test_malformed_instance_ids_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidRequestError):
        naming.parse_instance_id(bad)  # type: ignore[arg-type]


# ============================================================================ pure: config


def test_machine_specs_validate_and_price() -> None:
    t4 = MachineSpec("n1-standard-8", "nvidia-tesla-t4", 1)
    assert t4.instance_type == "n1-standard-8+1xnvidia-tesla-t4"
    assert parse_instance_type(t4.instance_type) == t4
    assert (t4.gpu_type, t4.gpus) == ("T4", 1)
    assert t4.price_usd_per_hour(Market.ON_DEMAND) == pytest.approx(0.379998 + 0.35)
    g2 = MachineSpec("g2-standard-24")
    assert (g2.instance_type, g2.gpu_type, g2.gpus) == ("g2-standard-24", "L4", 2)
    for bad in (
        lambda: MachineSpec("n9-mystery-8"),
        lambda: MachineSpec("n1-standard-8"),
        lambda: MachineSpec("n1-standard-8", "nvidia-tesla-t4", 3),
        lambda: MachineSpec("n1-standard-8", "nvidia-l4", 1),
        lambda: MachineSpec("a2-highgpu-1g", "nvidia-tesla-t4", 1),
    ):
        with pytest.raises(InvalidRequestError):
            bad()


@pytest.mark.parametrize(
    "overrides",
    [
        {"project": "Bad_Project"},
        {"zones": ()},
        {"zones": ("us-central1",)},
        {"zones": (ZONE_A, ZONE_A)},
        {"list_page_size": 501},
        {"disk_size_gb": 5},
        {"operation_timeout_s": 0},
        {"price_overrides": {"g2-standard-4/spot": -1.0}},
        {"machines": (MachineSpec("g2-standard-4"), MachineSpec("g2-standard-4"))},
    ],
)
def test_config_rejects_bad_values(overrides: dict[str, object]) -> None:
    fields: dict[str, object] = {"project": "coadapt-test", "zones": (ZONE_A,)}
    fields.update(overrides)
    with pytest.raises(InvalidRequestError):
        GcpConfig(**fields)  # type: ignore[arg-type]


def test_catalogue_is_consistent() -> None:
    assert catalog.region_of("europe-west4-a") == "europe-west4"
    for shape in catalog.MACHINE_SHAPES.values():
        assert 0 < shape.spot_usd_per_hour < shape.on_demand_usd_per_hour
        if shape.builtin_accelerator is not None:
            assert shape.builtin_accelerator in catalog.ACCELERATORS
    for acc in catalog.ACCELERATORS.values():
        if acc.allowed_counts:
            assert acc.spot_usd_per_gpu_hour is not None
            assert acc.on_demand_usd_per_gpu_hour is not None
            assert acc.spot_usd_per_gpu_hour < acc.on_demand_usd_per_gpu_hour


# ============================================================================ pure: fake filters


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ('labels.coadapt-cluster-id = "c1"', True),
        ("labels.coadapt-cluster-id = c1", True),
        ('labels.coadapt-cluster-id != "c1"', False),
        ('(labels.coadapt-cluster-id = "c1") AND (status = "RUNNING")', True),
        ('(labels.coadapt-cluster-id = "c1") (status = "STOPPING")', False),
        ('(status = "STOPPING") OR (name = "n1")', True),
        ('labels.missing = "x"', False),
        ("scheduling.automaticRestart = false", True),
        ("", True),
    ],
)
def test_fake_filter_language(text: str, matches: bool) -> None:
    resource = {
        "name": "n1",
        "status": "RUNNING",
        "labels": {"coadapt-cluster-id": "c1"},
        "scheduling": {"automaticRestart": False},
    }
    assert parse_filter(text)(resource) is matches


@pytest.mark.parametrize("text", ["name eq foo.*", "name =", "(name = a", "name > 3", 'a = "x" )'])
def test_fake_rejects_unsupported_filters(text: str) -> None:
    with pytest.raises(ValueError):
        parse_filter(text)


# ============================================================================ over the fake server


@pytest.fixture(scope="module")
def env() -> Iterator[FakeGcpEnv]:
    with FakeGcpEnv() as e:
        yield e


@pytest.fixture
def cluster() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def clean_env(env: FakeGcpEnv) -> Iterator[FakeGcpEnv]:
    """The shared env; pools, quotas, zones and injections restored after the test."""
    yield env
    env.server.settle()
    env.server.reset_faults()


def pool(provider_offerings: list[Offering], instance_type: str, zone: str, market: Market):
    return next(
        o
        for o in provider_offerings
        if (o.instance_type, o.zone, o.market) == (instance_type, zone, market)
    )


def request(cluster: str, pools: list[Offering], count: int, **kw: object) -> LaunchRequest:
    return LaunchRequest(
        request_id=str(kw.pop("request_id", f"r-{uuid.uuid4().hex[:12]}")),
        cluster_id=cluster,
        offerings=tuple(pools),
        count=count,
        **kw,  # type: ignore[arg-type]
    )


def last(env: FakeGcpEnv, route: str):
    return [r for r in env.server.requests if r.route == route][-1]


def test_offerings_cover_machines_zones_and_markets(env: FakeGcpEnv) -> None:
    provider = env.provider(env.config(price_overrides={"g2-standard-4/spot": 0.25}))
    offerings = provider.offerings()
    assert len(offerings) == 4 * len(env.zones) * 2
    g2 = pool(offerings, "g2-standard-4", ZONE_A, Market.SPOT)
    assert (g2.gpu_type, g2.gpus, g2.vcpus, g2.region) == ("L4", 1, 4, "us-central1")
    assert g2.price_usd_per_hour == 0.25
    prices = provider.spot_prices()
    assert {(p.instance_type, p.zone) for p in prices} == {
        (o.instance_type, o.zone) for o in offerings if o.market is Market.SPOT
    }
    assert all(p.timestamp_s == catalog.PRICES_RECORDED_EPOCH_S for p in prices)


@pytest.mark.slow
def test_zone_availability_check_drops_pools_without_the_gpu(clean_env: FakeGcpEnv) -> None:
    env = clean_env
    env.server.set_zone_accelerators(ZONE_C, {"nvidia-tesla-t4", "nvidia-l4"})
    provider = env.provider(env.config(check_zone_availability=True))
    calls = env.server.api_calls()
    types_in_c = {o.instance_type for o in provider.offerings() if o.zone == ZONE_C}
    provider.offerings()  # cached: one call only
    assert env.server.api_calls() == calls + 1
    assert types_in_c == {"g2-standard-4", "n1-standard-8+1xnvidia-tesla-t4"}


@pytest.mark.slow
def test_spot_launch_request_shape(env: FakeGcpEnv, cluster: str) -> None:
    provider = env.provider(env.config(network_tags=("coadapt-c1-node",)))
    t4 = pool(provider.offerings(), "n1-standard-8+1xnvidia-tesla-t4", ZONE_B, Market.SPOT)
    req = request(cluster, [t4], 2, tags={"team": "ml"}, user_data="#!/bin/sh\necho hi")
    result = provider.launch(req)
    assert result.fulfilled and result.errors == ()
    sent = last(env, "instances.bulkInsert")
    assert sent.path.endswith(f"/zones/{ZONE_B}/instances/bulkInsert")
    assert str(uuid.UUID(sent.query["requestId"])) == sent.query["requestId"]
    body = sent.body
    names = [naming.instance_name(cluster, req.request_id, i) for i in (0, 1)]
    assert sorted(body["perInstanceProperties"]) == names
    assert (body["count"], body["minCount"]) == ("2", "1")
    props = body["instanceProperties"]
    assert props["machineType"] == "n1-standard-8"
    assert props["guestAccelerators"] == [
        {"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}
    ]
    assert props["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert props["labels"] == {
        "team": "ml",
        CLUSTER_ID_TAG: cluster,
        REQUEST_ID_TAG: req.request_id,
        MANAGED_BY_TAG: "coadapt",
    }
    assert props["metadata"]["items"] == [{"key": "startup-script", "value": req.user_data}]
    assert props["tags"] == {"items": ["coadapt-c1-node"]}  # what the firewall selects by
    assert props["disks"][0]["initializeParams"]["diskSizeGb"] == "100"
    assert {i.instance_id for i in result.instances} == {f"{ZONE_B}/{n}" for n in names}
    assert all(i.instance_type == t4.instance_type for i in result.instances)


def test_on_demand_uses_standard_scheduling(env: FakeGcpEnv, cluster: str) -> None:
    provider = env.provider()
    a2 = pool(provider.offerings(), "a2-highgpu-1g", ZONE_A, Market.ON_DEMAND)
    result = provider.launch(request(cluster, [a2], 1))
    assert [i.market for i in result.instances] == [Market.ON_DEMAND]
    props = last(env, "instances.bulkInsert").body["instanceProperties"]
    assert props["scheduling"]["provisioningModel"] == "STANDARD"
    assert props["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert "guestAccelerators" not in props  # built into A2


def test_per_instance_insert_mode(env: FakeGcpEnv, cluster: str) -> None:
    provider = env.provider(env.config(use_bulk_insert=False))
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    before = env.server.request_counts().get(("POST", "instances.insert"), 0)
    req = request(cluster, [g2], 3)
    result = provider.launch(req)
    assert result.fulfilled and len(result.instances) == 3
    inserts = [r for r in env.server.requests if r.route == "instances.insert"][-3:]
    assert env.server.request_counts()[("POST", "instances.insert")] == before + 3
    assert [r.body["name"] for r in inserts] == [
        naming.instance_name(cluster, req.request_id, i) for i in range(3)
    ]
    assert inserts[0].body["machineType"] == f"zones/{ZONE_A}/machineTypes/g2-standard-4"
    assert len({r.query["requestId"] for r in inserts}) == 3
    again = provider.launch(req)  # idempotent in this mode too
    assert {i.instance_id for i in again.instances} == {i.instance_id for i in result.instances}
    assert env.server.request_counts()[("POST", "instances.insert")] == before + 3


def test_same_request_after_a_restart_creates_nothing(env: FakeGcpEnv, cluster: str) -> None:
    first = env.provider()
    g2 = pool(first.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    req = request(cluster, [g2], 2)
    ids = {i.instance_id for i in first.launch(req).instances}
    launches = env.launch_attempts(g2)
    restarted = env.provider()  # a new controller process: no memory of the first
    assert {i.instance_id for i in restarted.launch(req).instances} == ids
    assert env.launch_attempts(g2) == launches


def test_lost_response_is_retried_with_the_same_request_id(
    clean_env: FakeGcpEnv, cluster: str
) -> None:
    env = clean_env
    provider = env.provider()
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_B, Market.SPOT)
    env.server.inject_error("instances.bulkInsert", 503, "backendError", after_effect=True)
    result = provider.launch(request(cluster, [g2], 3))
    sent = [r for r in env.server.requests if r.route == "instances.bulkInsert"][-2:]
    assert sent[0].query["requestId"] == sent[1].query["requestId"]
    assert result.fulfilled and result.errors == ()
    env.server.settle()
    assert len(provider.list_instances(cluster)) == 3  # the replay created nothing new


def test_transient_errors_back_off_on_the_injected_clock(
    clean_env: FakeGcpEnv, cluster: str
) -> None:
    env = clean_env
    clock = FakeClock()
    provider = env.provider(clock=clock, retry_policy=RetryPolicy(max_attempts=3))
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    env.server.inject_error("instances.aggregatedList", 429, "rateLimitExceeded")
    env.server.inject_error("instances.bulkInsert", 503, "backendError", times=2)
    assert provider.launch(request(cluster, [g2], 1)).fulfilled
    assert len(clock.sleeps) >= 3  # one backoff per retried call (plus operation polls)
    env.server.inject_error("instances.bulkInsert", 503, "backendError", times=3)
    result = provider.launch(request(cluster, [g2], 1))
    assert [type(e.error) for e in result.errors] == [TransientError]
    assert not provider.unavailable.is_unavailable(g2.key)


def test_auth_errors_raise(clean_env: FakeGcpEnv, cluster: str) -> None:
    env = clean_env
    provider = env.provider()
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    env.server.inject_error("instances.aggregatedList", 401, "authError", "Invalid Credentials")
    with pytest.raises(AuthError):
        provider.launch(request(cluster, [g2], 1))
    env.server.inject_error("instances.bulkInsert", 403, "forbidden", "permission denied")
    with pytest.raises(AuthError):
        provider.launch(request(cluster, [g2], 1))


def test_partial_capacity_fills_then_falls_through(clean_env: FakeGcpEnv, cluster: str) -> None:
    env = clean_env
    provider = env.provider()
    a = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    b = pool(provider.offerings(), "g2-standard-4", ZONE_B, Market.SPOT)
    env.server.set_capacity(ZONE_A, "g2-standard-4", 2, market="spot")
    result = provider.launch(request(cluster, [a, b], 5))
    assert result.fulfilled
    by_pool = {k: sum(i.offering_key == k for i in result.instances) for k in (a.key, b.key)}
    assert by_pool == {a.key: 2, b.key: 3}
    assert [(e.offering_key, type(e.error)) for e in result.errors] == [
        (a.key, InsufficientCapacityError)
    ]
    assert provider.unavailable.is_unavailable(a.key)
    assert len({naming.parse_instance_id(i.instance_id)[1] for i in result.instances}) == 5


def test_pool_exhausted_with_details_and_quota(clean_env: FakeGcpEnv, cluster: str) -> None:
    env = clean_env
    provider = env.provider()
    a = pool(provider.offerings(), "a2-highgpu-1g", ZONE_A, Market.SPOT)
    t4 = pool(provider.offerings(), "n1-standard-8+1xnvidia-tesla-t4", ZONE_B, Market.SPOT)
    env.server.exhaust(ZONE_A, "a2-highgpu-1g", code="ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
    env.server.set_gpu_quota("us-central1", "PREEMPTIBLE_NVIDIA_T4_GPUS", 0)
    result = provider.launch(request(cluster, [a, t4], 1))
    errors = {e.offering_key: e.error for e in result.errors}
    assert isinstance(errors[a.key], InsufficientCapacityError)
    assert errors[a.key].code == "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
    assert isinstance(errors[t4.key], QuotaExceededError)
    assert provider.unavailable.is_unavailable(a.key)
    assert not provider.unavailable.is_unavailable(t4.key)  # quota is not a capacity signal


def test_capacity_failure_does_not_replay_by_request_id(
    clean_env: FakeGcpEnv, cluster: str
) -> None:
    env = clean_env
    provider = env.provider()
    a = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    env.exhaust(a)
    req = request(cluster, [a], 2)
    assert provider.launch(req).instances == ()
    env.server.restore(ZONE_A, "g2-standard-4")
    provider.unavailable.clear()
    result = provider.launch(req)  # same request id: a fresh attempt, not the failed operation
    assert result.fulfilled and result.errors == ()


def test_cloud_side_invalid_requests_are_pool_errors(clean_env: FakeGcpEnv, cluster: str) -> None:
    env = clean_env
    provider = env.provider(env.config(network="global/networks/nowhere"))
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    result = provider.launch(request(cluster, [g2], 1))
    assert [type(e.error) for e in result.errors] == [InvalidRequestError]
    env.server.set_zone_accelerators(ZONE_C, {"nvidia-l4"})
    provider = env.provider()
    t4 = pool(provider.offerings(), "n1-standard-8+1xnvidia-tesla-t4", ZONE_C, Market.SPOT)
    result = provider.launch(request(cluster, [t4], 1))
    assert [type(e.error) for e in result.errors] == [InvalidRequestError]
    assert "does not exist in zone" in str(result.errors[0].error)


def test_operation_timeout_reports_transient_and_keeps_the_names(cluster: str) -> None:
    with FakeGcpEnv(insert_duration_s=10_000.0) as slow:
        provider = slow.provider(slow.config(operation_timeout_s=300.0))
        a = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
        b = pool(provider.offerings(), "g2-standard-4", ZONE_B, Market.SPOT)
        result = provider.launch(request(cluster, [a, b], 2))
        assert [(e.offering_key, type(e.error)) for e in result.errors] == [(a.key, TransientError)]
        # The slow pool's names were not retried elsewhere: no risk of a double launch.
        assert slow.launch_attempts(b) == 0
        assert {i.state for i in result.instances} == {InstanceState.PENDING}


def test_relaunch_after_loss_tops_up_under_a_new_name(env: FakeGcpEnv, cluster: str) -> None:
    """The launch rule: an ended instance no longer counts, so re-issuing the request creates
    one replacement (inside the requestId window too: a new shortfall is a new requestId),
    under a name this provider never used; a restarted controller then finds the request full."""
    provider = env.provider()
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    req = request(cluster, [g2], 2)
    first = provider.launch(req)
    lost, kept = (i.instance_id for i in first.instances)
    env.preempt(lost)
    env.server.settle()
    again = provider.launch(req)
    assert again.fulfilled and again.errors == ()
    ids = {i.instance_id for i in again.instances}
    assert kept in ids and lost not in ids and len(ids) == 2
    launches = env.launch_attempts(g2)
    restarted = env.provider()
    assert {i.instance_id for i in restarted.launch(req).instances} == ids
    assert env.launch_attempts(g2) == launches
    env.server.settle()
    assert {i.instance_id for i in provider.list_instances(cluster)} == ids


@pytest.mark.parametrize("bulk", [True, False])
def test_name_taken_by_a_foreign_instance_is_not_adopted(
    env: FakeGcpEnv, cluster: str, bulk: bool
) -> None:
    provider = env.provider(env.config(use_bulk_insert=bulk))
    a = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    b = pool(provider.offerings(), "g2-standard-4", ZONE_B, Market.SPOT)
    req = request(cluster, [a, b], 1)
    squatter = naming.instance_name(cluster, req.request_id, 0)
    env.server.add_foreign_instance(ZONE_A, squatter)  # same name, not our labels
    result = provider.launch(req)
    errors = [(e.offering_key, type(e.error)) for e in result.errors]
    assert errors == [(a.key, InvalidRequestError)]
    assert [i.offering_key for i in result.instances] == [b.key]  # fell through to the next pool
    assert env.has_live_instance(f"{ZONE_A}/{squatter}")


def test_listing_paginates_and_filters_by_label(env: FakeGcpEnv, cluster: str) -> None:
    provider = env.provider(env.config(list_page_size=2))
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_B, Market.SPOT)
    launched = provider.launch(request(cluster, [g2], 5))
    env.add_foreign_instance(zone=ZONE_B)  # unlabelled
    env.add_foreign_instance(labels={CLUSTER_ID_TAG: cluster})  # no managed-by label
    env.add_foreign_instance(labels={CLUSTER_ID_TAG: "other", MANAGED_BY_TAG: "coadapt"})
    stopped = env.server.add_foreign_instance(
        ZONE_A, labels={CLUSTER_ID_TAG: cluster, MANAGED_BY_TAG: "coadapt"}, spot=False
    )  # ours, but preempted with termination action STOP: TERMINATED, still in the API
    env.server.preempt(ZONE_A, stopped)
    assert env.server.instance(ZONE_A, stopped)["status"] == "TERMINATED"
    before = env.server.request_counts().get(("GET", "instances.aggregatedList"), 0)
    listed = provider.list_instances(cluster)
    assert {i.instance_id for i in listed} == {i.instance_id for i in launched.instances}
    pages = env.server.request_counts()[("GET", "instances.aggregatedList")] - before
    assert pages == 3
    sent = last(env, "instances.aggregatedList")
    assert sent.query["maxResults"] == "2" and sent.query["pageToken"]
    assert f'labels.{CLUSTER_ID_TAG} = "{cluster}"' in sent.query["filter"]
    assert f'labels.{MANAGED_BY_TAG} = "coadapt"' in sent.query["filter"]


def test_terminate_batches_operation_polls_per_zone(env: FakeGcpEnv, cluster: str) -> None:
    provider = env.provider()
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    ids = [i.instance_id for i in provider.launch(request(cluster, [g2], 6)).instances]
    counts = env.server.request_counts()
    result = provider.terminate(cluster, ids, "term-1")
    after = env.server.request_counts()
    assert sorted(result.terminated) == sorted(ids)
    assert (
        after[("DELETE", "instances.delete")] - counts.get(("DELETE", "instances.delete"), 0) == 6
    )
    assert after.get(("GET", "zoneOperations.list"), 0) > counts.get(
        ("GET", "zoneOperations.list"), 0
    )
    assert after.get(("POST", "zoneOperations.wait"), 0) == counts.get(
        ("POST", "zoneOperations.wait"), 0
    )
    deletes = [r for r in env.server.requests if r.route == "instances.delete"][-6:]
    assert all(str(uuid.UUID(r.query["requestId"])) == r.query["requestId"] for r in deletes)
    assert all(not env.has_live_instance(i) for i in ids)  # the waits saw the deletes through
    sent = last(env, "zoneOperations.list")
    assert sent.query["filter"] == '(operationType = "delete") AND (status != "DONE")'


def test_terminate_overlaps_deletes() -> None:
    # The Compute API has no bulk delete; with a real round trip per call, deleting many
    # instances one after another would take minutes. The fake delays each response (wall
    # clock) and counts requests in flight at once.
    env = FakeGcpEnv(response_latency_s=0.05)
    try:
        provider = env.provider()
        g2 = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
        ids = [i.instance_id for i in provider.launch(request("c-overlap", [g2], 12)).instances]
        env.server.max_in_flight = 0
        result = provider.terminate("c-overlap", ids, "term-overlap")
        assert sorted(result.terminated) == sorted(ids)
        assert env.server.max_in_flight > 1
        assert all(not env.has_live_instance(i) for i in ids)
    finally:
        env.close()


def test_terminate_sorts_ids(env: FakeGcpEnv, cluster: str) -> None:
    provider = env.provider(env.config(delete_wait_s=0.0))
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    (ours,) = (i.instance_id for i in provider.launch(request(cluster, [g2], 1)).instances)
    foreign = env.add_foreign_instance()
    gone = f"{ZONE_A}/ca-00000000-0000000000-0000"
    waits = env.server.request_counts().get(("POST", "zoneOperations.wait"), 0)
    result = provider.terminate(cluster, [ours, foreign, gone, "garbage", ours], "term-2")
    assert result.terminated == (ours,)
    assert result.already_gone == (gone,)
    assert result.refused == (foreign, "garbage")
    assert env.server.request_counts().get(("POST", "zoneOperations.wait"), 0) == waits
    again = provider.terminate(cluster, [ours], "term-3")  # still STOPPING: not deleted twice
    assert again.terminated == (ours,)
    assert [r.route for r in env.server.requests][-1] != "instances.delete"


def test_interruptions_from_preemption_operations(env: FakeGcpEnv, cluster: str) -> None:
    provider = env.provider(env.config(list_page_size=1))
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_B, Market.SPOT)
    ids = [i.instance_id for i in provider.launch(request(cluster, [g2], 2)).instances]
    foreign = env.add_foreign_instance(zone=ZONE_B)
    env.preempt(foreign)
    for iid in ids:
        env.preempt(iid)
    at = env.clock.now_s()
    restarted = env.provider()  # the controller restarted: labels are gone, names remain
    notices = restarted.interruptions(cluster)
    assert sorted(n.instance_id for n in notices) == sorted(ids)
    for notice in notices:
        assert notice.kind is InterruptionKind.PREEMPTED
        assert notice.source == "gce-operation"
        assert notice.deadline_s == pytest.approx(at + 30.0, abs=0.01)
    assert restarted.interruptions(cluster) == []
    sent = last(env, "zoneOperations.list")
    assert sent.query["filter"] == 'operationType = "compute.instances.preempted"'
    assert provider.interruptions(cluster) != []  # each provider drains its own view


def test_old_preemptions_are_history(env: FakeGcpEnv, cluster: str) -> None:
    provider = env.provider()
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    (iid,) = (i.instance_id for i in provider.launch(request(cluster, [g2], 1)).instances)
    env.preempt(iid)
    env.clock.advance(7200.0)
    later = env.provider(env.config(preemption_lookback_s=3600.0))
    assert later.interruptions(cluster) == []


def test_invalid_launch_makes_no_call(env: FakeGcpEnv, cluster: str) -> None:
    provider = env.provider()
    g2 = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
    calls = env.server.api_calls()
    bogus = Offering(**{**g2.__dict__, "instance_type": "n1-standard-8+1xnvidia-tesla-k80"})
    with pytest.raises(InvalidRequestError):
        provider.launch(request(cluster, [bogus], 1))
    with pytest.raises(InvalidRequestError):
        provider.terminate("Bad Cluster", ["x"], "r")
    with pytest.raises(InvalidRequestError):
        provider.list_instances("Bad Cluster")
    assert env.server.api_calls() == calls


def test_real_clock_end_to_end(cluster: str) -> None:
    """No FakeClock: operations take real (short) time and waits really block."""
    with FakeGceServer(
        TEST_PROJECT,
        (ZONE_A,),
        clock=SystemClock(),
        insert_pending_s=0.05,
        insert_duration_s=0.2,
        delete_duration_s=0.1,
    ) as server:
        provider = GcpProvider(
            GcpConfig(project=TEST_PROJECT, zones=(ZONE_A,), operation_poll_interval_s=0.05),
            api_endpoint=server.endpoint,
            credentials=anonymous_credentials(),
        )
        g2 = pool(provider.offerings(), "g2-standard-4", ZONE_A, Market.SPOT)
        result = provider.launch(request(cluster, [g2], 2))
        assert {i.state for i in result.instances} == {InstanceState.RUNNING}
        ids = [i.instance_id for i in result.instances]
        assert provider.terminate(cluster, ids, "end").terminated == tuple(ids)
        assert provider.list_instances(cluster) == []


# ============================================================================ fake faithfulness


def raw(env: FakeGcpEnv, method: str, path: str, body: object = None, **headers: str):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        env.server.endpoint + path, data=data, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_fake_error_bodies_and_request_id_validation(env: FakeGcpEnv) -> None:
    base = f"/compute/v1/projects/{env.project}/zones/{ZONE_A}"
    status, body = raw(env, "GET", f"{base}/instances/does-not-exist")
    assert status == 404
    assert body["error"]["errors"][0]["reason"] == "notFound"
    assert "was not found" in body["error"]["message"]
    status, body = raw(env, "DELETE", f"{base}/instances/x?requestId=not-a-uuid")
    assert status == 400 and "valid UUID" in body["error"]["message"]
    status, _ = raw(env, "GET", f"/compute/v1/projects/{env.project}/zones/mars-1-a/instances")
    assert status == 404


def test_fake_operations_progress_on_the_clock(env: FakeGcpEnv) -> None:
    name = env.server.add_foreign_instance(ZONE_C)
    base = f"/compute/v1/projects/{env.project}/zones/{ZONE_C}"
    status, op = raw(env, "DELETE", f"{base}/instances/{name}")
    assert status == 200 and op["status"] == "RUNNING" and op["operationType"] == "delete"
    assert raw(env, "GET", f"{base}/instances/{name}")[1]["status"] == "STOPPING"
    env.clock.advance(env.server.delete_duration_s)
    _, done = raw(env, "GET", f"{base}/operations/{op['name']}")
    assert done["status"] == "DONE" and "endTime" in done and "error" not in done
    assert raw(env, "GET", f"{base}/instances/{name}")[0] == 404


# ============================================================================ metadata server


def test_metadata_watcher_sees_preemption(env: FakeGcpEnv) -> None:
    name = env.server.add_foreign_instance(ZONE_A)
    base_url = env.server.metadata_base_url(ZONE_A, name)
    assert discover_instance_id(base_url) == f"{ZONE_A}/{name}"
    watcher = PreemptionWatcher(f"{ZONE_A}/{name}", clock=env.clock, base_url=base_url)
    assert watcher.poll() is None
    timer = threading.Timer(0.2, env.server.preempt, args=(ZONE_A, name))
    timer.start()
    notice = watcher.wait(timeout_s=3)  # wait_for_change returns on the flip
    timer.join()
    assert notice is not None
    assert notice.kind is InterruptionKind.PREEMPTED and notice.source == "gce-metadata"
    assert notice.deadline_s == pytest.approx(env.clock.now_s() + 30.0)
    assert watcher.poll() == notice  # stable deadline


def test_metadata_requires_the_flavor_header_and_a_reachable_server(env: FakeGcpEnv) -> None:
    name = env.server.add_foreign_instance(ZONE_A)
    url = env.server.metadata_base_url(ZONE_A, name) + "/computeMetadata/v1/instance/preempted"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=5)
    assert info.value.code == 403
    watcher = PreemptionWatcher("z/n", clock=FakeClock(), base_url="http://127.0.0.1:9")
    with pytest.raises(TransientError):
        watcher.poll()
