"""``benchmarks/controller_round.py``: the documented JSON, on a small fleet, and the rounds it
times are real ones: they keep the fleet it holds busy with the jobs it has."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.controller_round import main


def test_writes_the_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "round.json"
    assert main(["--jobs", "30", "--instances", "8", "--rounds", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["jobs"] == 30 and doc["instances"] == 8 and doc["rounds"] == 2
    for key in ("round_s_median", "round_s_p95", "rss_mib", "store_mib"):
        assert doc[key] > 0
    assert doc["round_s_p95"] >= doc["round_s_median"]
    assert set(doc["phases_s_median"]) == {"observe", "decide", "reconcile", "act"}
    # 30 jobs for 8 instances: every GPU paid for holds a job (no round left the fleet idle)
    assert doc["fleet_gpus"] >= 8 and doc["assigned_gpus"] == doc["fleet_gpus"], doc
    assert 8 <= doc["placed_jobs"] <= min(30, doc["assigned_gpus"]), doc


def test_history_days_fills_an_old_store_and_compares_a_fresh_one(tmp_path: Path) -> None:
    """``--history-days``: the store holds that many days of a busy past (every job moved
    every six hours, a generation of instances a day, every offering's price every hour), and
    the rounds timed after it are as busy as on a fresh store; ``--compare-fresh`` times a
    fresh store's rounds beside them."""
    out = tmp_path / "round.json"
    argv = ["--jobs", "30", "--instances", "8", "--rounds", "2", "--history-days", "2"]
    assert main([*argv, "--compare-fresh", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["history_days"] == 2
    history = doc["history"]
    assert history["spans"] == history["events"] == 30 * 4 * 2  # jobs x moves a day x days
    assert history["instances"] == 2 * 2  # --instances / 4 a day
    assert history["prices"] == 12 * 24 * 2  # the fake's T4 and A100 offerings, hourly
    assert history["fill_s"] > 0
    assert doc["jobs"] == 30 and doc["instances"] == 8 and doc["rounds"] == 2
    assert doc["fleet_gpus"] >= 8 and doc["assigned_gpus"] == doc["fleet_gpus"], doc
    fresh = doc["fresh"]
    assert set(fresh) == {"round_s_median", "round_s_p95", "phases_s_median"}
    assert fresh["round_s_p95"] >= fresh["round_s_median"] > 0
    assert doc["aged_over_fresh"] == doc["round_s_median"] / fresh["round_s_median"]


def test_store_times_the_same_cluster_on_postgresql_beside_sqlite(
    tmp_path: Path, postgres_url: str
) -> None:
    """``--store URL``: the same jobs and fleet on a real PostgreSQL database, its rounds timed
    interleaved with the SQLite store's, and as busy (the database holds that cluster)."""
    out = tmp_path / "round.json"
    argv = ["--jobs", "30", "--instances", "8", "--rounds", "2", "--store", postgres_url]
    assert main([*argv, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    pg = doc["postgres"]
    assert set(pg) == {"round_s_median", "round_s_p95", "phases_s_median", "warmup_rounds"}
    assert pg["round_s_p95"] >= pg["round_s_median"] > 0
    assert doc["postgres_over_sqlite"] == pg["round_s_median"] / doc["round_s_median"]
    from autoscaler.controller.lifecycle import InstanceStatus
    from autoscaler.controller.store import Store
    from coadapt_common.clock import SystemClock

    with Store.open_read_only(postgres_url, SystemClock()) as store:
        assert len(store.list_jobs()) == 30
        assert len(store.list_instances(statuses=(InstanceStatus.RUNNING,))) == 8
