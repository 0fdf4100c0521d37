"""A controller restarted on its store: it takes back the fleet and the jobs' placements as
they are, however long it was away, and only then judges the agents' liveness.

The real store file, the behavioural fake cloud, an injected clock; the agents' heartbeats
are written as the API writes them."""

from __future__ import annotations

from pathlib import Path

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import Store
from autoscaler.decide.sizing import SizingConfig
from coadapt_common.clock import FakeClock
from emulators.reports import synthetic_report
from providers.fake import FakeProvider

CLUSTER = "restart1"
CONFIG = ControllerConfig(
    CLUSTER,
    sizing=SizingConfig(max_instances=4),
    reconcile=ReconcileConfig(heartbeat_timeout_s=120.0, boot_grace_s=300.0),
)


def _live_agents(store: Store, clock: FakeClock) -> None:
    for row in store.list_instances(statuses=(InstanceStatus.RUNNING,)):
        store.record_heartbeat(row.instance_key, clock.now_s())


def _reports(store: Store, clock: FakeClock) -> None:
    placed: dict[str, int] = {}
    for (job, _), gpus in store.list_assignments().items():
        placed[job] = placed.get(job, 0) + gpus
    for job, gpus in placed.items():
        report = synthetic_report(
            job, gpus=gpus, nodes=1, local_bsz=128, step_s=0.2, sync_s=0.02, progress=1.0,
            now_s=clock.now_s(), init_batch_size=128, max_batch_size=1024, grad_var=3.0,
        )  # fmt: skip
        store.add_report(job, report.to_json())


def _world(tmp_path: Path) -> tuple[Store, FakeProvider, FakeClock, Controller]:
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", CLUSTER, clock)
    for i in range(3):
        spec = JobSubmission(
            f"job-{i}", 128, 1024, 128, 32, application="cifar10", command=("train.py",)
        )
        store.add_job(spec.name, spec.to_json())
    cloud = FakeProvider(clock=clock)
    return store, cloud, clock, Controller(store, cloud, clock, CONFIG)


def _settle(ctl: Controller, store: Store, clock: FakeClock) -> dict[tuple[str, str], int]:
    """Rounds (agents alive, trainers reporting) until two in a row leave the placements
    as they were; those placements."""
    before: dict[tuple[str, str], int] = {}
    for _ in range(30):
        ctl.run_round()
        clock.advance(30.0)
        _live_agents(store, clock)
        _reports(store, clock)
        now = store.list_assignments()
        if now and now == before:
            return now
        before = now
    raise AssertionError("the placements never settled")


def test_a_restart_after_a_long_absence_replaces_nothing_and_moves_no_job(tmp_path: Path) -> None:
    store, cloud, clock, ctl = _world(tmp_path)
    placed = _settle(ctl, store, clock)
    assert len({job for job, _ in placed}) == 3
    held = sorted(i.instance_id for i in cloud.list_instances(CLUSTER))
    calls = len(cloud.calls)
    clock.advance(15 * 60.0)  # the controller is away for 15 minutes: no heartbeat reaches it
    again = Controller(store, cloud.restarted(), clock, CONFIG)
    for _ in range(3):  # the agents find it again at once; their jobs keep running
        again.run_round()
        assert store.list_assignments() == placed
        clock.advance(30.0)
        _live_agents(store, clock)
    assert sorted(i.instance_id for i in cloud.list_instances(CLUSTER)) == held
    made = {c[0] for c in cloud.calls[calls:]}
    assert not made & {"launch", "terminate"}, made
    history = [h.reason for r in store.list_instances() for h in store.history(r.instance_key)]
    assert "agent stopped heartbeating" not in history


def test_after_a_restart_a_dead_agent_is_still_found_dead(tmp_path: Path) -> None:
    store, cloud, clock, ctl = _world(tmp_path)
    _settle(ctl, store, clock)
    clock.advance(15 * 60.0)
    again = Controller(store, cloud.restarted(), clock, CONFIG)
    again.run_round()
    assert not store.list_instances(statuses=(InstanceStatus.TERMINATING,))
    running = sorted(
        r.instance_key for r in store.list_instances(statuses=(InstanceStatus.RUNNING,))
    )
    dead, alive = running[0], running[1:]
    for _ in range(6):  # one agent never calls again: 3 minutes past the restart
        clock.advance(30.0)
        for key in alive:
            store.record_heartbeat(key, clock.now_s())
        again.run_round()
    assert "agent stopped heartbeating" in [h.reason for h in store.history(dead)]
    for key in alive:
        assert "agent stopped heartbeating" not in [h.reason for h in store.history(key)]


def test_after_a_restart_no_agent_heard_at_all_is_suspected_before_released(
    tmp_path: Path,
) -> None:
    """Every agent silent at once (the controller's network, not the fleet, is the likelier
    culprit: liveness.mass_silence): none is released within the hold, then one a round."""
    store, cloud, clock, ctl = _world(tmp_path)
    _settle(ctl, store, clock)
    clock.advance(15 * 60.0)
    started = clock.now_s()
    again = Controller(store, cloud.restarted(), clock, CONFIG)
    hold = CONFIG.reconcile.mass_silence_hold_s
    while clock.now_s() - started < hold - 30:
        report = again.run_round()
        assert not report.actions.terminate
        clock.advance(30.0)
    released = 0
    for _ in range(4):
        clock.advance(30.0)
        released += len(again.run_round().actions.terminate)
    assert 1 <= released <= 4
