"""Behaviour of ``FakeProvider`` beyond the shared contract: what tests and the simulator steer."""

from __future__ import annotations

import pytest

from coadapt_common.clock import FakeClock
from providers.base import (
    InstanceState,
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
    QuotaExceededError,
    TransientError,
)
from providers.fake import FakeProvider, default_capacity, default_offerings
from providers.retry import RetryPolicy
from providers.tags import CLUSTER_ID_TAG, ownership_tags

CLUSTER = "c1"


def pool(provider: FakeProvider, itype: str, zone: str, market: Market = Market.SPOT) -> Offering:
    return next(
        o
        for o in provider.offerings()
        if (o.instance_type, o.zone, o.market) == (itype, zone, market)
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake(clock: FakeClock) -> FakeProvider:
    return FakeProvider(clock=clock)


@pytest.fixture
def a(fake: FakeProvider) -> Offering:
    return pool(fake, "g4dn.xlarge", "us-east-1a")


@pytest.fixture
def b(fake: FakeProvider) -> Offering:
    return pool(fake, "g4dn.xlarge", "us-east-1b")


def req(rid: str, offerings: list[Offering], count: int, cluster: str = CLUSTER) -> LaunchRequest:
    return LaunchRequest(rid, cluster, tuple(offerings), count)


# ----------------------------------------------------------------- catalogue


def test_default_catalogue_is_realistic() -> None:
    offerings = default_offerings()
    assert len(offerings) == 16
    assert {o.instance_type for o in offerings} == {
        "g4dn.xlarge",
        "g4dn.12xlarge",
        "g5.xlarge",
        "p4d.24xlarge",
    }
    assert {o.zone for o in offerings} == {"us-east-1a", "us-east-1b"}
    by_key = {(o.instance_type, o.zone, o.market): o for o in offerings}
    for (itype, zone, market), o in by_key.items():
        assert o.price_usd_per_hour is not None
        if market is Market.SPOT:
            on_demand = by_key[(itype, zone, Market.ON_DEMAND)]
            assert on_demand.price_usd_per_hour is not None
            assert 0.2 < o.price_usd_per_hour / on_demand.price_usd_per_hour < 0.5
    assert by_key[("p4d.24xlarge", "us-east-1a", Market.ON_DEMAND)].gpus == 8


def test_fake_satisfies_the_provider_protocol(fake: FakeProvider) -> None:
    assert isinstance(fake, Provider)


def test_catalogue_of_another_provider_is_refused() -> None:
    with pytest.raises(InvalidRequestError):
        FakeProvider(default_offerings("aws"))
    assert FakeProvider(default_offerings("aws"), name="aws").name == "aws"


def test_default_capacity_makes_a100s_scarce(clock: FakeClock) -> None:
    fake = FakeProvider(capacity=default_capacity(), clock=clock)
    p4d = pool(fake, "p4d.24xlarge", "us-east-1a")
    result = fake.launch(req("r1", [p4d], 5))
    assert len(result.instances) == 2
    assert isinstance(result.errors[0].error, InsufficientCapacityError)


def test_spot_price_changes_show_in_offerings_and_prices(fake: FakeProvider, a: Offering) -> None:
    fake.set_spot_price("g4dn.xlarge", "us-east-1a", 0.42)
    assert pool(fake, "g4dn.xlarge", "us-east-1a").price_usd_per_hour == 0.42
    prices = {(p.instance_type, p.zone): p.price_usd_per_hour for p in fake.spot_prices()}
    assert prices[("g4dn.xlarge", "us-east-1a")] == 0.42
    assert prices[("g4dn.xlarge", "us-east-1b")] != 0.42
    launched = fake.launch(req("r1", [a], 1))  # stale prices in the request are fine
    assert len(launched.instances) == 1
    with pytest.raises(InvalidRequestError):
        fake.set_spot_price("g4dn.xlarge", "nowhere-1a", 0.1)


# ------------------------------------------------------------------ capacity


def test_a_pool_running_dry_fills_what_remains_then_moves_on(
    fake: FakeProvider, a: Offering, b: Offering
) -> None:
    fake.set_capacity(a.key, 3)
    result = fake.launch(req("r1", [a, b], 5))
    assert [i.offering_key for i in result.instances] == [a.key] * 3 + [b.key] * 2
    assert [e.offering_key for e in result.errors] == [a.key]
    assert isinstance(result.errors[0].error, InsufficientCapacityError)
    assert fake.unavailable.is_unavailable(a.key)
    assert fake.remaining_capacity(a.key) == 0


def test_a_marked_pool_is_skipped_until_the_mark_expires(
    fake: FakeProvider, clock: FakeClock, a: Offering, b: Offering
) -> None:
    fake.set_capacity(a.key, 0)
    fake.launch(req("r1", [a], 1))
    assert fake.call_count("launch", pool=a.key) == 1
    fake.set_capacity(a.key, None)  # capacity came back, but the provider does not know yet
    skipped = fake.launch(req("r2", [a, b], 1))
    assert fake.call_count("launch", pool=a.key) == 1
    assert skipped.errors[0].error.code == "skipped-unavailable"
    assert [i.offering_key for i in skipped.instances] == [b.key]
    clock.advance(180.0)
    again = fake.launch(req("r3", [a, b], 1))
    assert fake.call_count("launch", pool=a.key) == 2
    assert [i.offering_key for i in again.instances] == [a.key]
    assert again.errors == ()


def test_terminated_and_preempted_instances_give_capacity_back(
    fake: FakeProvider, clock: FakeClock, a: Offering
) -> None:
    fake.set_capacity(a.key, 2)
    first, second = fake.launch(req("r1", [a], 2)).instances
    assert fake.remaining_capacity(a.key) == 0
    fake.terminate(CLUSTER, [first.instance_id], "t1")
    fake.preempt(second.instance_id, notice_s=30.0)
    assert fake.remaining_capacity(a.key) == 1
    clock.advance(30.0)
    assert fake.list_instances(CLUSTER) == []
    assert fake.remaining_capacity(a.key) == 2


def test_foreign_instances_use_capacity(fake: FakeProvider, a: Offering) -> None:
    fake.set_capacity(a.key, 1)
    fake.add_foreign_instance(a)
    result = fake.launch(req("r1", [a], 1))
    assert result.instances == ()
    assert isinstance(result.errors[0].error, InsufficientCapacityError)


# ------------------------------------------------------------ injected errors


def test_a_transient_launch_error_is_retried_with_backoff(
    fake: FakeProvider, clock: FakeClock, a: Offering
) -> None:
    fake.next_error("launch", TransientError("RequestLimitExceeded", code="RequestLimitExceeded"))
    result = fake.launch(req("r1", [a], 2))
    assert result.fulfilled and result.errors == ()
    assert fake.call_count("launch", pool=a.key) == 2
    assert len(clock.sleeps) == 1


def test_persistent_transient_errors_become_a_pool_error(
    clock: FakeClock, a: Offering, b: Offering
) -> None:
    fake = FakeProvider(clock=clock, retry_policy=RetryPolicy(max_attempts=3))
    for _ in range(3):
        fake.next_error("launch", TransientError("503"))
    result = fake.launch(req("r1", [a, b], 1))
    assert [e.offering_key for e in result.errors] == [a.key]
    assert isinstance(result.errors[0].error, TransientError)
    assert not fake.unavailable.is_unavailable(a.key), "only capacity errors mark a pool"
    assert [i.offering_key for i in result.instances] == [b.key]


def test_quota_error_is_reported_per_pool_without_a_mark(
    fake: FakeProvider, a: Offering, b: Offering
) -> None:
    fake.next_error("launch", QuotaExceededError("VcpuLimitExceeded", code="VcpuLimitExceeded"))
    result = fake.launch(req("r1", [a, b], 2))
    assert isinstance(result.errors[0].error, QuotaExceededError)
    assert not fake.unavailable.is_unavailable(a.key)
    assert len(result.instances) == 2


def test_injected_capacity_error_marks_the_pool(fake: FakeProvider, a: Offering) -> None:
    fake.next_error("launch", InsufficientCapacityError("ICE"))
    result = fake.launch(req("r1", [a], 1))
    assert result.instances == ()
    assert fake.unavailable.is_unavailable(a.key)


def test_auth_errors_are_raised(fake: FakeProvider, a: Offering) -> None:
    fake.next_error("launch", AuthError("expired token"))
    with pytest.raises(AuthError):
        fake.launch(req("r1", [a], 1))


def test_errors_are_one_shot_and_per_op(fake: FakeProvider, a: Offering) -> None:
    fake.next_error("list", AuthError("denied"))
    fake.launch(req("r1", [a], 1))  # a launch does not consume the list error
    with pytest.raises(AuthError):
        fake.list_instances(CLUSTER)
    assert len(fake.list_instances(CLUSTER)) == 1


def test_transient_errors_on_list_and_terminate_are_retried(
    fake: FakeProvider, a: Offering
) -> None:
    (inst,) = fake.launch(req("r1", [a], 1)).instances
    fake.next_error("list", TransientError("503"))
    assert len(fake.list_instances(CLUSTER)) == 1
    fake.next_error("terminate", TransientError("503"))
    assert fake.terminate(CLUSTER, [inst.instance_id], "t1").terminated == (inst.instance_id,)
    assert fake.call_count("list") == 2 and fake.call_count("terminate") == 2


def test_unknown_ops_and_non_provider_errors_are_refused(fake: FakeProvider) -> None:
    with pytest.raises(ValueError):
        fake.next_error("reboot", TransientError("x"))
    with pytest.raises(TypeError):
        fake.next_error("launch", RuntimeError("x"))  # type: ignore[arg-type]


# --------------------------------------------------------------- preemption


def test_preemption_notice_then_termination_at_the_deadline(
    fake: FakeProvider, clock: FakeClock, a: Offering
) -> None:
    (inst,) = fake.launch(req("r1", [a], 1)).instances
    t0 = clock.now_s()
    notice = fake.preempt(inst.instance_id, notice_s=120.0)
    assert notice.deadline_s == t0 + 120.0
    assert notice.kind is InterruptionKind.SPOT_INTERRUPTION
    assert fake.interruptions(CLUSTER) == [notice]
    assert fake.interruptions(CLUSTER) == []
    clock.advance(119.0)
    assert [i.state for i in fake.list_instances(CLUSTER)] == [InstanceState.RUNNING]
    clock.advance(1.0)
    assert fake.list_instances(CLUSTER) == []
    assert fake.instance_state(inst.instance_id) is InstanceState.TERMINATED
    gone = fake.terminate(CLUSTER, [inst.instance_id], "t1")
    assert gone.already_gone == (inst.instance_id,)


def test_zero_notice_preemption_is_immediate(fake: FakeProvider, a: Offering) -> None:
    (inst,) = fake.launch(req("r1", [a], 1)).instances
    fake.preempt(inst.instance_id, notice_s=0.0)
    assert fake.list_instances(CLUSTER) == []
    with pytest.raises(InstanceNotFoundError):
        fake.preempt(inst.instance_id)


def test_rebalance_has_no_deadline_and_keeps_the_instance(
    fake: FakeProvider, clock: FakeClock, a: Offering
) -> None:
    (inst,) = fake.launch(req("r1", [a], 1)).instances
    notice = fake.rebalance(inst.instance_id)
    assert notice.kind is InterruptionKind.REBALANCE and notice.deadline_s is None
    clock.advance(3600.0)
    assert [i.instance_id for i in fake.list_instances(CLUSTER)] == [inst.instance_id]
    assert fake.interruptions(CLUSTER) == [notice]


def test_notices_go_to_the_owning_cluster_only(fake: FakeProvider, a: Offering) -> None:
    (mine,) = fake.launch(req("r1", [a], 1, cluster="c1")).instances
    (theirs,) = fake.launch(req("r2", [a], 1, cluster="c2")).instances
    fake.preempt(mine.instance_id)
    fake.preempt(theirs.instance_id)
    assert [n.instance_id for n in fake.interruptions("c2")] == [theirs.instance_id]
    assert [n.instance_id for n in fake.interruptions("c1")] == [mine.instance_id]


# -------------------------------------------------------------- idempotency


def test_same_request_id_with_a_larger_count_creates_only_the_shortfall(
    fake: FakeProvider, a: Offering, b: Offering
) -> None:
    first = fake.launch(req("r1", [a], 2))
    second = fake.launch(req("r1", [b], 5))
    assert second.instances[:2] == first.instances
    assert [i.offering_key for i in second.instances[2:]] == [b.key] * 3
    assert fake.call_count("launch") == 2
    assert fake.call_count("launch", pool=b.key, count=3) == 1
    third = fake.launch(req("r1", [a], 1))  # more exist than asked: nothing created or ended
    assert third.instances == second.instances
    assert fake.call_count("launch") == 2


def test_a_request_that_produced_nothing_can_be_retried(
    fake: FakeProvider, clock: FakeClock, a: Offering
) -> None:
    fake.set_capacity(a.key, 0)
    assert fake.launch(req("r1", [a], 1)).instances == ()
    fake.set_capacity(a.key, None)
    clock.advance(180.0)
    assert len(fake.launch(req("r1", [a], 1)).instances) == 1


def test_request_ids_are_scoped_per_cluster(fake: FakeProvider, a: Offering) -> None:
    one = fake.launch(req("r1", [a], 1, cluster="c1"))
    two = fake.launch(req("r1", [a], 1, cluster="c2"))
    assert one.instances[0].instance_id != two.instances[0].instance_id


# ---------------------------------------------------- lifecycle, paging, reset


def test_instances_boot_then_run(clock: FakeClock, a: Offering) -> None:
    fake = FakeProvider(clock=clock, boot_s=30.0)
    (inst,) = fake.launch(req("r1", [a], 1)).instances
    assert inst.state is InstanceState.PENDING
    clock.advance(30.0)
    assert fake.list_instances(CLUSTER)[0].state is InstanceState.RUNNING


def test_calls_grow_with_pages_not_instances(clock: FakeClock, a: Offering) -> None:
    fake = FakeProvider(clock=clock, page_size=10)
    ids = [i.instance_id for i in fake.launch(req("r1", [a], 25)).instances]
    assert fake.call_count("launch") == 1
    assert len(fake.list_instances(CLUSTER)) == 25
    assert fake.call_count("list") == 3
    result = fake.terminate(CLUSTER, ids, "t1")
    assert len(result.terminated) == 25
    assert fake.call_count("terminate") == 3
    fake.list_instances(CLUSTER)
    assert fake.call_count("list") == 4, "an empty list is one call"


def test_terminated_instances_are_forgotten_after_retention(clock: FakeClock, a: Offering) -> None:
    fake = FakeProvider(clock=clock, terminated_retention_s=60.0)
    (inst,) = fake.launch(req("r1", [a], 1)).instances
    fake.terminate(CLUSTER, [inst.instance_id], "t1")
    assert fake.instance_state(inst.instance_id) is InstanceState.TERMINATED
    clock.advance(61.0)
    assert fake.instance_state(inst.instance_id) is None
    again = fake.terminate(CLUSTER, [inst.instance_id], "t2")
    assert again.already_gone == (inst.instance_id,)


def test_foreign_instance_tagged_for_another_cluster(fake: FakeProvider, a: Offering) -> None:
    iid = fake.add_foreign_instance(a, ownership_tags("c2", "r9"))
    assert [i.instance_id for i in fake.list_instances("c2")] == [iid]
    assert fake.list_instances(CLUSTER) == []
    assert fake.terminate(CLUSTER, [iid], "t1").refused == (iid,)


def test_a_cluster_tag_without_managed_by_is_not_ownership(fake: FakeProvider, a: Offering) -> None:
    iid = fake.add_foreign_instance(a, {CLUSTER_ID_TAG: CLUSTER})
    fake.preempt(iid)
    assert fake.list_instances(CLUSTER) == []
    assert fake.interruptions(CLUSTER) == []
    assert fake.terminate(CLUSTER, [iid], "t1").refused == (iid,)


def test_unknown_ids_are_already_gone(fake: FakeProvider) -> None:
    result = fake.terminate(CLUSTER, ["i-doesnotexist", "i-doesnotexist"], "t1")
    assert result.already_gone == ("i-doesnotexist",)


def test_reset_restores_the_initial_cloud(
    fake: FakeProvider, clock: FakeClock, a: Offering
) -> None:
    fake.set_capacity(a.key, 0)
    fake.set_spot_price("g4dn.xlarge", "us-east-1a", 9.0)
    fake.launch(req("r1", [a], 1))
    fake.next_error("list", AuthError("x"))
    fake.reset()
    assert fake.calls == []
    assert not fake.unavailable.is_unavailable(a.key)
    assert pool(fake, "g4dn.xlarge", "us-east-1a").price_usd_per_hour == a.price_usd_per_hour
    assert fake.list_instances(CLUSTER) == []
    assert len(fake.launch(req("r1", [a], 1)).instances) == 1


def test_thousands_of_instances_stay_cheap(clock: FakeClock, a: Offering) -> None:
    fake = FakeProvider(clock=clock)
    for k in range(20):
        fake.launch(req(f"r{k}", [a], 500))
    listed = fake.list_instances(CLUSTER)
    assert len(listed) == 10_000
    fake.terminate(CLUSTER, [i.instance_id for i in listed], "t1")
    assert fake.list_instances(CLUSTER) == []
    assert len(fake.calls) == 20 + 10 + 10 + 1
