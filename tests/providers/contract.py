"""The provider contract test suite: one set of tests, run against every provider.

How to plug a provider in
=========================

Write ``tests/providers/test_<name>_contract.py`` with a pytest fixture named ``harness`` that
yields an object satisfying :class:`ContractHarness` (below), and a subclass of
:class:`ProviderContract` whose name starts with ``Test``::

    import pytest
    from tests.providers.contract import ProviderContract

    @pytest.fixture
    def harness(tmp_path):
        h = MyHarness(...)       # fresh cluster id per test
        yield h
        h.close()                # terminate everything it created, stop servers/processes

    class TestMyProviderContract(ProviderContract):
        pass

The fixture should be function-scoped (a fresh ``cluster_id`` per test); an expensive server
(moto, a fake REST server) may be session-scoped underneath it, because every test works only
inside its own cluster id and reads call counters as *differences*.

The harness interface (stable; additions only)
==============================================

``provider: Provider``
    The provider under test, already configured for the test cloud.
``cluster_id: str``
    The cluster this test owns (valid per ``providers.tags.validate_id``), unique per test.
``offerings_for_test() -> list[Offering]``
    At least two pools of the *same* market, all taken from ``provider.offerings()``, each able
    to hold at least 3 instances. Spot pools when the provider can simulate interruptions.
``exhaust_pool(offering) -> None``
    From now on the cloud has no capacity in that pool: a real launch attempt there fails with
    the cloud's capacity error (which the provider must map to ``InsufficientCapacityError``).
``add_foreign_instance() -> str``
    Create an instance in the cloud that the test cluster does NOT own (untagged, or tagged for
    another cluster) and return its cloud instance id.
``inject_preemption(instance_id) -> None``
    Cause an interruption notice for that instance by whatever means the provider has (spot
    notice, preemption, ...). Must work for foreign instances too. May ``pytest.skip`` when the
    provider cannot simulate interruptions.
``settle() -> None``
    Wait / advance time until the cloud's view is consistent (no-op for in-memory fakes).
``cloud_launch_calls(offering_key) -> int``
    Monotonic count of real launch attempts that reached the cloud for that pool (a call that
    could place instances in several pools counts once for each of them).
``cloud_calls() -> int``
    Monotonic count of every real cloud API call made so far, of any kind.
``cloud_has_instance(instance_id) -> bool``
    True while the cloud holds that instance in a non-terminated state (pending, running),
    whoever owns it. Read directly from the cloud, not through the provider.
``restarted_provider() -> Provider``
    A new provider object over the same cloud, as a controller restarted after a crash builds
    it: it shares nothing in memory with ``provider`` (capacity cache, names or tokens used,
    attempt counters) except what the cloud itself holds. Instrumented like ``provider`` where
    the cloud needs it to behave (e.g. moto's EC2 capacity hooks).
``forget_idempotency_tokens() -> None``
    The cloud forgets the idempotency tokens of every earlier call, as if their window had
    passed (GCE ``requestId``: 60 minutes). A no-op where the cloud keeps none, which the
    harness says.

The contract itself is written in ``providers/base.py``; each test below names the rule it
checks.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import pytest

from providers.base import (
    Instance,
    InstanceState,
    InterruptionKind,
    InterruptionNotice,
    LaunchRequest,
    LaunchResult,
    Market,
    Offering,
    Provider,
)
from providers.errors import InsufficientCapacityError, InvalidRequestError
from providers.tags import CLUSTER_ID_TAG, MANAGED_BY_TAG, MANAGED_BY_VALUE, REQUEST_ID_TAG

OTHER_CLUSTER_ID = "contract-other-cluster"
LIVE_STATES = frozenset({InstanceState.PENDING, InstanceState.RUNNING})


@runtime_checkable
class ContractHarness(Protocol):
    """What a provider's test module hands the contract suite. See the module docstring."""

    provider: Provider
    cluster_id: str

    def offerings_for_test(self) -> list[Offering]: ...

    def exhaust_pool(self, offering: Offering) -> None: ...

    def add_foreign_instance(self) -> str: ...

    def inject_preemption(self, instance_id: str) -> None: ...

    def settle(self) -> None: ...

    def cloud_launch_calls(self, offering_key: str) -> int: ...

    def cloud_calls(self) -> int: ...

    def cloud_has_instance(self, instance_id: str) -> bool: ...

    def restarted_provider(self) -> Provider: ...

    def forget_idempotency_tokens(self) -> None: ...


def new_request_id() -> str:
    """A fresh, valid request id (unique across tests sharing one cloud)."""
    return f"req-{uuid.uuid4().hex[:16]}"


def launch(
    harness: ContractHarness,
    offerings: Sequence[Offering],
    count: int,
    *,
    request_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> LaunchResult:
    """Launch through the provider with a valid request for the harness's cluster."""
    request = LaunchRequest(
        request_id=request_id or new_request_id(),
        cluster_id=harness.cluster_id,
        offerings=tuple(offerings),
        count=count,
        tags=dict(tags or {}),
    )
    return harness.provider.launch(request)


def two_pools(harness: ContractHarness) -> tuple[Offering, Offering]:
    pools = harness.offerings_for_test()
    assert len(pools) >= 2, "offerings_for_test() must return at least two pools"
    return pools[0], pools[1]


def listed_ids(harness: ContractHarness, cluster_id: str | None = None) -> set[str]:
    instances = harness.provider.list_instances(cluster_id or harness.cluster_id)
    return {i.instance_id for i in instances}


# Bad launch requests: (id, builder(pools, catalogue, cluster_id) -> LaunchRequest).
def _unknown_type(pools: list[Offering], catalogue: Sequence[Offering], cid: str) -> LaunchRequest:
    bogus = dataclasses.replace(pools[0], instance_type="no-such-type.xlarge")
    return LaunchRequest(new_request_id(), cid, (bogus,), 1)


def _unknown_zone(pools: list[Offering], catalogue: Sequence[Offering], cid: str) -> LaunchRequest:
    bogus = dataclasses.replace(pools[0], zone="nowhere-9z")
    return LaunchRequest(new_request_id(), cid, (bogus,), 1)


def _other_provider(
    pools: list[Offering], catalogue: Sequence[Offering], cid: str
) -> LaunchRequest:
    bogus = dataclasses.replace(pools[0], provider="some-other-cloud")
    return LaunchRequest(new_request_id(), cid, (bogus,), 1)


def _mixed_markets(pools: list[Offering], catalogue: Sequence[Offering], cid: str) -> LaunchRequest:
    first = pools[0]
    other_market = Market.ON_DEMAND if first.market is Market.SPOT else Market.SPOT
    other = next(
        (o for o in catalogue if o.market is other_market),
        dataclasses.replace(first, market=other_market),
    )
    return LaunchRequest(new_request_id(), cid, (first, other), 2)


BAD_REQUESTS: dict[str, Callable[[list[Offering], Sequence[Offering], str], LaunchRequest]] = {
    "unknown-instance-type": _unknown_type,
    "unknown-zone": _unknown_zone,
    "offering-of-another-provider": _other_provider,
    "mixed-markets": _mixed_markets,
    "zero-count": lambda p, c, cid: LaunchRequest(new_request_id(), cid, (p[0],), 0),
    "negative-count": lambda p, c, cid: LaunchRequest(new_request_id(), cid, (p[0],), -2),
    "bool-count": lambda p, c, cid: LaunchRequest(new_request_id(), cid, (p[0],), True),
    "no-offerings": lambda p, c, cid: LaunchRequest(new_request_id(), cid, (), 1),
    "duplicate-offerings": lambda p, c, cid: LaunchRequest(new_request_id(), cid, (p[0], p[0]), 1),
    "malformed-tag-key": lambda p, c, cid: LaunchRequest(
        new_request_id(), cid, (p[0],), 1, tags={"Bad Key": "x"}
    ),
    "malformed-tag-value": lambda p, c, cid: LaunchRequest(
        new_request_id(), cid, (p[0],), 1, tags={"team": "UPPER CASE"}
    ),
    "reserved-tag-key": lambda p, c, cid: LaunchRequest(
        new_request_id(), cid, (p[0],), 1, tags={CLUSTER_ID_TAG: "someone-else"}
    ),
    "malformed-request-id": lambda p, c, cid: LaunchRequest("Not_Valid!", cid, (p[0],), 1),
    "malformed-cluster-id": lambda p, c, cid: LaunchRequest(
        new_request_id(), "Bad Cluster", (p[0],), 1
    ),
}


def assert_owned(instance: Instance, harness: ContractHarness, request_id: str) -> None:
    assert instance.cluster_id == harness.cluster_id
    assert instance.request_id == request_id
    assert instance.provider == harness.provider.name
    assert instance.tags.get(CLUSTER_ID_TAG) == harness.cluster_id
    assert instance.tags.get(REQUEST_ID_TAG) == request_id
    assert instance.tags.get(MANAGED_BY_TAG) == MANAGED_BY_VALUE


class ProviderContract:
    """The rules of ``providers.base``, checked through a :class:`ContractHarness`."""

    # ---------------------------------------------------------------- offerings

    def test_offerings_are_well_formed(self, harness: ContractHarness) -> None:
        offerings = list(harness.provider.offerings())
        assert offerings, "a provider offers at least one pool"
        keys = [o.key for o in offerings]
        assert len(keys) == len(set(keys)), "offering keys are unique"
        for o in offerings:
            assert isinstance(o, Offering)
            assert o.provider == harness.provider.name
            assert o.instance_type and o.gpu_type and o.region and o.zone
            assert isinstance(o.market, Market)
            assert isinstance(o.gpus, int) and o.gpus > 0, f"{o.key}: GPU offerings only"
            assert isinstance(o.vcpus, int) and o.vcpus > 0
            assert o.memory_gib > 0
            assert o.price_usd_per_hour is None or o.price_usd_per_hour > 0

    def test_test_offerings_come_from_the_catalogue(self, harness: ContractHarness) -> None:
        catalogue = {o.key for o in harness.provider.offerings()}
        pools = harness.offerings_for_test()
        assert len(pools) >= 2
        assert {o.key for o in pools} <= catalogue
        assert len({o.market for o in pools}) == 1

    def test_spot_prices_refer_to_spot_offerings(self, harness: ContractHarness) -> None:
        spot_pools = {
            (o.instance_type, o.zone)
            for o in harness.provider.offerings()
            if o.market is Market.SPOT
        }
        for price in harness.provider.spot_prices():
            assert (price.instance_type, price.zone) in spot_pools
            assert price.price_usd_per_hour > 0
            assert price.timestamp_s > 0

    # ------------------------------------------------------------------- launch

    def test_launch_returns_count_owned_instances(self, harness: ContractHarness) -> None:
        a, b = two_pools(harness)
        request_id = new_request_id()
        result = launch(harness, [a, b], 3, request_id=request_id, tags={"team": "ml"})
        assert result.request_id == request_id
        assert result.requested == 3
        assert result.fulfilled
        assert len(result.instances) == 3
        assert result.errors == (), "a healthy launch reports no pool errors"
        assert len({i.instance_id for i in result.instances}) == 3
        for instance in result.instances:
            assert_owned(instance, harness, request_id)
            assert instance.tags.get("team") == "ml"
            assert instance.offering_key in {a.key, b.key}
            assert instance.market is a.market
            assert instance.state in LIVE_STATES

    def test_launched_instances_are_listed(self, harness: ContractHarness) -> None:
        a, _ = two_pools(harness)
        request_id = new_request_id()
        result = launch(harness, [a], 2, request_id=request_id)
        harness.settle()
        listed = {i.instance_id: i for i in harness.provider.list_instances(harness.cluster_id)}
        assert set(listed) == {i.instance_id for i in result.instances}
        for instance in listed.values():
            assert_owned(instance, harness, request_id)
            assert instance.state in LIVE_STATES
            assert instance.offering_key == a.key
            assert harness.cloud_has_instance(instance.instance_id)

    def test_same_request_twice_launches_once(self, harness: ContractHarness) -> None:
        a, b = two_pools(harness)
        request_id = new_request_id()
        first = launch(harness, [a, b], 2, request_id=request_id)
        second = launch(harness, [a, b], 2, request_id=request_id)
        first_ids = {i.instance_id for i in first.instances}
        assert len(first_ids) == 2
        assert {i.instance_id for i in second.instances} == first_ids
        harness.settle()
        assert listed_ids(harness) == first_ids

    # The launch rule of ``providers.base``: found < count creates only the shortfall and
    # returns found + created; found >= count creates and ends nothing and returns all found.

    def test_relaunch_with_a_larger_count_creates_only_the_shortfall(
        self, harness: ContractHarness
    ) -> None:
        a, b = two_pools(harness)
        request_id = new_request_id()
        first = {i.instance_id for i in launch(harness, [a, b], 2, request_id=request_id).instances}
        assert len(first) == 2
        second = launch(harness, [a, b], 4, request_id=request_id)  # now 2 of 4: partly filled
        ids = {i.instance_id for i in second.instances}
        assert len(second.instances) == 4 and first <= ids
        assert second.fulfilled and second.errors == ()
        for instance in second.instances:
            assert_owned(instance, harness, request_id)
        harness.settle()
        assert listed_ids(harness) == ids

    def test_relaunch_after_an_instance_ended_tops_up_to_count(
        self, harness: ContractHarness
    ) -> None:
        a, b = two_pools(harness)
        request_id = new_request_id()
        first = [i.instance_id for i in launch(harness, [a, b], 3, request_id=request_id).instances]
        ended, *kept = first
        harness.settle()
        harness.provider.terminate(harness.cluster_id, [ended], new_request_id())
        harness.settle()
        again = launch(harness, [a, b], 3, request_id=request_id)
        ids = {i.instance_id for i in again.instances}
        assert len(ids) == 3 and set(kept) <= ids and ended not in ids
        assert again.fulfilled
        harness.settle()
        assert listed_ids(harness) == ids

    def test_relaunch_with_more_instances_than_count_creates_and_ends_nothing(
        self, harness: ContractHarness
    ) -> None:
        a, b = two_pools(harness)
        request_id = new_request_id()
        first = {i.instance_id for i in launch(harness, [a, b], 3, request_id=request_id).instances}
        harness.settle()
        calls = (harness.cloud_launch_calls(a.key), harness.cloud_launch_calls(b.key))
        again = launch(harness, [a, b], 2, request_id=request_id)
        assert {i.instance_id for i in again.instances} == first, "all of them are returned"
        assert again.fulfilled and again.errors == ()
        assert (harness.cloud_launch_calls(a.key), harness.cloud_launch_calls(b.key)) == calls
        harness.settle()
        assert listed_ids(harness) == first
        assert all(harness.cloud_has_instance(i) for i in first), "launch ended an instance"

    def test_relaunch_after_the_cloud_forgot_its_idempotency_tokens(
        self, harness: ContractHarness
    ) -> None:
        a, b = two_pools(harness)
        request_id = new_request_id()
        first = {i.instance_id for i in launch(harness, [a, b], 2, request_id=request_id).instances}
        harness.settle()
        harness.forget_idempotency_tokens()
        again = launch(harness, [a, b], 2, request_id=request_id)
        assert {i.instance_id for i in again.instances} == first
        harness.settle()
        assert listed_ids(harness) == first, "the request-id lookup did not prevent a duplicate"
        harness.forget_idempotency_tokens()
        more = launch(harness, [a, b], 3, request_id=request_id)
        ids = {i.instance_id for i in more.instances}
        assert len(ids) == 3 and first <= ids
        harness.settle()
        assert listed_ids(harness) == ids

    @pytest.mark.parametrize("tokens", ["kept", "forgotten"])
    def test_relaunch_after_a_crash_before_the_answer_was_recorded(
        self, harness: ContractHarness, tokens: str
    ) -> None:
        a, b = two_pools(harness)
        request = LaunchRequest(
            request_id=new_request_id(),
            cluster_id=harness.cluster_id,
            offerings=(a, b),
            count=3,
        )
        harness.provider.launch(request)  # the controller dies before it records the answer
        if tokens == "forgotten":
            harness.settle()
            harness.forget_idempotency_tokens()
        restarted = harness.restarted_provider()
        again = restarted.launch(request)  # the recorded intent, re-issued after the restart
        ids = {i.instance_id for i in again.instances}
        assert len(ids) == 3 and again.fulfilled
        for instance in again.instances:
            assert_owned(instance, harness, request.request_id)
        harness.settle()
        assert listed_ids(harness) == ids, "the re-issued launch duplicated instances"
        assert {i.instance_id for i in restarted.list_instances(harness.cluster_id)} == ids

    def test_distinct_requests_launch_distinct_instances(self, harness: ContractHarness) -> None:
        a, _ = two_pools(harness)
        first = launch(harness, [a], 1)
        second = launch(harness, [a], 1)
        assert first.instances[0].instance_id != second.instances[0].instance_id
        harness.settle()
        assert len(listed_ids(harness)) == 2

    # ---------------------------------------------------------------- ownership

    def test_list_never_returns_foreign_instances(self, harness: ContractHarness) -> None:
        a, _ = two_pools(harness)
        foreign_id = harness.add_foreign_instance()
        ours = launch(harness, [a], 1)
        harness.settle()
        assert harness.cloud_has_instance(foreign_id)
        listed = listed_ids(harness)
        assert foreign_id not in listed
        assert listed == {i.instance_id for i in ours.instances}

    def test_list_is_scoped_to_the_cluster(self, harness: ContractHarness) -> None:
        a, _ = two_pools(harness)
        launch(harness, [a], 2)
        harness.settle()
        assert listed_ids(harness, OTHER_CLUSTER_ID) == set()

    def test_terminate_all_listed_spares_the_foreign_instance(
        self, harness: ContractHarness
    ) -> None:
        a, b = two_pools(harness)
        foreign_id = harness.add_foreign_instance()
        launch(harness, [a, b], 3)
        harness.settle()
        ours = listed_ids(harness)
        assert len(ours) == 3
        result = harness.provider.terminate(harness.cluster_id, sorted(ours), new_request_id())
        assert set(result.terminated) == ours
        assert result.refused == () and result.already_gone == ()
        harness.settle()
        assert listed_ids(harness) == set()
        for iid in ours:
            assert not harness.cloud_has_instance(iid)
        assert harness.cloud_has_instance(foreign_id), "the foreign instance was touched"

    def test_terminate_refuses_a_foreign_instance(self, harness: ContractHarness) -> None:
        foreign_id = harness.add_foreign_instance()
        harness.settle()
        result = harness.provider.terminate(harness.cluster_id, [foreign_id], new_request_id())
        assert result.refused == (foreign_id,)
        assert result.terminated == () and result.already_gone == ()
        harness.settle()
        assert harness.cloud_has_instance(foreign_id)

    def test_terminate_refuses_instances_of_our_cluster_asked_by_another(
        self, harness: ContractHarness
    ) -> None:
        a, _ = two_pools(harness)
        ours = {i.instance_id for i in launch(harness, [a], 2).instances}
        harness.settle()
        result = harness.provider.terminate(OTHER_CLUSTER_ID, sorted(ours), new_request_id())
        assert set(result.refused) == ours
        assert result.terminated == ()
        harness.settle()
        assert listed_ids(harness) == ours

    def test_terminate_twice_reports_already_gone(self, harness: ContractHarness) -> None:
        a, _ = two_pools(harness)
        ids = sorted(i.instance_id for i in launch(harness, [a], 2).instances)
        harness.settle()
        first = harness.provider.terminate(harness.cluster_id, ids, new_request_id())
        assert sorted(first.terminated) == ids
        harness.settle()
        second = harness.provider.terminate(harness.cluster_id, ids, new_request_id())
        assert sorted(second.already_gone) == ids
        assert second.terminated == () and second.refused == ()

    def test_terminate_mixed_batch_sorts_each_id(self, harness: ContractHarness) -> None:
        a, _ = two_pools(harness)
        foreign_id = harness.add_foreign_instance()
        gone, live = (i.instance_id for i in launch(harness, [a], 2).instances)
        harness.settle()
        harness.provider.terminate(harness.cluster_id, [gone], new_request_id())
        harness.settle()
        result = harness.provider.terminate(
            harness.cluster_id, [gone, live, foreign_id], new_request_id()
        )
        assert result.terminated == (live,)
        assert result.already_gone == (gone,)
        assert result.refused == (foreign_id,)

    # ----------------------------------------------------------------- capacity

    def test_exhausted_pool_reports_a_typed_capacity_error(self, harness: ContractHarness) -> None:
        a, _ = two_pools(harness)
        harness.exhaust_pool(a)
        before = harness.cloud_launch_calls(a.key)
        result = launch(harness, [a], 2)
        assert result.instances == ()
        assert not result.fulfilled
        assert harness.cloud_launch_calls(a.key) > before, "the cloud was asked once"
        assert [e.offering_key for e in result.errors] == [a.key]
        assert isinstance(result.errors[0].error, InsufficientCapacityError)

    def test_exhausted_pool_is_not_retried_and_the_other_pool_fills(
        self, harness: ContractHarness
    ) -> None:
        a, b = two_pools(harness)
        harness.exhaust_pool(a)
        launch(harness, [a], 1)  # the cloud reports no capacity; the provider marks the pool
        calls_a = harness.cloud_launch_calls(a.key)
        result = launch(harness, [a, b], 2)
        assert harness.cloud_launch_calls(a.key) == calls_a, "a dry pool was retried in place"
        assert result.fulfilled and len(result.instances) == 2
        assert {i.offering_key for i in result.instances} == {b.key}
        errors = {e.offering_key: e.error for e in result.errors}
        assert set(errors) == {a.key}, "the skipped pool is still reported"
        assert isinstance(errors[a.key], InsufficientCapacityError)

    def test_first_launch_into_a_dry_pool_fills_from_the_other(
        self, harness: ContractHarness
    ) -> None:
        a, b = two_pools(harness)
        harness.exhaust_pool(a)
        calls_a = harness.cloud_launch_calls(a.key)
        result = launch(harness, [a, b], 2)
        assert result.fulfilled and len(result.instances) == 2
        assert {i.offering_key for i in result.instances} == {b.key}
        errors = {e.offering_key: e.error for e in result.errors}
        assert b.key not in errors
        if harness.cloud_launch_calls(a.key) > calls_a:
            # The provider's strategy tried the dry pool: it must say so, typed.
            assert isinstance(errors.get(a.key), InsufficientCapacityError)
        harness.settle()
        assert listed_ids(harness) == {i.instance_id for i in result.instances}

    # ------------------------------------------------------------ invalid input

    @pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
    def test_invalid_request_is_rejected_before_any_call(
        self, harness: ContractHarness, case: str
    ) -> None:
        catalogue = list(harness.provider.offerings())  # a provider may fetch its catalogue once
        request = BAD_REQUESTS[case](harness.offerings_for_test(), catalogue, harness.cluster_id)
        calls = harness.cloud_calls()
        with pytest.raises(InvalidRequestError):
            harness.provider.launch(request)
        assert harness.cloud_calls() == calls, "a cloud call was made for an invalid request"
        harness.settle()
        assert listed_ids(harness) == set()

    # ------------------------------------------------------------ interruptions

    def test_injected_preemption_yields_a_notice(self, harness: ContractHarness) -> None:
        a, _ = two_pools(harness)
        (instance,) = launch(harness, [a], 1).instances
        harness.settle()
        harness.inject_preemption(instance.instance_id)
        harness.settle()
        notices = [
            n
            for n in harness.provider.interruptions(harness.cluster_id)
            if n.instance_id == instance.instance_id
        ]
        assert notices, "no interruption notice for a preempted instance"
        for notice in notices:
            assert isinstance(notice, InterruptionNotice)
            assert notice.kind in {
                InterruptionKind.SPOT_INTERRUPTION,
                InterruptionKind.PREEMPTED,
                InterruptionKind.TERMINATED,
            }
            assert notice.source
            assert notice.deadline_s is None or notice.deadline_s > 0

    def test_interruptions_are_drained(self, harness: ContractHarness) -> None:
        a, _ = two_pools(harness)
        (instance,) = launch(harness, [a], 1).instances
        harness.settle()
        assert list(harness.provider.interruptions(harness.cluster_id)) == []
        harness.inject_preemption(instance.instance_id)
        harness.settle()
        first = harness.provider.interruptions(harness.cluster_id)
        assert any(n.instance_id == instance.instance_id for n in first)
        harness.settle()
        again = harness.provider.interruptions(harness.cluster_id)
        assert not any(
            n.instance_id == instance.instance_id and n.kind == first[0].kind for n in again
        ), "the same notice was reported twice"

    def test_interruptions_ignore_foreign_instances(self, harness: ContractHarness) -> None:
        foreign_id = harness.add_foreign_instance()
        harness.settle()
        harness.inject_preemption(foreign_id)
        harness.settle()
        notices = harness.provider.interruptions(harness.cluster_id)
        assert all(n.instance_id != foreign_id for n in notices)
