"""Churn as a measured cost (issue 40, Build item 4): launches, boots billed, restarts,
reversals, and idle split by cause, from a controller's store (autoscaler/accounting/churn.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler.accounting.billing import churn_from_store, cost_record_from_store, run_origin_s
from autoscaler.accounting.churn import (
    IDLE_CAUSES,
    ChurnFigures,
    batch_reversals,
    placement_reversals,
    sum_churn_json,
)
from autoscaler.accounting.costs import idle_cost_usd
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.store import Store
from coadapt_common.clock import FakeClock


def _instance(store: Store, key: str, gpus: int) -> None:
    """An instance row of ``gpus`` GPUs at 3.6 USD/h (0.001 USD/s), launched and running now."""
    row = store.add_instance(
        instance_key=key, request_id=f"churn-{key}", offering_key="fake/t/z/spot",
        provider="fake", instance_type="t", zone="z", market="spot", gpu_type="T4", gpus=gpus,
        price_usd_per_hour=3.6,
    )  # fmt: skip
    row = store.transition(key, row.version, InstanceStatus.REQUESTED, reason="launch")
    store.transition(key, row.version, InstanceStatus.RUNNING, reason="up",
                     provider_instance_id=f"p-{key}")  # fmt: skip


def _leave(store: Store, key: str, status: InstanceStatus, reason: str) -> None:
    store.transition(key, store.get_instance(key).version, status, reason=reason)


def _hand_built_run(tmp_path: Path) -> tuple[Store, FakeClock]:
    """i-1, 4 GPUs: 100 s before its first job (boot), job a on 2 of its GPUs for 200 s
    (fragmentation: the 2 free), 100 s empty (empty-ready), drained, gone 100 s later (drain).
    i-2, 1 GPU: no job ever; drained after 50 s (boot), gone 50 s later (drain). Job a goes
    2 -> 4 -> 2 GPUs on i-1 at 160 s and 220 s (a reversal within 5 rounds of 60 s)."""
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "churn", clock)
    store.add_job("a", JobSubmission("a", 64, 512, 64, command=("t.py",)).to_json())
    _instance(store, "i-1", 4)
    _instance(store, "i-2", 1)
    clock.advance(50.0)
    _leave(store, "i-2", InstanceStatus.DRAINING, "fleet target lowered (cost)")
    clock.advance(50.0)  # t = 100
    _leave(store, "i-2", InstanceStatus.TERMINATING, "no job left")
    _leave(store, "i-2", InstanceStatus.TERMINATED, "gone")
    store.set_assignments("a", {"i-1": 2})
    clock.advance(60.0)  # t = 160
    store.set_assignments("a", {"i-1": 4})
    clock.advance(60.0)  # t = 220
    store.set_assignments("a", {"i-1": 2})
    clock.advance(80.0)  # t = 300
    store.set_assignments("a", {})
    clock.advance(100.0)  # t = 400
    _leave(store, "i-1", InstanceStatus.DRAINING, "fleet target lowered (cost)")
    clock.advance(100.0)  # t = 500
    _leave(store, "i-1", InstanceStatus.TERMINATING, "no job left")
    _leave(store, "i-1", InstanceStatus.TERMINATED, "gone")
    return store, clock


def test_idle_is_split_into_boot_drain_empty_ready_and_fragmentation(tmp_path: Path) -> None:
    store, clock = _hand_built_run(tmp_path)
    record = cost_record_from_store(store, clock.now_s())
    origin = run_origin_s(store)
    assert origin is not None
    churn = churn_from_store(store, record, interval_s=60.0, origin_s=origin)
    by_cause = churn.idle_usd_by_cause
    assert set(by_cause) == set(IDLE_CAUSES)
    # 0.001 USD per instance-second: i-1's GPU costs 0.00025 USD/s, i-2's 0.001 USD/s.
    assert by_cause["boot"] == pytest.approx(100 * 4 * 0.00025 + 50 * 0.001)
    assert by_cause["fragmentation"] == pytest.approx(140 * 2 * 0.00025)  # 160-220: all 4 held
    assert by_cause["empty_ready"] == pytest.approx(100 * 4 * 0.00025)
    assert by_cause["drain"] == pytest.approx(100 * 4 * 0.00025 + 50 * 0.001)
    assert by_cause["minimum_billing"] == pytest.approx(0.0)
    assert churn.idle_usd == pytest.approx(idle_cost_usd(record))  # every idle dollar, once
    assert churn.launches == 2 and churn.boots_billed == 2
    assert churn.jobs == 1 and churn.restarts == 2  # 2 -> 4 -> 2 GPUs: two restarts
    assert churn.reversals_by_kind == {"gpus": 1, "instances": 0, "batch": None}
    assert churn.reversals == 1 and churn.restarts_per_job == 2.0
    store.close()


def test_a_change_back_after_the_horizon_is_no_reversal(tmp_path: Path) -> None:
    store, clock = _hand_built_run(tmp_path)
    record = cost_record_from_store(store, clock.now_s())
    # 2 -> 4 at 160 s, 4 -> 2 at 220 s: 60 s apart, more than 5 rounds of 10 s
    churn = churn_from_store(store, record, interval_s=10.0, origin_s=run_origin_s(store) or 0)
    assert churn.reversals == 0
    store.close()


def test_reversals_of_gpus_instances_and_batch() -> None:
    a, b = {"i-1": 1}, {"i-2": 1}
    # a job moved i-1 -> i-2 -> i-1 within 2 rounds: one instance reversal
    assert placement_reversals([(0, a), (60, b), (120, a)], 300.0) == (0, 1)
    # a stop between is no state: 1 GPU, stopped, 2 GPUs, 1 GPU
    assert placement_reversals([(0, a), (60, {}), (120, {"i-1": 2}), (180, a)], 300.0) == (1, 0)
    # growing twice is no reversal; shrinking after is
    assert placement_reversals(
        [(0, a), (60, {"i-1": 2}), (120, {"i-1": 4}), (180, {"i-1": 2})], 300.0
    ) == (1, 0)
    # the batch 32 -> 1024 -> 32 -> 252 in 21 s: two reversals (down, then up)
    assert batch_reversals([(0, 32), (7, 1024), (14, 32), (21, 252)], 300.0) == 2
    assert batch_reversals([(0, 32), (7, 1024), (400, 32)], 300.0) == 0


def test_churn_json_sums_over_runs() -> None:
    one = ChurnFigures(3, 2, 4, 2, {"gpus": 1, "instances": 0, "batch": 2},
                       dict.fromkeys(IDLE_CAUSES, 1.0))  # fmt: skip
    two = ChurnFigures(1, 1, 1, 3, {"gpus": 0, "instances": 1, "batch": None},
                       dict.fromkeys(IDLE_CAUSES, 0.5))  # fmt: skip
    total = sum_churn_json([one.to_json(), two.to_json()])
    assert total["launches"] == 4 and total["boots_billed"] == 3
    assert total["restarts_per_job"] == pytest.approx(5 / 5)
    assert total["reversals"] == 4  # each run's own: 3 (gpus 1, batch 2) + 1 (instances)
    assert total["reversals_by_kind"] == {"gpus": 1, "instances": 1, "batch": None}
    assert total["idle_usd_by_cause"] == dict.fromkeys(IDLE_CAUSES, 1.5)
    json.dumps(total, allow_nan=False)


def test_the_cost_report_of_a_store_shows_launches_boots_and_idle_by_cause(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from autoscaler.cli.main import app

    store, _clock = _hand_built_run(tmp_path)
    store.close()
    runner = CliRunner()
    out = runner.invoke(app, ["cost", "report", "--state-dir", str(tmp_path), "--format", "json"])
    assert out.exit_code == 0, out.output
    churn = json.loads(out.output)["churn"]
    assert churn["launches"] == 2 and churn["boots_billed"] == 2 and churn["reversals"] == 1
    assert churn["idle_usd_by_cause"]["boot"] == pytest.approx(0.15)
    assert churn["idle_usd_by_cause"]["empty_ready"] == pytest.approx(0.1)
    table = runner.invoke(
        app, ["cost", "report", "--state-dir", str(tmp_path)], env={"COLUMNS": "120"}
    )
    assert table.exit_code == 0, table.output
    for words in ("launches", "boots billed", "idle: boot", "idle: drain", "idle: empty ready",
                  "idle: fragmentation"):  # fmt: skip
        assert words in table.output, table.output
