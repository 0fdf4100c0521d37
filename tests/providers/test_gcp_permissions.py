"""The GCP adapter's REST methods against its declared permissions
(``providers.gcp.permissions``): ``tests/conftest.py`` checks every test that talks to the
fake Compute Engine server; here one fake server sees every kind of work the controller asks
of the adapter, and the methods it answered must be exactly the declared ones."""

from __future__ import annotations

import uuid

import pytest

from emulators.gcp_env import TEST_ZONES, FakeGcpEnv
from providers.base import LaunchRequest, Market
from providers.gcp.permissions import ADAPTER_METHODS, controller_permissions

ZONE_A, ZONE_B = TEST_ZONES[:2]


def _request(cluster: str, pools, count: int) -> LaunchRequest:
    return LaunchRequest(
        request_id=f"r-{uuid.uuid4().hex[:12]}", cluster_id=cluster, offerings=tuple(pools),
        count=count,
    )  # fmt: skip


@pytest.mark.slow
def test_the_adapter_calls_exactly_the_declared_methods() -> None:
    cluster = f"perm-{uuid.uuid4().hex[:8]}"
    with FakeGcpEnv() as env:
        for bulk in (True, False):
            provider = env.provider(env.config(use_bulk_insert=bulk, check_zone_availability=True))
            spot = [o for o in provider.offerings() if o.market is Market.SPOT]
            pool = next(o for o in spot if o.zone == (ZONE_A if bulk else ZONE_B))
            ids = [i.instance_id for i in provider.launch(_request(cluster, [pool], 2)).instances]
            env.preempt(ids[0])
            assert provider.interruptions(cluster)
            provider.list_instances(cluster)
            gone = f"{ZONE_A}/ca-00000000-0000000000-0000"
            provider.terminate(cluster, [*ids, gone], f"term-{int(bulk)}")
        answered = {r.route for r in env.server.requests} - {"metadata.get"}
    assert answered == set(ADAPTER_METHODS)


def test_external_addresses_need_one_more_permission() -> None:
    assert controller_permissions(external_ip=True) - controller_permissions() == {
        "compute.subnetworks.useExternalIp"
    }
    assert all(p.startswith("compute.") for p in controller_permissions())
