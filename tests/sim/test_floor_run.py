"""The cost floor on real simulated cloud runs: floor (a) <= floor (b) <= the run's bill, and no
job ever progresses faster than the goodput envelope the floor assumes is its best."""

from __future__ import annotations

import bisect

import pytest

from autoscaler.accounting.costs import summarize
from autoscaler.analysis.floor import cost_floor
from autoscaler.decide.policy import make_policy
from autoscaler.model.traces import load_app
from autoscaler.sim.config import SimConfig
from autoscaler.sim.engine import Simulator
from autoscaler.sim.experiments import build_run, e1_workload, experiment_menu
from autoscaler.sim.floor_inputs import DEFAULT_SEGMENTS, _segment_cells, floor_problem

from .conftest import SMALL


class _Observed(Simulator):
    """The simulator, recording what each replayed slice of a job truly achieved: (job,
    node group, GPUs, progress before, progress after, seconds it ran)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.slices: list[tuple[str, object, int, float, float, float]] = []

    def _step(self, job, seconds, interference):  # type: ignore[no-untyped-def]
        before, delay = job.progress, job.delay_left_s
        groups = {self._group[n] for n in job.allocation}
        gpus = job.allocation.num_gpus
        ran = super()._step(job, seconds, interference)
        run_s = (ran if ran is not None else seconds) - min(delay, seconds)
        if gpus and run_s > 0 and job.progress > before:
            for group in groups:
                self.slices.append((job.spec.name, group, gpus, before, job.progress, run_s))
        return ran


def _run(experiment: str, strategy: str, jobs):
    run = build_run(experiment, strategy)
    sim = _Observed(jobs, make_policy(run.policy, **run.policy_options), SimConfig(cloud=run.cloud))
    return sim, sim.run()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("experiment", "strategy", "jobs"),
    [
        ("E1", "coadapt", e1_workload()),
        ("E2", "coadapt", tuple(SMALL)),
        ("E2", "cheapest-spot", tuple(SMALL)),
        ("E2", "static-ondemand", tuple(SMALL)),
    ],
)
def test_floors_bound_the_bill_and_the_envelope_bounds_every_rate(experiment, strategy, jobs):
    sim, result = _run(experiment, strategy, jobs)
    assert result.cost is not None
    menu = experiment_menu(experiment)
    problem = floor_problem(jobs, result, offerings=menu)
    floor = cost_floor(problem)
    cost = summarize(result.cost).total_usd
    assert 0 < floor.no_limit_usd <= floor.at_deadline_usd * (1 + 1e-9)
    assert floor.at_deadline_usd <= cost
    # Per job too: (a) <= (b) (each job's share of the program's optimum).
    for name, a in floor.no_limit_by_job.items():
        assert a <= floor.at_deadline_by_job[name] * (1 + 1e-6) + 1e-9

    # Every slice the run replayed progressed at most at the envelope's rate for its
    # offering's node group, GPU count and the segments it crossed.
    key_of = {o.key: o.group for o in menu}
    checked = 0
    for job in problem.jobs:
        app = load_app(job.application)
        grid = app.progress_curve(app.init_batch_size).progress_grid
        starts = [float(grid[a]) for a, _ in _segment_cells(app, DEFAULT_SEGMENTS)]
        rates = {(key_of[c.offering], c.gpus): c.goodput for c in job.configs}
        for name, group, gpus, p0, p1, run_s in sim.slices:
            if name != job.job_id:
                continue
            first = max(0, bisect.bisect_right(starts, p0) - 1)
            last = max(0, bisect.bisect_left(starts, p1) - 1)
            bound = max(rates[(group, gpus)][first : last + 1])
            assert (p1 - p0) / run_s <= bound * (1 + 1e-9), (name, group, gpus, p0, p1)
            checked += 1
    assert checked >= len(problem.jobs)


@pytest.mark.slow
def test_the_floor_buys_from_the_whole_menu_not_the_strategys():
    """static-ondemand runs on on-demand g4dn.12xlarge only; its floor may buy anything the
    experiment offers (the least any fleet could have paid)."""
    jobs = tuple(SMALL[:1])
    _, result = _run("E2", "static-ondemand", jobs)
    own = floor_problem(jobs, result)
    whole = floor_problem(jobs, result, offerings=experiment_menu("E2"))
    assert {o.key for o in own.offerings} == {"aws/g4dn.12xlarge/use1-az1/on-demand"}
    assert len(whole.offerings) == 6
    assert cost_floor(whole).no_limit_usd < cost_floor(own).no_limit_usd


@pytest.mark.slow
def test_simulate_floor_reaches_the_cost_report(tmp_path):
    """``coadapt simulate --fleet ... --floor`` keeps the floors in its results JSON and
    ``coadapt cost report`` shows them (table and JSON); a malformed floor is refused."""
    import json

    from typer.testing import CliRunner

    from autoscaler.cli.main import app

    wl = tmp_path / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\nncf-0,0,ncf,1,256\n")
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        app, ["simulate", str(wl), "--fleet", "coadapt", "--floor", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "cost floor $" in res.output
    payload = json.loads(out.read_text())
    floor = payload["runs"][0]["floor"]
    assert 0 < floor["floor_usd"] <= floor["floor_at_jct_usd"] <= floor["cost_usd"]
    assert floor["cost_over_floor"] == pytest.approx(floor["cost_usd"] / floor["floor_at_jct_usd"])
    assert set(floor["per_application"]) == {"ncf"}
    assert len(floor["offerings"]) == 6  # E2's whole menu

    table = CliRunner().invoke(app, ["cost", "report", str(out), "--wide"])
    assert table.exit_code == 0, table.output
    assert "Cost floor" in table.output and "ncf" in table.output
    summary = json.loads(CliRunner().invoke(app, ["cost", "report", str(out), "-f", "json"]).output)
    assert summary["floor"]["floor_at_jct_usd"] == pytest.approx(
        floor["floor_at_jct_usd"], abs=0.006
    )
    assert summary["floor"]["per_application"]["ncf"]["cost_over_floor"] > 1
    page = tmp_path / "r.html"
    html = CliRunner().invoke(app, ["cost", "report", str(out), "-f", "html", "-o", str(page)])
    assert html.exit_code == 0, html.output
    text = page.read_text()
    assert 'data-table="floor"' in text and "floor (b) USD" in text
    ratio = floor["cost_usd"] / floor["floor_at_jct_usd"]
    assert f"<td class=num>{ratio:.2f}</td>" in text

    payload["runs"][0]["floor"]["floor_usd"] = -1.0
    out.write_text(json.dumps(payload))
    bad = CliRunner().invoke(app, ["cost", "report", str(out)])
    assert bad.exit_code != 0 and "floor.floor_usd" in bad.output
