"""The coadapt policy: invariants, fairness knob, types, restarts, refusals, and its solver."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.decide.policy import make_policy
from autoscaler.decide.policy.coadapt import (
    CoadaptOptions,
    CoadaptPolicy,
    CoadaptState,
    Pool,
    pools_of,
    solve_choices,
)
from autoscaler.decide.views import Allocation, ClusterView, JobView, NodeView, Plan, RoundInput
from autoscaler.errors import InvalidInputError
from autoscaler.model.goodput import BatchLimits, GoodputModel, GradParams, PerfParams
from tests.decide.policy.conftest import LIMITS, alloc_of, cluster, model, round_input, rows, view


def mixed_cluster(t4: int = 2, v100: int = 1, a100: int = 1) -> ClusterView:
    nodes = [NodeView(f"t4-{i}", "T4", 4) for i in range(t4)]
    nodes += [NodeView(f"v100-{i}", "V100", 8) for i in range(v100)]
    nodes += [NodeView(f"a100-{i}", "A100", 8) for i in range(a100)]
    return ClusterView(tuple(nodes), now_s=600.0, round_index=10)


def check_plan(policy: CoadaptPolicy, ri: RoundInput, plan: Plan) -> None:
    """Everything a coadapt plan promises, beyond Plan.validate."""
    bounds = {job.name: policy.gpu_bounds(job, ri.cluster)[1] for job in ri.jobs}
    plan.validate(ri, max_gpus=bounds, single_type=True)
    c = ri.cluster
    for job in ri.jobs:
        alloc = plan.allocations[job.name]
        if not alloc or alloc == job.allocation:
            continue
        # A new allocation is canonical: a power of two on one node, or whole nodes.
        size = c.node(next(iter(alloc))).gpus
        if alloc.num_nodes == 1:
            g = alloc.num_gpus
            assert g == size or (g & (g - 1)) == 0, alloc
        else:
            assert all(v == size for v in alloc.values()), alloc


# ---- invariants --------------------------------------------------------------------------


@st.composite
def rounds(draw: st.DrawFn) -> RoundInput:
    groups = draw(
        st.lists(
            st.tuples(st.sampled_from(["T4", "V100", "A100"]), st.sampled_from([1, 2, 4, 8])),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    nodes = []
    for g, (gpu_type, size) in enumerate(groups):
        for i in range(draw(st.integers(1, 4))):
            nodes.append(NodeView(f"g{g}-{i}", gpu_type, size))
    c = ClusterView(tuple(nodes), now_s=3600.0, round_index=60)
    free = {n.instance_key: n.gpus for n in nodes}
    jobs = []
    for j in range(draw(st.integers(0, 10))):
        alloc: dict[str, int] = {}
        if draw(st.booleans()):  # some current allocation inside one node group
            g = draw(st.integers(0, len(groups) - 1))
            for node in nodes:
                if node.instance_key.startswith(f"g{g}-") and draw(st.booleans()):
                    take = draw(st.integers(0, free[node.instance_key]))
                    if take:
                        alloc[node.instance_key] = take
                        free[node.instance_key] -= take
        profiled = draw(st.sampled_from([0, 1, 2, 4, 8, 16]))
        fitted = profiled > 0 and draw(st.booleans())
        models = {}
        if fitted:
            for gpu_type in {t for t, _ in groups}:
                if draw(st.booleans()):
                    models[gpu_type] = model(draw(st.sampled_from([0.001, 0.05, 0.5])))
        adaptive = draw(st.booleans()) or True
        jobs.append(
            JobView(
                name=f"j{j}",
                application=draw(st.sampled_from(["cifar10", "bert", "imagenet"])),
                submit_time_s=float(j),
                age_s=draw(st.sampled_from([10.0, 600.0, 3600.0])),
                attained_gpu_s=0.0,
                num_restarts=draw(st.integers(0, 3)),
                allocation=Allocation(alloc),
                limits=LIMITS,
                requested_gpus=draw(st.integers(1, 8)),
                fixed_batch_size=256,
                max_profiled_gpus=max(profiled, sum(alloc.values())),
                model=next(iter(models.values()), None) if models else None,
                models=models,
                adaptive=adaptive,
                remaining_progress=draw(st.sampled_from([None, 0.0, 100.0, 1e5])),
            )
        )
    return RoundInput(c, tuple(jobs))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ri=rounds(), power=st.sampled_from([-4.0, -1.0, 0.0, 0.5]), milp=st.booleans())
@pytest.mark.slow
def test_plans_keep_every_invariant(ri: RoundInput, power: float, milp: bool) -> None:
    policy = CoadaptPolicy(power=power, solver="milp" if milp else "lagrange")
    decision = policy.decide(ri, policy.initial_state())
    check_plan(policy, ri, decision.plan)
    assert decision.state.bound >= decision.state.objective - 1e-6 * abs(decision.state.bound)
    # Deterministic, and from the state it returned too.
    again = policy.decide(ri, policy.initial_state())
    assert dict(again.plan.allocations) == dict(decision.plan.allocations)
    assert dict(again.plan.batches) == dict(decision.plan.batches)
    warm = policy.decide(ri, decision.state)
    assert dict(warm.plan.allocations) == dict(decision.plan.allocations)


def test_empty_queue_and_empty_fleet() -> None:
    policy = CoadaptPolicy()
    d = policy.decide(round_input(cluster()), policy.initial_state())
    assert dict(d.plan.allocations) == {} and not d.plan.refused
    nobody = ClusterView((), now_s=0.0, round_index=0)
    d = policy.decide(RoundInput(nobody, (view("a"), view("b"))), policy.initial_state())
    assert {n: a.num_gpus for n, a in d.plan.allocations.items()} == {"a": 0, "b": 0}
    assert not d.plan.refused  # a fleet being provisioned is no reason to refuse


def test_seed_changes_nothing() -> None:
    c = cluster(nodes=4)
    jobs = [view(f"j{i}", nodes=4, model=model(0.001 * 10**i), profiled=4) for i in range(3)]
    plans = [
        make_policy("coadapt", seed=s).decide(round_input(c, *jobs), CoadaptState()).plan
        for s in (0, 1, 2)
    ]
    assert all(dict(p.allocations) == dict(plans[0].allocations) for p in plans)


# ---- the fairness knob -------------------------------------------------------------------


def test_very_negative_power_approaches_max_min_fairness() -> None:
    # Three jobs on 2 x 4 GPUs that scale very differently. Max-min fairness (the limit of the
    # power mean as p -> -inf) maximises the smallest speedup; p = 1 maximises their sum.
    # Speedups are over each job's fair share, ceil(8 / 3) = 3 GPUs on one node, as in the
    # policy's objective.
    c = cluster(nodes=2, gpus=4)
    jobs = [
        view("fast", model=model(0.0001), profiled=8),
        view("mid", model=model(0.02), profiled=8),
        view("slow", model=model(0.3), profiled=8),
    ]
    ri = round_input(c, *jobs)

    def speedups(alloc_gpus: dict[str, int]) -> dict[str, float]:
        out = {}
        for job in jobs:
            g = alloc_gpus[job.name]
            nodes = 1 if g <= 4 else 2
            out[job.name] = float(job.model.optimize(nodes, g).goodput) if g else 0.0
            out[job.name] /= float(job.model.optimize(1, 3).goodput)
        return out

    # Brute force over canonical shapes (1, 2, 4 on one node; 8 on two) that fit 8 GPUs.
    best_min, best_sum = -1.0, -1.0
    for combo in itertools.product([0, 1, 2, 4, 8], repeat=3):
        if sum(combo) > 8 or (8 in combo and sum(combo) > 8):
            continue
        s = speedups(dict(zip(("fast", "mid", "slow"), combo, strict=True)))
        best_min = max(best_min, min(s.values()))
        best_sum = max(best_sum, sum(s.values()))
    for solver in ("milp", "lagrange"):
        maxmin = CoadaptPolicy(power=-30.0, restart_penalty=False, solver=solver)
        got = speedups(
            {n: a.num_gpus for n, a in maxmin.decide(ri, CoadaptState()).plan.allocations.items()}
        )
        assert min(got.values()) == pytest.approx(best_min, rel=1e-6)
        utilitarian = CoadaptPolicy(
            power=1.0, restart_penalty=False, admit_first=False, solver=solver
        )
        got = speedups(
            {
                n: a.num_gpus
                for n, a in utilitarian.decide(ri, CoadaptState()).plan.allocations.items()
            }
        )
        assert sum(got.values()) == pytest.approx(best_sum, rel=1e-3)
        assert min(got.values()) <= best_min + 1e-12


# ---- GPU types ---------------------------------------------------------------------------


def _perf(compute_s: float) -> PerfParams:
    return PerfParams(0.1 * compute_s, 0.9 * compute_s / 128, 0.01, 0.001, 0.02, 0.002, 1.0)


def test_unprofiled_faster_type_is_explored_and_profiled_speeds_decide() -> None:
    c = mixed_cluster(t4=1, v100=0, a100=1)
    grad = GradParams(0.01, 1.0)
    on_t4 = GoodputModel(_perf(0.5), grad, LIMITS)
    job = view("j", profiled=4, model=on_t4)
    job = JobView(**{**job.__dict__, "models": {"T4": on_t4}})
    policy = CoadaptPolicy(restart_penalty=False)
    plan = policy.decide(round_input(c, job), CoadaptState()).plan
    # Never run on A100; its estimate (several times a T4) wins: the job goes there.
    assert c.gpu_types_of(plan.allocations["j"]) == ("A100",)
    # Once profiled there and found slow (a job the ratio rule overrates), it comes back.
    slow_a100 = GoodputModel(_perf(5.0), grad, LIMITS)
    job = JobView(**{**job.__dict__, "models": {"T4": on_t4, "A100": slow_a100}})
    plan = policy.decide(round_input(c, job), CoadaptState()).plan
    assert c.gpu_types_of(plan.allocations["j"]) == ("T4",)


# ---- restarts, admission -----------------------------------------------------------------


def test_horizon_rule_keeps_a_job_close_to_done_in_place() -> None:
    c = cluster(nodes=2, gpus=4)
    m = model(0.0001)
    common = {"alloc": (2, 0), "model": m, "profiled": 4}
    # Lots of work left: growing to 4 GPUs is worth a 30 s restart.
    far = JobView(**{**view("j", **common).__dict__, "remaining_progress": 1e7})
    plan = CoadaptPolicy().decide(round_input(c, far), CoadaptState()).plan
    assert plan.allocations["j"].num_gpus > 2
    # Done in well under a minute at 2 GPUs: a restart would cost more than it gains.
    work_s = 20.0 * float(m.optimize(1, 2).goodput) / LIMITS.init_batch_size
    near = JobView(**{**view("j", **common).__dict__, "remaining_progress": work_s})
    plan = CoadaptPolicy().decide(round_input(c, near), CoadaptState()).plan
    assert rows(c, plan)["j"] == (2, 0)


def test_admit_first_starts_queued_jobs_before_growing_running_ones() -> None:
    c = cluster(nodes=1, gpus=4)
    runner = view("run", nodes=1, alloc=(1,), model=model(0.0001), profiled=8, age=36000.0)
    queued = [view(f"q{i}", nodes=1, age=1.0) for i in range(3)]  # submitted a second ago
    ri = round_input(c, runner, *queued)
    # Under Pollux's age rule a job starting at age 1 s keeps 1/31 of its speedup: the sum of
    # speedups (p = 1) grows the runner instead of starting them...
    greedy = CoadaptPolicy(power=1.0, admit_first=False, restart_rule="age")
    got = {n: a.num_gpus for n, a in greedy.decide(ri, CoadaptState()).plan.allocations.items()}
    assert got["run"] == 4 and sum(got[f"q{i}"] for i in range(3)) == 0
    # ... unless queued jobs are admitted first.
    admit = CoadaptPolicy(power=1.0, admit_first=True, restart_rule="age")
    got = {n: a.num_gpus for n, a in admit.decide(ri, CoadaptState()).plan.allocations.items()}
    assert all(got[f"q{i}"] == 1 for i in range(3)) and got["run"] == 1


def test_a_job_is_not_stopped_for_newcomers_while_its_service_is_its_start() -> None:
    """Expected remaining service grows with attained service (Gott's prior), so newcomers may
    take a running job's GPUs; but service below a restart is the job's start, not a sign of
    its length: a job placed seconds ago keeps its GPUs (a live 1-second-round cluster stopped
    one after 3 s for a job submitted after it: tests/controller/test_failover.py)."""
    c = ClusterView.uniform(2, 1, now_s=600.0, round_index=10, interval_s=1.0, restart_delay_s=10.0)

    def plan(attained_s: float) -> dict[str, tuple[int, ...]]:
        runner = view("a", alloc=(1, 0), age=attained_s + 1.0, attained=attained_s)
        late = [view("b", age=2.0), view("c", age=0.5)]
        return rows(c, CoadaptPolicy().decide(round_input(c, runner, *late), CoadaptState()).plan)

    for attained_s in (2.0, 9.0):
        got = plan(attained_s)
        assert got["a"] == (1, 0) and sorted([got["b"], got["c"]]) == [(0, 0), (0, 1)], got
    got = plan(60.0)  # six restarts' worth of service: the newcomers go first
    assert got["a"] == (0, 0) and sorted([got["b"], got["c"]]) == [(0, 1), (1, 0)], got


def test_a_running_job_never_trades_its_type_for_a_slower_one() -> None:
    nodes = (NodeView("a100-0", "A100", 8), NodeView("a100-1", "A100", 8))
    c = ClusterView((*nodes, NodeView("v100-0", "V100", 8)), now_s=600.0, round_index=10)
    # A job that scales poorly holds both A100 nodes; a newcomer that scales well would gain
    # more from them than the runner loses on 8 V100s (the objective's trade, found in
    # cloud_cost.py E3): the runner keeps its type, the newcomer takes the V100s.
    on_a100 = Allocation({"a100-0": 8, "a100-1": 8})
    big = view("big", model=model(0.05), profiled=16)
    big = JobView(**{**big.__dict__, "allocation": on_a100, "remaining_progress": 1e7})
    new = view("new", model=model(0.001), profiled=4, age=60.0)
    new = JobView(**{**new.__dict__, "remaining_progress": 1e7})
    plan = CoadaptPolicy().decide(round_input(c, big, new), CoadaptState()).plan
    assert plan.allocations["big"] == on_a100
    assert c.gpu_types_of(plan.allocations["new"]) == ("V100",)
    # A move to another type that gains goodput after the restart is still taken.
    slow = JobView(**{**big.__dict__, "allocation": Allocation({"v100-0": 8})})
    plan = CoadaptPolicy().decide(round_input(c, slow), CoadaptState()).plan
    assert c.gpu_types_of(plan.allocations["big"]) == ("A100",)


# ---- refusals ----------------------------------------------------------------------------


def test_a_job_larger_than_any_pool_is_refused_with_the_reason() -> None:
    c = cluster(nodes=2, gpus=4)
    # M0 = 4096 with at most 32 per GPU and 16 micro-batches needs 8 GPUs of one type.
    big = BatchLimits(init_batch_size=4096, max_batch_size=8192, max_local_bsz=32, min_local_bsz=32)
    huge = JobView(**{**view("huge").__dict__, "limits": big})
    policy = CoadaptPolicy()
    assert policy.min_gpus(huge, "T4") == 8
    plan = policy.decide(round_input(c, huge), CoadaptState()).plan
    assert not plan.refused and plan.allocations["huge"].num_gpus == 8  # 2 nodes x 4 fit
    small = cluster(nodes=1, gpus=4)
    plan = policy.decide(round_input(small, huge, view("ok")), CoadaptState()).plan
    assert set(plan.refused) == {"huge"}
    assert "at least 8 GPUs" in plan.refused["huge"] and "T4x4" in plan.refused["huge"]
    assert plan.allocations["huge"].num_gpus == 0 and plan.allocations["ok"].num_gpus == 1


# ---- the solver --------------------------------------------------------------------------


def _instance(seed: int, jobs: int, pools: int):
    """Random menus shaped like real ones: each job's value rises with its GPUs with
    diminishing returns (speedup ~ k^a, a in [0.3, 1]), at a speed that differs by pool, under
    the p = -1 kernel; waiting costs 1000; pool capacities 8-63."""
    rng = np.random.default_rng(seed)
    job, pool, gpus, value = [], [], [], []
    for j in range(jobs):
        weight, exponent = rng.uniform(0.5, 2), rng.uniform(0.3, 1.0)
        for p in range(pools):
            speed = rng.uniform(0.5, 3)
            for k in (1, 2, 4, 8, 16):
                job.append(j)
                pool.append(p)
                gpus.append(k)
                value.append(-weight / (speed * k**exponent / 16 + 1e-3))
    empty = np.full(jobs, -1000.0)
    capacity = rng.integers(8, 64, size=pools)
    return (np.array(job), np.array(pool), np.array(gpus), np.array(value), empty, capacity)


@pytest.mark.parametrize("seed", range(8))
def test_lagrange_is_within_its_bound_of_the_exact_optimum(seed: int) -> None:
    inst = _instance(seed, jobs=30, pools=2)
    exact, opt, opt_bound = solve_choices(*inst, solver="milp")
    choice, objective, bound = solve_choices(*inst, solver="lagrange")
    assert opt == pytest.approx(opt_bound)
    assert objective <= opt + 1e-6 and bound >= opt - 1e-6
    assert (opt - objective) <= 0.02 * abs(opt)  # 0-1.6% on these eight instances
    job, pool, gpus = inst[0], inst[1], inst[2]
    for c in (choice, exact):
        picked = c[c >= 0]
        used = np.bincount(pool[picked], weights=gpus[picked], minlength=len(inst[5]))
        assert np.all(used <= inst[5])
        assert np.all(job[picked] == np.flatnonzero(c >= 0))


def test_solver_input_errors() -> None:
    with pytest.raises(InvalidInputError):
        solve_choices(
            np.array([1, 0]),
            np.zeros(2, int),
            np.ones(2, int),
            np.zeros(2),
            np.zeros(2),
            np.ones(1, int),
        )
    with pytest.raises(InvalidInputError):
        CoadaptOptions(solver="magic")
    with pytest.raises(InvalidInputError):
        CoadaptOptions(restart_rule="never")
    with pytest.raises(InvalidInputError):
        CoadaptPolicy(options=CoadaptOptions(), power=0.0)


def test_pools_group_nodes_by_type_and_size() -> None:
    c = ClusterView(
        (NodeView("a", "T4", 4), NodeView("b", "T4", 1), NodeView("c", "T4", 4)), 0.0, 0
    )
    pools = pools_of(c)
    assert [(p.key, p.nodes, p.capacity) for p in pools] == [("T4x1", (1,), 1), ("T4x4", (0, 2), 8)]
    assert pools[1].sizes(8) == ((1, 1), (2, 1), (4, 1), (8, 2))
    assert pools[1].sizes(3) == ((1, 1), (2, 1))


def test_whole_node_shapes_keep_every_count_to_15_then_four_significant_bits() -> None:
    """A large pool's menu grows with the logarithm of its size: whole-node counts 1..15, then
    16, 18, ..., 30, 32, 36, ..., 60, 64, 72, ... (steps of at most an eighth)."""
    big = Pool("V100", 8, tuple(range(200)))
    counts = [n for g, n in big.sizes(10**6) if g >= 8]
    assert counts[:15] == list(range(1, 16))
    assert counts[15:24] == [16, 18, 20, 22, 24, 26, 28, 30, 32]
    assert counts[24:33] == [36, 40, 44, 48, 52, 56, 60, 64, 72]
    assert all(b - a <= max(1, a // 8) for a, b in itertools.pairwise(counts))
    assert all(g == 8 * n for g, n in big.sizes(10**6) if g >= 8)
    # Up to 16 nodes (every cluster of the paper's experiments) nothing is left out.
    sixteen = Pool("T4", 4, tuple(range(16)))
    assert [n for g, n in sixteen.sizes(64) if g >= 4] == list(range(1, 17))


def test_kept_allocation_is_not_moved_and_new_ones_fill_free_nodes() -> None:
    c = cluster(nodes=3, gpus=4)
    a = view("a", nodes=3, alloc=(0, 3, 0), model=model(0.5), profiled=3)  # non-canonical, kept
    b = view("b", nodes=3, model=model(0.0001), profiled=8)
    # A restart costs half of the minute it would serve: a stays where it is.
    plan = CoadaptPolicy(restart_horizon_s=60.0).decide(round_input(c, a, b), CoadaptState()).plan
    assert rows(c, plan)["a"] == (0, 3, 0)
    assert rows(c, plan)["b"] == (4, 0, 4)  # two whole free nodes
    assert alloc_of((4, 0, 4)) == plan.allocations["b"]


def test_linear_batch_rule_keeps_the_users_per_gpu_batch() -> None:
    """``batch_rule="linear"`` (the throughput-autoscale baseline) scales the batch with the
    GPUs: the spec's 256 over 2 replicas is 128 per GPU, whatever the goodput optimum."""
    c = cluster(1, 4)
    job = view("a", nodes=1, requested=2, batch=256, model=model(0.001), profiled=4)
    ri = RoundInput(c, (job,))
    policy = CoadaptPolicy(CoadaptOptions(batch_rule="linear"))
    plan = policy.decide(ri, policy.initial_state()).plan
    gpus = plan.allocations["a"].num_gpus
    assert gpus >= 1
    assert plan.batches["a"].batch_size == 128 * gpus
    with pytest.raises(InvalidInputError, match="batch_rule"):
        CoadaptOptions(batch_rule="largest")


def test_without_any_declared_length_the_least_served_job_gets_the_contested_gpu() -> None:
    """No job declared its length and none has finished: the prior (Gott's: as much again as
    it has had) stands in for the time left, as attained service did before ("attained"), so
    of two alike queued jobs contending for one GPU the one served less starts, whatever
    their order; weighed alike ("mean") the other, which the tie favours here, would."""
    c = cluster(nodes=1, gpus=1)
    m = model(0.0001)
    served = view("b-served", nodes=1, model=m, profiled=1, attained=36000.0)
    fresh = view("a-fresh", nodes=1, model=m, profiled=1, attained=600.0)
    for ri in (round_input(c, served, fresh), round_input(c, fresh, served)):
        for rule in ("expected", "gittins", "attained"):
            got = CoadaptPolicy(unknown_remaining=rule).decide(ri, CoadaptState()).plan
            assert got.allocations["a-fresh"].num_gpus == 1, rule
            assert got.allocations["b-served"].num_gpus == 0, rule
        alike = CoadaptPolicy(unknown_remaining="mean").decide(ri, CoadaptState()).plan
        assert alike.allocations["b-served"].num_gpus == 1
    with pytest.raises(InvalidInputError, match="unknown_remaining"):
        CoadaptPolicy(unknown_remaining="oracle")


@pytest.mark.parametrize("rule", ["expected", "gittins"])
def test_the_contested_gpu_goes_to_the_job_the_finished_lengths_say_ends_first(rule: str) -> None:
    """The weight follows the lengths the cluster has seen finish, not attained service:
    every finished job ran 40,000 GPU-s, so the job at 36,000 has 4,000 left and the one at
    600 has 39,400: the served one starts (attained service, the rule before, starts the
    other). Once the served one has outlived every finished job (they all ran 30,000) it is
    expected to run as long again, and the fresh one starts."""
    c = cluster(nodes=1, gpus=1)
    m = model(0.0001)
    served = view("b-served", nodes=1, model=m, profiled=1, attained=36000.0)
    fresh = view("a-fresh", nodes=1, model=m, profiled=1, attained=600.0)
    policy = CoadaptPolicy(unknown_remaining=rule)
    old = CoadaptPolicy(unknown_remaining="attained")
    for jobs in ((served, fresh), (fresh, served)):
        near_end = RoundInput(c, jobs, (40000.0,) * 8)
        got = policy.decide(near_end, CoadaptState()).plan.allocations
        assert got["b-served"].num_gpus == 1 and got["a-fresh"].num_gpus == 0
        before = old.decide(near_end, CoadaptState()).plan.allocations
        assert before["a-fresh"].num_gpus == 1
        past_all = RoundInput(c, jobs, (30000.0,) * 8)
        got = policy.decide(past_all, CoadaptState()).plan.allocations
        assert got["a-fresh"].num_gpus == 1 and got["b-served"].num_gpus == 0
    assert CoadaptOptions().unknown_remaining == "expected"
