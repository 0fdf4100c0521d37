"""job_costs(): instances' billed cost split by the GPU-time jobs held, the rest idle."""

from __future__ import annotations

import pytest

from autoscaler.controller.billing import IDLE, job_costs
from autoscaler.controller.store import AssignmentSpan, CostRecordRow


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
