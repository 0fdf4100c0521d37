"""Deadlines in the simulated cloud: the deadline travels as the API takes it, coadapt meets
a tight one through spot preemptions by falling back to on demand, the controller says when
a deadline is missed for certain, and E4's benchmark reports deadlines."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from autoscaler.controller.events import DEADLINE_REASON, EventKind, EventRecorder
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.decide.policy import make_policy
from autoscaler.decide.strategies import GoodputSizing, UniformProgress
from autoscaler.decide.views import OfferingRef
from autoscaler.market.series import ConstantPrice
from autoscaler.sim.cloud_config import CloudConfig, CloudOffering
from autoscaler.sim.config import SimConfig
from autoscaler.sim.engine import Simulator, isolated_jct_s
from autoscaler.sim.experiments import with_deadlines
from autoscaler.sim.results import results_payload
from autoscaler.sim.workload import TraceJob

T4_OD = OfferingRef("aws", "g4dn.12xlarge", "use1-az1", "on-demand")
T4_SPOT = OfferingRef("aws", "g4dn.12xlarge", "use1-az1", "spot")
JOB = TraceJob("cifar10-0", "cifar10", 0.0, 4, 512)


@dataclass(frozen=True)
class Every:
    """Every spot instance is taken back ``after_s`` after its launch (a market that never
    lets a job run long)."""

    after_s: float

    def preemption_time_s(self, instance_id: str, launched_at_s: float) -> float | None:
        return launched_at_s + self.after_s

    def capacity_at(self, t_s: float) -> int | None:
        return None

    def capacity_changes(self, t0_s: float, t1_s: float) -> list[tuple[float, int]]:
        return []


def offerings(after_s: float) -> tuple[CloudOffering, ...]:
    return (
        CloudOffering(T4_OD, "T4", 4, ConstantPrice(3.912), ondemand_usd_per_hour=3.912),
        CloudOffering(
            T4_SPOT,
            "T4",
            4,
            ConstantPrice(1.3),
            ondemand_usd_per_hour=3.912,
            preemption=Every(after_s),
        ),
    )


def simulate(jobs, strategy, policy: str, after_s: float):
    """The run's result, and what was seen of the job at each round's end: its store row
    and the events a recorder told (the store closes with the run)."""
    cloud = CloudConfig(offerings(after_s), strategy)
    sim = Simulator(jobs, make_policy(policy), SimConfig(cloud=cloud))
    recorder = EventRecorder(sim.world.store, sim.world.clock)
    rows, events = [], []

    def seen(now_s: float, done: int, total: int) -> None:
        rows.append(sim.world.store.get_job(jobs[0].name))
        events.extend(recorder.observe())

    sim.on_round = seen
    return sim.run(), rows, events


def test_the_deadline_travels_as_the_api_takes_it() -> None:
    (job,) = with_deadlines((JOB,), 2.0)
    reference = isolated_jct_s(JOB, 4, 4) + 120.0 + 30.0 + 2 * 60.0
    assert job.deadline_after_s == pytest.approx(2.0 * reference)
    sim = Simulator(
        (job,),
        make_policy("coadapt"),
        SimConfig(cloud=CloudConfig(offerings(1e9), GoodputSizing("c"))),
    )
    submission = sim._submission(sim.jobs[0])
    assert submission.deadline == job.deadline_after_s
    assert JobSubmission.from_json(submission.to_json()) == submission
    result, rows, _ = simulate((job,), GoodputSizing("c"), "coadapt", 1e9)
    assert rows[-1].deadline_s == pytest.approx(job.deadline_after_s)  # submitted at 0
    (done,) = result.jobs
    assert done.deadline_s == pytest.approx(job.deadline_after_s) and done.deadline_met
    assert results_payload([result])["runs"][0]["jobs"][0]["deadline_met"] is True


def test_coadapt_meets_a_tight_deadline_through_preemptions_on_spot_then_on_demand() -> None:
    # k = 1.0: since the controller holds its decisions (controller/hold.py: no young spot
    # instance drained for cost), this job meets k = 1.2 on spot alone (JCT 1177 s, was 1400);
    # since the world runs a new batch only after the trainer's next report reply (as the real
    # trainer does), it meets k = 1.05 on spot alone too (JCT 1177 s, was 1397 s with the batch
    # applied at once): k = 1.0 (JCT 1191 s, deadline 1431 s) still needs on-demand
    jobs = with_deadlines((JOB,), 1.0)
    result, _, events = simulate(jobs, GoodputSizing("coadapt"), "coadapt", 400.0)
    (job,) = result.jobs
    assert job.deadline_met
    markets = {i.market for i in result.cost.instances}
    assert markets == {"spot", "on-demand"}  # spot while the slack allowed, then on demand
    assert result.fleet["preemptions"] >= 1
    first_od = min(i.launched_s for i in result.cost.instances if i.market == "on-demand")
    first_spot = min(i.launched_s for i in result.cost.instances if i.market == "spot")
    assert first_spot < first_od
    assert not any(e.kind is EventKind.DEADLINE for e in events)  # never said to be missed


def test_a_missed_deadline_is_said_once_when_it_is_certain() -> None:
    """Uniform progress on its 4 GPUs misses a deadline of its JCT alone in this market; the
    controller says so (the job's reason, a deadline event) once it is certain -- even
    perfect scaling of its best GPU could not finish in time -- and not before."""
    jobs = with_deadlines((JOB,), 1.0)
    result, rows, events = simulate(jobs, UniformProgress("uniform-progress"), "tiresias", 300.0)
    (job,) = result.jobs
    assert job.deadline_met is False
    said = [r for r in rows if r.reason and r.reason.startswith(DEADLINE_REASON)]
    assert said and "samples left take at least" in said[0].reason
    told = [e for e in events if e.kind is EventKind.DEADLINE]
    assert len(told) == 1 and told[0].warning and told[0].message == said[0].reason
    # Said within two rounds of it being certain (here: the deadline passed with work left),
    # and not before.
    assert job.deadline_s < told[0].at_s <= job.deadline_s + 120.0  # its round, or the next
    assert all(r.reason is None for r in rows if r.updated_at_s < told[0].at_s)


@pytest.mark.slow
def test_the_e4_benchmark_reports_deadlines(tmp_path, capsys) -> None:
    from benchmarks.cloud_cost import main

    out = tmp_path / "e4.json"
    argv = ["--experiment", "E4", "--workloads", "1", "--max-jobs", "40", "--deadline-factor", "2"]
    argv += ["-j", "1"]
    argv += ["--no-floor"]  # the floors have their own tests (tests/sim/test_floor_run.py)
    assert main([*argv, "--strategies", "ondemand-only,coadapt", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["deadline_factor"] == 2.0
    for v in got["strategies"].values():  # skipped, so null, not zero
        assert v["floor_usd"] is None and v["cost_over_floor"] is None
        assert all(a["floor_usd"] is None for a in v["per_application"].values())
    for name in ("ondemand-only", "coadapt"):
        v = got["strategies"][name]
        assert v["deadline_jobs"] == 40  # --max-jobs: the workload's first 40 jobs only
        assert len(v["deadline_misses"]) == round((1 - v["deadlines_met"]) * v["deadline_jobs"])
    assert got["strategies"]["ondemand-only"]["deadlines_met"] == 1.0
    # coadapt's target (the deadline issue): at least 99% met; these 40 jobs at k = 2 all are.
    assert got["strategies"]["coadapt"]["deadlines_met"] >= 0.99
    assert "coadapt / ondemand-only" in got["ratios"]
    assert "deadlines met" in capsys.readouterr().out
