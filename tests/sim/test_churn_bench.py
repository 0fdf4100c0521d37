"""Churn measured in both simulator benchmarks (issue 40): per strategy (cloud_cost.py) and per
policy (paper_sim.py) the JSON gains ``launches``, ``restarts_per_job``, ``reversals`` and
``idle_usd_by_cause``, computed from the store each run leaves (one definition:
autoscaler/accounting/churn.py); the idle causes sum to the run's idle cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler.accounting.churn import IDLE_CAUSES

CHURN_KEYS = {"launches", "restarts_per_job", "reversals", "idle_usd_by_cause"}


def test_cloud_cost_json_gives_each_strategy_its_churn(tmp_path: Path, capsys) -> None:
    from benchmarks.cloud_cost import main

    out = tmp_path / "e2.json"
    argv = ["--experiment", "E2", "--strategies", "coadapt,cheapest-spot", "--workloads", "1"]
    argv += ["--max-jobs", "4", "--no-floor", "-j", "1", "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    for name, v in doc["strategies"].items():
        assert set(v) >= CHURN_KEYS, name
        assert set(v["idle_usd_by_cause"]) == set(IDLE_CAUSES)
        assert sum(v["idle_usd_by_cause"].values()) == pytest.approx(v["idle_usd"], rel=1e-9)
        assert v["launches"] >= v["boots_billed"] > 0 and v["restarts_per_job"] >= 0
        assert v["reversals"] == sum(v["reversals_by_kind"].values())
        (w,) = v["per_workload"].values()
        assert set(w) >= CHURN_KEYS and w["launches"] == v["launches"]
    assert "churn: launches" in capsys.readouterr().out


def test_paper_sim_json_gives_each_policy_its_churn(tmp_path: Path) -> None:
    from benchmarks.paper_sim import main

    folder = tmp_path / "workloads"
    folder.mkdir()
    (folder / "small-1.csv").write_text(
        "name,time,application,num_replicas,batch_size\na,0,cifar10,1,128\nb,30,ncf,2,256\n"
    )
    out = tmp_path / "bench.json"
    argv = ["--workloads", str(folder), "--policies", "tiresias", "--processes", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    v = json.loads(out.read_text())["policies"]["tiresias"]
    assert set(v) >= CHURN_KEYS
    assert v["launches"] == 16  # the fixed fleet: 16 nodes, each launched once
    assert set(v["idle_usd_by_cause"]) == set(IDLE_CAUSES)
    assert sum(v["idle_usd_by_cause"].values()) > 0
