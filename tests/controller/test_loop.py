"""The controller's round end to end on the fake cloud: restarts keep the learned models, job
outcomes, job specs, offerings the decision core cannot value."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import JobStatus, Store
from autoscaler.decide.sizing import SizingConfig
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import FakeClock
from emulators.reports import synthetic_report
from providers.base import Market
from providers.capacity import UnavailableOfferings
from providers.fake import FakeProvider
from trainer.report import TrainerReport

CLUSTER = "loop1"
CONFIG = ControllerConfig(
    CLUSTER,
    sizing=SizingConfig(max_instances=4),
    reconcile=ReconcileConfig(heartbeat_timeout_s=None),
)


def _report(job: str, gpus: int, now_s: float, step_s: float, nodes: int = 1) -> str:
    return synthetic_report(
        job,
        gpus=gpus,
        nodes=nodes,
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
        nodes: dict[str, int] = {}
        for (job, _), gpus in store.list_assignments().items():
            placed[job] = placed.get(job, 0) + gpus
            nodes[job] = nodes.get(job, 0) + 1
        for job, gpus in placed.items():
            step_s = 0.2 + 0.01 * r
            store.add_report(job, _report(job, gpus, clock.now_s(), step_s, nodes[job]))


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
    config = ControllerConfig(CLUSTER, max_job_retries=2, reconcile=CONFIG.reconcile)
    ctl = Controller(store, cloud, clock, config)  # no agents here: none is waited for
    _rounds(ctl, store, clock, 2)
    assert ctl.job_exited("job-0", failed=True) is JobStatus.QUEUED
    ctl.run_round()
    assert store.list_assignments(), "a retried job is placed again"
    assert ctl.job_exited("job-0", failed=True) is JobStatus.QUEUED
    assert ctl.job_exited("job-0", failed=True) is JobStatus.FAILED
    job = store.get_job("job-0")
    assert job.retries == 3 and not store.list_assignments()
    assert ctl.job_exited("job-0", failed=False) is JobStatus.FAILED  # late report: no change


def _gpus(store: Store, job: str) -> int:
    return sum(g for (name, _), g in store.list_assignments().items() if name == job)


def test_rescales_and_preemptions_never_count_as_failures(tmp_path: Path) -> None:
    """The job is rescaled (its GPU count changes while it runs), then preempted and placed
    again: each is a restart, none a retry, and the job still completes."""
    store, cloud, clock = _setup(tmp_path, jobs=1)
    ctl = Controller(store, cloud, clock, CONFIG)
    _rounds(ctl, store, clock, 2)
    first = _gpus(store, "job-0")
    assert first >= 1
    sizes = [first]
    for _ in range(4):  # profiled on its first GPUs, it scales out within a few rounds
        _rounds(ctl, store, clock, 1)
        sizes.append(_gpus(store, "job-0"))
    assert any(0 < n != first for n in sizes), f"no rescale happened: GPUs by round {sizes}"
    assert store.get_job("job-0").status is JobStatus.RUNNING
    restarts_after_rescale = store.restart_counts(["job-0"])["job-0"]
    assert restarts_after_rescale >= 1
    assert store.get_job("job-0").retries == 0
    for inst in cloud.list_instances(CLUSTER):
        cloud.preempt(inst.instance_id, notice_s=0.0)
    _rounds(ctl, store, clock, 3)
    assert _gpus(store, "job-0") >= 1, "placed again after the preemption"
    assert store.restart_counts(["job-0"])["job-0"] > restarts_after_rescale
    job = store.get_job("job-0")
    assert job.retries == 0 and job.status is JobStatus.RUNNING and job.reason is None
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
    assert victim.instance_key in report.actions.leaving
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


def test_a_quota_error_is_remembered_and_the_next_round_launches_elsewhere(
    tmp_path: Path,
) -> None:
    """A launch refused for quota marks its offering unavailable (for the quota's longer
    time), its row fails at once instead of waiting ``requested`` round after round, and the
    next round's sizing routes around it: the next launch goes to another offering. One
    memory: the provider's launch walk shares it (its own skip makes no call)."""
    from providers.errors import QuotaExceededError

    store, _, clock = _setup(tmp_path, jobs=1)
    memory = CONFIG.unavailable_offerings(clock)
    cloud = FakeProvider(clock=clock, unavailable=memory)
    ctl = Controller(store, cloud, clock, CONFIG, unavailable=memory)
    cloud.next_error("launch", QuotaExceededError("vCPU quota of the family reached"))
    ctl.run_round()
    first = [c for c in cloud.calls if c.op == "launch"]
    assert len(first) == 1
    failed = store.list_instances()
    assert failed and {r.status for r in failed} == {InstanceStatus.ALLOCATION_FAILED}
    assert len({r.offering_key for r in failed}) == 1  # the rest skipped without a call
    refused_key = failed[0].offering_key
    assert memory.is_unavailable(refused_key)
    clock.advance(CONFIG.unavailable_ttl_s + 1)  # a capacity mark would be gone by now
    assert memory.is_unavailable(refused_key), "a quota lasts longer"
    ctl.run_round()
    again = [c for c in cloud.calls if c.op == "launch"][1:]
    live = [r for r in store.list_instances() if r.status is not InstanceStatus.ALLOCATION_FAILED]
    assert live and all(r.offering_key != refused_key for r in live)
    # bounded: one call per instance the round wanted, none to the refused pool
    assert len(again) == len(failed) == len(live)
    assert all(c.args["pool"] != refused_key for c in again)


def test_a_job_no_fleet_can_hold_is_refused_with_the_reason_within_a_round(
    tmp_path: Path,
) -> None:
    store, cloud, clock = _setup(tmp_path, jobs=1)
    big = JobSubmission("huge", 128, 8192, 128, 32, min_gpus=4000, command=("train.py",))
    wrong = JobSubmission("wrong-type", 128, 1024, 128, 32, gpu_types=("H200",), command=("t.py",))
    for spec in (big, wrong):
        store.add_job(spec.name, spec.to_json())
    ctl = Controller(store, cloud, clock, CONFIG)
    ctl.run_round()
    huge, typed = store.get_job("huge"), store.get_job("wrong-type")
    assert huge.status is JobStatus.REFUSED and typed.status is JobStatus.REFUSED
    assert huge.reason is not None and "needs at least 4000 GPUs" in huge.reason
    assert typed.reason is not None and "gpu_types allows H200" in typed.reason
    assert store.get_job("job-0").status is not JobStatus.REFUSED
    _rounds(ctl, store, clock, 2)  # not retried until the user acts
    assert store.get_job("huge").status is JobStatus.REFUSED
    assert not store.list_assignments(job="huge")


def test_the_spec_bounds_hold_in_every_round(tmp_path: Path) -> None:
    """``gpus.max`` caps, ``gpus.min`` floors, a non-adaptive job runs on exactly its GPUs,
    ``gpu_types`` restricts: asserted on the store's assignments after every round."""
    store, cloud, clock = _setup(tmp_path, jobs=0)
    specs = [
        JobSubmission("capped", 128, 1024, 128, 32, max_gpus=1, application="cifar10",
                      command=("t.py",)),
        JobSubmission("floored", 128, 1024, 128, 32, min_gpus=4, application="cifar10",
                      command=("t.py",)),
        JobSubmission("fixed", 128, 128, 128, 32, min_gpus=2, adaptive=False,
                      application="cifar10", command=("t.py",)),
        JobSubmission("typed", 128, 1024, 128, 32, gpu_types=("A100",), application="cifar10",
                      command=("t.py",)),
    ]  # fmt: skip
    for spec in specs:
        store.add_job(spec.name, spec.to_json())
    roomy = ControllerConfig(
        CLUSTER,
        sizing=SizingConfig(max_instances=16),
        reconcile=ReconcileConfig(heartbeat_timeout_s=None),
    )
    ctl = Controller(store, cloud, clock, roomy)
    ran: dict[str, set[int]] = {s.name: set() for s in specs}
    for _ in range(8):
        _rounds(ctl, store, clock, 1)
        rows = {r.instance_key: r for r in store.list_instances()}
        gpus: dict[str, int] = {}
        for (job, key), g in store.list_assignments().items():
            gpus[job] = gpus.get(job, 0) + g
            if job == "typed":
                assert rows[key].gpu_type == "A100"
        for job, g in gpus.items():
            ran[job].add(g)
    assert ran["capped"] and max(ran["capped"]) == 1
    assert ran["floored"] and min(ran["floored"]) >= 4
    assert ran["fixed"] == {2}
    assert ran["typed"]


def test_a_bad_job_fails_alone_and_the_round_goes_on(tmp_path: Path) -> None:
    """A stored spec that no longer passes (written by an older version, or by hand) fails
    its job with the reason; the other jobs are decided as usual."""
    store, cloud, clock = _setup(tmp_path, jobs=1)
    store.add_job(
        "old",
        '{"name": "old", "init_batch_size": 64, "max_batch_size": 64, '
        '"max_local_bsz": 64, "min_gpus": 9223372036854775808, "command": ["t.py"]}',
    )
    ctl = Controller(store, cloud, clock, CONFIG)
    _rounds(ctl, store, clock, 2)
    old = store.get_job("old")
    assert old.status is JobStatus.FAILED
    assert old.reason is not None and "min_gpus" in old.reason
    assert store.list_assignments(job="job-0"), "the other job was placed"


def test_a_finished_job_keeps_its_gpus_until_it_exits_and_is_never_moved(
    tmp_path: Path,
) -> None:
    store, cloud, clock = _setup(tmp_path, jobs=1)
    ctl = Controller(store, cloud, clock, CONFIG)
    _rounds(ctl, store, clock, 3)
    held = store.list_assignments(job="job-0")
    assert held
    done = synthetic_report(
        "job-0", gpus=sum(held.values()), nodes=1, local_bsz=128, step_s=0.2, sync_s=0.02,
        progress=50.0, now_s=clock.now_s(), init_batch_size=128, max_batch_size=1024,
        grad_var=3.0,
    )  # fmt: skip
    import dataclasses

    store.add_report("job-0", dataclasses.replace(done, done=True, target_progress=50.0).to_json())
    for _ in range(3):
        clock.advance(60.0)
        ctl.run_round()
        assert store.list_assignments(job="job-0") == held, "pinned until its exit"
    assert ctl.job_exited("job-0", failed=False) is JobStatus.COMPLETED
    ctl.run_round()
    assert not store.list_assignments(job="job-0")


# ---- unavailable offerings: one memory, one rule, the config's TTL ---------------------------


def _dry_cloud(
    clock: FakeClock, memory: UnavailableOfferings | None = None
) -> tuple[FakeProvider, str]:
    """A cloud of one offering (1 x T4, spot) that has no capacity."""
    from providers.fake import default_offerings

    only = default_offerings("fake")[0]
    return FakeProvider([only], {only.key: 0}, clock=clock, unavailable=memory), only.key


def test_the_unavailable_ttl_of_the_config_decides_when_an_offering_is_tried_again(
    tmp_path: Path,
) -> None:
    """A capacity error keeps the offering out for the config's ``unavailable_ttl_s``, not a
    default: with 60 s it is tried again two minutes later, with 600 s it is not. The one
    memory is built from the config (``ControllerConfig.unavailable_offerings``, as the
    service and the simulator build it) and shared by the provider's pool walk."""
    tried_again = {}
    for ttl_s in (60.0, 600.0):
        store, _, clock = _setup(tmp_path / f"{ttl_s:.0f}", jobs=1)
        config = dataclasses.replace(CONFIG, unavailable_ttl_s=ttl_s)
        memory = config.unavailable_offerings(clock)
        cloud, key = _dry_cloud(clock, memory)
        ctl = Controller(store, cloud, clock, config, unavailable=memory)
        ctl.run_round()
        first = [c for c in cloud.calls if c.op == "launch"]
        assert len(first) == 1 and key in ctl.unavailable
        clock.advance(120.0)
        ctl.run_round()
        tried_again[ttl_s] = len([c for c in cloud.calls if c.op == "launch"]) > 1
    assert tried_again == {60.0: True, 600.0: False}


def test_a_memory_with_other_ttls_than_the_config_is_refused(tmp_path: Path) -> None:
    store, cloud, clock = _setup(tmp_path)
    with pytest.raises(InvalidInputError, match="unavailable_offerings"):
        Controller(store, cloud, clock, CONFIG, unavailable=UnavailableOfferings(clock, 180.0))
    ok = CONFIG.unavailable_offerings(clock)
    assert (ok.ttl_s, ok.quota_ttl_s) == (CONFIG.unavailable_ttl_s, CONFIG.quota_ttl_s)
    Controller(store, cloud, clock, CONFIG, unavailable=ok)


def test_a_queued_launch_into_an_unavailable_offering_fails_by_one_rule(tmp_path: Path) -> None:
    """The rule "a queued row of an offering marked unavailable fails without a cloud call"
    is :func:`~autoscaler.controller.reconcile.unavailable_launch`, applied by reconcile to the
    rows it reads and by the act phase to a mark an earlier launch of the same round made:
    two new rows for a dry offering make one launch call, the second row fails by the rule
    (its reason is the rule's), and a queued row read the next round fails by it as well."""
    from autoscaler.controller.reconcile import UNAVAILABLE_REASON

    store, _, clock = _setup(tmp_path, jobs=2)
    config = dataclasses.replace(CONFIG, sizing=dataclasses.replace(CONFIG.sizing, max_instances=8))
    memory = config.unavailable_offerings(clock)
    cloud, key = _dry_cloud(clock, memory)
    ctl = Controller(store, cloud, clock, config, unavailable=memory)
    report = ctl.run_round()
    assert len(report.actions.new_rows) >= 2
    launches = [c for c in cloud.calls if c.op == "launch"]
    assert len(launches) == 1  # the first found the offering dry; the others made no call
    reasons = [store.history(r.instance_key)[-1].reason for r in store.list_instances()]
    assert sorted(set(reasons)) == ["capacity error", UNAVAILABLE_REASON]
    assert reasons.count(UNAVAILABLE_REASON) == len(reasons) - 1
    # A row still queued when a round reads it (a launch that timed back): reconcile's turn.
    row = store.add_instance(
        instance_key="late",
        request_id="loop1-late",
        offering_key=key,
        provider="fake",
        instance_type="g4dn.xlarge",
        zone="us-east-1a",
        market="spot",
        gpu_type="T4",
        gpus=1,
        price_usd_per_hour=0.1578,
    )
    assert row.status is InstanceStatus.QUEUED
    clock.advance(10.0)
    report = ctl.run_round()
    assert [(t.key, t.reason) for t in report.actions.transitions if t.key == "late"] == [
        ("late", UNAVAILABLE_REASON)
    ]
    assert len([c for c in cloud.calls if c.op == "launch"]) == 1


def test_rounds_prune_what_is_older_than_the_retention(tmp_path: Path) -> None:
    """A round prunes the store's old events and prices (``retention_s``), a backlog a batch
    at a time over rounds, and keeps every job's latest report; ``None`` keeps all."""
    store, cloud, clock = _setup(tmp_path)
    old = clock.now_s()
    store.add_events([(old, "note", "c", f"old {i}") for i in range(2500)])
    store.add_report("job-0", _report("job-0", 1, old, 0.1))
    store.record_price("fake/z/t/spot", 0.5, Market.SPOT, at_s=old)
    store.record_price("fake/z/t/spot", 0.6, Market.SPOT, at_s=old + 1)
    clock.advance(7200.0)
    Controller(store, cloud, clock, replace(CONFIG, retention_s=None)).run_round()
    assert len(store.events_after(0)) == 2500
    ctl = Controller(store, cloud, clock, replace(CONFIG, retention_s=3600.0))
    ctl.run_round()  # up to 10 batches of 1,000 a round: the backlog is gone at once
    assert [e for e in store.events_after(0) if e.message.startswith("old")] == []
    assert store.report_count("job-0") == 1  # its latest
    assert [p.price_usd_per_hour for p in store.prices("fake/z/t/spot")] == [0.6]
    with pytest.raises(InvalidInputError):
        ControllerConfig(CLUSTER, retention_s=0.0)


# ---- ETAs: when a running job will be done, by its model -------------------------------------


def test_a_running_job_with_a_declared_length_and_a_model_gets_an_eta_in_the_store(
    tmp_path: Path,
) -> None:
    """Every round records, for each running job whose script declared its length and whose
    model is fitted, when it will be done at the GPUs it holds (its work left over its
    model's goodput there); a job without a declared length gets none, and a job that stops
    running loses its estimate."""
    from autoscaler.decide.deadlines import MAX_REMAINING_S

    store, cloud, clock = _setup(tmp_path)
    ctl = Controller(store, cloud, clock, CONFIG)
    gpu_type_of: dict[str, str] = {}
    for _ in range(4):
        ctl.run_round()
        clock.advance(60.0)
        placed: dict[str, int] = {}
        for (job, key), gpus in store.list_assignments().items():
            placed[job] = placed.get(job, 0) + gpus
            gpu_type_of[job] = store.get_instance(key).gpu_type
        for job, gpus in placed.items():
            report = TrainerReport.from_json(_report(job, gpus, clock.now_s(), 0.2))
            if job == "job-0":  # only job-0's script declared its length
                report = dataclasses.replace(report, target_progress=400.0)
            store.add_report(job, report.to_json())
    ctl.run_round()  # reads the last reports, fits, and estimates
    said = clock.now_s()
    etas = store.list_etas()
    assert set(etas) == {"job-0"}, etas  # job-1 declared no length: no estimate
    eta = etas["job-0"]
    assert eta.eta_at_s == said
    # The estimate is its remaining work (399 units of 128 samples) over its fitted
    # model's goodput on the GPUs it held this round.
    (view,) = [v for v in ctl.job_views(said) if v.name == "job-0"]
    model = view.models[gpu_type_of["job-0"]]
    goodput = float(np.ravel(model.optimize(view.num_nodes, view.num_gpus).goodput)[0])
    assert 0 < eta.eta_s - said < MAX_REMAINING_S
    assert eta.eta_s - said == pytest.approx(399.0 * 128 / goodput, rel=1e-9)
    # Cancelled: it runs no more, and the next round forgets its estimate.
    row = store.get_job("job-0")
    store.update_job("job-0", row.version, status=JobStatus.CANCELLED)
    clock.advance(60.0)
    ctl.run_round()
    assert store.list_etas() == {}


# ---- reports are credited to what produced them ------------------------------------------


def _held(store: Store, job: str) -> set[str]:
    return {key for (name, key) in store.list_assignments() if name == job}


def _profile_rows(store: Store, job: str) -> dict[str, str]:
    return {row.gpu_type: row.params_json for row in store.list_models(job)}


def _late_report(
    job: str, gpus: int, nodes: int, launched_s: float, now_s: float, local_bsz: int
) -> str:
    """A report of a launch that started at ``launched_s`` on ``gpus`` GPUs over ``nodes``
    instances, with a
    configuration (``local_bsz``) no report has profiled yet and a step time far off the
    others: were it credited, the profile of the type it is credited to would change."""
    report = synthetic_report(
        job,
        gpus=gpus,
        nodes=nodes,
        local_bsz=local_bsz,
        step_s=1.5,
        sync_s=0.15,
        progress=1.0,
        now_s=now_s,
        init_batch_size=128,
        max_batch_size=1024,
        grad_var=3.0,
    )
    return replace(report, started_at_s=launched_s).to_json()


def test_a_late_report_of_the_configuration_before_a_rescale_is_not_credited(
    tmp_path: Path,
) -> None:
    """The job is rescaled; then its old launch's last report (the old world size, launched
    before the rescale) arrives: the profiles of the GPU type the job now runs on (and its
    pooled fit) are not fitted from it. A report of the new launch still is."""
    store, cloud, clock = _setup(tmp_path, jobs=1)
    ctl = Controller(store, cloud, clock, CONFIG)
    _rounds(ctl, store, clock, 2)
    old_gpus, old_nodes = _gpus(store, "job-0"), len(_held(store, "job-0"))
    old_launch_s = clock.now_s() - 60.0  # the round that placed it as it is
    for _ in range(6):  # profiled on its first GPUs, it scales out within a few rounds
        ctl.run_round()
        if _gpus(store, "job-0") != old_gpus:
            break
        old_nodes = len(_held(store, "job-0"))
        old_launch_s = clock.now_s()
        clock.advance(60.0)
        store.add_report("job-0", _report("job-0", old_gpus, clock.now_s(), 0.2))
    new_gpus = _gpus(store, "job-0")
    assert 0 < new_gpus != old_gpus, "no rescale happened"
    rescaled_s = clock.now_s()
    held = _held(store, "job-0")
    (gpu_type,) = {r.gpu_type for r in store.list_instances() if r.instance_key in held}
    before = _profile_rows(store, "job-0")
    assert gpu_type in before and "*" in before, "the job was profiled before the rescale"
    samples = ctl.book.models.samples("job-0", gpu_type)

    clock.advance(30.0)  # the old launch's last report, sent as it was being stopped
    late = _late_report("job-0", old_gpus, old_nodes, old_launch_s, clock.now_s(), 64)
    store.add_report("job-0", late)
    ctl.run_round()
    assert _profile_rows(store, "job-0") == before, "a stale report changed the profiles"
    assert ctl.book.models.samples("job-0", gpu_type) == samples

    clock.advance(60.0)  # the new launch reports a configuration it ran: credited
    now_gpus, now_nodes = _gpus(store, "job-0"), len(_held(store, "job-0"))
    launched_s = store.placed_at(["job-0"])["job-0"]
    assert launched_s >= rescaled_s
    store.add_report(
        "job-0", _late_report("job-0", now_gpus, now_nodes, launched_s, clock.now_s(), 32)
    )
    ctl.run_round()
    assert _profile_rows(store, "job-0")[gpu_type] != before[gpu_type]
