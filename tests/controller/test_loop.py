"""The controller's round end to end on the fake cloud: restarts keep the learned models, job
outcomes, job specs, offerings the decision core cannot value."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.controller.jobs import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import JobStatus, Store
from autoscaler.errors import InvalidInputError
from autoscaler.sizing import SizingConfig
from coadapt_common.clock import FakeClock
from emulators.reports import synthetic_report
from providers.base import Market
from providers.fake import FakeProvider

CLUSTER = "loop1"
CONFIG = ControllerConfig(
    CLUSTER,
    sizing=SizingConfig(max_instances=4),
    reconcile=ReconcileConfig(heartbeat_timeout_s=None),
)


def _report(job: str, gpus: int, now_s: float, step_s: float) -> str:
    return synthetic_report(
        job,
        gpus=gpus,
        nodes=1,
        local_bsz=128,
        step_s=step_s,
        sync_s=step_s * 0.1,
        progress=1.0,
        now_s=now_s,
        init_batch_size=128,
        max_batch_size=1024,
        grad_var=3.0,
    ).to_json()


def _setup(tmp_path: Path, jobs: int = 2) -> tuple[Store, FakeProvider, FakeClock]:
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", CLUSTER, clock)
    for i in range(jobs):
        spec = JobSubmission(
            f"job-{i}", 128, 1024, 128, 32, application="cifar10", command=("train.py",)
        )
        store.add_job(spec.name, spec.to_json())
    return store, FakeProvider(clock=clock), clock


def _rounds(ctl: Controller, store: Store, clock: FakeClock, n: int) -> None:
    for r in range(n):
        ctl.run_round()
        clock.advance(60.0)
        placed: dict[str, int] = {}
        for (job, _), gpus in store.list_assignments().items():
            placed[job] = placed.get(job, 0) + gpus
        for job, gpus in placed.items():
            store.add_report(job, _report(job, gpus, clock.now_s(), 0.2 + 0.01 * r))


def test_a_restarted_controller_sees_the_same_models(tmp_path: Path) -> None:
    store, cloud, clock = _setup(tmp_path)
    ctl = Controller(store, cloud, clock, CONFIG)
    _rounds(ctl, store, clock, 4)
    ctl.run_round()  # ingests the last reports
    assert store.list_models(), "profiles are written to the store"
    views = {v.name: v for v in ctl.job_views(0.0)}
    assert all(v.models for v in views.values())
    again = Controller(store, cloud.restarted(), clock, CONFIG)
    again._read_reports(store.list_assignments(), {})  # restore, nothing new to read
    views2 = {v.name: v for v in again.job_views(0.0)}
    for name, view in views.items():
        assert dict(views2[name].models) == dict(view.models)
        assert views2[name].max_profiled_gpus == view.max_profiled_gpus


def test_failures_are_retried_then_the_job_fails(tmp_path: Path) -> None:
    store, cloud, clock = _setup(tmp_path, jobs=1)
    ctl = Controller(store, cloud, clock, ControllerConfig(CLUSTER, max_job_retries=2))
    _rounds(ctl, store, clock, 2)
    assert ctl.job_exited("job-0", failed=True) is JobStatus.QUEUED
    ctl.run_round()
    assert store.list_assignments(), "a retried job is placed again"
    assert ctl.job_exited("job-0", failed=True) is JobStatus.QUEUED
    assert ctl.job_exited("job-0", failed=True) is JobStatus.FAILED
    job = store.get_job("job-0")
    assert job.retries == 3 and not store.list_assignments()
    assert ctl.job_exited("job-0", failed=False) is JobStatus.FAILED  # late report: no change


def test_rescales_and_preemptions_never_count_as_failures(tmp_path: Path) -> None:
    store, cloud, clock = _setup(tmp_path, jobs=1)
    ctl = Controller(store, cloud, clock, CONFIG)
    _rounds(ctl, store, clock, 2)
    for inst in cloud.list_instances(CLUSTER):
        cloud.preempt(inst.instance_id, notice_s=0.0)
    _rounds(ctl, store, clock, 3)
    assert store.get_job("job-0").retries == 0
    assert ctl.job_exited("job-0", failed=False) is JobStatus.COMPLETED


def test_offerings_of_unknown_speed_are_never_bought(tmp_path: Path) -> None:
    store, cloud, clock = _setup(tmp_path)
    ctl = Controller(store, cloud, clock, CONFIG)
    _rounds(ctl, store, clock, 3)
    types = {r.gpu_type for r in store.list_instances()}
    assert types and "A10G" not in types  # the fake sells A10G; the speed table has no row


def test_drained_instances_take_their_jobs_off_first(tmp_path: Path) -> None:
    store, cloud, clock = _setup(tmp_path)
    ctl = Controller(store, cloud, clock, CONFIG)
    _rounds(ctl, store, clock, 3)
    victim = next(r for r in store.list_instances(statuses=(InstanceStatus.RUNNING,)))
    assert victim.provider_instance_id is not None
    cloud.preempt(victim.provider_instance_id, notice_s=120.0)
    report = ctl.run_round()
    assert victim.instance_key in report.actions.drained
    assert all(victim.instance_key not in alloc for alloc in report.allocations.values())


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"init_batch_size": 0}, "init_batch_size"),
        ({"max_batch_size": 64}, "max_batch_size"),
        ({"min_local_bsz": 256}, "max_local_bsz"),
        ({"min_gpus": 2**63}, "min_gpus"),
        ({"max_gpus": 4097}, "max_gpus"),
        ({"command": ("--controller-url", "http://elsewhere", "t.py")}, "command[0]"),
        ({"min_gpus": 0}, "min_gpus"),
        ({"name": ""}, "name"),
    ],
)
def test_job_spec_errors_name_the_field(changes: dict, field: str) -> None:
    base = {
        "name": "j",
        "init_batch_size": 128,
        "max_batch_size": 1024,
        "max_local_bsz": 128,
        "command": ("train.py",),
    }
    with pytest.raises(InvalidInputError) as e:
        JobSubmission(**{**base, **changes})
    assert e.value.field == field


def test_stored_spec_round_trips_and_unknown_fields_are_named() -> None:
    spec = JobSubmission("j", 128, 1024, 128, command=("train.py", "--lr", "0.1"))
    assert JobSubmission.from_json(spec.to_json()) == spec
    with pytest.raises(InvalidInputError) as e:
        JobSubmission.from_json(
            '{"name": "j", "init_batch_size": 1, "max_batch_size": 1, '
            '"max_local_bsz": 1, "gpus": 3}'
        )
    assert e.value.field == "gpus"


def test_bad_config_is_refused() -> None:
    with pytest.raises(InvalidInputError):
        ControllerConfig(CLUSTER, default_spot_band="sometimes")
    with pytest.raises(InvalidInputError):
        ControllerConfig(CLUSTER, max_job_retries=-1)


def test_a_job_ended_elsewhere_loses_its_gpus_next_round(tmp_path: Path) -> None:
    store, cloud, clock = _setup(tmp_path)
    ctl = Controller(store, cloud, clock, CONFIG)
    _rounds(ctl, store, clock, 2)
    job = store.get_job("job-0")
    assert store.list_assignments(job="job-0")
    store.update_job("job-0", job.version, status=JobStatus.CANCELLED)  # e.g. the API
    report = ctl.run_round()
    assert "job-0" not in report.allocations
    assert not store.list_assignments(job="job-0")
    assert store.get_job("job-0").status is JobStatus.CANCELLED


def test_spot_prices_are_read_again_and_recorded_every_refresh(tmp_path: Path) -> None:
    store, cloud, clock = _setup(tmp_path, jobs=1)
    ctl = Controller(store, cloud, clock, ControllerConfig(CLUSTER, offerings_refresh_s=120.0))
    ctl.run_round()
    spot = next(o for o in cloud.offerings() if o.market is Market.SPOT)
    first = spot.price_usd_per_hour
    cloud.set_spot_price(spot.instance_type, spot.zone, 2 * (first or 1.0))
    clock.advance(60.0)
    ctl.run_round()  # within the refresh: the old price holds
    assert [p.price_usd_per_hour for p in store.prices(spot.key)] == [first]
    clock.advance(60.0)
    ctl.run_round()
    assert [p.price_usd_per_hour for p in store.prices(spot.key)] == [first, 2 * (first or 1.0)]
    assert store.price_at(spot.key, clock.now_s()) == 2 * (first or 1.0)
