"""job_costs(): instances' billed cost split by the GPU-time jobs held, the rest idle."""

from __future__ import annotations

import pytest

from autoscaler.controller.billing import IDLE, job_costs
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

    from autoscaler.cli import app
    from autoscaler.controller.billing import cost_record_from_store
    from autoscaler.controller.lifecycle import InstanceStatus
    from autoscaler.costs import summarize

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
    from autoscaler.controller.billing import cost_record_from_store
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
