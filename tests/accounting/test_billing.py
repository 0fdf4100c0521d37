"""job_costs(): instances' billed cost split by the GPU-time jobs held, the rest idle."""

from __future__ import annotations

import json

import pytest

from autoscaler.accounting.billing import IDLE, job_costs
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.store import AssignmentSpan, CostRecordRow
from tests.controller.fakes import fake_controller


def test_cost_is_split_by_gpu_seconds_and_the_parts_sum_to_the_total() -> None:
    # i-1: 4 GPUs at $4/h for an hour; a holds 2 GPUs all hour, b 2 GPUs the second half.
    # i-2: 1 GPU at $1/h for half an hour, held by b throughout (an open span).
    records = [
        CostRecordRow(1, "i-1", 0.0, 3600.0, 4.0, 4.0),
        CostRecordRow(2, "i-2", 3600.0, 5400.0, 1.0, 0.5),
    ]
    spans = [
        AssignmentSpan("a", "i-1", 2, 0.0, 3600.0),
        AssignmentSpan("b", "i-1", 2, 1800.0, 3600.0),
        AssignmentSpan("b", "i-2", 1, 3600.0, None),
    ]
    costs = job_costs(records, spans, {"i-1": 4, "i-2": 1}, now_s=9000.0)
    assert costs["a"] == pytest.approx(2.0)
    assert costs["b"] == pytest.approx(1.0 + 0.5)
    assert costs[IDLE] == pytest.approx(1.0)
    assert sum(costs.values()) == pytest.approx(4.5)


def test_billing_minimum_and_unheld_instances_are_idle() -> None:
    # 10 s of life billed as the 60 s minimum: the job pays its share of what was billed.
    records = [CostRecordRow(1, "i-1", 0.0, 10.0, 3.6, 0.06), CostRecordRow(2, "i-9", 0, 60, 1, 1)]
    costs = job_costs(records, [AssignmentSpan("a", "i-1", 1, 0.0, 10.0)], {"i-1": 1}, 10.0)
    assert costs["a"] == pytest.approx(0.06) and costs[IDLE] == pytest.approx(1.0)


def test_the_cost_report_over_a_controller_store_lists_jobs_and_instances(tmp_path) -> None:
    """A controller run on the fake cloud (jobs placed, one instance preempted, down), then
    `coadapt cost report --state-dir`: every job and every instance that ran are listed, and
    the total equals the store's own cost records (price x billed life) to the cent."""
    from typer.testing import CliRunner

    from autoscaler.accounting.billing import cost_record_from_store
    from autoscaler.accounting.costs import summarize
    from autoscaler.cli.main import app
    from autoscaler.controller.lifecycle import InstanceStatus

    store, cloud, clock, ctl = fake_controller(tmp_path, "bill1", jobs=2, max_instances=4)
    for r in range(4):
        ctl.run_round()
        clock.advance(600.0)
        if r == 1:
            victim = store.list_instances(statuses=(InstanceStatus.RUNNING,))[0]
            assert victim.provider_instance_id is not None
            cloud.preempt(victim.provider_instance_id, notice_s=0.0)
    assert ctl.down().clean
    record = cost_record_from_store(store, clock.now_s())
    ran = {r.instance_key for r in store.list_instances() if r.provider_instance_id}
    assert {i.instance_id for i in record.instances} == ran
    assert {j.job_id for j in record.jobs} == {"job-0", "job-1"}
    assert all(j.usages for j in record.jobs)
    summary = summarize(record)
    assert round(summary.total_usd, 2) == round(store.total_cost_usd(), 2)
    assert summary.attributed_usd > 0
    store.close()
    out = CliRunner().invoke(
        app, ["cost", "report", "--state-dir", str(tmp_path), "--format", "json"]
    )
    assert out.exit_code == 0, out.output
    assert "bill1" in out.output and "job-0" in out.output
    refused = CliRunner().invoke(app, ["cost", "report"])
    assert refused.exit_code != 0 and "either a FILE or --state-dir" in refused.output


def test_a_notice_on_an_instance_draining_for_cost_bills_it_as_preempted(tmp_path) -> None:
    """The cloud reclaims an instance the controller was already releasing: its history shows
    the notice once, after the cost drain, and the cost report ends it ``preempted``."""
    from autoscaler.accounting.billing import cost_record_from_store
    from autoscaler.controller.lifecycle import InstanceStatus
    from autoscaler.controller.reconcile import NOTICE_REASON

    store, cloud, clock, ctl = fake_controller(tmp_path, "bill2", jobs=1, max_instances=4)
    for _ in range(2):
        ctl.run_round()
        clock.advance(60.0)
    row = store.list_instances(statuses=(InstanceStatus.RUNNING,))[0]
    assert row.provider_instance_id is not None
    store.transition(
        row.instance_key, row.version, InstanceStatus.DRAINING, reason="fleet target lowered (cost)"
    )
    cloud.preempt(row.provider_instance_id, notice_s=120.0)
    for _ in range(3):
        ctl.run_round()
        clock.advance(60.0)
    reasons = [h.reason for h in store.history(row.instance_key)]
    assert reasons.count(NOTICE_REASON) == 1
    assert reasons.index(NOTICE_REASON) == reasons.index("fleet target lowered (cost)") + 1
    assert ctl.down().clean
    record = cost_record_from_store(store, clock.now_s())
    ends = {i.instance_id: i.end_reason for i in record.instances}
    assert ends[row.instance_key] == "preempted"
    store.close()


def test_a_cluster_report_tells_the_truths_of_its_run(tmp_path) -> None:
    """Issue 28, item 1, over a real store: a controller run on the fake cloud (its clock at
    Unix time 1.7e9) with one spot notice, trainer reports and a finished job, then down.
    The record's times start at the run's first event (run length: the minutes it ran, not
    Unix time), only the noticed instance is preempted (the others, released and gone from
    the listing, are not), each job on it counts a preemption, placements after the first
    are restarts, useful samples are progress x initial batch size of the latest report, and
    reading the record later does not lengthen the run."""
    from autoscaler.accounting.billing import cost_record_from_store
    from autoscaler.accounting.costs import job_costs as record_job_costs
    from autoscaler.accounting.costs import summarize
    from autoscaler.controller.lifecycle import InstanceStatus
    from autoscaler.controller.store import JobStatus
    from emulators.reports import synthetic_report

    store, cloud, clock, ctl = fake_controller(tmp_path, "truth", jobs=2, max_instances=4)
    start = clock.now_s()
    victim_key = None
    for r in range(6):
        ctl.run_round()
        placed: dict[str, int] = {}
        for (job, _key), gpus in store.list_assignments().items():
            placed[job] = placed.get(job, 0) + gpus
        for job, gpus in sorted(placed.items()):
            report = synthetic_report(
                job, gpus=gpus, nodes=1, local_bsz=32, step_s=0.1, sync_s=0.0,
                progress=10.0 * (r + 1), now_s=clock.now_s(), init_batch_size=128,
                max_batch_size=1024,
            )  # fmt: skip
            store.add_report(job, report.to_json())
        clock.advance(120.0)
        if r == 1:
            held = {key for (_job, key) in store.list_assignments()}
            victim = next(
                i for i in store.list_instances(statuses=(InstanceStatus.RUNNING,))
                if i.instance_key in held
            )  # fmt: skip
            assert victim.provider_instance_id is not None
            victim_key = victim.instance_key
            cloud.preempt(victim.provider_instance_id, notice_s=30.0)
    job0 = store.get_job("job-0")
    store.update_job("job-0", job0.version, status=JobStatus.COMPLETED)
    ctl.run_round()
    clock.advance(60.0)
    assert ctl.down().clean
    ended_s = clock.now_s() - start
    record = cost_record_from_store(store, clock.now_s())
    summary = summarize(record)
    assert 0 < summary.closed_s <= ended_s + 1.0, summary.closed_s
    assert cost_record_from_store(store, clock.now_s() + 86400.0).closed_s == summary.closed_s
    ends = {i.instance_id: i.end_reason for i in record.instances}
    assert ends[victim_key] == "preempted"
    released = [k for k, why in ends.items() if k != victim_key]
    assert released and all(ends[k] == "released" for k in released), ends
    assert summary.preempted_instances == 1
    on_victim = {s.job_name for s in store.assignment_history() if s.instance_key == victim_key}
    by_job = {j.job_id: j for j in record_job_costs(record)}
    assert on_victim and all(by_job[name].preemptions == 1 for name in on_victim)
    assert summary.preemptions == len(on_victim)
    assert summary.restarts == sum(store.restart_counts(["job-0", "job-1"]).values())
    for name in ("job-0", "job-1"):
        last = store.latest_report(name)
        assert last is not None
        progress = json.loads(last.payload_json)["progress"]
        assert by_job[name].useful_samples == pytest.approx(progress * 128)
        assert by_job[name].cost_usd > 0
    assert by_job["job-0"].finished_s is not None
    assert round(summary.total_usd, 2) == round(store.total_cost_usd(), 2)
    assert summary.total_usd == pytest.approx(store.total_cost_usd(), rel=1e-9)
    store.close()


def test_sub_cent_amounts_are_shown_with_the_digits_they_need() -> None:
    """A $0.0153 run reads 0.0153 (not 0.00) in every table; the bill's total stays to the
    cent; a dollar and up is to the cent."""
    from autoscaler.accounting.costs import CostLedger, summarize
    from autoscaler.accounting.report.export import summary_json
    from autoscaler.accounting.report.rows import fmt_usd, report_tables

    assert [fmt_usd(x) for x in (0.0153, 0.000412, 0.5123, 0.0, 12.345)] == [
        "0.0153", "0.000412", "0.512", "0.00", "12.35"
    ]  # fmt: skip
    ledger = CostLedger()
    ledger.launch("i-1", offering_key="o", provider="local", instance_type="t", gpu_type="g",
                  gpus=1, zone="z", market="spot", t_s=0.0, usd_per_hour=0.918)  # fmt: skip
    ledger.job_event("a", 0.0, "submitted")
    ledger.job_usage("a", "i-1", 0.0, 60.0, 1)
    ledger.end("i-1", 60.0, "released")
    record = ledger.close(60.0)
    assert summarize(record).total_usd == pytest.approx(0.0153)
    rows = {t.name: t.rows for t in report_tables(record)}
    summary = dict(rows["summary"])
    assert summary["total cost (USD)"] == "0.0153"
    assert summary["total billed, to the cent (USD)"] == "0.02"
    assert rows["jobs"][0][2] == "0.0153"
    doc = summary_json(record)
    assert doc["summary"]["total_usd"] == 0.0153 and doc["summary"]["total_billed_usd"] == 0.02
    assert doc["jobs"][0]["cost_usd"] == 0.0153


def test_a_round_that_moves_a_job_onto_gpus_another_is_leaving_is_billed(tmp_path) -> None:
    """A round writes its assignments one job after another: job b is put on i-1's 2 GPUs a
    few milliseconds before job a's release of them is written. The report takes that as one
    moment (it raised "2 of its 2 are already in use" on the demo's store) and bills each
    job its own GPU-time."""
    from autoscaler.accounting.billing import cost_record_from_store
    from autoscaler.accounting.costs import job_costs as record_job_costs
    from autoscaler.controller.lifecycle import InstanceStatus
    from autoscaler.controller.store import Store
    from coadapt_common.clock import FakeClock

    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "overlap", clock)
    row = store.add_instance(
        instance_key="i-1", request_id="overlap-i-1", offering_key="fake/z/t/spot",
        provider="fake", instance_type="t", zone="z", market="spot", gpu_type="T4", gpus=2,
        price_usd_per_hour=3.6,
    )  # fmt: skip
    row = store.transition("i-1", row.version, InstanceStatus.REQUESTED, reason="launch")
    store.transition("i-1", row.version, InstanceStatus.RUNNING, reason="up",
                     provider_instance_id="p-1")  # fmt: skip
    for name in ("a", "b"):
        store.add_job(name, JobSubmission(name, 64, 512, 64, command=("t.py",)).to_json())
    store.set_assignments("a", {"i-1": 2})
    clock.advance(100.0)
    store.set_assignments("b", {"i-1": 2})  # written first ...
    clock.advance(0.012)
    store.set_assignments("a", {})  # ... the release it replaces, 12 ms later
    clock.advance(100.0)
    store.set_assignments("b", {})
    record = cost_record_from_store(store, clock.now_s())
    by_job = {j.job_id: j for j in record_job_costs(record)}
    assert by_job["a"].gpu_hours == pytest.approx(2 * 100.0 / 3600, abs=1e-4)
    assert by_job["b"].gpu_hours == pytest.approx(2 * 100.012 / 3600, abs=1e-4)
    assert by_job["a"].restarts == 0 and by_job["b"].restarts == 0
    store.close()


def test_a_spot_instance_is_compared_with_its_on_demand_twin_so_the_report_has_savings(
    tmp_path,
) -> None:
    """The store's cost record gives each spot instance the on-demand price the controller
    recorded for the same instance type and zone (issue 41: the demo's report said `savings
    vs on-demand: -`); the savings are that price's bill minus the spot bill, > 0."""
    from autoscaler.accounting.billing import cost_record_from_store
    from autoscaler.accounting.costs import summarize
    from providers.base import Market, offering_key

    store, _cloud, clock, ctl = fake_controller(tmp_path, "bill-od", jobs=1, max_instances=2)
    for _ in range(3):
        ctl.run_round()
        clock.advance(600.0)
    assert ctl.down().clean
    record = cost_record_from_store(store, clock.now_s())
    rows = {r.instance_key: r for r in store.list_instances() if r.provider_instance_id}
    assert rows and record.instances
    for inst in record.instances:
        row = rows[inst.instance_id]
        twin = offering_key(row.provider, row.instance_type, row.zone, Market.ON_DEMAND.value)
        expected = (
            row.price_usd_per_hour
            if row.market is Market.ON_DEMAND
            else store.price_at(twin, store.status_times(row.instance_key)[1] or 0.0)
        )
        assert expected is not None and inst.ondemand_usd_per_hour == expected
    summary = summarize(record)
    assert summary.savings_usd is not None and summary.savings_usd > 0, summary
    store.close()
