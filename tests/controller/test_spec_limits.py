"""A job's ``markets`` and ``offerings`` through the controller's round on the fake cloud: the
sizing buys what the limited jobs can use, the policy places them only there (asserted on the
store's assignments after every round), and a job no offering on sale allows is refused with
the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import JobStatus, Store
from autoscaler.decide.sizing import SizingConfig
from autoscaler.decide.views import OfferingRef
from autoscaler.errors import InvalidInputError
from coadapt_common.clock import FakeClock
from emulators.reports import synthetic_report
from providers.fake import FakeProvider

CLUSTER = "limits1"
# An offering key (provider/instance_type/zone/market): the spec's, the fake provider's and the
# controller's rows' one format.
ZONE_B = "fake/g4dn.12xlarge/us-east-1b/spot"


def _report(job: str, gpus: int, now_s: float) -> str:
    return synthetic_report(
        job,
        gpus=gpus,
        nodes=1,
        local_bsz=128,
        step_s=0.2,
        sync_s=0.02,
        progress=1.0,
        now_s=now_s,
        init_batch_size=128,
        max_batch_size=1024,
        grad_var=3.0,
    ).to_json()


def _spec(name: str, **limits: object) -> JobSubmission:
    return JobSubmission(
        name, 128, 1024, 128, 32, application="cifar10", command=("train.py",), **limits
    )


@pytest.mark.parametrize("policy", ["coadapt", "pollux", "tiresias", "optimus"])
def test_limited_jobs_run_only_where_their_spec_allows(tmp_path: Path, policy: str) -> None:
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", CLUSTER, clock)
    specs = [
        _spec("free-0"),
        _spec("od", markets=("on-demand",)),
        _spec("zone-b", offerings=(ZONE_B,)),
        _spec("free-1"),
    ]
    for spec in specs:
        store.add_job(spec.name, spec.to_json())
    cloud = FakeProvider(clock=clock)
    config = ControllerConfig(
        CLUSTER,
        policy=policy,
        sizing=SizingConfig(max_instances=16),  # room for all (8 would go to the others)
        reconcile=ReconcileConfig(heartbeat_timeout_s=None),
    )
    ctl = Controller(store, cloud, clock, config)
    ran: dict[str, int] = {s.name: 0 for s in specs}
    markets_held: set[str] = set()
    for _ in range(8):
        ctl.run_round()
        clock.advance(60.0)
        rows = {r.instance_key: r for r in store.list_instances()}
        placed: dict[str, int] = {}
        for (job, key), gpus in store.list_assignments().items():
            row = rows[key]
            ref = OfferingRef(row.provider, row.instance_type, row.zone, row.market)
            markets_held.add(row.market)
            if job == "od":
                assert row.market == "on-demand", (policy, key, ref)
            if job == "zone-b":
                assert ref == OfferingRef.parse(ZONE_B), (policy, key, ref)
            placed[job] = placed.get(job, 0) + gpus
        for job, gpus in placed.items():
            ran[job] += 1
            store.add_report(job, _report(job, gpus, clock.now_s()))
    assert ran["od"] and ran["zone-b"], (policy, ran)
    assert "spot" in markets_held, "the other jobs ran on spot: the fleet was mixed"
    assert {store.get_job(s.name).status for s in specs} <= {JobStatus.RUNNING, JobStatus.QUEUED}


def test_a_job_no_offering_on_sale_allows_is_refused(tmp_path: Path) -> None:
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", CLUSTER, clock)
    nowhere = _spec("nowhere", offerings=("fake/g4dn.xlarge/us-west-2a/on-demand",))
    od_a100 = _spec("od-a100", markets=("on-demand",), gpu_types=("A100",))
    for spec in (nowhere, od_a100, _spec("free")):
        store.add_job(spec.name, spec.to_json())
    config = ControllerConfig(
        CLUSTER,
        sizing=SizingConfig(max_instances=4),
        reconcile=ReconcileConfig(heartbeat_timeout_s=None),
    )
    ctl = Controller(store, FakeProvider(clock=clock), clock, config)
    ctl.run_round()
    job = store.get_job("nowhere")
    assert job.status is JobStatus.REFUSED
    assert job.reason is not None and job.reason.startswith(
        "offerings allows fake/g4dn.xlarge/us-west-2a/on-demand; the fleet can have only "
        "fake/g4dn.12xlarge/us-east-1a/on-demand, "
    )
    assert store.get_job("od-a100").status is not JobStatus.REFUSED  # A100 on demand exists
    assert store.get_job("free").status is not JobStatus.REFUSED


def test_the_api_body_checks_markets_and_offerings() -> None:
    """The JSON body of ``POST /v1/jobs`` takes the same fields with the same checks, and a
    stored job that sets neither is stored exactly as before they existed."""
    body = {"name": "a", "init_batch_size": 8, "max_batch_size": 8, "max_local_bsz": 8}
    body["command"] = ["t.py"]
    assert "markets" not in JobSubmission.from_mapping(body).to_json()
    with pytest.raises(InvalidInputError) as info:
        JobSubmission.from_mapping({**body, "markets": ["on-demand"], "offerings": [ZONE_B]})
    assert info.value.field == "offerings[0]"
    assert "its market 'spot' is not in markets (on-demand)" in str(info.value)
    made = JobSubmission.from_mapping({**body, "offerings": [ZONE_B]})
    assert JobSubmission.from_json(made.to_json()) == made
    for bad, field in (
        ({"markets": "spot"}, "markets"),
        ({"markets": ["spot", "spot"]}, "markets[1]"),
        ({"offerings": ["fake/us-east-1b/spot"]}, "offerings[0]"),
        ({"offerings": [7]}, "offerings[0]"),
    ):
        with pytest.raises(InvalidInputError) as info:
            JobSubmission.from_mapping({**body, **bad})
        assert info.value.field == field, bad
