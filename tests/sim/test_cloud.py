"""Cloud mode of the simulator: provisioning, preemptions with and without notice, capacity
from traces, the budget, and the cost ledger's totals against price x time."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from autoscaler.accounting.costs import job_costs, summarize, usd_to_cents
from autoscaler.decide.policy import make_policy
from autoscaler.decide.sizing import SizingConfig
from autoscaler.decide.strategies import FixedFleet, GoodputSizing
from autoscaler.decide.views import OfferingRef
from autoscaler.errors import InvalidInputError
from autoscaler.market.series import ConstantPrice, StepPriceSeries
from autoscaler.sim.cloud_config import BudgetExceededError, CloudConfig, CloudOffering
from autoscaler.sim.config import SimConfig
from autoscaler.sim.engine import Simulator
from autoscaler.sim.experiments import EXPERIMENTS, build_run
from autoscaler.sim.workload import TraceJob

T4_OD = OfferingRef("aws", "g4dn.12xlarge", "use1-az1", "on-demand")
T4_SPOT = OfferingRef("aws", "g4dn.12xlarge", "use1-az1", "spot")
JOBS = (
    TraceJob("cifar10-0", "cifar10", 0.0, 4, 512),
    TraceJob("ncf-0", "ncf", 300.0, 1, 256),
)


@dataclass(frozen=True)
class At:
    """Every instance of the offering is preempted ``after_s`` after its launch (once: the
    replacement lives on)."""

    after_s: float

    def preemption_time_s(self, instance_id: str, launched_at_s: float) -> float | None:
        return launched_at_s + self.after_s if instance_id.endswith("00001") else None

    def capacity_at(self, t_s: float) -> int | None:
        return None

    def capacity_changes(self, t0_s: float, t1_s: float) -> list[tuple[float, int]]:
        return []


@dataclass(frozen=True)
class Capacity:
    """Two instances until ``drop_s``, one after."""

    drop_s: float

    def preemption_time_s(self, instance_id: str, launched_at_s: float) -> float | None:
        return None

    def capacity_at(self, t_s: float) -> int | None:
        return 2 if t_s < self.drop_s else 1

    def capacity_changes(self, t0_s: float, t1_s: float) -> list[tuple[float, int]]:
        return [(self.drop_s, 1)] if t0_s < self.drop_s <= t1_s else []


def offering(ref=T4_OD, price=3.912, **kw) -> CloudOffering:
    return CloudOffering(ref, "T4", 4, ConstantPrice(price), ondemand_usd_per_hour=3.912, **kw)


def run(offerings, strategy, jobs=JOBS, policy="coadapt", **kw):
    cloud = CloudConfig(tuple(offerings), strategy, **kw)
    return Simulator(jobs, make_policy(policy), SimConfig(cloud=cloud)).run()


def test_fixed_fleet_costs_price_times_time_to_the_cent_and_nothing_runs_before_provisioning():
    r = run([offering()], FixedFleet("two", {T4_OD.key: 2}))
    assert r.cost is not None
    end = r.cost.closed_s
    assert usd_to_cents(summarize(r.cost).total_usd) == usd_to_cents(2 * 3.912 * end / 3600)
    first_use = min(u.t0_s for job in r.cost.jobs for u in job.usages)
    assert first_use >= 120.0  # the default provisioning delay
    s = summarize(r.cost)
    assert s.attributed_usd + s.idle_usd == pytest.approx(s.total_usd)
    assert sum(j.cost_usd for j in job_costs(r.cost)) == pytest.approx(s.attributed_usd)
    assert {j.job_id for j in job_costs(r.cost)} == {"cifar10-0", "ncf-0"}
    assert all(j.finished_s is not None for j in job_costs(r.cost))


def test_a_spot_price_change_is_billed_from_the_round_it_takes_effect():
    series = StepPriceSeries.from_points([(0.0, 1.0), (600.0, 2.0)])
    ref = T4_SPOT
    r = run([CloudOffering(ref, "T4", 4, series)], FixedFleet("one", {ref.key: 1}))
    assert r.cost is not None
    end = r.cost.closed_s
    assert end > 600
    expected = 1.0 * 600 / 3600 + 2.0 * (end - 600) / 3600
    assert usd_to_cents(summarize(r.cost).total_usd) == usd_to_cents(expected)


def test_a_preemption_stops_the_job_and_costs_progress_only_without_enough_notice():
    # Tiresias keeps the job's GPUs fixed: no planned restart writes a checkpoint before the
    # preemption at 930 s (mid-round), and periodic checkpoints come every hour.
    fleet = FixedFleet("one", {T4_SPOT.key: 1})
    jobs = JOBS[:1]

    def go(notice_s: float):
        o = offering(T4_SPOT, 1.3, preemption=At(930.0), notice_s=notice_s)
        return run([o], fleet, jobs=jobs, policy="tiresias", checkpoint_interval_s=3600.0)

    ok, short = go(120.0), go(5.0)
    for r in (ok, short):
        assert r.fleet is not None and r.fleet["preemptions"] == 1
        assert r.cost is not None and summarize(r.cost).preemptions == 1
        assert r.jobs[0].restarts == 1
    # Without time to write a checkpoint the job redoes its ~800 s of work since the start.
    assert short.jobs[0].jct_s > ok.jobs[0].jct_s + 600
    assert go(120.0).jobs == ok.jobs  # deterministic


def test_trace_capacity_preempts_the_newest_instance_and_refuses_launches_above_it():
    fleet = FixedFleet("three", {T4_SPOT.key: 3})
    r = run([offering(T4_SPOT, 1.3, preemption=Capacity(1200.0))], fleet)
    assert r.fleet is not None
    assert r.fleet["capacity_errors"] >= 1  # the third launch, and relaunches after the drop
    assert r.fleet["preemptions"] == 1
    assert r.cost is not None
    preempted = [i for i in r.cost.instances if i.end_reason == "preempted"]
    # Noticed 120 s ahead of the drop at 1,200 s, drained, and released by the controller
    # once no job was left on it (not later than the drop).
    assert len(preempted) == 1 and 1200.0 - 120.0 <= preempted[0].ended_s <= 1200.0
    assert preempted[0].instance_id == max(i.instance_id for i in r.cost.instances[:2])


def test_goodput_sizing_keeps_the_budget_at_every_round_and_a_tiny_budget_is_refused():
    sizing = GoodputSizing("coadapt", SizingConfig(budget_usd_per_hour=5.0))
    r = run([offering()], sizing, budget_usd_per_hour=5.0)
    assert r.fleet is not None and r.fleet["peak_usd_per_hour"] <= 5.0
    with pytest.raises(InvalidInputError, match="below the cheapest"):
        run([offering()], sizing, budget_usd_per_hour=3.0)
    # A strategy that ignores the budget is caught by the simulator.
    with pytest.raises(BudgetExceededError):
        run([offering()], FixedFleet("two", {T4_OD.key: 2}), budget_usd_per_hour=5.0)


def test_goodput_sizing_grows_for_work_and_releases_when_idle():
    jobs = (TraceJob("cifar10-0", "cifar10", 0.0, 4, 512), TraceJob("ncf-1", "ncf", 4000.0, 1, 256))
    r = run([offering()], GoodputSizing("coadapt"), jobs=jobs)
    assert r.cost is not None
    ends = sorted(i.ended_s for i in r.cost.instances)
    # Between the two jobs the fleet was released: some instance ended before the second job.
    assert ends[0] < 4000.0
    assert all(j.finished_s is not None for j in job_costs(r.cost))


def test_experiment_runs_are_built_from_the_shipped_catalogue_and_traces():
    for experiment, names in EXPERIMENTS.items():
        for name in names:
            cr = build_run(experiment, name)
            assert cr.cloud.offerings
            assert all(o.price.price_at(0.0) > 0 for o in cr.cloud.offerings)
    e2 = build_run("E2", "coadapt")
    spot = [o for o in e2.cloud.offerings if o.ref.market == "spot"]
    assert spot and all(o.preemption is not None for o in spot)
    with pytest.raises(InvalidInputError, match="no strategy"):
        build_run("E1", "cheapest-spot")


def test_results_json_carries_the_cost_record_for_cost_reports(tmp_path):
    from typer.testing import CliRunner

    from autoscaler.cli.main import app
    from autoscaler.sim.results import write_results_json

    r = run([offering()], FixedFleet("two", {T4_OD.key: 2}))
    path = tmp_path / "result.json"
    write_results_json(path, [r])
    out = CliRunner().invoke(app, ["cost", "report", str(path), "--format", "json"])
    assert out.exit_code == 0, out.output
    assert r.cost is not None
    assert str(usd_to_cents(summarize(r.cost).total_usd)) in out.output


def test_simulate_fleet_from_the_cli_writes_cost_records(tmp_path):
    import json

    from typer.testing import CliRunner

    from autoscaler.cli.main import app

    wl = tmp_path / "w.csv"
    wl.write_text("name,time,application,num_replicas,batch_size\nncf-0,0,ncf,1,256\n")
    out = tmp_path / "r.json"
    args = ["simulate", str(wl), "--fleet", "coadapt", "--budget-usd-per-hour", "10"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "coadapt cost $" in res.output
    run_json = json.loads(out.read_text())["runs"][0]
    assert run_json["config"]["cloud"]["strategy"] == "coadapt"
    assert run_json["cost_record"]["version"] == 1
    assert run_json["fleet"]["peak_usd_per_hour"] <= 10.0
    bad = CliRunner().invoke(app, ["simulate", str(wl), "--fleet", "cheapest"])
    assert bad.exit_code == 2 and "unknown strategy" in bad.output


def test_stochastic_spot_prices_move_are_seeded_and_stay_under_on_demand():
    a = build_run("E2", "coadapt", spot_prices="stochastic", seed=3)
    b = build_run("E2", "coadapt", spot_prices="stochastic", seed=3)
    spot = [o for o in a.cloud.offerings if o.ref.market == "spot"]
    times = [3600.0 * h for h in range(48)]
    for o, o2 in zip(spot, [o for o in b.cloud.offerings if o.ref.market == "spot"], strict=True):
        prices = [o.price.price_at(t) for t in times]
        assert prices == [o2.price.price_at(t) for t in times]
        assert len(set(prices)) > 1
        assert o.ondemand_usd_per_hour is not None
        assert max(prices) <= o.ondemand_usd_per_hour
    with pytest.raises(InvalidInputError, match="spot price model"):
        build_run("E2", "coadapt", spot_prices="weekly")


def test_a_replaced_spot_trace_keeps_the_other_families(tmp_path):
    from autoscaler.market.preemption import bamboo_trace_path
    from autoscaler.sim.experiments import load_traces

    p3 = bamboo_trace_path("p3-trace.csv")
    traces = load_traces({"g4dn": p3})
    assert set(traces) == {"g4dn", "p3"}
    assert traces["g4dn"].times_s == traces["p3"].times_s  # g4dn replaced by the p3 file
    assert load_traces()["g4dn"].times_s != traces["g4dn"].times_s


def test_cloud_cost_benchmark_rejects_a_bad_spot_trace_before_simulating(tmp_path, capsys):
    from benchmarks.cloud_cost import main

    out = tmp_path / "e.json"
    for bad in (str(tmp_path / "missing.csv"), "k80=" + str(tmp_path / "w.csv")):
        (tmp_path / "w.csv").write_text("0,add,node1\n")
        with pytest.raises(SystemExit) as info:
            main(["--experiment", "E1", "--spot-trace", bad, "--out", str(out)])
        assert info.value.code == 2
    assert "unknown family" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_cloud_cost_benchmark_splits_cost_into_applications_and_idle(tmp_path, capsys):
    """The per-application costs plus idle make the total to the cent, and the applications'
    JCT shares make the mean JCT (one workload, one strategy: a quick run)."""
    import json

    from benchmarks.cloud_cost import main

    out = tmp_path / "e3.json"
    argv = ["--experiment", "E3", "--strategies", "coadapt-v100", "--workloads", "1"]
    argv += ["--max-jobs", "40"]  # its first 40 jobs: a quick run
    assert main([*argv, "-j", "1", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    v = got["strategies"]["coadapt-v100"]
    assert set(got["strategies"]) == {"coadapt-v100"} and got["ratios"] == {}
    apps = v["per_application"]
    assert len(apps) >= 3 and v["idle_usd"] > 0
    total = sum(a["cost_usd"] for a in apps.values()) + v["idle_usd"]
    assert round(total, 2) == pytest.approx(v["cost_usd"], abs=0.011)
    assert sum(a["jct_share_s"] for a in apps.values()) == pytest.approx(v["mean_jct_s"])
    # The cost floors: (a) <= (b) <= cost, per strategy, workload and (summed) application.
    assert 0 < v["floor_usd"] <= v["floor_at_jct_usd"] <= v["cost_usd"]
    assert v["cost_over_floor"] == pytest.approx(v["cost_usd"] / v["floor_at_jct_usd"])
    (w,) = v["per_workload"].values()
    assert w["floor_usd"] == v["floor_usd"] and w["floor_wall_s"] > 0
    assert sum(a["floor_at_jct_usd"] for a in apps.values()) == pytest.approx(v["floor_at_jct_usd"])
    assert all(0 < a["floor_usd"] <= a["floor_at_jct_usd"] * (1 + 1e-6) for a in apps.values())
    printed = capsys.readouterr().out
    assert "where the money went" in printed and "cost floor (USD)" in printed
    with pytest.raises(SystemExit) as info:
        main(["--experiment", "E3", "--strategies", "coadapt-k80", "--out", str(out)])
    assert info.value.code == 2
    capsys.readouterr()
    for flag, bad in [
        *(("--max-jobs", b) for b in ("0", "-3", "many")),
        *(("--workloads", b) for b in ("0", "-1")),  # -1 sliced away the last workload
        *(("--deadline-factor", b) for b in ("0", "-2", "nan", "inf", "soon")),
    ]:
        with pytest.raises(SystemExit) as info:
            main(["--experiment", "E4", flag, bad, "--out", str(out)])
        assert info.value.code == 2
        assert flag in capsys.readouterr().err


def test_the_sizing_learns_how_long_a_running_job_has_left():
    """``demands_of`` gives a running job's remaining time at its allocation: the work the
    trainer has left over its fitted goodput there; unknown when it does not run or its
    length is unknown."""
    import dataclasses as dc

    from autoscaler.decide.sizing import FleetOption
    from autoscaler.decide.strategies import demands_of
    from autoscaler.decide.views import Allocation
    from autoscaler.model.gputypes import default_speed_table
    from autoscaler.sim.cloud_config import FleetView
    from tests.decide.policy.conftest import cluster, model, view

    m = model(0.05)
    running = dc.replace(
        view("run", alloc=(4, 0), profiled=4, model=m), models={"T4": m}, remaining_progress=500.0
    )
    goodput = float(m.optimize(1, 4).goodput)
    unknown = dc.replace(running, name="unknown", remaining_progress=None)
    waiting = dc.replace(running, name="wait", allocation=Allocation())
    option = FleetOption("aws/g4dn.12xlarge/use1-az1/on-demand", "T4", 4, "on-demand", 3.912)
    fleet = FleetView(600.0, (running, unknown, waiting), cluster(2, 4), {}, (option,))
    got = {d.name: d.remaining_s for d in demands_of(fleet, default_speed_table())}
    assert got["run"] == pytest.approx(500.0 * running.limits.init_batch_size / goodput)
    assert got["unknown"] is None and got["wait"] is None
