"""Helpers to run ``AwsProvider`` against a local moto server (tests and benchmarks only).

Everything here talks to a real moto **server** (a child process) over HTTP on 127.0.0.1 with
real boto3 clients and dummy credentials; nothing patches coadapt code. What moto does not
model is added on the provider's *real* botocore client through botocore's event hooks, and
each place says so:

* ``ApiCallCounter`` counts real API calls (``before-call`` hook), attributed to the provider
  method that made them (``AwsProvider.current_operation``).
* ``OPERATIONS_SEEN`` records every API operation any provider built by ``make_provider``
  makes (``(service, OperationName)``), so the tests can hold the adapter to the calls its IAM
  policy grants (``providers.aws.permissions``).
* ``CapacityModel`` makes chosen pools answer like EC2 does when it has no capacity (moto
  never does), and makes ``RunInstances`` launch ``MaxCount`` as EC2 does (moto launches
  ``MinCount``): ``CreateFleet`` requests lose those pools' overrides before they are sent, and
  the response gets EC2-shaped ``Errors`` entries (``InsufficientInstanceCapacity``) for them;
  a request with only dry pools is answered locally with an instant-fleet response holding
  only ``Errors``; ``RunInstances`` into a dry pool is answered with EC2's HTTP 500
  ``InsufficientInstanceCapacity`` error. It also records every launch attempt per pool.
* ``create_interruption_queue`` wires an EventBridge rule to an SQS queue in moto, as the
  terraform module does in an account; ``send_ec2_event`` publishes an ``aws.ec2`` event
  through EventBridge (real EventBridge refuses ``aws.*`` sources from ``PutEvents``; moto
  accepts them, which is what lets tests produce EC2's events).

moto limits worth knowing (``/work/shared/ENVIRONMENT.md``): no ``ClientToken`` idempotency,
no capacity errors, spot prices all 0.00001 dated 2006, instant fleets use only the first
override, ``MaxResults`` is ignored (one page), no interruption notices.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from coadapt_common.clock import Clock, SystemClock
from providers.aws.config import AwsConfig
from providers.aws.events import INTERRUPTION_DETAIL_TYPES, SPOT_WARNING_DETAIL_TYPE
from providers.aws.provider import AwsProvider
from providers.base import Market, Offering, offering_key
from providers.retry import RetryPolicy

DEFAULT_REGION = "us-east-1"
DUMMY_ACCESS_KEY_ID = "testing"
DUMMY_SECRET_ACCESS_KEY = "testing"
# A small catalogue keeps tests quick: two 1-GPU types and one 4-GPU type.
TEST_GPU_TYPES = ("g4dn.xlarge", "g4dn.12xlarge", "g5.xlarge")

# Which counter bucket a provider method's calls go to.
METHOD_BUCKETS = {"launch": "launch", "list": "list", "terminate": "terminate"}


# ------------------------------------------------------------------------------ server


_SERVER_SCRIPT = """
import logging, sys
logging.getLogger("werkzeug").setLevel(logging.WARNING)
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # serve until the parent closes our stdin (or dies)
server.stop()
"""


@dataclass
class MotoServer:
    """A running moto server: ``url`` is ``http://127.0.0.1:<port>``."""

    url: str
    _process: subprocess.Popen[str] = field(repr=False)

    def stop(self) -> None:
        """Stop the server process (idempotent)."""
        if self._process.poll() is None:
            if self._process.stdin is not None:
                self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        if self._process.stdout is not None:
            self._process.stdout.close()


def start_moto_server(*, timeout_s: float = 60.0) -> MotoServer:
    """Start a moto server in a child process on a free port of 127.0.0.1 (ready in ~1 s).

    A separate process (not a thread of this one) so that the server's work does not compete
    with the client's for this interpreter's lock. It binds port 0 and reports the port it got;
    it exits when ``stop`` closes its stdin, or when this process dies.
    """
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVER_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    stdout = process.stdout
    if stdout is None:  # cannot happen with stdout=PIPE; keeps the type checker honest
        raise RuntimeError("moto server has no stdout pipe")
    ready: list[str] = []
    reader = threading.Thread(target=lambda: ready.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    line = ready[0].strip() if ready else ""
    if not line.isdigit():
        process.kill()
        process.wait(timeout=10)
        raise RuntimeError(f"moto server did not start (exit code {process.returncode})")
    return MotoServer(url=f"http://127.0.0.1:{int(line)}", _process=process)


_shared_lock = threading.Lock()
_shared: MotoServer | None = None


def shared_moto_server() -> MotoServer:
    """One moto server per process, started on first use (tests share it across modules).

    Tests sharing it must stay inside their own cluster ids and read counters as differences.
    It stops when this process exits.
    """
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = start_moto_server()
            atexit.register(_shared.stop)
        return _shared


_sessions: dict[str, Any] = {}
_clients: dict[tuple[str, str, str], Any] = {}
_networks: dict[tuple[str, str], tuple[str, dict[str, str]]] = {}


def boto_session(region: str = DEFAULT_REGION) -> Any:
    """A boto3 session with dummy credentials (never reads the environment's), one per region.

    Shared because a fresh session re-reads botocore's service models (~0.5-1 s for EC2).
    """
    import boto3

    with _shared_lock:
        session = _sessions.get(region)
        if session is None:
            session = boto3.session.Session(
                aws_access_key_id=DUMMY_ACCESS_KEY_ID,
                aws_secret_access_key=DUMMY_SECRET_ACCESS_KEY,
                region_name=region,
            )
            _sessions[region] = session
        return session


def admin_client(url: str, service: str, region: str = DEFAULT_REGION) -> Any:
    """A plain client for test set-up and checks (not the provider's: its calls are not counted)."""
    key = (url, service, region)
    client = _clients.get(key)
    if client is None:
        client = boto_session(region).client(service, endpoint_url=url, region_name=region)
        with _shared_lock:
            _clients[key] = client
    return client


TEST_IMAGE_NAME = "coadapt-test-gpu-ami"


def default_network(url: str, region: str = DEFAULT_REGION) -> tuple[str, dict[str, str]]:
    """(a test AMI id, the default subnet per zone name) in ``region`` of the moto server.

    The AMI is registered once per server (``TEST_IMAGE_NAME``, owned by the account):
    listing moto's thousands of built-in public images takes seconds, one of our own does not.
    """
    cached = _networks.get((url, region))
    if cached is not None:
        return cached[0], dict(cached[1])
    ec2 = admin_client(url, "ec2", region)
    images = ec2.describe_images(
        Owners=["self"], Filters=[{"Name": "name", "Values": [TEST_IMAGE_NAME]}]
    )["Images"]
    if images:
        image_id = sorted(i["ImageId"] for i in images)[0]
    else:
        image_id = ec2.register_image(
            Name=TEST_IMAGE_NAME,
            Architecture="x86_64",
            RootDeviceName="/dev/xvda",
            VirtualizationType="hvm",
            BlockDeviceMappings=[{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 100}}],
        )["ImageId"]
    subnets = {
        s["AvailabilityZone"]: s["SubnetId"]
        for s in ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])[
            "Subnets"
        ]
    }
    _networks[(url, region)] = (image_id, dict(subnets))
    return image_id, subnets


class OperationLog:
    """The ``(service, OperationName)`` pairs providers' clients called (``before-call``).

    Thread-safe; ``watch(provider)`` hooks every client of a provider (first in line, so a
    hook answering locally, like a Stubber or ``CapacityModel``, still counts).
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def watch(self, provider: AwsProvider) -> AwsProvider:
        for client in provider.clients():
            service = client.meta.service_model.service_name

            def on_call(model: Any = None, _service: str = service, **_: Any) -> None:
                with self._lock:
                    self._seen.add((_service, getattr(model, "name", "unknown")))

            client.meta.events.register_first("before-call", on_call)
        return provider

    def seen(self) -> frozenset[tuple[str, str]]:
        with self._lock:
            return frozenset(self._seen)

    def take(self) -> frozenset[tuple[str, str]]:
        """What was seen since the last ``take``, forgotten."""
        with self._lock:
            seen, self._seen = frozenset(self._seen), set()
            return seen


OPERATIONS_SEEN = OperationLog()


def make_provider(
    url: str,
    *,
    region: str = DEFAULT_REGION,
    clock: Clock | None = None,
    retry_policy: RetryPolicy | None = None,
    **config_overrides: Any,
) -> AwsProvider:
    """An ``AwsProvider`` on the moto server at ``url``, with dummy credentials.

    Defaults: a registered test AMI, moto's default subnet in every zone, GPU types
    ``TEST_GPU_TYPES``. Any ``AwsConfig`` field can be overridden.
    """
    if "image_id" not in config_overrides and "launch_template" not in config_overrides:
        image_id, subnets = default_network(url, region)
        config_overrides.setdefault("image_id", image_id)
        config_overrides.setdefault("subnets_by_zone", subnets)
    elif "subnets_by_zone" not in config_overrides:
        config_overrides["subnets_by_zone"] = default_network(url, region)[1]
    config_overrides.setdefault("instance_types", TEST_GPU_TYPES)
    config = AwsConfig(region=region, **config_overrides)
    provider = AwsProvider(
        config,
        clock=clock or SystemClock(),
        session=boto_session(region),
        endpoint_url=url,
        retry_policy=retry_policy,
    )
    return OPERATIONS_SEEN.watch(provider)


# ---------------------------------------------------------------------- interruptions


def create_interruption_queue(
    url: str, *, name: str | None = None, region: str = DEFAULT_REGION
) -> tuple[str, str]:
    """Create an SQS queue and an EventBridge rule sending EC2 interruption events to it.

    Returns ``(queue_url, rule_name)``; ``delete_interruption_queue`` removes both.
    """
    name = name or f"coadapt-interruptions-{uuid.uuid4().hex[:12]}"
    sqs = admin_client(url, "sqs", region)
    events = admin_client(url, "events", region)
    queue_url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events.put_rule(
        Name=name,
        EventPattern=json.dumps(
            {"source": ["aws.ec2"], "detail-type": list(INTERRUPTION_DETAIL_TYPES)}
        ),
        State="ENABLED",
    )
    events.put_targets(Rule=name, Targets=[{"Id": "coadapt-queue", "Arn": arn}])
    return queue_url, name


def delete_interruption_queue(
    url: str, queue_url: str, rule_name: str, *, region: str = DEFAULT_REGION
) -> None:
    events = admin_client(url, "events", region)
    events.remove_targets(Rule=rule_name, Ids=["coadapt-queue"])
    events.delete_rule(Name=rule_name)
    admin_client(url, "sqs", region).delete_queue(QueueUrl=queue_url)


def send_ec2_event(
    url: str,
    detail_type: str,
    detail: Mapping[str, Any],
    *,
    at_s: float,
    region: str = DEFAULT_REGION,
) -> None:
    """Publish an ``aws.ec2`` event through EventBridge (moto delivers it to matching rules)."""
    events = admin_client(url, "events", region)
    instance_id = detail.get("instance-id", "")
    response = events.put_events(
        Entries=[
            {
                "Source": "aws.ec2",
                "DetailType": detail_type,
                "Detail": json.dumps(dict(detail)),
                "Resources": [f"arn:aws:ec2:{region}:123456789012:instance/{instance_id}"],
                "Time": datetime.fromtimestamp(at_s, tz=UTC),
            }
        ]
    )
    if response.get("FailedEntryCount"):
        raise RuntimeError(f"EventBridge refused the event: {response}")


def send_spot_warning(
    url: str, instance_id: str, *, at_s: float, region: str = DEFAULT_REGION
) -> None:
    """EC2's two-minute spot interruption warning for ``instance_id``, via EventBridge."""
    send_ec2_event(
        url,
        SPOT_WARNING_DETAIL_TYPE,
        {"instance-id": instance_id, "instance-action": "terminate"},
        at_s=at_s,
        region=region,
    )


# ------------------------------------------------------------------------ instruments


class ApiCallCounter:
    """Counts the real API calls a provider's clients make (botocore ``before-call`` hook).

    ``counter()`` returns ``{"launch": n, "list": n, "terminate": n}``: the calls made while
    ``launch``, ``list_instances`` and ``terminate`` ran (every call they make, e.g. the
    ownership ``DescribeInstances`` of ``terminate``). ``by_method()`` has every provider
    method (``offerings``, ``interruptions``, ... and ``other`` for calls outside one);
    ``by_operation()`` counts API operations (``CreateFleet``, ``DescribeInstances``, ...).
    """

    def __init__(self, provider: AwsProvider) -> None:
        self._provider = provider
        self._methods: Counter[str] = Counter()
        self._operations: Counter[str] = Counter()
        self._lock = threading.Lock()
        for client in provider.clients():
            # First in line, so a hook answering a call locally cannot hide it from the count.
            client.meta.events.register_first("before-call", self._on_call)

    def _on_call(self, model: Any = None, **_: Any) -> None:
        method = self._provider.current_operation() or "other"
        with self._lock:
            self._methods[method] += 1
            self._operations[getattr(model, "name", "unknown")] += 1

    def __call__(self) -> dict[str, int]:
        with self._lock:
            return {bucket: self._methods[method] for method, bucket in METHOD_BUCKETS.items()}

    def total(self) -> int:
        with self._lock:
            return sum(self._methods.values())

    def by_method(self) -> dict[str, int]:
        with self._lock:
            return dict(self._methods)

    def by_operation(self) -> dict[str, int]:
        with self._lock:
            return dict(self._operations)


class CapacityModel:
    """EC2's capacity behaviour on a provider's EC2 client, where moto lacks it.

    moto never runs out of capacity; this adds that behaviour on the provider's real botocore
    client through event hooks (the module docstring describes the shapes). ``exhaust(key)``
    dries a pool up; ``refill(key)`` undoes it; ``attempts(key)`` counts launch calls
    (``CreateFleet`` / ``RunInstances``) that asked for that pool, dry or not.

    It also fixes one moto deviation: moto's ``RunInstances`` launches ``MinCount`` instances,
    EC2 launches as many as capacity allows up to ``MaxCount``; with a pool that is not dry
    (unlimited capacity) that is ``MaxCount``, so the hook raises ``MinCount`` to it.
    """

    def __init__(self, provider: AwsProvider) -> None:
        self._provider = provider
        self._dry: set[str] = set()
        self._attempts: Counter[str] = Counter()
        self._lock = threading.Lock()
        events = provider.ec2.meta.events
        events.register("before-parameter-build.ec2.CreateFleet", self._fleet_params)
        events.register("before-call.ec2.CreateFleet", self._fleet_answer)
        events.register("after-call.ec2.CreateFleet", self._fleet_errors)
        events.register("before-parameter-build.ec2.RunInstances", self._run_params)
        events.register("before-call.ec2.RunInstances", self._run_answer)

    def exhaust(self, offering_key: str) -> None:
        with self._lock:
            self._dry.add(offering_key)

    def refill(self, offering_key: str) -> None:
        with self._lock:
            self._dry.discard(offering_key)

    def refill_all(self) -> None:
        with self._lock:
            self._dry.clear()

    def attempts(self, offering_key: str) -> int:
        with self._lock:
            return self._attempts[offering_key]

    def _key(self, instance_type: str, market: Market, placement: Mapping[str, Any]) -> str:
        if placement.get("SubnetId"):
            zone_id = self._provider.zone_id_for(subnet_id=placement["SubnetId"])
        else:
            zone_id = self._provider.zone_id_for(zone=placement["AvailabilityZone"])
        return offering_key(self._provider.name, instance_type, zone_id, market)

    # -- CreateFleet ---------------------------------------------------------------------

    def _fleet_params(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        capacity_type = params["TargetCapacitySpecification"]["DefaultTargetCapacityType"]
        market = Market.SPOT if capacity_type == "spot" else Market.ON_DEMAND
        injected: list[dict[str, Any]] = []
        configs = []
        kept_any = False
        for config in params.get("LaunchTemplateConfigs", []):
            kept = []
            for override in config.get("Overrides", []):
                key = self._key(override["InstanceType"], market, override)
                with self._lock:
                    self._attempts[key] += 1
                    dry = key in self._dry
                if dry:
                    injected.append(
                        {
                            "LaunchTemplateAndOverrides": {
                                "LaunchTemplateSpecification": config[
                                    "LaunchTemplateSpecification"
                                ],
                                "Overrides": dict(override),
                            },
                            "Lifecycle": market.value,
                            "ErrorCode": "InsufficientInstanceCapacity",
                            "ErrorMessage": (
                                "We currently do not have sufficient "
                                f"{override['InstanceType']} capacity in the Availability "
                                "Zone you requested."
                            ),
                        }
                    )
                else:
                    kept.append(override)
            kept_any = kept_any or bool(kept)
            configs.append({**config, "Overrides": kept})
        if not injected:
            return
        context["coadapt_injected_errors"] = injected
        if kept_any:
            params["LaunchTemplateConfigs"] = [c for c in configs if c["Overrides"]]
        else:
            context["coadapt_answer_locally"] = True

    def _fleet_answer(self, context: dict[str, Any], **_: Any) -> Any:
        if not context.get("coadapt_answer_locally"):
            return None
        from botocore.awsrequest import AWSResponse

        parsed = {
            "FleetId": f"fleet-{uuid.uuid4()}",
            "Instances": [],
            "Errors": list(context["coadapt_injected_errors"]),
            "ResponseMetadata": {"HTTPStatusCode": 200, "RequestId": str(uuid.uuid4())},
        }
        return AWSResponse(None, 200, {}, None), parsed

    def _fleet_errors(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        injected = context.get("coadapt_injected_errors")
        if injected and not context.get("coadapt_answer_locally"):
            parsed.setdefault("Errors", []).extend(injected)

    # -- RunInstances --------------------------------------------------------------------

    def _run_params(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        options = params.get("InstanceMarketOptions") or {}
        market = Market.SPOT if options.get("MarketType") == "spot" else Market.ON_DEMAND
        placement = {"SubnetId": params.get("SubnetId")} if params.get("SubnetId") else {}
        if not placement:
            placement = {"AvailabilityZone": (params.get("Placement") or {})["AvailabilityZone"]}
        key = self._key(params["InstanceType"], market, placement)
        with self._lock:
            self._attempts[key] += 1
            dry = key in self._dry
        if dry:
            context["coadapt_dry_pool"] = params["InstanceType"]
        else:  # EC2 with capacity to spare launches MaxCount; moto would launch MinCount
            params["MinCount"] = params["MaxCount"]

    def _run_answer(self, context: dict[str, Any], **_: Any) -> Any:
        instance_type = context.get("coadapt_dry_pool")
        if instance_type is None:
            return None
        from botocore.awsrequest import AWSResponse

        parsed = {
            "Error": {
                "Code": "InsufficientInstanceCapacity",
                "Message": (
                    f"We currently do not have sufficient {instance_type} capacity in the "
                    "Availability Zone you requested."
                ),
            },
            "ResponseMetadata": {"HTTPStatusCode": 500, "RequestId": str(uuid.uuid4())},
        }
        return AWSResponse(None, 500, {}, None), parsed


# ------------------------------------------------------------------------- benchmarks


def pick_pools(provider: AwsProvider, market: Market, count: int) -> list[Offering]:
    """``count`` pools of ``market``: the cheapest-listed types first, spread over zones."""
    pools = [o for o in provider.offerings() if o.market is market]
    pools.sort(key=lambda o: (o.gpus, o.vcpus, o.instance_type, o.zone))
    chosen: list[Offering] = []
    seen_zones: set[str] = set()
    for o in pools:  # first pass: one per zone, then fill
        if o.zone not in seen_zones and o.instance_type == pools[0].instance_type:
            chosen.append(o)
            seen_zones.add(o.zone)
    for o in pools:
        if o not in chosen:
            chosen.append(o)
    return chosen[:count]


@contextlib.contextmanager
def moto_benchmark_env(
    cluster_id: str,
    *,
    region: str = DEFAULT_REGION,
    pools: int = 4,
    market: Market = Market.SPOT,
    clock: Clock | None = None,
) -> Iterator[tuple[AwsProvider, list[Offering], ApiCallCounter]]:
    """A fresh moto server and an ``AwsProvider`` on it, for benchmarks.

    Yields ``(provider, offerings, call_counter)``: ``offerings`` are ``pools`` pools of
    ``market`` from the provider's catalogue (the catalogue is already read, so its calls are
    not in the counts); ``call_counter()`` returns ``{"launch", "list", "terminate"}`` counts
    of real EC2 API calls (see ``ApiCallCounter``). The server stops on exit.
    """
    from providers.tags import validate_id

    validate_id(cluster_id, field="cluster_id")
    server = start_moto_server()
    try:
        provider = make_provider(server.url, region=region, clock=clock)
        offerings = pick_pools(provider, market, pools)
        counter = ApiCallCounter(provider)
        yield provider, offerings, counter
    finally:
        server.stop()
