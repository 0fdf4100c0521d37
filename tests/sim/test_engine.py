"""Simulator semantics and invariants, with scripted policies and the real ones."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.decide.policy import make_policy
from autoscaler.decide.policy.base import Decision
from autoscaler.decide.views import (
    BatchChoice,
    ClusterView,
    JobView,
    Plan,
    PolicyName,
    RoundInput,
    fixed_batch_choice,
    num_nodes_of,
)
from autoscaler.errors import InvalidInputError
from autoscaler.model.traces import load_app
from autoscaler.sim.engine import (
    SimConfig,
    SimulationError,
    Simulator,
    isolated_jct_s,
    simulate,
)
from autoscaler.sim.results import results_payload, write_results_json
from autoscaler.sim.workload import TraceJob
from tests.sim.conftest import SMALL

FAST_POLLUX = {"population": 24, "generations": 8}


@dataclass
class Scripted:
    """A policy that gives each job a fixed allocation (by name) at the user's batch size,
    from a given round on; records every round input it sees."""

    allocations: dict[str, tuple[int, ...]]
    start_round: dict[str, int] = field(default_factory=dict)
    seen: list[RoundInput] = field(default_factory=list)
    name: PolicyName = PolicyName.TIRESIAS
    uses_model: bool = True
    uses_oracle: bool = True
    avoids_interference: bool = False

    def initial_state(self) -> None:
        return None

    def gpu_bounds(self, job: JobView, cluster: ClusterView) -> tuple[int, int]:
        return 0, cluster.total_gpus

    def decide(self, round_input: RoundInput, state: Any) -> Decision:
        self.seen.append(round_input)
        zeros = (0,) * round_input.cluster.num_nodes
        allocs, batches = {}, {}
        for job in round_input.jobs:
            alloc = self.allocations.get(job.name, zeros)
            if round_input.cluster.round_index < self.start_round.get(job.name, 0):
                alloc = zeros
            allocs[job.name] = round_input.cluster.sparse(alloc)
            if sum(alloc):
                batches[job.name] = fixed_batch_choice(job.fixed_batch_size, sum(alloc), job.limits)
        return Decision(Plan(allocs, batches), state)


def _expected_jct(spec: TraceJob, placement: tuple[int, ...], delay_s: float) -> float:
    app = load_app(spec.application)
    from autoscaler.sim.engine import _limits

    choice = fixed_batch_choice(spec.batch_size, sum(placement), _limits(app))
    step, sync = app.step_time_s(placement, choice.local_bsz)
    t_iter = step + (choice.accum_steps - 1) * (step - sync)
    iters = float(app.progress_curve(choice.batch_size).iterations(app.target_progress))
    return delay_s + iters * t_iter


def test_single_job_jct_matches_traces() -> None:
    spec = TraceJob("c", "cifar10", 0.0, 2, 512)
    policy = Scripted({"c": (2, 0)})
    res = simulate([spec], policy, SimConfig(num_nodes=2))
    job = res.jobs[0]
    assert job.jct_s == pytest.approx(_expected_jct(spec, (2,), 30.0), rel=1e-9)
    assert job.restarts == 0
    assert job.gpu_s == pytest.approx(2 * job.jct_s, rel=1e-9)


def test_queueing_counts_and_rounds_are_aligned() -> None:
    spec = TraceJob("n", "ncf", 107.0, 1, 256)
    policy = Scripted({"n": (1,)})
    res = simulate([spec], policy, SimConfig(num_nodes=1))
    # Seen first at the round starting at 120 s; 13 s of queueing count in the JCT.
    assert policy.seen[0].cluster.now_s == 120.0
    assert res.jobs[0].jct_s == pytest.approx(13.0 + _expected_jct(spec, (1,), 30.0), rel=1e-9)


def test_restart_delay_on_every_change() -> None:
    spec = TraceJob("c", "cifar10", 0.0, 1, 128)

    @dataclass
    class Flip(Scripted):
        def decide(self, round_input: RoundInput, state: Any) -> Decision:
            r = round_input.cluster.round_index
            self.allocations["c"] = (1, 0) if r % 4 < 2 else (0, 1)
            return super().decide(round_input, state)

    res = simulate([spec], Flip({}), SimConfig(num_nodes=2))
    job = res.jobs[0]
    changes = math.floor(job.jct_s / 120.0)
    assert job.restarts in (changes, changes + 1)
    # Same speed on either node: JCT grows by one delay per restart.
    assert job.jct_s == pytest.approx(
        _expected_jct(spec, (1,), 30.0) + 30.0 * job.restarts, rel=1e-6
    )


def test_interference_slows_shared_multi_node_jobs() -> None:
    a = TraceJob("a", "cifar10", 0.0, 4, 1024)
    b = TraceJob("b", "cifar10", 0.0, 4, 1024)
    shared = {"a": (2, 2, 0), "b": (2, 2, 0)}
    apart = {"a": (2, 2, 0), "b": (0, 0, 4)}
    cfg = SimConfig(num_nodes=3, interference=0.5)
    slow = simulate([a, b], Scripted(dict(shared)), cfg)
    fast = simulate([a, b], Scripted(dict(apart)), cfg)
    base = _expected_jct(a, (2, 2), 0.0)
    assert slow.jobs[0].jct_s == pytest.approx(30.0 + 2 * base, rel=1e-6)
    assert fast.jobs[0].jct_s == pytest.approx(30.0 + base, rel=1e-6)
    # Without interference, sharing costs nothing.
    same = simulate([a, b], Scripted(dict(shared)), SimConfig(num_nodes=3))
    assert same.jobs[0].jct_s == pytest.approx(fast.jobs[0].jct_s)


def test_plan_violations_are_caught() -> None:
    spec = [TraceJob("a", "ncf", 0.0, 1, 256), TraceJob("b", "ncf", 0.0, 1, 256)]
    over = Scripted({"a": (3,), "b": (2,)})
    with pytest.raises(SimulationError, match="over-allocated"):
        simulate(spec, over, SimConfig(num_nodes=1))

    @dataclass
    class NoBatch(Scripted):
        def decide(self, round_input: RoundInput, state: Any) -> Decision:
            d = super().decide(round_input, state)
            return Decision(Plan(d.plan.allocations, {}), state)

    with pytest.raises(SimulationError, match="batch"):
        simulate(spec, NoBatch({"a": (1,)}), SimConfig(num_nodes=1))

    @dataclass
    class Spread(Scripted):
        avoids_interference: bool = True

    crowded = Spread({"a": (1, 1), "b": (1, 1)})
    with pytest.raises(SimulationError, match="multi-node"):
        simulate(spec, crowded, SimConfig(num_nodes=2))
    # Without avoidance the same plan is legal.
    simulate(
        spec,
        Spread({"a": (1, 1), "b": (1, 1)}),
        SimConfig(num_nodes=2, interference_avoidance=False),
    )


def test_starvation_is_bounded() -> None:
    spec = [TraceJob("a", "ncf", 0.0, 1, 256)]
    with pytest.raises(SimulationError, match="unfinished"):
        simulate(spec, Scripted({}), SimConfig(num_nodes=1, max_time_s=600))


def test_policy_view_is_what_a_controller_sees() -> None:
    spec = TraceJob("c", "cifar10", 0.0, 2, 512)
    policy = Scripted({"c": (2,)})
    simulate([spec], policy, SimConfig(num_nodes=1))
    first, second, later = policy.seen[0].jobs[0], policy.seen[1].jobs[0], policy.seen[5].jobs[0]
    assert first.model is None and first.max_profiled_gpus == 0 and first.num_restarts == 0
    assert second.model is not None and second.max_profiled_gpus == 2
    assert second.attained_gpu_s == pytest.approx(120.0)
    assert later.age_s == pytest.approx(300.0)
    # The oracle's remaining iterations shrink as the job progresses.
    assert first.oracle is not None and later.oracle is not None
    assert later.oracle.remaining_iterations < first.oracle.remaining_iterations
    # The fitted model predicts the profiled configuration closely.
    c = fixed_batch_choice(512, 2, second.limits)
    step, _ = load_app("cifar10").step_time_s((2,), c.local_bsz)
    predicted = float(second.model.step_time_s(1, 2, c.local_bsz, c.accum_steps))
    assert predicted == pytest.approx(step, rel=0.05)


def test_isolated_jct_reference() -> None:
    spec = TraceJob("c", "cifar10", 0.0, 4, 512)
    one = isolated_jct_s(spec, 1.0, 4)
    half = isolated_jct_s(spec, 0.5, 4)
    assert half == pytest.approx(2 * one)
    assert isolated_jct_s(spec, 4.0, 4) < one


def _check_invariants(result_rounds: list[RoundInput], plans: list[Plan], policy) -> None:
    for round_input, plan in zip(result_rounds, plans, strict=True):
        cluster = round_input.cluster
        used = np.zeros(cluster.num_nodes, dtype=int)
        multi = np.zeros(cluster.num_nodes, dtype=int)
        for job in round_input.jobs:
            alloc = np.array(cluster.dense(plan.allocations[job.name]))
            used += alloc
            low, high = policy.gpu_bounds(job, cluster)
            assert alloc.sum() == 0 or low <= alloc.sum() <= high
            if num_nodes_of(tuple(alloc)) > 1:
                multi += alloc > 0
        assert np.all(used <= np.array(cluster.gpus_per_node))
        if cluster.interference_avoidance:
            assert np.all(multi <= 1)


class Recording:
    """Wraps a policy and records every round's input and plan."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.uses_model = inner.uses_model
        self.uses_oracle = inner.uses_oracle
        self.avoids_interference = inner.avoids_interference
        self.inputs: list[RoundInput] = []
        self.plans: list[Plan] = []

    def initial_state(self) -> Any:
        return self.inner.initial_state()

    def gpu_bounds(self, job: JobView, cluster: ClusterView) -> tuple[int, int]:
        return self.inner.gpu_bounds(job, cluster)

    def decide(self, round_input: RoundInput, state: Any) -> Decision:
        d = self.inner.decide(round_input, state)
        self.inputs.append(round_input)
        self.plans.append(d.plan)
        return d


@pytest.mark.parametrize("policy_name", list(PolicyName))
def test_real_policies_complete_small_workload_within_invariants(policy_name: PolicyName) -> None:
    options = FAST_POLLUX if policy_name is PolicyName.POLLUX else {}
    policy = Recording(make_policy(policy_name, seed=3, **options))
    res = simulate(SMALL, policy, SimConfig(num_nodes=2, gpus_per_node=4))
    assert [j.name for j in res.jobs] == [s.name for s in SMALL]
    assert all(j.jct_s > 0 and j.completion_time_s > j.submit_time_s for j in res.jobs)
    _check_invariants(policy.inputs, policy.plans, policy.inner)
    assert len(res.rounds) == len(policy.inputs)


job_strategy = st.builds(
    TraceJob,
    name=st.just("x"),
    application=st.sampled_from(["ncf", "cifar10"]),
    submit_time_s=st.floats(0, 1800).map(round),
    num_replicas=st.integers(1, 8),
    batch_size=st.sampled_from([128, 256, 512, 1024]),
)


@pytest.mark.slow
@settings(max_examples=6, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(job_strategy, min_size=1, max_size=6),
    policy_name=st.sampled_from(list(PolicyName)),
    nodes=st.integers(1, 3),
    interference=st.sampled_from([0.0, 0.3]),
)
def test_random_workloads_complete_within_invariants(
    jobs: list[TraceJob], policy_name: PolicyName, nodes: int, interference: float
) -> None:
    jobs = [TraceJob(f"j{i}", *_fields(j)) for i, j in enumerate(jobs)]
    options = FAST_POLLUX if policy_name is PolicyName.POLLUX else {}
    policy = Recording(make_policy(policy_name, seed=1, **options))
    res = simulate(jobs, policy, SimConfig(num_nodes=nodes, interference=interference))
    assert len(res.jobs) == len(jobs)
    assert all(np.isfinite(j.jct_s) and j.jct_s > 0 for j in res.jobs)
    _check_invariants(policy.inputs, policy.plans, policy.inner)


def _fields(job: TraceJob) -> tuple:
    return job.application, job.submit_time_s, job.num_replicas, job.batch_size


@pytest.mark.parametrize("world", ["ideal", "measured"])
def test_same_seed_gives_byte_identical_json(tmp_path: Path, world: str) -> None:
    cfg = SimConfig(num_nodes=2, seed=5, world=world)
    paths = []
    for i in range(2):
        res = simulate(SMALL, make_policy("pollux", seed=5, **FAST_POLLUX), cfg)
        paths.append(tmp_path / f"r{i}.json")
        write_results_json(paths[-1], [res])
    assert paths[0].read_bytes() == paths[1].read_bytes()
    payload = json.loads(paths[0].read_text())
    assert payload["runs"][0]["policy"] == "pollux"
    assert "timing" not in payload["runs"][0]
    assert "timing" in results_payload([res], include_timing=True)["runs"][0]


def test_config_validation() -> None:
    with pytest.raises(InvalidInputError):
        SimConfig(num_nodes=0)
    with pytest.raises(InvalidInputError):
        SimConfig(interference=1.0)
    with pytest.raises(InvalidInputError):
        SimConfig(interval_s=0)
    with pytest.raises(InvalidInputError):
        Simulator([], make_policy("tiresias"))


def test_batch_choice_validation() -> None:
    with pytest.raises(InvalidInputError):
        BatchChoice(0, 1, 1)


def test_the_policy_learns_lengths_only_through_the_declared_channel() -> None:
    """``lengths="declared"``: every view carries the remaining work by the trainer's rule
    (the application's target less the job's progress); ``"none"``: no view does. Jobs end
    at their true length either way."""
    from trainer.report import remaining_progress

    seen: dict[str, list[JobView]] = {}
    for lengths in ("declared", "none"):
        policy = Recording(make_policy(PolicyName.COADAPT))
        res = simulate(SMALL, policy, SimConfig(num_nodes=2, gpus_per_node=4, lengths=lengths))
        assert all(j.jct_s > 0 for j in res.jobs)
        seen[lengths] = [v for r in policy.inputs for v in r.jobs]
    assert all(v.remaining_progress is None for v in seen["none"])
    # A job's length reaches the controller with its trainer's first report.
    declared = [v for v in seen["declared"] if v.max_profiled_gpus]
    assert declared and all(v.remaining_progress is not None for v in declared)
    assert all(v.remaining_progress is None for v in seen["declared"] if not v.max_profiled_gpus)
    first: dict[str, JobView] = {}
    for v in declared:
        first.setdefault(v.name, v)
        assert 0 <= (v.remaining_progress or 0) <= load_app(v.application).target_progress
    for v in first.values():  # after its first report, all but what it ran is left
        target = load_app(v.application).target_progress
        assert 0 < (v.remaining_progress or 0) < remaining_progress(0.0, target) == target
    with pytest.raises(InvalidInputError):
        SimConfig(lengths="oracle")


def test_a_new_batch_on_the_same_gpus_runs_from_the_round_after_the_report_reply() -> None:
    """The controller plans a larger batch for a job on the same GPU at its 4th round: its trainer
    learns it from the reply to the report it sends at that round's end and runs it from the
    next round on (as the real trainer does), never in the round it was planned; its first
    launch starts with the batch planned for it."""
    spec = TraceJob("c", "cifar10", 0.0, 1, 128)

    @dataclass
    class Rebatch(Scripted):
        def decide(self, round_input: RoundInput, state: Any) -> Decision:
            decision = super().decide(round_input, state)
            plan = decision.plan
            if sum(1 for seen in self.seen if seen.jobs) > 3 and plan.batches:
                job = round_input.jobs[0]
                bigger = fixed_batch_choice(256, 1, job.limits)
                plan = Plan(plan.allocations, {job.name: bigger})
            return Decision(plan, state)

    planned: list[int] = []
    ran: list[int] = []

    def note(now_s: float, done: int, total: int) -> None:
        store = sim.world.store
        if done:
            return
        planned.append(store.list_batches()["c"].global_batch_size)
        report = store.latest_report("c")
        assert report is not None
        ran.append(json.loads(report.payload_json)["batch"]["global_batch_size"])

    sim = Simulator([spec], Rebatch({"c": (1,)}), SimConfig(num_nodes=1), on_round=note)
    sim.run()
    assert planned[:6] == [128, 128, 128, 256, 256, 256]
    assert ran[:6] == [128, 128, 128, 128, 256, 256]


def test_the_policy_learns_the_finished_jobs_lengths_from_the_controllers_store() -> None:
    """The simulator runs the controller's own round, so a policy gets the lengths of the
    jobs that completed (the store's attained service of each), however few declared theirs:
    none before the first job ends, then one more with each completion, each the GPU-seconds
    that job held (the results' ``gpu_s``, to within one round of the cluster's 8 GPUs: the
    store closes a job's spans when the controller hears that it ended)."""
    policy = Recording(make_policy(PolicyName.COADAPT))
    res = simulate(SMALL, policy, SimConfig(num_nodes=2, gpus_per_node=4, lengths="none"))
    counts = [len(r.finished_gpu_s) for r in policy.inputs]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] >= 1
    assert counts[-1] <= len(res.jobs) - 1  # the round that saw the last job end decides nothing
    held = sorted(j.gpu_s for j in res.jobs)
    for length in policy.inputs[-1].finished_gpu_s:
        assert length > 0
        assert min(abs(length - g) for g in held) <= 60.0 * 8, (length, held)
