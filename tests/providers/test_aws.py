"""Unit and integration tests of the AWS provider (``providers.aws``).

Where each kind of test gets its AWS:

* **moto server** (real boto3 over HTTP to ``emulators.aws_moto.shared_moto_server``):
  catalogue, launch tags, ownership filters, batching, EventBridge -> SQS interruptions.
* **botocore Stubber** on the provider's real client, for what moto does not model: capacity
  and quota errors in a partial ``CreateFleet`` answer, throttling/5xx retries,
  ``ClientToken`` replay (EC2 answers a repeated token with the original instances; moto
  launches again), real spot prices across pages with zone names, ``InvalidInstanceID.NotFound``
  during terminate. Each such test says so. The catalogue those tests need is read from moto
  first; the Stubber is switched on only for the calls under test.
* **a local fake IMDSv2 HTTP server** (``FakeImds``, below) for the node-side poller: instance
  metadata exists only on EC2.
* pure functions (error mapping, parsers) directly, including hypothesis property tests.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coadapt_common.clock import FakeClock
from emulators.aws_imds import FakeImds
from providers.aws.catalog import gpu_type_name, on_demand_price_usd_per_hour
from providers.aws.config import AwsConfig, LaunchApi, LaunchTemplateRef
from providers.aws.errors import error_from_code
from providers.aws.events import (
    SPOT_WARNING_LEAD_S,
    MalformedNoticeError,
    parse_eventbridge_event,
    parse_imds_instance_action,
    parse_imds_rebalance,
    unwrap_sqs_body,
)
from providers.aws.imds import ImdsPoller
from providers.base import (
    InterruptionKind,
    LaunchRequest,
    Market,
    Offering,
    Provider,
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
from providers.retry import RetryPolicy
from providers.tags import CLUSTER_ID_TAG, MANAGED_BY_TAG, MANAGED_BY_VALUE, REQUEST_ID_TAG

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# =============================================================================== errors


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("InsufficientInstanceCapacity", 500, InsufficientCapacityError),  # code beats 5xx
        ("Server.InsufficientInstanceCapacity", None, InsufficientCapacityError),
        ("InsufficientCapacity", 400, InsufficientCapacityError),
        ("InsufficientHostCapacity", 400, InsufficientCapacityError),
        ("MaxSpotInstanceCountExceeded", 400, InsufficientCapacityError),
        ("SpotMaxPriceTooLow", 400, InsufficientCapacityError),
        ("UnfulfillableCapacity", 400, InsufficientCapacityError),
        ("VcpuLimitExceeded", 400, QuotaExceededError),
        ("InstanceLimitExceeded", 400, QuotaExceededError),
        ("RequestLimitExceeded", 503, TransientError),
        ("Throttling", 400, TransientError),
        ("ThrottlingException", 400, TransientError),
        ("InternalError", 500, TransientError),
        ("ServiceUnavailable", 503, TransientError),
        ("Unavailable", 503, TransientError),
        ("SomethingNew", 502, TransientError),  # unknown code, 5xx
        ("", 504, TransientError),
        ("SomethingNew", 429, TransientError),
        ("InvalidInstanceID.NotFound", 400, InstanceNotFoundError),
        ("InvalidInstanceID.Malformed", 400, InstanceNotFoundError),
        ("AuthFailure", 401, AuthError),
        ("UnauthorizedOperation", 403, AuthError),
        ("ExpiredToken", 400, AuthError),
        ("SomethingNew", 403, AuthError),
        ("InvalidParameterValue", 400, InvalidRequestError),
        ("IdempotentParameterMismatch", 400, InvalidRequestError),
        ("InvalidSubnetID.NotFound", 400, InvalidRequestError),
        ("InvalidFooBar", 400, InvalidRequestError),  # unknown Invalid* code
    ],
)
def test_error_codes_map_to_typed_errors(code: str, status: int | None, expected: type) -> None:
    err = error_from_code(code, "message", http_status=status, pool="aws/g5.xlarge/use1-az1/spot")
    assert type(err) is expected
    assert err.code == (code or None)
    assert err.pool == "aws/g5.xlarge/use1-az1/spot"
    assert err.retryable is (expected is TransientError)


def test_unknown_client_error_is_a_plain_non_retryable_provider_error() -> None:
    err = error_from_code("SomethingNew", "?", http_status=400)
    assert type(err) is ProviderError
    assert not err.retryable


def test_translate_botocore_exceptions() -> None:
    bce = pytest.importorskip("botocore.exceptions")

    from providers.aws.errors import translate

    client_error = bce.ClientError(
        {
            "Error": {"Code": "RequestLimitExceeded", "Message": "Request limit exceeded."},
            "ResponseMetadata": {"HTTPStatusCode": 503},
        },
        "CreateFleet",
    )
    assert isinstance(translate(client_error), TransientError)
    assert isinstance(
        translate(bce.EndpointConnectionError(endpoint_url="http://x")), TransientError
    )
    assert isinstance(translate(bce.ReadTimeoutError(endpoint_url="http://x")), TransientError)
    assert isinstance(translate(bce.ConnectTimeoutError(endpoint_url="http://x")), TransientError)
    assert isinstance(translate(bce.ConnectionClosedError(endpoint_url="http://x")), TransientError)
    assert isinstance(translate(bce.NoCredentialsError()), AuthError)
    assert isinstance(translate(bce.ParamValidationError(report="bad")), InvalidRequestError)
    mine = QuotaExceededError("q")
    assert translate(mine) is mine


# ============================================================================== parsers

# Shapes as documented by AWS (EC2 user guide: "Spot Instance interruption notices",
# "EC2 instance rebalance recommendations", EventBridge event examples).
SPOT_WARNING_EVENT = {
    "version": "0",
    "id": "12345678-1234-1234-1234-123456789012",
    "detail-type": "EC2 Spot Instance Interruption Warning",
    "source": "aws.ec2",
    "account": "123456789012",
    "time": "2021-02-03T14:12:00Z",
    "region": "us-east-2",
    "resources": ["arn:aws:ec2:us-east-2a:instance/i-1234567890abcdef0"],
    "detail": {"instance-id": "i-1234567890abcdef0", "instance-action": "terminate"},
}
REBALANCE_EVENT = {
    "version": "0",
    "id": "12345678-1234-1234-1234-123456789012",
    "detail-type": "EC2 Instance Rebalance Recommendation",
    "source": "aws.ec2",
    "account": "123456789012",
    "time": "2020-10-26T14:14:14Z",
    "region": "us-east-1",
    "resources": ["arn:aws:ec2:us-east-1b:instance/i-1234567890abcdef0"],
    "detail": {"instance-id": "i-1234567890abcdef0"},
}
STATE_CHANGE_EVENT = {
    "version": "0",
    "id": "7bf73129-1428-4cd3-a780-95db273d1602",
    "detail-type": "EC2 Instance State-change Notification",
    "source": "aws.ec2",
    "account": "123456789012",
    "time": "2015-11-11T21:29:54Z",
    "region": "us-east-1",
    "resources": ["arn:aws:ec2:us-east-1:123456789012:instance/i-abcd1111"],
    "detail": {"instance-id": "i-abcd1111", "state": "shutting-down"},
}
T_SPOT = datetime(2021, 2, 3, 14, 12, tzinfo=UTC).timestamp()


def test_parse_spot_warning_event() -> None:
    notice = parse_eventbridge_event(SPOT_WARNING_EVENT)
    assert notice is not None
    assert notice.instance_id == "i-1234567890abcdef0"
    assert notice.kind is InterruptionKind.SPOT_INTERRUPTION
    assert notice.deadline_s == T_SPOT + SPOT_WARNING_LEAD_S
    assert notice.source == "eventbridge"
    assert notice.noticed_at_s == T_SPOT
    # The same event as the JSON text SQS delivers, with an explicit noticed time.
    again = parse_eventbridge_event(json.dumps(SPOT_WARNING_EVENT), noticed_at_s=5.0)
    assert again == replace(notice, noticed_at_s=5.0)


def test_parse_rebalance_and_state_change_events() -> None:
    rebalance = parse_eventbridge_event(REBALANCE_EVENT)
    assert rebalance is not None and rebalance.kind is InterruptionKind.REBALANCE
    assert rebalance.deadline_s is None
    gone = parse_eventbridge_event(STATE_CHANGE_EVENT)
    assert gone is not None and gone.kind is InterruptionKind.TERMINATED
    assert gone.instance_id == "i-abcd1111"
    assert gone.deadline_s == datetime(2015, 11, 11, 21, 29, 54, tzinfo=UTC).timestamp()
    for state in ("pending", "running"):
        event = {**STATE_CHANGE_EVENT, "detail": {"instance-id": "i-abcd1111", "state": state}}
        assert parse_eventbridge_event(event) is None


@pytest.mark.parametrize(
    "event",
    [
        {**SPOT_WARNING_EVENT, "source": "aws.autoscaling"},
        {**SPOT_WARNING_EVENT, "detail-type": "EC2 Instance Launch Successful"},
        {"source": "aws.ec2", "detail-type": "AWS API Call via CloudTrail", "detail": {}},
    ],
)
def test_unrelated_events_are_ignored(event: dict[str, Any]) -> None:
    assert parse_eventbridge_event(event) is None


@pytest.mark.parametrize(
    "event",
    [
        "not json",
        "[1, 2]",
        {**SPOT_WARNING_EVENT, "detail": "x"},
        {**SPOT_WARNING_EVENT, "detail": {"instance-action": "terminate"}},
        {**SPOT_WARNING_EVENT, "time": "yesterday"},
        {**SPOT_WARNING_EVENT, "time": None},
        {**STATE_CHANGE_EVENT, "detail": {"instance-id": "i-abcd1111", "state": "exploded"}},
    ],
)
def test_malformed_events_raise_a_typed_error(event: Any) -> None:
    with pytest.raises(MalformedNoticeError):
        parse_eventbridge_event(event)


def test_unwrap_sqs_body_accepts_plain_and_sns_wrapped_events() -> None:
    body = json.dumps(SPOT_WARNING_EVENT)
    assert unwrap_sqs_body(body) == SPOT_WARNING_EVENT
    sns = json.dumps({"Type": "Notification", "MessageId": "m", "Message": body})
    assert unwrap_sqs_body(sns) == SPOT_WARNING_EVENT


@pytest.mark.parametrize("action", ["terminate", "stop", "hibernate"])
def test_parse_imds_instance_action(action: str) -> None:
    body = json.dumps({"action": action, "time": "2017-09-18T08:22:00Z"})
    notice = parse_imds_instance_action(body, instance_id="i-0123456789abcdef0", noticed_at_s=1.0)
    assert notice is not None
    assert notice.kind is InterruptionKind.SPOT_INTERRUPTION
    assert notice.deadline_s == datetime(2017, 9, 18, 8, 22, tzinfo=UTC).timestamp()
    assert notice.source == "imds" and notice.noticed_at_s == 1.0


def test_parse_imds_nothing_and_malformed() -> None:
    assert parse_imds_instance_action(None, instance_id="i-0123456789abcdef0") is None
    assert parse_imds_instance_action("", instance_id="i-0123456789abcdef0") is None
    with pytest.raises(MalformedNoticeError):
        parse_imds_instance_action('{"action": "explode"}', instance_id="i-0123456789abcdef0")
    with pytest.raises(MalformedNoticeError):
        parse_imds_instance_action("<html>", instance_id="i-0123456789abcdef0")
    rebalance = parse_imds_rebalance(
        '{"noticeTime": "2020-10-27T08:22:00Z"}', instance_id="i-0123456789abcdef0"
    )
    assert rebalance is not None and rebalance.kind is InterruptionKind.REBALANCE
    assert rebalance.deadline_s is None
    assert rebalance.noticed_at_s == datetime(2020, 10, 27, 8, 22, tzinfo=UTC).timestamp()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


@given(
    detail_type=st.sampled_from(
        [
            "EC2 Spot Instance Interruption Warning",
            "EC2 Instance Rebalance Recommendation",
            "EC2 Instance State-change Notification",
            "Other",
        ]
    ),
    detail=_json,
    time=st.one_of(_json, st.just("2021-02-03T14:12:00Z")),
)
def test_parse_eventbridge_never_fails_untyped(detail_type: str, detail: Any, time: Any) -> None:
    event = {"source": "aws.ec2", "detail-type": detail_type, "detail": detail, "time": time}
    try:
        notice = parse_eventbridge_event(event)
    except MalformedNoticeError:
        return
    assert notice is None or notice.instance_id.startswith("i-")


@given(
    epoch_s=st.integers(min_value=0, max_value=4_000_000_000),
    instance=st.from_regex(r"i-[0-9a-f]{17}", fullmatch=True),
)
def test_spot_warning_deadline_is_two_minutes_after_the_event(epoch_s: int, instance: str) -> None:
    event = {**SPOT_WARNING_EVENT, "time": _iso(epoch_s), "detail": {"instance-id": instance}}
    notice = parse_eventbridge_event(event)
    assert notice is not None and notice.instance_id == instance
    assert notice.deadline_s == epoch_s + SPOT_WARNING_LEAD_S


# ============================================================================== catalog


def test_catalogue_prices_and_gpu_names() -> None:
    assert on_demand_price_usd_per_hour("g4dn.xlarge", "us-east-1") == 0.526
    assert on_demand_price_usd_per_hour("g4dn.xlarge", "eu-west-1") is None
    assert on_demand_price_usd_per_hour("g4dn.xlarge", "eu-west-1", {"g4dn.xlarge": 0.6}) == 0.6
    assert on_demand_price_usd_per_hour("p5.4xlarge", "us-east-1") is None
    assert gpu_type_name("T4", 16384) == "T4"
    assert gpu_type_name("A100", 40960) == "A100"
    assert gpu_type_name("A100", 81920) == "A100-80GB"


def test_config_validation() -> None:
    with pytest.raises(InvalidRequestError):
        AwsConfig(region="us-east-1")  # neither image nor template
    with pytest.raises(InvalidRequestError):
        AwsConfig(
            region="us-east-1",
            image_id="ami-1",
            launch_template=LaunchTemplateRef(template_id="lt-1"),
        )
    with pytest.raises(InvalidRequestError):
        AwsConfig(region="us-east-1", image_id="ami-1", terminate_batch_size=1001)
    with pytest.raises(InvalidRequestError):
        LaunchTemplateRef()
    config = AwsConfig(region="us-east-1", image_id="ami-1", launch_api="run-instances")
    assert config.launch_api is LaunchApi.RUN_INSTANCES


def test_pure_modules_import_without_boto3() -> None:
    """The core and the AWS pure modules import on a machine without boto3/botocore/moto."""
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"boto3", "botocore", "moto"}:
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, Block())
import providers, providers.base, providers.aws
import providers.aws.events, providers.aws.imds, providers.aws.catalog, providers.aws.config
from providers.aws.errors import error_from_code
assert error_from_code("VcpuLimitExceeded").__class__.__name__ == "QuotaExceededError"
try:
    providers.aws.AwsProvider
except ModuleNotFoundError:
    print("ok")
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ================================================================================= IMDS


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    fake = FakeImds()
    yield fake
    fake.close()


def test_imds_poller_reports_each_notice_once(imds: FakeImds) -> None:
    clock = FakeClock()
    poller = ImdsPoller(base_url=imds.url, clock=clock)
    assert poller.poll() == []
    imds.instance_action = json.dumps({"action": "terminate", "time": _iso(clock.now_s() + 120)})
    (notice,) = poller.poll()
    assert notice.instance_id == imds.instance_id
    assert notice.kind is InterruptionKind.SPOT_INTERRUPTION
    assert notice.deadline_s == clock.now_s() + 120
    assert notice.noticed_at_s == clock.now_s()
    assert poller.poll() == []  # still shown by IMDS, already reported
    imds.rebalance = json.dumps({"noticeTime": _iso(clock.now_s())})
    (rebalance,) = poller.poll()
    assert rebalance.kind is InterruptionKind.REBALANCE and rebalance.deadline_s is None
    assert poller.poll() == []
    imds.rebalance = json.dumps({"noticeTime": _iso(clock.now_s() + 600)})  # a new one
    assert [n.kind for n in poller.poll()] == [InterruptionKind.REBALANCE]
    assert imds.token_puts == 1, "one session token serves every GET until it expires"


def test_imds_poller_renews_expired_and_revoked_tokens(imds: FakeImds) -> None:
    clock = FakeClock()
    poller = ImdsPoller(base_url=imds.url, clock=clock, token_ttl_s=600)
    poller.poll()
    assert imds.token_puts == 1
    clock.advance(600)  # past the TTL (renewed a minute early)
    poller.poll()
    assert imds.token_puts == 2
    imds.tokens.clear()  # e.g. IMDS restarted: the token is refused with 401
    poller.poll()
    assert imds.token_puts == 3


def test_imds_poller_ignores_proxy_settings(
    imds: FakeImds, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    imds.instance_action = json.dumps({"action": "stop", "time": "2030-01-01T00:00:00Z"})
    assert len(ImdsPoller(base_url=imds.url, clock=FakeClock()).poll()) == 1


def test_imds_poller_unreachable_is_transient() -> None:
    with pytest.raises(TransientError):
        ImdsPoller(base_url="http://127.0.0.1:9", clock=FakeClock(), timeout_s=0.5).poll()


def test_imds_watch_calls_back_and_sleeps_on_the_clock(imds: FakeImds) -> None:
    clock = FakeClock()
    poller = ImdsPoller(base_url=imds.url, clock=clock)
    seen = []
    polls = {"n": 0}

    def should_stop() -> bool:
        polls["n"] += 1
        if polls["n"] == 3:  # the notice appears between the first and second poll
            imds.instance_action = json.dumps(
                {"action": "terminate", "time": "2030-01-01T00:00:00Z"}
            )
        return polls["n"] > 6

    poller.watch(seen.append, interval_s=5.0, should_stop=should_stop)
    assert [n.kind for n in seen] == [InterruptionKind.SPOT_INTERRUPTION]
    assert clock.sleeps and all(s == 5.0 for s in clock.sleeps)


# ========================================================================== moto fixtures

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

from botocore.stub import ANY, Stubber  # noqa: E402

from emulators.aws_moto import (  # noqa: E402
    ApiCallCounter,
    CapacityModel,
    MotoServer,
    admin_client,
    boto_session,
    create_interruption_queue,
    delete_interruption_queue,
    make_provider,
    pick_pools,
    send_ec2_event,
    shared_moto_server,
)
from providers.aws.provider import AwsProvider, client_token  # noqa: E402


@pytest.fixture(scope="module")
def moto() -> MotoServer:
    return shared_moto_server()


@pytest.fixture
def cluster_id() -> str:
    return f"aws-unit-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="module")
def fleet_template(moto: MotoServer) -> str:
    """A launch template in moto (the Stubber tests only need its id to exist in config)."""
    ec2 = admin_client(moto.url, "ec2")
    name = f"coadapt-unit-{uuid.uuid4().hex[:8]}"
    return ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData={"ImageId": "ami-12345678"}
    )["LaunchTemplate"]["LaunchTemplateId"]


@pytest.fixture
def provider(moto: MotoServer, clock: FakeClock) -> AwsProvider:
    return make_provider(moto.url, clock=clock)


@pytest.fixture
def stub_provider(moto: MotoServer, clock: FakeClock, fleet_template: str) -> AwsProvider:
    """A provider whose catalogue is read from moto, for tests that then switch on a Stubber."""
    p = make_provider(
        moto.url,
        clock=clock,
        launch_template=LaunchTemplateRef(template_id=fleet_template),
        retry_policy=RetryPolicy(max_attempts=4, base_delay_s=0.5, max_delay_s=4.0),
    )
    p.offerings()
    return p


def _pools(p: AwsProvider, n: int, market: Market = Market.SPOT) -> list[Offering]:
    return pick_pools(p, market, n)


def _subnet(p: AwsProvider, o: Offering) -> str:
    return p.config.subnets_by_zone[p._zone_map().name_by_id[o.zone]]


def _request(cluster_id: str, pools: list[Offering], count: int, **kw: Any) -> LaunchRequest:
    return LaunchRequest(
        request_id=kw.pop("request_id", f"req-{uuid.uuid4().hex[:12]}"),
        cluster_id=cluster_id,
        offerings=tuple(pools),
        count=count,
        **kw,
    )


def _capture(p: AwsProvider, operation: str) -> list[dict[str, Any]]:
    """Record the parameters of every ``operation`` call the provider's EC2 client makes."""
    seen: list[dict[str, Any]] = []
    p.ec2.meta.events.register(
        f"provide-client-params.ec2.{operation}", lambda params, **_: seen.append(dict(params))
    )
    return seen


def _empty_lookup(stub: Stubber) -> None:
    stub.add_response(
        "describe_instances", {"Reservations": []}, {"Filters": ANY, "MaxResults": 1000}
    )


def _fleet_group(p: AwsProvider, o: Offering, ids: list[str], template_id: str) -> dict[str, Any]:
    return {
        "LaunchTemplateAndOverrides": {
            "LaunchTemplateSpecification": {"LaunchTemplateId": template_id, "Version": "1"},
            "Overrides": {"InstanceType": o.instance_type, "SubnetId": _subnet(p, o)},
        },
        "Lifecycle": "spot" if o.market is Market.SPOT else "on-demand",
        "InstanceIds": ids,
        "InstanceType": o.instance_type,
    }


def _fleet_error(
    p: AwsProvider, o: Offering, code: str, template_id: str, message: str = "no"
) -> dict[str, Any]:
    return {
        "LaunchTemplateAndOverrides": {
            "LaunchTemplateSpecification": {"LaunchTemplateId": template_id, "Version": "1"},
            "Overrides": {"InstanceType": o.instance_type, "SubnetId": _subnet(p, o)},
        },
        "Lifecycle": "spot" if o.market is Market.SPOT else "on-demand",
        "ErrorCode": code,
        "ErrorMessage": message,
    }


# ====================================================================== moto: catalogue


def test_provider_satisfies_the_protocol(provider: AwsProvider) -> None:
    assert isinstance(provider, Provider)
    assert provider.name == "aws"


def test_offerings_are_gpu_pools_by_zone_id_with_prices(moto: MotoServer, clock: FakeClock) -> None:
    p = make_provider(moto.url, clock=clock, instance_types=("g4dn.xlarge", "t3.*", "g5.*"))
    offerings = p.offerings()
    types = {o.instance_type for o in offerings}
    assert "g4dn.xlarge" in types and "g5.xlarge" in types
    assert not any(t.startswith("t3.") for t in types), "non-GPU types are dropped"
    zone_ids = set(p._zone_map().name_by_id)
    assert {o.zone for o in offerings} <= zone_ids, "zones are zone ids, not names"
    g4 = {o.key: o for o in offerings if o.instance_type == "g4dn.xlarge"}
    od = [o for o in g4.values() if o.market is Market.ON_DEMAND]
    spot = [o for o in g4.values() if o.market is Market.SPOT]
    assert od and spot and len(od) == len(spot)
    assert all(o.price_usd_per_hour == 0.526 for o in od), "on-demand from the catalogue"
    assert all(o.price_usd_per_hour is not None for o in spot), "spot from the price history"
    sample = od[0]
    assert (sample.gpu_type, sample.gpus, sample.vcpus, sample.memory_gib) == ("T4", 1, 4, 16.0)


def test_subnet_mapping_limits_zones_and_accepts_names_or_ids(
    moto: MotoServer, clock: FakeClock
) -> None:
    ec2 = admin_client(moto.url, "ec2")
    zones = {
        z["ZoneName"]: z["ZoneId"] for z in ec2.describe_availability_zones()["AvailabilityZones"]
    }
    subnets = {
        s["AvailabilityZone"]: s["SubnetId"]
        for s in ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])[
            "Subnets"
        ]
    }
    mapping = {"us-east-1a": subnets["us-east-1a"], zones["us-east-1b"]: subnets["us-east-1b"]}
    p = make_provider(moto.url, clock=clock, subnets_by_zone=mapping)
    assert {o.zone for o in p.offerings()} == {zones["us-east-1a"], zones["us-east-1b"]}
    assert p.zone_id_for(subnet_id=subnets["us-east-1b"]) == zones["us-east-1b"]
    bad = make_provider(moto.url, clock=clock, subnets_by_zone={"mars-1a": "subnet-1"})
    with pytest.raises(InvalidRequestError):
        bad.offerings()


def test_unreachable_endpoint_is_transient_after_retries(clock: FakeClock) -> None:
    """A real closed port: connection refused is retried on the clock, then TransientError."""
    p = AwsProvider(
        AwsConfig(region="us-east-1", image_id="ami-12345678"),
        clock=clock,
        session=boto_session(),
        endpoint_url="http://127.0.0.1:9",
        retry_policy=RetryPolicy(max_attempts=3, base_delay_s=1.0),
    )
    with pytest.raises(TransientError):
        p.offerings()
    assert len(clock.sleeps) == 2


# =================================================================== moto: launch/list


@pytest.mark.parametrize("launch_api", [LaunchApi.CREATE_FLEET, LaunchApi.RUN_INSTANCES])
def test_launch_tags_instances_and_volumes(
    moto: MotoServer, clock: FakeClock, cluster_id: str, launch_api: LaunchApi
) -> None:
    p = make_provider(moto.url, clock=clock, launch_api=launch_api)
    CapacityModel(p)  # moto's RunInstances launches MinCount; EC2 launches MaxCount
    result = p.launch(
        _request(cluster_id, _pools(p, 2), 2, tags={"team": "ml"}, user_data="#!/bin/sh\necho hi")
    )
    assert result.fulfilled and result.errors == ()
    ec2 = admin_client(moto.url, "ec2")
    ids = [i.instance_id for i in result.instances]
    described = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    for raw in (i for r in described for i in r["Instances"]):
        tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
        assert tags[CLUSTER_ID_TAG] == cluster_id
        assert tags[REQUEST_ID_TAG] == result.request_id
        assert tags[MANAGED_BY_TAG] == MANAGED_BY_VALUE
        assert tags["team"] == "ml"
        assert raw.get("InstanceLifecycle") == "spot"
    if launch_api is LaunchApi.RUN_INSTANCES:
        volumes = ec2.describe_volumes(
            Filters=[{"Name": f"tag:{REQUEST_ID_TAG}", "Values": [result.request_id]}]
        )["Volumes"]
        assert len(volumes) == 2, "RunInstances tags the volumes with the request's tags"
    else:
        (template,) = ec2.describe_launch_templates(
            Filters=[{"Name": f"tag:{CLUSTER_ID_TAG}", "Values": [cluster_id]}]
        )["LaunchTemplates"]
        assert template["LaunchTemplateName"].startswith(f"coadapt-{cluster_id}-")
        data = ec2.describe_launch_template_versions(LaunchTemplateId=template["LaunchTemplateId"])[
            "LaunchTemplateVersions"
        ][0]["LaunchTemplateData"]
        volume_tags = {
            t["Key"]: t["Value"]
            for spec in data["TagSpecifications"]
            if spec["ResourceType"] == "volume"
            for t in spec["Tags"]
        }
        assert volume_tags == {CLUSTER_ID_TAG: cluster_id, MANAGED_BY_TAG: MANAGED_BY_VALUE}
    # A second launch with the same user data reuses the managed template (no template calls).
    counter = ApiCallCounter(p)
    p.launch(_request(cluster_id, _pools(p, 1), 1, user_data="#!/bin/sh\necho hi"))
    ops = counter.by_operation()
    assert "CreateLaunchTemplate" not in ops and "DescribeLaunchTemplates" not in ops


def test_list_never_returns_untagged_or_foreign(
    moto: MotoServer, provider: AwsProvider, cluster_id: str
) -> None:
    ec2 = admin_client(moto.url, "ec2")
    image = provider.config.image_id

    def run(tags: dict[str, str]) -> str:
        spec = [
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ]
        kw: dict[str, Any] = {"TagSpecifications": spec} if tags else {}
        return ec2.run_instances(
            ImageId=image, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1, **kw
        )["Instances"][0]["InstanceId"]

    foreign = [
        run({}),
        run({CLUSTER_ID_TAG: cluster_id}),  # no managed-by tag
        run({CLUSTER_ID_TAG: "someone-else", MANAGED_BY_TAG: MANAGED_BY_VALUE}),
        run({CLUSTER_ID_TAG: cluster_id, MANAGED_BY_TAG: "not-coadapt"}),
    ]
    ours = provider.launch(_request(cluster_id, _pools(provider, 1), 1)).instances[0]
    listed = provider.list_instances(cluster_id)
    assert [i.instance_id for i in listed] == [ours.instance_id]
    assert listed[0].offering_key == ours.offering_key and listed[0].private_ip
    result = provider.terminate(cluster_id, foreign, "term-foreign")
    assert result.refused == tuple(foreign)
    ec2.terminate_instances(InstanceIds=[*foreign, ours.instance_id])


def test_reality_exceeding_intent_creates_nothing(
    provider: AwsProvider, cluster_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    pools = _pools(provider, 1)
    first = provider.launch(_request(cluster_id, pools, 3, request_id="req-leak"))
    counter = ApiCallCounter(provider)
    with caplog.at_level(logging.WARNING, logger="providers.aws.provider"):
        again = provider.launch(_request(cluster_id, pools, 2, request_id="req-leak"))
    assert {i.instance_id for i in again.instances} == {i.instance_id for i in first.instances}
    assert counter.by_operation() == {"DescribeInstances": 1}, "only the lookup, no launch"
    assert "likely a leak" in caplog.text
    provider.terminate(cluster_id, [i.instance_id for i in first.instances], "cleanup")


def test_skipped_pool_makes_no_call_and_reports_capacity(
    provider: AwsProvider, cluster_id: str, clock: FakeClock
) -> None:
    (a,) = _pools(provider, 1)
    provider.unavailable.mark(a.key)
    counter = ApiCallCounter(provider)
    result = provider.launch(_request(cluster_id, [a], 1))
    assert result.instances == ()
    assert isinstance(result.errors[0].error, InsufficientCapacityError)
    assert counter.by_operation() == {"DescribeInstances": 1}
    clock.advance(181)  # the mark expires: the pool is tried again
    assert provider.launch(_request(cluster_id, [a], 1)).fulfilled


def test_run_instances_falls_through_dry_pools(
    moto: MotoServer, clock: FakeClock, cluster_id: str
) -> None:
    p = make_provider(moto.url, clock=clock, launch_api=LaunchApi.RUN_INSTANCES)
    capacity = CapacityModel(p)
    a, b, c = _pools(p, 3)
    capacity.exhaust(a.key)
    capacity.exhaust(b.key)
    result = p.launch(_request(cluster_id, [a, b, c], 2))
    assert result.fulfilled and {i.offering_key for i in result.instances} == {c.key}
    assert {e.offering_key for e in result.errors} == {a.key, b.key}
    assert all(isinstance(e.error, InsufficientCapacityError) for e in result.errors)
    assert p.unavailable.unavailable() == {a.key, b.key}


def test_terminate_batches_describe_and_terminate(
    moto: MotoServer, clock: FakeClock, cluster_id: str
) -> None:
    p = make_provider(moto.url, clock=clock, describe_batch_size=2, terminate_batch_size=2)
    ids = [i.instance_id for i in p.launch(_request(cluster_id, _pools(p, 1), 5)).instances]
    counter = ApiCallCounter(p)
    result = p.terminate(cluster_id, ids, "term-1")
    assert sorted(result.terminated) == sorted(ids)
    assert counter.by_operation() == {"DescribeInstances": 3, "TerminateInstances": 3}
    assert counter()["terminate"] == 6
    again = p.terminate(cluster_id, [*ids, "not-an-id", "i-0000000000000000f"], "term-2")
    assert again.terminated == ()
    assert again.already_gone == (*ids, "not-an-id", "i-0000000000000000f")


def test_invalid_terminate_input(provider: AwsProvider) -> None:
    with pytest.raises(InvalidRequestError):
        provider.terminate("Bad Cluster", ["i-0123456789abcdef0"], "r")
    with pytest.raises(InvalidRequestError):
        provider.terminate("c1", "i-0123456789abcdef0", "r")  # type: ignore[arg-type]


def test_fleet_with_user_template_refuses_user_data_before_any_call(
    stub_provider: AwsProvider, cluster_id: str
) -> None:
    counter = ApiCallCounter(stub_provider)
    with pytest.raises(InvalidRequestError):
        stub_provider.launch(_request(cluster_id, _pools(stub_provider, 1), 1, user_data="x"))
    assert counter.total() == 0


# ========================================================================= Stubber: launch


def test_partial_fleet_maps_each_pool_error(
    stub_provider: AwsProvider, cluster_id: str, fleet_template: str
) -> None:
    """Stubber: EC2 fills part of an instant fleet and reports per-pool errors (moto never does).

    Pool A: no capacity; pool B: 2 instances; pool C: a vCPU quota error.
    """
    p = stub_provider
    a, b, c = _pools(p, 3)
    with Stubber(p.ec2) as stub:
        _empty_lookup(stub)
        stub.add_response(
            "create_fleet",
            {
                "FleetId": "fleet-11111111-2222-3333-4444-555555555555",
                "Instances": [
                    _fleet_group(
                        p, b, ["i-0000000000000000b", "i-000000000000000bb"], fleet_template
                    )
                ],
                "Errors": [
                    _fleet_error(p, a, "InsufficientInstanceCapacity", fleet_template),
                    _fleet_error(p, c, "VcpuLimitExceeded", fleet_template),
                ],
            },
        )
        result = p.launch(_request(cluster_id, [a, b, c], 3, tags={"team": "ml"}))
        stub.assert_no_pending_responses()
    assert [i.instance_id for i in result.instances] == [
        "i-0000000000000000b",
        "i-000000000000000bb",
    ]
    assert {i.offering_key for i in result.instances} == {b.key}
    assert all(i.market is Market.SPOT and i.tags["team"] == "ml" for i in result.instances)
    assert not result.fulfilled
    errors = {e.offering_key: e.error for e in result.errors}
    assert [e.offering_key for e in result.errors] == [a.key, c.key], "in request order"
    assert isinstance(errors[a.key], InsufficientCapacityError)
    assert isinstance(errors[c.key], QuotaExceededError)
    assert p.unavailable.unavailable() == {a.key}, "only the capacity error marks a pool"


def test_fleet_request_shape(
    stub_provider: AwsProvider, cluster_id: str, fleet_template: str
) -> None:
    """Stubber: the CreateFleet request itself (strategy, capacity, tags, overrides, token)."""
    p = stub_provider
    a, b = _pools(p, 2)
    seen = _capture(p, "CreateFleet")
    with Stubber(p.ec2) as stub:
        _empty_lookup(stub)
        stub.add_response(
            "create_fleet",
            {"Instances": [_fleet_group(p, a, ["i-0000000000000000a"], fleet_template)]},
        )
        p.launch(_request(cluster_id, [a, b], 1, request_id="req-shape"))
    (params,) = seen
    assert params["Type"] == "instant"
    assert params["SpotOptions"]["AllocationStrategy"] == "price-capacity-optimized"
    assert params["TargetCapacitySpecification"] == {
        "TotalTargetCapacity": 1,
        "SpotTargetCapacity": 1,
        "DefaultTargetCapacityType": "spot",
    }
    overrides = params["LaunchTemplateConfigs"][0]["Overrides"]
    assert [(o["InstanceType"], o["SubnetId"]) for o in overrides] == [
        (a.instance_type, _subnet(p, a)),
        (b.instance_type, _subnet(p, b)),
    ]
    tag_specs = {
        s["ResourceType"]: {t["Key"]: t["Value"] for t in s["Tags"]}
        for s in params["TagSpecifications"]
    }
    assert tag_specs["instance"][REQUEST_ID_TAG] == "req-shape"
    assert tag_specs["fleet"][CLUSTER_ID_TAG] == cluster_id
    assert len(params["ClientToken"]) <= 64


def test_on_demand_fleet_uses_lowest_price(
    stub_provider: AwsProvider, cluster_id: str, fleet_template: str
) -> None:
    """Stubber: on-demand requests ask EC2 Fleet for the lowest-price strategy."""
    p = stub_provider
    a, b = _pools(p, 2, Market.ON_DEMAND)
    seen = _capture(p, "CreateFleet")
    with Stubber(p.ec2) as stub:
        _empty_lookup(stub)
        stub.add_response(
            "create_fleet",
            {"Instances": [_fleet_group(p, b, ["i-0000000000000000d"], fleet_template)]},
        )
        result = p.launch(_request(cluster_id, [a, b], 1))
    assert seen[0]["OnDemandOptions"] == {"AllocationStrategy": "lowest-price"}
    assert seen[0]["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "on-demand"
    first = result.instances[0]
    assert first.market is Market.ON_DEMAND and first.offering_key == b.key


def test_whole_fleet_capacity_error_marks_every_pool(
    stub_provider: AwsProvider, cluster_id: str
) -> None:
    """Stubber: EC2 answers the whole call with InsufficientInstanceCapacity (HTTP 500)."""
    p = stub_provider
    a, b = _pools(p, 2)
    with Stubber(p.ec2) as stub:
        _empty_lookup(stub)
        stub.add_client_error("create_fleet", "InsufficientInstanceCapacity", "none", 500)
        result = p.launch(_request(cluster_id, [a, b], 2))
    assert [e.offering_key for e in result.errors] == [a.key, b.key]
    assert all(isinstance(e.error, InsufficientCapacityError) for e in result.errors)
    assert p.unavailable.unavailable() == {a.key, b.key}
    assert p.clock.sleeps == [], "capacity errors are never retried in place"  # type: ignore[attr-defined]


def test_transient_errors_are_retried_with_the_same_token(
    stub_provider: AwsProvider, cluster_id: str, clock: FakeClock, fleet_template: str
) -> None:
    """Stubber: throttling then a 5xx, then success; backoff sleeps on the injected clock."""
    p = stub_provider
    (a,) = _pools(p, 1)
    seen = _capture(p, "CreateFleet")
    with Stubber(p.ec2) as stub:
        _empty_lookup(stub)
        stub.add_client_error("create_fleet", "RequestLimitExceeded", "slow down", 503)
        stub.add_client_error("create_fleet", "SomethingBroke", "oops", 502)
        stub.add_response(
            "create_fleet",
            {"Instances": [_fleet_group(p, a, ["i-0000000000000000a"], fleet_template)]},
        )
        result = p.launch(_request(cluster_id, [a], 1))
    assert result.fulfilled
    assert len(clock.sleeps) == 2 and all(0 <= s <= 1.0 for s in clock.sleeps)
    assert len({s["ClientToken"] for s in seen}) == 1, "a retry repeats the ClientToken"


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("UnauthorizedOperation", 403, AuthError),
        ("InvalidParameterValue", 400, InvalidRequestError),
        ("RequestLimitExceeded", 503, TransientError),  # after max_attempts
    ],
)
def test_fatal_fleet_errors_raise(
    stub_provider: AwsProvider,
    cluster_id: str,
    clock: FakeClock,
    code: str,
    status: int,
    expected: type,
) -> None:
    """Stubber: auth/invalid errors raise at once; transient ones after the retry budget."""
    p = stub_provider
    (a,) = _pools(p, 1)
    with Stubber(p.ec2) as stub:
        _empty_lookup(stub)
        for _ in range(4 if expected is TransientError else 1):
            stub.add_client_error("create_fleet", code, "no", status)
        with pytest.raises(expected):
            p.launch(_request(cluster_id, [a], 1))
    assert len(clock.sleeps) == (3 if expected is TransientError else 0)


def test_client_token_replay_after_a_crash_launches_once(
    moto: MotoServer, clock: FakeClock, cluster_id: str, fleet_template: str
) -> None:
    """Stubber: EC2's ClientToken idempotency, which moto lacks.

    A controller launches, crashes before recording the outcome, restarts (a new provider)
    and retries the same request while DescribeInstances does not show the new instances yet
    (eventual consistency). The retry must carry the same ClientToken, so EC2 answers with the
    original instances instead of launching more; this test plays EC2's part.
    """

    def fresh() -> AwsProvider:
        p = make_provider(
            moto.url, clock=clock, launch_template=LaunchTemplateRef(template_id=fleet_template)
        )
        p.offerings()
        return p

    first, restarted = fresh(), fresh()
    a, b = _pools(first, 2)
    request = _request(cluster_id, [a, b], 2, request_id="req-crash")
    answer = {
        "Instances": [
            _fleet_group(first, a, ["i-0000000000000000a", "i-000000000000000aa"], fleet_template)
        ]
    }
    tokens = _capture(first, "CreateFleet")
    with Stubber(first.ec2) as stub:
        _empty_lookup(stub)
        stub.add_response("create_fleet", answer)
        launched = first.launch(request)
    (token,) = [t["ClientToken"] for t in tokens]
    assert len(token) <= 64
    with Stubber(restarted.ec2) as stub:
        _empty_lookup(stub)  # the instances are not visible yet
        stub.add_response("create_fleet", answer, {**_any_fleet_params(), "ClientToken": token})
        replayed = restarted.launch(request)
    assert [i.instance_id for i in replayed.instances] == [
        i.instance_id for i in launched.instances
    ]
    # Another request id, or the same one after a partial fill, is a different token.
    other = first._token(replace(request, request_id="req-other"), [a.key, b.key], 0, 2, 0)
    partial = first._token(request, [a.key, b.key], 1, 1, 0)
    assert len({token, other, partial}) == 3
    assert token == client_token(cluster_id, "req-crash", f"{a.key},{b.key}", "0", "2", "0")


def _any_fleet_params() -> dict[str, Any]:
    keys = (
        "Type",
        "LaunchTemplateConfigs",
        "TagSpecifications",
        "TargetCapacitySpecification",
        "SpotOptions",
    )
    return {k: ANY for k in keys}


def test_token_changes_after_a_failed_attempt(
    stub_provider: AwsProvider, cluster_id: str, clock: FakeClock, fleet_template: str
) -> None:
    """Stubber: once a launch reported pool errors, the next try is a new EC2 request.

    EC2 would answer a repeated token with the old (failed) fleet result; after the capacity
    mark expires the retry must get a fresh token to reach EC2 again.
    """
    p = stub_provider
    (a,) = _pools(p, 1)
    seen = _capture(p, "CreateFleet")
    request = _request(cluster_id, [a], 1, request_id="req-gen")
    with Stubber(p.ec2) as stub:
        _empty_lookup(stub)
        stub.add_response(
            "create_fleet",
            {
                "Instances": [],
                "Errors": [_fleet_error(p, a, "InsufficientInstanceCapacity", fleet_template)],
            },
        )
        assert not p.launch(request).fulfilled
        clock.advance(181)
        _empty_lookup(stub)
        stub.add_response(
            "create_fleet",
            {"Instances": [_fleet_group(p, a, ["i-0000000000000000a"], fleet_template)]},
        )
        assert p.launch(request).fulfilled
    assert seen[0]["ClientToken"] != seen[1]["ClientToken"]


# ====================================================================== Stubber: others


def test_spot_prices_paginate_and_map_zone_names(stub_provider: AwsProvider) -> None:
    """Stubber: real-looking prices over two pages (moto's are all 0.00001 from 2006).

    Zone names are mapped to zone ids; the latest price per (type, zone) wins; types and zones
    outside the catalogue are dropped.
    """
    p = stub_provider
    zones = p._zone_map()
    names = sorted(zones.id_by_name)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    t1 = datetime(2026, 1, 1, 1, tzinfo=UTC)

    def price(itype: str, zone: str, value: str, ts: datetime, **kw: str) -> dict[str, Any]:
        return {
            "InstanceType": itype,
            "AvailabilityZone": zone,
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": value,
            "Timestamp": ts,
            **kw,
        }

    with Stubber(p.ec2) as stub:
        stub.add_response(
            "describe_spot_price_history",
            {
                "SpotPriceHistory": [
                    price("g4dn.xlarge", names[0], "0.2104", t0),
                    price("g4dn.xlarge", names[0], "0.1893", t1),  # newer: wins
                    price("p3.2xlarge", names[0], "0.9180", t1),  # not in the catalogue
                ],
                "NextToken": "page-2",
            },
            {
                "InstanceTypes": ANY,
                "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                "StartTime": datetime.fromtimestamp(p.clock.now_s(), tz=UTC),
                "MaxResults": 1000,
            },
        )
        stub.add_response(
            "describe_spot_price_history",
            {
                "SpotPriceHistory": [
                    price("g4dn.xlarge", names[1], "0.2250", t0),
                    price(
                        "g5.xlarge", "", "0.4100", t0, AvailabilityZoneId=zones.id_by_name[names[1]]
                    ),
                    price("g5.xlarge", "mars-1a", "0.4100", t0),  # unknown zone
                ]
            },
            {
                "InstanceTypes": ANY,
                "ProductDescriptions": ANY,
                "StartTime": ANY,
                "MaxResults": 1000,
                "NextToken": "page-2",
            },
        )
        prices = {(s.instance_type, s.zone): s for s in p.spot_prices()}
    assert set(prices) == {
        ("g4dn.xlarge", zones.id_by_name[names[0]]),
        ("g4dn.xlarge", zones.id_by_name[names[1]]),
        ("g5.xlarge", zones.id_by_name[names[1]]),
    }
    first = prices[("g4dn.xlarge", zones.id_by_name[names[0]])]
    assert first.price_usd_per_hour == 0.1893 and first.timestamp_s == t1.timestamp()


def test_list_instances_follows_pages(stub_provider: AwsProvider, cluster_id: str) -> None:
    """Stubber: DescribeInstances over two pages (moto ignores MaxResults and answers one)."""
    p = stub_provider
    (a,) = _pools(p, 1)
    zone_name = p._zone_map().name_by_id[a.zone]

    def raw(iid: str) -> dict[str, Any]:
        return {
            "InstanceId": iid,
            "InstanceType": a.instance_type,
            "Placement": {"AvailabilityZone": zone_name},
            "State": {"Code": 16, "Name": "running"},
            "InstanceLifecycle": "spot",
            "LaunchTime": datetime(2026, 1, 1, tzinfo=UTC),
            "Tags": [
                {"Key": CLUSTER_ID_TAG, "Value": cluster_id},
                {"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE},
                {"Key": REQUEST_ID_TAG, "Value": "req-1"},
            ],
        }

    with Stubber(p.ec2) as stub:
        stub.add_response(
            "describe_instances",
            {"Reservations": [{"Instances": [raw("i-0000000000000000a")]}], "NextToken": "n2"},
            {"Filters": ANY, "MaxResults": 1000},
        )
        stub.add_response(
            "describe_instances",
            {"Reservations": [{"Instances": [raw("i-0000000000000000b")]}]},
            {"Filters": ANY, "MaxResults": 1000, "NextToken": "n2"},
        )
        listed = p.list_instances(cluster_id)
    assert [i.instance_id for i in listed] == ["i-0000000000000000a", "i-0000000000000000b"]
    assert all(i.offering_key == a.key and i.request_id == "req-1" for i in listed)


def _owned_running(p: AwsProvider, cluster_id: str, ids: list[str]) -> dict[str, Any]:
    return {
        "Reservations": [
            {
                "Instances": [
                    {
                        "InstanceId": iid,
                        "State": {"Code": 16, "Name": "running"},
                        "Tags": [
                            {"Key": CLUSTER_ID_TAG, "Value": cluster_id},
                            {"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE},
                        ],
                    }
                    for iid in ids
                ]
            }
        ]
    }


def test_terminate_narrows_not_found_by_the_named_ids(
    stub_provider: AwsProvider, cluster_id: str
) -> None:
    """Stubber: an instance vanishes between the ownership check and TerminateInstances."""
    p = stub_provider
    a, b, c = "i-0000000000000000a", "i-0000000000000000b", "i-0000000000000000c"
    with Stubber(p.ec2) as stub:
        stub.add_response("describe_instances", _owned_running(p, cluster_id, [a, b, c]))
        stub.add_client_error(
            "terminate_instances",
            "InvalidInstanceID.NotFound",
            f"The instance ID '{b}' does not exist",
            400,
            expected_params={"InstanceIds": [a, b, c]},
        )
        stub.add_response(
            "terminate_instances", {"TerminatingInstances": []}, {"InstanceIds": [a, c]}
        )
        result = p.terminate(cluster_id, [a, b, c], "term-nf")
        stub.assert_no_pending_responses()
    assert result.terminated == (a, c)
    assert result.already_gone == (b,)


def test_terminate_bisects_when_the_message_names_no_id(
    stub_provider: AwsProvider, cluster_id: str
) -> None:
    """Stubber: a NotFound error whose message names no id is narrowed by bisection."""
    p = stub_provider
    a, b = "i-0000000000000000a", "i-0000000000000000b"
    with Stubber(p.ec2) as stub:
        stub.add_response("describe_instances", _owned_running(p, cluster_id, [a, b]))
        stub.add_client_error("terminate_instances", "InvalidInstanceID.NotFound", "gone", 400)
        stub.add_client_error(
            "terminate_instances",
            "InvalidInstanceID.NotFound",
            "gone",
            400,
            expected_params={"InstanceIds": [b]},
        )
        stub.add_response("terminate_instances", {}, {"InstanceIds": [a]})
        result = p.terminate(cluster_id, [a, b], "term-bisect")
        stub.assert_no_pending_responses()
    assert result.terminated == (a,) and result.already_gone == (b,)


# ================================================================ EventBridge -> SQS (moto)


@pytest.fixture
def queue(moto: MotoServer) -> Iterator[str]:
    queue_url, rule = create_interruption_queue(moto.url)
    yield queue_url
    delete_interruption_queue(moto.url, queue_url, rule)


def test_eventbridge_to_sqs_interruptions(
    moto: MotoServer, clock: FakeClock, cluster_id: str, queue: str
) -> None:
    """moto: EC2 events published through EventBridge reach the SQS queue and are drained.

    Owned instances' spot warning, rebalance and shutting-down state change come back as
    notices; a state change to running, a foreign instance's warning and an unreadable message
    are dropped; everything is deleted from the queue.
    """
    p = make_provider(moto.url, clock=clock, interruption_queue_url=queue)
    assert p.interruptions(cluster_id) == []
    ours = p.launch(_request(cluster_id, _pools(p, 1), 1)).instances[0].instance_id
    ec2 = admin_client(moto.url, "ec2")
    foreign = ec2.run_instances(
        ImageId=p.config.image_id, InstanceType="g4dn.xlarge", MinCount=1, MaxCount=1
    )["Instances"][0]["InstanceId"]
    t = clock.now_s()
    send_ec2_event(
        moto.url,
        "EC2 Spot Instance Interruption Warning",
        {"instance-id": ours, "instance-action": "terminate"},
        at_s=t,
    )
    send_ec2_event(
        moto.url,
        "EC2 Spot Instance Interruption Warning",
        {"instance-id": ours, "instance-action": "terminate"},
        at_s=t,
    )
    send_ec2_event(moto.url, "EC2 Instance Rebalance Recommendation", {"instance-id": ours}, at_s=t)
    send_ec2_event(
        moto.url,
        "EC2 Instance State-change Notification",
        {"instance-id": ours, "state": "running"},
        at_s=t,
    )
    send_ec2_event(
        moto.url,
        "EC2 Instance State-change Notification",
        {"instance-id": ours, "state": "shutting-down"},
        at_s=t + 100,
    )
    send_ec2_event(
        moto.url,
        "EC2 Spot Instance Interruption Warning",
        {"instance-id": foreign, "instance-action": "terminate"},
        at_s=t,
    )
    sqs = admin_client(moto.url, "sqs")
    sqs.send_message(QueueUrl=queue, MessageBody="not an event")
    clock.advance(3)
    notices = p.interruptions(cluster_id)
    assert sorted((n.kind.value, n.deadline_s) for n in notices) == sorted(
        [
            (InterruptionKind.SPOT_INTERRUPTION.value, t + 120),
            (InterruptionKind.REBALANCE.value, None),
            (InterruptionKind.TERMINATED.value, t + 100),
        ]
    )
    assert all(n.instance_id == ours and n.source == "eventbridge" for n in notices)
    assert all(n.noticed_at_s == t + 3 for n in notices)
    attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "0", "every message was deleted"
    assert p.interruptions(cluster_id) == []
    ec2.terminate_instances(InstanceIds=[ours, foreign])


def test_shared_queue_leaves_foreign_events(
    moto: MotoServer, clock: FakeClock, cluster_id: str, queue: str
) -> None:
    """moto: with ``delete_foreign_events=False`` another cluster's events stay queued."""
    p = make_provider(
        moto.url, clock=clock, interruption_queue_url=queue, delete_foreign_events=False
    )
    send_ec2_event(
        moto.url,
        "EC2 Spot Instance Interruption Warning",
        {"instance-id": "i-0fedcba9876543210", "instance-action": "terminate"},
        at_s=clock.now_s(),
    )
    assert p.interruptions(cluster_id) == []
    sqs = admin_client(moto.url, "sqs")
    attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert int(attrs["ApproximateNumberOfMessagesNotVisible"]) == 1


def test_no_queue_means_no_interruptions(provider: AwsProvider, cluster_id: str) -> None:
    counter = ApiCallCounter(provider)
    assert provider.interruptions(cluster_id) == []
    assert counter.total() == 0
    with pytest.raises(InvalidRequestError):
        provider.interruptions("Not Valid")
