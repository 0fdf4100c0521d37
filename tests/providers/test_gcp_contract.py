"""The provider contract, run against ``GcpProvider`` over the fake Compute REST server.

The provider uses the real google-cloud-compute client (REST transport, AnonymousCredentials)
against ``emulators.gce_server.FakeGceServer`` on 127.0.0.1; one server serves the whole
module, each test works in its own cluster id with a fresh provider (fresh capacity cache) and
reads the server's counters as differences.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from emulators.gcp_env import FakeGcpEnv
from providers.base import Market, Offering
from providers.gcp.provider import GcpProvider
from tests.providers.contract import ProviderContract


class GcpHarness:
    """``ContractHarness`` over ``GcpProvider`` + ``FakeGceServer`` (shared across tests)."""

    def __init__(self, env: FakeGcpEnv) -> None:
        self.env = env
        self.provider = env.provider()
        self.cluster_id = f"gcp-{uuid.uuid4().hex[:10]}"
        self._exhausted: list[Offering] = []

    def offerings_for_test(self) -> list[Offering]:
        return [
            o
            for o in self.provider.offerings()
            if o.instance_type == "g2-standard-4"
            and o.market is Market.SPOT
            and o.zone in ("us-central1-a", "us-central1-b")
        ]

    def exhaust_pool(self, offering: Offering) -> None:
        self._exhausted.append(offering)
        self.env.exhaust(offering)

    def add_foreign_instance(self) -> str:
        return self.env.add_foreign_instance()

    def inject_preemption(self, instance_id: str) -> None:
        self.env.preempt(instance_id)

    def settle(self) -> None:
        self.env.server.settle()

    def cloud_launch_calls(self, offering_key: str) -> int:
        offering = next(o for o in self.provider.offerings() if o.key == offering_key)
        return self.env.launch_attempts(offering)

    def cloud_calls(self) -> int:
        return self.env.server.api_calls()

    def cloud_has_instance(self, instance_id: str) -> bool:
        return self.env.has_live_instance(instance_id)

    def restarted_provider(self) -> GcpProvider:
        return self.env.provider()

    def forget_idempotency_tokens(self) -> None:
        self.env.server.forget_request_ids()

    def close(self) -> None:
        """Delete what the test left behind and give exhausted pools their capacity back."""
        self.env.server.settle()
        leftovers = [i.instance_id for i in self.provider.list_instances(self.cluster_id)]
        if leftovers:
            self.provider.terminate(self.cluster_id, leftovers, f"cleanup-{uuid.uuid4().hex[:8]}")
            self.env.server.settle()
        for offering in self._exhausted:
            zone, machine, _, _ = self.env.pool_of(offering)
            self.env.server.restore(zone, machine, market=offering.market.value)


@pytest.fixture(scope="module")
def gcp_env() -> Iterator[FakeGcpEnv]:
    with FakeGcpEnv() as env:
        yield env


@pytest.fixture
def harness(gcp_env: FakeGcpEnv) -> Iterator[GcpHarness]:
    h = GcpHarness(gcp_env)
    yield h
    h.close()


class TestGcpProviderContract(ProviderContract):
    pass
