"""The provider contract, run against the in-memory ``FakeProvider``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from coadapt_common.clock import FakeClock
from providers.base import InstanceState, Market, Offering
from providers.fake import FakeProvider
from tests.providers.contract import ProviderContract


class FakeHarness:
    """``ContractHarness`` over a ``FakeProvider`` on a ``FakeClock``."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.provider = FakeProvider(clock=self.clock)
        self.cluster_id = f"fake-{uuid.uuid4().hex[:10]}"

    def offerings_for_test(self) -> list[Offering]:
        return [
            o
            for o in self.provider.offerings()
            if o.instance_type == "g4dn.xlarge" and o.market is Market.SPOT
        ]

    def exhaust_pool(self, offering: Offering) -> None:
        self.provider.set_capacity(offering.key, 0)

    def add_foreign_instance(self) -> str:
        return self.provider.add_foreign_instance(self.offerings_for_test()[0])

    def inject_preemption(self, instance_id: str) -> None:
        self.provider.preempt(instance_id, notice_s=120.0)

    def settle(self) -> None:
        """The fake is consistent at once; nothing to wait for."""

    def cloud_launch_calls(self, offering_key: str) -> int:
        return self.provider.call_count("launch", pool=offering_key)

    def cloud_calls(self) -> int:
        return len(self.provider.calls)

    def cloud_has_instance(self, instance_id: str) -> bool:
        return self.provider.instance_state(instance_id) in {
            InstanceState.PENDING,
            InstanceState.RUNNING,
        }

    def restarted_provider(self) -> FakeProvider:
        return self.provider.restarted()

    def forget_idempotency_tokens(self) -> None:
        """The fake cloud keeps no idempotency tokens: only the request-id tag index."""


@pytest.fixture
def harness() -> Iterator[FakeHarness]:
    yield FakeHarness()


class TestFakeProviderContract(ProviderContract):
    pass
