"""The leader lease and its fencing epoch, on both back ends (a real SQLite file and a real
PostgreSQL server): one holder at a time, renewal, takeover after expiry, every write of a
deposed leader refused inside its own transaction (and counted), a deposed controller's
round stopped before any launch or terminate reaches the cloud."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.controller.errors import FencedError
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.leader import Election, leader_state
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import Store
from autoscaler.decide.sizing import SizingConfig
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import FakeClock
from providers.fake import FakeProvider

ROOT = Path(__file__).resolve().parents[2]
SHORT_S = 0.3  # a lease short enough to expire in a test, on either clock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start_s=1_700_000_000.0)


@pytest.fixture
def stores(store_location: Path | str, clock: FakeClock) -> Iterator[tuple[Store, Store]]:
    """Two store objects on one store: two controllers' connections."""
    a = Store.create(store_location, "lease1", clock)
    b = Store.open(store_location, clock)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _expire(clock: FakeClock) -> None:
    """Past a SHORT_S lease on either clock (the injected one on SQLite, the server's on
    PostgreSQL)."""
    clock.advance(SHORT_S + 1.0)
    time.sleep(SHORT_S + 0.1)


def test_one_holder_at_a_time_renewed_at_its_epoch_taken_after_expiry(
    stores: tuple[Store, Store], clock: FakeClock
) -> None:
    a, b = stores
    assert a.lease() is None and leader_state(a).holder is None
    first = a.acquire_lease("a", SHORT_S)
    assert (first.holder, first.epoch) == ("a", 1)
    assert b.acquire_lease("b", SHORT_S).holder == "a"  # held: left to its holder
    renewed = a.acquire_lease("a", SHORT_S)
    assert (renewed.holder, renewed.epoch) == ("a", 1)
    assert renewed.expires_at_s >= first.expires_at_s
    assert leader_state(b, "a").leading and not leader_state(b, "b").leading
    _expire(clock)
    taken = b.acquire_lease("b", SHORT_S)
    assert (taken.holder, taken.epoch) == ("b", 2)
    assert taken.acquired_at_s >= first.expires_at_s
    assert a.acquire_lease("a", SHORT_S).holder == "b"
    state = leader_state(a, "b")
    assert (state.leading, state.holder, state.epoch) == (True, "b", 2)
    assert state.since_s == taken.acquired_at_s
    b.release_lease("b")  # a leader that stops: taken at the next try, not a lease later
    assert a.acquire_lease("a", SHORT_S).epoch == 3


def test_take_leads_at_once_and_bad_arguments_are_refused(stores: tuple[Store, Store]) -> None:
    a, b = stores
    a.acquire_lease("a", 60.0)
    assert b.acquire_lease("b", 60.0, take=True).holder == "b"
    for bad in (0.0, -1.0, float("inf"), float("nan"), 3601.0):
        with pytest.raises(InvalidInputError):
            a.acquire_lease("a", bad)
    with pytest.raises(InvalidInputError):
        a.acquire_lease("x" * 201, 1.0)


def _instance(store: Store, key: str) -> None:
    store.add_instance(
        instance_key=key,
        request_id=f"lease1-{key}",
        offering_key="fake/g4dn.xlarge/us-east-1a/spot",
        provider="fake",
        instance_type="g4dn.xlarge",
        zone="us-east-1a",
        market="spot",
        gpu_type="T4",
        gpus=1,
        price_usd_per_hour=0.2,
    )


def test_a_deposed_leaders_writes_are_refused_in_their_own_transaction_and_counted(
    stores: tuple[Store, Store], clock: FakeClock
) -> None:
    a, b = stores
    lead_a = Election(a, "a", SHORT_S)
    lead_a.try_lead()
    assert a.fenced_epoch == 1
    _instance(a, "i-1")  # the leader writes
    a.check_fence()
    _expire(clock)
    assert Election(b, "b", SHORT_S).try_lead().epoch == 2
    with pytest.raises(FencedError) as refused:
        _instance(a, "i-2")
    assert (refused.value.epoch, refused.value.current_epoch) == (1, 2)
    assert refused.value.holder == "b"
    with pytest.raises(FencedError):
        a.check_fence()
    with pytest.raises(FencedError):
        a.add_events([(clock.now_s(), "launch", "i-3", "x")])
    assert [r.instance_key for r in b.list_instances()] == ["i-1"]  # nothing of it written
    assert leader_state(b).refused_writes == 3
    api = a.for_thread()  # the API's store objects are never fenced
    try:
        _instance(api, "i-4")
    finally:
        api.close()
    # Woken up, the deposed process tries the lease again: it stands by, its store unfenced.
    assert lead_a.try_lead().holder == "b" and not lead_a.leading
    assert a.fenced_epoch is None


_RACE = """
import json, sys, time
from autoscaler.controller.store import Store
from coadapt_common.clock import SystemClock
store = Store.open(sys.argv[1], SystemClock())
while time.time() < float(sys.argv[3]):
    time.sleep(0.001)
lease = store.acquire_lease(sys.argv[2], 30.0)
print(json.dumps([lease.holder, lease.epoch]))
"""


def test_processes_racing_for_a_free_lease_agree_on_one_holder(
    store_location: Path | str, clock: FakeClock
) -> None:
    Store.create(store_location, "lease1", clock).close()
    start = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE, str(store_location), f"p{i}", str(start)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    seen = {tuple(json.loads(p.communicate(timeout=60)[0])) for p in procs}
    assert len(seen) == 1, seen  # every process saw the same holder at epoch 1
    ((holder, epoch),) = seen
    assert epoch == 1 and holder in {"p0", "p1", "p2", "p3"}


def test_a_deposed_controllers_round_stops_before_any_launch_reaches_the_cloud(
    store_location: Path | str, clock: FakeClock
) -> None:
    store = Store.create(store_location, "lease1", clock)
    other = Store.open(store_location, clock)
    try:
        for i in range(2):
            spec = JobSubmission(
                f"job-{i}", 128, 1024, 128, 32, application="cifar10", command=("train.py",)
            )
            store.add_job(spec.name, spec.to_json())
        cloud = FakeProvider(clock=clock)
        config = ControllerConfig(
            "lease1",
            sizing=SizingConfig(max_instances=4),
            reconcile=ReconcileConfig(heartbeat_timeout_s=None),
        )
        Election(store, "a", SHORT_S).try_lead()
        led = Controller(store, cloud, clock, config)
        led.run_round()  # the leader launches for its queued jobs
        launched = [c for c in cloud.calls if c.op == "launch"]
        assert launched
        rows_before = {r.instance_key: r.version for r in other.list_instances()}
        spec = JobSubmission("job-2", 128, 1024, 128, 32, application="cifar10",
                             command=("train.py",))  # fmt: skip
        other.add_job(spec.name, spec.to_json())  # more work: the next round would act
        _expire(clock)
        Election(other, "b", SHORT_S).try_lead()  # a standby takes the expired lease
        cloud.calls.clear()
        with pytest.raises(FencedError):
            led.run_round()
        acted = [c.op for c in cloud.calls if c.op in ("launch", "terminate")]
        assert acted == [], cloud.calls
        assert {r.instance_key: r.version for r in other.list_instances()} == rows_before
        assert leader_state(other).refused_writes >= 1
    finally:
        store.close()
        other.close()
