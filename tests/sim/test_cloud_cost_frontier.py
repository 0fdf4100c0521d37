"""``benchmarks/cloud_cost.py --frontier``: every strategy at every knob of a grid, or its knob
swept to the ends (``--frontier auto``), and the checks."""

from __future__ import annotations

import json

import pytest

from autoscaler.analysis.frontier import END_TOLERANCE, check_frontiers, points_from_json


def test_frontier_refuses_bad_knobs_before_simulating(tmp_path, capsys):
    from benchmarks.cloud_cost import main

    out = tmp_path / "f.json"
    too_many = ",".join(str(k / 100) for k in range(21))
    for bad in ("a,b", "", "-0.1", " , ", "nan", too_many, "0.5", "0.2,10.5", "autox"):
        with pytest.raises(SystemExit) as info:
            main(["--experiment", "E3", "--frontier", bad, "--out", str(out)])
        assert info.value.code == 2
    assert "--frontier" in capsys.readouterr().err
    # The cap on an auto sweep's runs covers the grid at least.
    for argv in (["--frontier-max-runs", "2"], ["--frontier-max-runs", "0"]):
        with pytest.raises(SystemExit) as info:
            main(["--experiment", "E3", "--frontier", "auto", *argv, "--out", str(out)])
        assert info.value.code == 2
    assert "--frontier-max-runs" in capsys.readouterr().err
    # An earlier file of another experiment, other settings or other workloads is refused.
    earlier = tmp_path / "earlier.json"
    argv_from = ["--experiment", "E3", "--frontier", "--frontier-from"]
    point = {"knob": 0.15, "cost_usd": 1.0, "mean_jct_s": 2.0}
    for payload, said in (
        ({"experiment": "E2", "frontier": {}}, "experiment"),
        ({"experiment": "E3", "frontier": {}, "settings": {"seed": 7}}, "settings"),
        (
            {"experiment": "E3", "frontier": {"coadapt": [point | {"per_workload": {"x": {}}}]}},
            "other workloads",
        ),
        ({"experiment": "E3"}, "no 'frontier'"),
    ):
        earlier.write_text(json.dumps(payload))
        with pytest.raises(SystemExit) as info:
            main([*argv_from, str(earlier), "--workloads", "1", "--out", str(out)])
        assert info.value.code == 2
        assert said in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--experiment", "E3", "--frontier-from", str(earlier), "--out", str(out)])
    assert "goes with --frontier" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_frontier_auto_sweeps_from_the_grid_toward_the_ends(tmp_path, capsys):
    """A bare --frontier sweeps: one strategy, one workload's first 8 jobs, at most 4 knobs.
    The grid runs first, then the fast end's first extension (the fast end goes first on a
    tie); each run prints one line on stderr; the JSON says how each end ended, and the points
    and statuses written are those the analysis gives for them."""
    from autoscaler.analysis.frontier import SweepSpec, next_knob, sweep_ends
    from benchmarks.cloud_cost import main

    out = tmp_path / "auto.json"
    base = ["--experiment", "E3", "--strategies", "coadapt-v100", "--workloads", "1"]
    base += ["--max-jobs", "8", "--no-floor", "-j", "1"]
    assert main([*base, "--frontier-max-runs", "4", "--out", str(out), "--frontier"]) == 0
    got = json.loads(out.read_text())
    points = got["frontier"]["coadapt-v100"]
    spec = SweepSpec(max_runs=4)
    grid = [p for p in points if p["knob"] in spec.grid]
    assert sorted(p["knob"] for p in grid) == sorted(spec.grid)
    # The fourth knob is the extension the analysis picks from the grid's points (which end
    # depends on the simulated figures: the analysis decides it, not this test).
    fourth = next_knob(points_from_json(grid), spec)
    assert fourth is not None and fourth not in spec.grid
    knobs = sorted([*spec.grid, fourth])
    assert [p["knob"] for p in points] == knobs
    assert got["knobs"] == knobs and got["complete"] is True
    assert all(p["peak_instances"] >= 1 and p["peak_gpus"] >= 1 for p in points)
    assert not any(p["at_max_instances"] for p in points)  # 8 jobs: far below 256 instances
    sweep = got["sweep"]
    assert sweep["mode"] == "auto" and sweep["spec"]["max_runs"] == 4
    assert sweep["max_instances"] == 256
    fleet = sweep["fleets"]["coadapt-v100"]
    expected = {e: s.to_json() for e, s in sweep_ends(points_from_json(points), spec).items()}
    assert {k: fleet[k] for k in ("fast", "cheap")} == json.loads(json.dumps(expected))
    assert fleet["runs"] == 4
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if "coadapt-v100" in line]) == 4
    # No reference fleet beside it: no checks.
    assert "frontier_checks" not in got
    # Taking those points, a cap of 5 runs the one knob more the analysis picks from them.
    fifth = next_knob(points_from_json(points), SweepSpec(max_runs=5))
    more = tmp_path / "more.json"
    argv = [*base, "--frontier-max-runs", "5", "--frontier-from", str(out), "--out", str(more)]
    assert main([*argv, "--frontier"]) == 0
    err = capsys.readouterr().err
    ran = [line for line in err.splitlines() if " knob " in line and "$" in line]
    assert len(ran) == (0 if fifth is None else 1)
    again = json.loads(more.read_text())
    assert [p["knob"] for p in again["frontier"]["coadapt-v100"]] == sorted(
        [*knobs, *([] if fifth is None else [fifth])]
    )
    assert [p for p in again["frontier"]["coadapt-v100"] if p["knob"] in knobs] == points
    assert again["sweep"]["fleets"]["coadapt-v100"]["from_file"] == knobs


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
    assert got["knobs"] == [0.15, 0.7] and got["complete"] is True
    # An explicit grid: its knobs and no more, each end said (here neither flat nor bounded).
    assert got["sweep"]["mode"] == "grid" and got["sweep"]["spec"]["grid"] == [0.15, 0.7]
    for fleet in got["sweep"]["fleets"].values():
        assert fleet["runs"] == 2 and fleet["fast"]["knobs"] == [0.15, 0.7]
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
    expected = check_frontiers(parsed, "coadapt", END_TOLERANCE)
    assert got["frontier_checks"] == json.loads(json.dumps(expected))
    printed = capsys.readouterr().out
    assert "frontier checks, coadapt" in printed and "vs coadapt-v100" in printed
