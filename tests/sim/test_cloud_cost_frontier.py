"""``benchmarks/cloud_cost.py --frontier``: every strategy at every knob, and the checks."""

from __future__ import annotations

import json

import pytest

from autoscaler.analysis.frontier import check_frontiers, points_from_json


def test_frontier_refuses_bad_knobs_before_simulating(tmp_path, capsys):
    from benchmarks.cloud_cost import main

    out = tmp_path / "f.json"
    for bad in ("a,b", "", "-0.1", " , ", "nan", ",".join(str(k / 100) for k in range(21))):
        with pytest.raises(SystemExit) as info:
            main(["--experiment", "E3", "--frontier", bad, "--out", str(out)])
        assert info.value.code == 2
    assert "--frontier" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_frontier_runs_each_strategy_at_each_knob_and_checks_them(tmp_path, capsys):
    """One workload, two knobs, coadapt and its all-V100 variant: four runs. Each strategy has
    one point per knob, the points of one strategy differ (the knob moves the fleet), and the
    checks written are those of the points written."""
    from benchmarks.cloud_cost import main

    out = tmp_path / "frontier.json"
    argv = ["--experiment", "E3", "--strategies", "coadapt,coadapt-v100", "--workloads", "1"]
    argv += ["--max-jobs", "40"]
    argv += ["--no-floor"]  # the floors have their own tests (tests/sim/test_floor_run.py)
    assert main([*argv, "--frontier", "0.7,0.15", "-j", "2", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["knobs"] == [0.15, 0.7]
    assert set(got["frontier"]) == {"coadapt", "coadapt-v100"}
    for points in got["frontier"].values():
        assert [p["knob"] for p in points] == [0.15, 0.7]
        assert all(p["cost_usd"] > 0 and p["mean_jct_s"] > 0 for p in points)
        assert set(points[0]["per_workload"]) == {"workload-1"}
    v100 = got["frontier"]["coadapt-v100"]
    assert (v100[0]["cost_usd"], v100[0]["mean_jct_s"]) != (
        v100[1]["cost_usd"],
        v100[1]["mean_jct_s"],
    )
    parsed = {s: points_from_json(p) for s, p in got["frontier"].items()}
    expected = check_frontiers(parsed, "coadapt")
    assert got["frontier_checks"] == json.loads(json.dumps(expected))
    printed = capsys.readouterr().out
    assert "frontier checks, coadapt" in printed and "vs coadapt-v100" in printed
