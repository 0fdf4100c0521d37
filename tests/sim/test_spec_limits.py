"""A simulated E2 workload (``benchmarks/cloud_cost.py``, the product's controller under the
simulated cloud) whose first jobs set ``markets`` or ``offerings`` in their spec: under every
E2 fleet strategy they run, and never on an instance their limits exclude (read from the
run's cost ledger); a fleet that cannot serve them refuses them with the reason."""

from __future__ import annotations

import json

import pytest

from autoscaler.sim.engine import SimulationError
from autoscaler.sim.runner import paper_workloads
from autoscaler.sim.workload import load_workload

E2 = ["--experiment", "E2", "--workloads", "1", "--max-jobs", "8", "--no-floor", "-j", "2"]
FIRST_JOBS = [j.name for j in load_workload(str(paper_workloads("1.0")[0])).jobs[:3]]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("limit", "strategies"),
    [
        (["--limit-markets", "on-demand"], "coadapt,pollux-autoscale"),
        (
            [
                "--limit-offerings",
                "aws/g4dn.12xlarge/use1-az1/on-demand,aws/p3.16xlarge/use1-az1/spot",
            ],
            "coadapt,cheapest-spot",
        ),
    ],
    ids=["on-demand", "offerings"],
)
def test_limited_jobs_never_run_outside_their_limits(
    tmp_path, limit: list[str], strategies: str
) -> None:
    """coadapt buys from both markets (the others' spot and the limited jobs' on demand);
    the limited jobs run, and hold no GPU-second outside their limits."""
    from benchmarks.cloud_cost import main

    out = tmp_path / "e2.json"
    argv = [*E2, "--strategies", strategies, "--limit-jobs", "3", *limit, "--out", str(out)]
    assert main(argv) == 0
    got = json.loads(out.read_text())["strategies"]
    assert set(got) == set(strategies.split(","))
    for name, s in got.items():
        assert s["limited_jobs"] == ["workload-1/" + n for n in FIRST_JOBS], name
        assert s["limited_gpu_s"] > 0, f"{name}: the limited jobs never ran"
        assert s["limited_outside_gpu_s"] == 0.0, name


@pytest.mark.slow
def test_an_on_demand_job_is_refused_by_a_spot_only_fleet(tmp_path) -> None:
    """E2's ``cheapest-spot`` buys spot only: the controller refuses a job limited to on
    demand at once, with the reason, and the simulator stops on it (a refusal is final)."""
    from benchmarks.cloud_cost import main

    argv = [*E2, "--strategies", "cheapest-spot", "--limit-jobs", "1"]
    with pytest.raises(SimulationError) as info:
        main([*argv, "--limit-markets", "on-demand", "--out", str(tmp_path / "x.json")])
    assert (
        f"the controller refused {FIRST_JOBS[0]}: markets allows on-demand; the fleet can have "
        "only aws/g4dn.12xlarge/use1-az1/spot, aws/g4dn.xlarge/use1-az1/spot, "
        "aws/p3.16xlarge/use1-az1/spot"
    ) in str(info.value)


def test_limit_jobs_wants_a_limit(tmp_path, capsys) -> None:
    from benchmarks.cloud_cost import main

    with pytest.raises(SystemExit) as info:
        main([*E2, "--limit-jobs", "3", "--out", str(tmp_path / "x.json")])
    assert info.value.code == 2
    assert "--limit-jobs wants --limit-markets or --limit-offerings" in capsys.readouterr().err
