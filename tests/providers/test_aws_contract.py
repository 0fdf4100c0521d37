"""The shared provider contract, run against ``AwsProvider`` on a real moto server.

Real boto3 clients talk HTTP to a moto server on 127.0.0.1 (one per test session). Both launch
paths run the whole contract: ``CreateFleet`` (instant) and ``RunInstances``. One provider per
launch path is shared by the session (its catalogue is read once); each test owns a fresh
cluster id, starts with an empty capacity cache and full pools, and reads counters as
differences. The interruption queue is shared too: notices are scoped by cluster ownership,
which is exactly what the contract checks.

What moto does not model, and how this harness covers it (all on the provider's *real*
botocore client, through botocore event hooks; no coadapt code is patched):

* capacity errors: ``exhaust_pool`` uses ``emulators.aws_moto.CapacityModel`` (which also
  makes moto's ``RunInstances`` launch ``MaxCount`` like EC2, where moto launches ``MinCount``). For
  ``CreateFleet`` the dry pool's override is taken out of the request before it is sent and an
  EC2-shaped ``InsufficientInstanceCapacity`` entry is added to the response's ``Errors`` (a
  request with only dry pools is answered locally with an ``Errors``-only instant-fleet
  response); ``RunInstances`` into a dry pool gets EC2's HTTP 500
  ``InsufficientInstanceCapacity`` error. ``cloud_launch_calls`` counts launch calls per pool
  at the same hook, before any injection.
* interruption notices: ``inject_preemption`` publishes EC2's "Spot Instance Interruption
  Warning" event through moto's EventBridge, whose rule delivers it to the harness's SQS queue
  (real EventBridge refuses ``aws.*`` sources from ``PutEvents``; moto accepts them).
* moto is strongly consistent, so ``settle`` has nothing to wait for.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

pytest.importorskip("boto3")
pytest.importorskip("moto")

from coadapt_common.clock import FakeClock
from emulators.aws_moto import (
    ApiCallCounter,
    CapacityModel,
    MotoServer,
    admin_client,
    create_interruption_queue,
    make_provider,
    pick_pools,
    send_spot_warning,
    shared_moto_server,
)
from providers.aws.config import LaunchApi
from providers.aws.provider import AwsProvider
from providers.base import Market, Offering
from providers.tags import CLUSTER_ID_TAG, MANAGED_BY_TAG, MANAGED_BY_VALUE
from tests.providers.contract import OTHER_CLUSTER_ID, ContractHarness, ProviderContract

FOREIGN_TYPE = "g4dn.xlarge"


@dataclass
class _Cloud:
    """One provider (per launch API) on the shared moto server, with its instruments.

    Shared by the tests of a session: reading the catalogue costs a few calls, and every test
    works inside its own cluster id. Per-test state is reset by the harness: the capacity cache
    is cleared and every pool refilled; counters are read as differences.
    """

    url: str
    provider: AwsProvider
    counter: ApiCallCounter
    capacity: CapacityModel
    queue_url: str
    rule: str


class AwsMotoHarness:
    """``ContractHarness`` for ``AwsProvider`` on a moto server (see the module docstring)."""

    def __init__(self, cloud: _Cloud, cluster_id: str) -> None:
        self.cluster_id = cluster_id
        self._cloud = cloud
        self.provider = cloud.provider
        self.clock = cloud.provider.clock
        self._ec2 = admin_client(cloud.url, "ec2")  # set-up and checks: not counted
        self._foreign: list[str] = []
        cloud.provider.unavailable.clear()
        cloud.capacity.refill_all()

    # -- ContractHarness -------------------------------------------------------------------

    def offerings_for_test(self) -> list[Offering]:
        return pick_pools(self.provider, Market.SPOT, 2)

    def exhaust_pool(self, offering: Offering) -> None:
        self._cloud.capacity.exhaust(offering.key)

    def add_foreign_instance(self) -> str:
        # Tagged as coadapt's, but for another cluster: the closest a foreign instance gets.
        response = self._ec2.run_instances(
            ImageId=self.provider.config.image_id,
            InstanceType=FOREIGN_TYPE,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [
                        {"Key": CLUSTER_ID_TAG, "Value": OTHER_CLUSTER_ID},
                        {"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE},
                    ],
                }
            ],
        )
        instance_id = response["Instances"][0]["InstanceId"]
        self._foreign.append(instance_id)
        return instance_id

    def inject_preemption(self, instance_id: str) -> None:
        send_spot_warning(self._cloud.url, instance_id, at_s=self.clock.now_s())

    def settle(self) -> None:
        return None

    def cloud_launch_calls(self, offering_key: str) -> int:
        return self._cloud.capacity.attempts(offering_key)

    def cloud_calls(self) -> int:
        return self._cloud.counter.total()

    def restarted_provider(self) -> AwsProvider:
        """A new ``AwsProvider`` on the same moto server and queue, with its own capacity hooks
        (so moto's ``RunInstances`` launches ``MaxCount`` for it too, as EC2 does)."""
        provider = make_provider(
            self._cloud.url,
            clock=FakeClock(),
            launch_api=self.provider.config.launch_api,
            interruption_queue_url=self._cloud.queue_url,
        )
        CapacityModel(provider)
        return provider

    def forget_idempotency_tokens(self) -> None:
        """moto keeps no ``ClientToken`` memory at all (ENVIRONMENT.md): every launch there is
        already a launch after the token window, which is why this contract runs it."""

    def cloud_has_instance(self, instance_id: str) -> bool:
        response = self._ec2.describe_instances(
            Filters=[
                {"Name": "instance-id", "Values": [instance_id]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )
        return any(r["Instances"] for r in response["Reservations"])

    # -- clean-up --------------------------------------------------------------------------

    def close(self) -> None:
        ids = [i.instance_id for i in self.provider.list_instances(self.cluster_id)]
        ids += self._foreign
        if ids:
            self._ec2.terminate_instances(InstanceIds=ids)
        self.provider.unavailable.clear()
        self._cloud.capacity.refill_all()


_clouds: dict[LaunchApi, _Cloud] = {}


def _cloud_for(server: MotoServer, launch_api: LaunchApi) -> _Cloud:
    cloud = _clouds.get(launch_api)
    if cloud is None or cloud.url != server.url:
        queue_url, rule = create_interruption_queue(
            server.url, name=f"coadapt-contract-{launch_api.value}"
        )
        provider = make_provider(
            server.url,
            clock=FakeClock(),
            launch_api=launch_api,
            interruption_queue_url=queue_url,
        )
        cloud = _Cloud(
            server.url,
            provider,
            ApiCallCounter(provider),
            CapacityModel(provider),
            queue_url,
            rule,
        )
        _clouds[launch_api] = cloud
    return cloud


@pytest.fixture(scope="session")
def moto_server() -> MotoServer:
    return shared_moto_server()


@pytest.fixture(params=[LaunchApi.CREATE_FLEET, LaunchApi.RUN_INSTANCES], ids=lambda a: a.value)
def harness(moto_server: MotoServer, request: pytest.FixtureRequest) -> Iterator[AwsMotoHarness]:
    cloud = _cloud_for(moto_server, request.param)
    h = AwsMotoHarness(cloud, f"aws-contract-{uuid.uuid4().hex[:12]}")
    assert isinstance(h, ContractHarness)
    yield h
    h.close()


class TestAwsProviderContract(ProviderContract):
    """Every rule of ``providers.base``, checked on EC2 (moto) through both launch APIs."""
