"""Boot-aware fleets (issue 40, item 2): an instance is launched, then booting, then ready
(the cloud lists it running and its agent is heard), and only a ready instance is given a
job; a ready instance that runs no job and that the plan drops is released in that round.
The controller's own round over a real SQLite store and the fake cloud, whose instances boot
in a set time; the same round runs in every simulation."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from autoscaler.controller.events import EventKind, EventRecorder
from autoscaler.controller.hold import HoldConfig
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import BootPhase, InstanceStatus, boot_phase
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import EMPTY_RELEASE_REASON, ReconcileConfig
from autoscaler.controller.store import JobStatus, Store
from autoscaler.decide.policy import make_policy
from autoscaler.decide.sizing import SizingConfig
from autoscaler.errors import InvalidInputError
from autoscaler.sim.boot import load_boot_times
from autoscaler.sim.cloud_config import CloudConfig
from autoscaler.sim.experiments import build_run
from autoscaler.sim.world import CloudWorld, WorldConfig
from coadapt_common.clock import FakeClock
from providers.base import Offering
from providers.fake import FakeProvider, default_offerings
from tests.controller.fakes import fake_controller

BOOT_S = 90.0


def _running(store: Store) -> list[str]:
    return [i.instance_key for i in store.list_instances(statuses=(InstanceStatus.RUNNING,))]


def _heard(store: Store, cloud: FakeProvider, cluster: str, now_s: float) -> None:
    """The agents of the instances the cloud has booted send their heartbeats."""
    booted = cloud.booted_ids(cluster)
    for row in store.list_instances(statuses=(InstanceStatus.RUNNING,)):
        if row.provider_instance_id in booted:
            store.record_heartbeat(row.instance_key, now_s)


def test_the_boot_phase_rule() -> None:
    q, r, run = InstanceStatus.QUEUED, InstanceStatus.REQUESTED, InstanceStatus.RUNNING
    for status in (q, r):
        assert boot_phase(status, cloud_running=False, heard_s=None, needs_agent=True) is (
            BootPhase.LAUNCHED
        )
    assert boot_phase(run, cloud_running=False, heard_s=1.0, needs_agent=True) is (
        BootPhase.BOOTING
    )
    assert boot_phase(run, cloud_running=True, heard_s=None, needs_agent=True) is (
        BootPhase.BOOTING
    )
    assert boot_phase(run, cloud_running=True, heard_s=1.0, needs_agent=True) is BootPhase.READY
    assert boot_phase(run, cloud_running=True, heard_s=None, needs_agent=False) is (BootPhase.READY)
    assert (
        boot_phase(InstanceStatus.DRAINING, cloud_running=True, heard_s=1.0, needs_agent=True)
        is None
    )


def test_no_job_before_its_instance_is_ready_and_a_ready_event_with_its_boot(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "boot1", clock)
    spec = JobSubmission("job-0", 128, 1024, 128, 32, application="cifar10", command=("t.py",))
    store.add_job(spec.name, spec.to_json())
    cloud = FakeProvider(clock=clock, boot_s=BOOT_S)
    config = ControllerConfig(
        "boot1",
        interval_s=30.0,
        sizing=SizingConfig(max_instances=1),
        reconcile=ReconcileConfig(heartbeat_timeout_s=120.0, boot_grace_s=600.0),
    )
    ctl = Controller(store, cloud, clock, config)
    recorder = EventRecorder(store, clock)
    placed_at = None
    for _ in range(8):
        _heard(store, cloud, "boot1", clock.now_s())
        ctl.run_round()
        recorder.observe()
        if store.list_assignments() and placed_at is None:
            placed_at = clock.now_s()
        if placed_at is None:
            # Before the boot ends, the instance is running in the store (the cloud has it,
            # pending) but no job is on it.
            assert not store.list_assignments()
        clock.advance(30.0)
    assert placed_at is not None and placed_at >= BOOT_S
    kinds = [e.kind for e in store.latest_events(100)]
    assert EventKind.BOOT in kinds and EventKind.READY in kinds
    ready = next(e for e in store.latest_events(100) if e.kind == EventKind.READY)
    assert "after its launch" in ready.message


def test_a_cloud_instance_running_but_its_agent_unheard_gets_no_job(tmp_path: Path) -> None:
    store, cloud, clock, ctl = fake_controller(
        tmp_path, "boot2", jobs=1, max_instances=1, heartbeat_timeout_s=120.0
    )
    for _ in range(3):
        ctl.run_round()
        clock.advance(30.0)
    assert _running(store) and not store.list_assignments()  # booted, agent never heard
    _heard(store, cloud, "boot2", clock.now_s())
    ctl.run_round()
    assert store.list_assignments()


def _job_done(store: Store, ctl: Controller) -> None:
    job = store.get_job("job-0")
    store.update_job("job-0", job.version, status=JobStatus.COMPLETED)
    ctl.job_exited("job-0", failed=False)


def _released(store: Store) -> set[str]:
    reasons = {
        c.reason
        for i in store.list_instances(statuses=(InstanceStatus.TERMINATING,))
        for c in store.history(i.instance_key)
        if c.status is InstanceStatus.TERMINATING
    }
    assert reasons <= {EMPTY_RELEASE_REASON}, reasons
    assert not store.list_instances(statuses=(InstanceStatus.DRAINING,))  # nothing to drain
    return {i.instance_key for i in store.list_instances(statuses=(InstanceStatus.TERMINATING,))}


def test_an_empty_ready_instance_the_plan_drops_is_released_in_that_round(
    tmp_path: Path,
) -> None:
    """With the hold's rent-or-buy keep off, the round in which the job ends releases its
    now empty instances; with it (the default), they wait the boot a relaunch would take (the
    sizing's 120 s) for a next job, and go in the first round past it."""
    store, _cloud, clock, ctl = fake_controller(tmp_path, "boot3", jobs=1, max_instances=2)
    ctl = Controller(store, _cloud, clock, replace(ctl.config, hold=HoldConfig(keep_empty=False)))
    for _ in range(3):
        ctl.run_round()
        clock.advance(30.0)
    assert store.list_assignments()
    _job_done(store, ctl)
    ctl.run_round()  # the plan now wants no instance: the empty ones go in this round
    assert _released(store) and not _running(store)


def test_an_empty_instance_waits_the_break_even_then_goes(tmp_path: Path) -> None:
    store, _cloud, clock, ctl = fake_controller(tmp_path, "boot4", jobs=1, max_instances=1)
    keep_s = ctl.config.sizing.provisioning_delay_s
    for _ in range(3):
        ctl.run_round()
        clock.advance(30.0)
    _job_done(store, ctl)
    t0 = clock.now_s()
    while True:
        ctl.run_round()
        if _released(store):
            break
        assert clock.now_s() - t0 < keep_s, "kept past the break-even"
        clock.advance(30.0)
    assert clock.now_s() - t0 == keep_s  # the first round past it (rounds every 30 s)
    assert not _running(store)


def _offering(provider: str, gpus: int) -> Offering:
    base = next(o for o in default_offerings() if o.gpus == 1)
    return Offering(**{**base.__dict__, "provider": provider, "gpus": gpus})


def test_the_worlds_boot_times_follow_the_table_and_the_seed() -> None:
    table = load_boot_times(seed=7)
    small, large = _offering("aws", 1), _offering("aws", 8)
    q_small, q_large = table.quantiles("aws", 1), table.quantiles("aws", 8)
    assert q_small.max_gpus == 1 and q_large.max_gpus == 8
    draws = [table.draw_s(small) for _ in range(4000)]
    assert abs(statistics.median(draws) - q_small.median_s) < 0.06 * q_small.median_s
    p95 = sorted(draws)[int(0.95 * len(draws))]
    assert abs(p95 - q_small.p95_s) < 0.1 * q_small.p95_s
    assert min(draws) > 0
    a, b = load_boot_times(seed=7), load_boot_times(seed=7)
    assert [a.draw_s(large) for _ in range(5)] == [b.draw_s(large) for _ in range(5)]
    c, d = load_boot_times(seed=8), load_boot_times(seed=7)
    assert [c.draw_s(large) for _ in range(5)] != [d.draw_s(large) for _ in range(5)]
    assert statistics.median(table.draw_s(large) for _ in range(999)) > q_small.median_s
    # A provider the table lacks boots like the slowest of its size.
    assert table.quantiles("other", 8).median_s == max(
        table.quantiles(p, 8).median_s for p in ("aws", "gcp")
    )
    with pytest.raises(InvalidInputError):
        load_boot_times(text="provider,max_gpus,median_s,p95_s\naws,1,100,50\n")


def test_a_simulated_instance_is_heard_only_once_it_has_booted(tmp_path: Path) -> None:
    """The simulated world's agents start on booted instances only: a world whose instances
    boot in 150 s places no job before then (its rounds every 60 s)."""
    run = build_run("E2", "coadapt")
    cloud = CloudConfig(
        run.cloud.offerings,
        run.cloud.strategy,
        boot=load_boot_times(text="provider,max_gpus,median_s,p95_s\naws,8,150,150\n"),
    )
    with CloudWorld(cloud, make_policy("coadapt"), WorldConfig()) as world:
        world.submit(
            JobSubmission("j", 128, 1024, 128, 32, application="cifar10", command=("t.py",))
        )
        first = None
        for _ in range(6):
            world.run_round()
            plan, _ = world.plan()
            if plan and first is None:
                first = world.now_s
            world.advance_to(world.now_s + 60.0)
        assert first is not None and first >= 150.0
