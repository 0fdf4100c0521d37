"""The controller under faults: capacity errors, dead agents, a lost or damaged store, foreign
instances, failed jobs. Real store files, the behavioural fake cloud, an injected clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.controller.errors import StoreError, StoreMissingError, UnknownFleetError
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import FakeClock
from providers.fake import FakeProvider
from tests.controller.fakes import fake_controller

CLUSTER = "faults1"


def _world(
    tmp_path: Path, jobs: int = 2, **reconcile: object
) -> tuple[Store, FakeProvider, FakeClock, Controller]:
    return fake_controller(tmp_path, CLUSTER, jobs=jobs, **reconcile)


def _heartbeat(store: Store, clock: FakeClock, skip: str | None = None) -> None:
    for row in store.list_instances(statuses=(InstanceStatus.RUNNING,)):
        if row.instance_key != skip:
            store.record_heartbeat(row.instance_key, clock.now_s())


def test_capacity_error_reroutes_the_next_round_and_never_hot_loops(tmp_path: Path) -> None:
    # The pool the sizing buys from first, found on an identical world; then it runs dry.
    probe_store, _, _, probe = _world(tmp_path / "probe")
    probe.run_round()
    first_pool = probe_store.list_instances()[0].offering_key
    store, cloud, clock, ctl = _world(tmp_path)
    cloud.set_capacity(first_pool, 0)
    per_round = []
    for _ in range(8):
        report = ctl.run_round()
        per_round.append(report.cloud_calls)
        clock.advance(30.0)  # 8 rounds = 4 min: the 3 min mark expires once
    dry = cloud.call_count("launch", pool=first_pool)
    assert 1 <= dry <= 2, f"the dry pool was tried {dry} times in 8 rounds"
    rows = store.list_instances()
    failed = [r for r in rows if r.offering_key == first_pool]
    assert failed and all(r.status is InstanceStatus.ALLOCATION_FAILED for r in failed)
    placed = [r for r in rows if r.status is InstanceStatus.RUNNING]
    assert placed and all(r.offering_key != first_pool for r in placed)  # rerouted
    cfg = ctl.config.reconcile
    bound = 2 + cfg.max_in_flight + 2 * cfg.disruption_budget
    assert max(per_round) <= bound, per_round


def test_an_agent_that_stops_heartbeating_is_replaced(tmp_path: Path) -> None:
    store, cloud, clock, ctl = _world(tmp_path, heartbeat_timeout_s=120.0, boot_grace_s=300.0)
    for _ in range(3):
        ctl.run_round()
        clock.advance(60.0)
        _heartbeat(store, clock)
    running = store.list_instances(statuses=(InstanceStatus.RUNNING,))
    before = len(running)
    dead = running[0]
    for _ in range(6):
        ctl.run_round()
        clock.advance(60.0)
        _heartbeat(store, clock, skip=dead.instance_key)
    row = store.get_instance(dead.instance_key)
    assert row.status in (InstanceStatus.TERMINATING, InstanceStatus.TERMINATED)
    assert "agent stopped heartbeating" in [h.reason for h in store.history(row.instance_key)]
    assert dead.provider_instance_id not in {i.instance_id for i in cloud.list_instances(CLUSTER)}
    live = store.list_instances(statuses=(InstanceStatus.RUNNING,))
    assert len(live) >= before and dead.instance_key not in {r.instance_key for r in live}
    assert all(key != dead.instance_key for _, key in store.list_assignments())


def test_a_deleted_store_stops_the_round_before_any_cloud_call(tmp_path: Path) -> None:
    _, cloud, _, ctl = _world(tmp_path)
    ctl.run_round()
    calls = len(cloud.calls)
    (tmp_path / "store.db").unlink()
    with pytest.raises(StoreMissingError, match="deleted or replaced"):
        ctl.run_round()
    assert len(cloud.calls) == calls


def test_a_corrupted_store_touches_no_instance(tmp_path: Path) -> None:
    """After the damage a controller is started as ``coadapt up`` starts one (the service's
    own store opening): on the damaged store it cannot start; on the new store the refusal
    points to (``--new-store``) it runs a round, which refuses the fleet it has never seen.
    Neither launches, terminates or changes an instance, and the damaged file is kept."""
    from autoscaler.controller.service import ServiceError, _open_store

    store, cloud, clock, ctl = _world(tmp_path)
    ctl.run_round()
    clock.advance(60.0)
    ctl.run_round()
    store.close()
    before = sorted(i.instance_id for i in cloud.list_instances(CLUSTER))
    assert before
    path = tmp_path / "store.db"
    data = bytearray(path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the header page's b-tree, overwritten
    path.write_bytes(bytes(data))
    calls = len(cloud.calls)
    with pytest.raises(StoreError, match=str(path)):
        Store.open(path, clock)
    with pytest.raises(ServiceError, match="--new-store"):
        _open_store(tmp_path, CLUSTER, clock, new_store=False)
    fresh = _open_store(tmp_path, CLUSTER, clock, new_store=True)
    restarted = Controller(fresh, cloud.restarted(), clock, ControllerConfig(CLUSTER))
    with pytest.raises(UnknownFleetError, match="never seen"):
        restarted.run_round()
    mutating = [c.op for c in cloud.calls[calls:] if c.op not in ("list", "interruptions")]
    assert mutating == [], mutating
    assert sorted(i.instance_id for i in cloud.list_instances(CLUSTER)) == before
    assert [p.name for p in tmp_path.glob("store.db.*.aside")], "the damaged store is kept"


def test_a_new_store_facing_an_existing_fleet_refuses_to_touch_it(tmp_path: Path) -> None:
    store, cloud, clock, ctl = _world(tmp_path)
    ctl.run_round()
    ctl.run_round()
    held = sorted(i.instance_id for i in cloud.list_instances(CLUSTER))
    assert held
    store.close()
    (tmp_path / "store.db").unlink()
    fresh = Store.create(tmp_path / "store.db", CLUSTER, clock)  # the store was lost
    ctl2 = Controller(fresh, cloud.restarted(), clock, ControllerConfig(CLUSTER))
    with pytest.raises(UnknownFleetError, match="never seen"):
        ctl2.run_round()
    assert cloud.call_count("terminate") == 0 and cloud.call_count("launch") <= len(held)
    assert sorted(i.instance_id for i in cloud.list_instances(CLUSTER)) == held


def test_foreign_instances_are_never_touched_across_restarts(tmp_path: Path) -> None:
    store, cloud, clock, ctl = _world(tmp_path)
    foreign = cloud.add_foreign_instance()
    other = cloud.add_foreign_instance(tags={"coadapt-cluster-id": "someone-else"})
    for _ in range(3):
        ctl.run_round()
        clock.advance(60.0)
    restarted = Controller(store, cloud.restarted(), clock, ctl.config)
    restarted.run_round()
    assert restarted.down().clean
    assert cloud.instance_state(foreign) is not None and cloud.instance_state(other) is not None
    assert str(cloud.instance_state(foreign)) == "running" == str(cloud.instance_state(other))
    assert all(foreign not in (r.provider_instance_id or "") for r in store.list_instances())


def test_down_releases_everything_and_confirms_by_listing(tmp_path: Path) -> None:
    store, cloud, clock, ctl = _world(tmp_path)
    for _ in range(3):
        ctl.run_round()
        clock.advance(60.0)
    assert cloud.list_instances(CLUSTER)
    report = ctl.down()
    assert report.clean and cloud.list_instances(CLUSTER) == []
    statuses = {r.status for r in store.list_instances()}
    assert statuses <= {InstanceStatus.TERMINATED, InstanceStatus.ALLOCATION_FAILED}
    assert store.list_assignments() == {}
    assert {j.status for j in store.list_jobs()} <= {JobStatus.QUEUED, JobStatus.RUNNING}


def test_every_instance_that_ran_is_billed_at_its_price(tmp_path: Path) -> None:
    store, cloud, clock, ctl = _world(tmp_path)
    for _ in range(3):
        ctl.run_round()
        clock.advance(60.0)
    victim = store.list_instances(statuses=(InstanceStatus.RUNNING,))[0]
    assert victim.provider_instance_id is not None
    cloud.preempt(victim.provider_instance_id, notice_s=0.0)
    ctl.run_round()
    assert ctl.down().clean
    ran = [r for r in store.list_instances() if r.provider_instance_id is not None]
    records = {c.instance_key: c for c in store.cost_records()}
    assert set(records) == {r.instance_key for r in ran}
    for r in ran:
        c = records[r.instance_key]
        assert c.price_usd_per_hour == r.price_usd_per_hour
        assert c.usd == pytest.approx(r.price_usd_per_hour * max(60.0, c.end_s - c.start_s) / 3600)
    assert store.total_cost_usd() == pytest.approx(sum(c.usd for c in records.values()))
    assert store.prices(victim.offering_key), "offering prices are recorded"
