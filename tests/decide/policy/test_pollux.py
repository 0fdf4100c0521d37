"""The Pollux policy: objective, genetic operators, and decisions on literal rounds."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.decide.policy.pollux import (
    PolluxOptions,
    PolluxPolicy,
    PolluxState,
    _Search,
    power_mean,
)
from autoscaler.decide.views import ClusterView, JobView
from autoscaler.errors import InvalidInputError
from tests.decide.policy.conftest import cluster, model, round_input, rows, view

FAST = {"population": 40, "generations": 40}


def test_power_mean() -> None:
    v = np.array([[1.0, 4.0], [2.0, 2.0]]) - 1e-3
    np.testing.assert_allclose(power_mean(v, -1), [1.6, 2.0])
    np.testing.assert_allclose(power_mean(v, 0), [2.0, 2.0])
    np.testing.assert_allclose(power_mean(v, 1), [2.5, 2.0])
    # p < 0: a job with nothing drags the mean to ~0.
    assert power_mean(np.array([0.0, 100.0]), -1) < 0.01


def _search(num_jobs: int, num_nodes: int, cap: int, max_gpus, avoid: bool, seed: int) -> _Search:
    top = int(max(max_gpus))
    speed = np.tile(
        np.arange(top + 1, dtype=float)[None, None, :], (num_jobs, min(num_nodes, top) + 1, 1)
    )
    return _Search(
        speed=speed,
        base=np.zeros((num_jobs, num_nodes), dtype=np.int16),
        capacity=np.full(num_nodes, cap, dtype=np.int16),
        max_gpus=np.asarray(max_gpus, dtype=np.int16),
        penalty=np.ones(num_jobs),
        power=-1.0,
        avoid_interference=avoid,
        rng=np.random.default_rng(seed),
        reset_prob=0.1,
        zero_prob=0.1,
    )


@settings(max_examples=60)
@given(
    num_jobs=st.integers(1, 8),
    num_nodes=st.integers(1, 6),
    cap=st.integers(1, 8),
    avoid=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_repair_enforces_all_constraints(num_jobs, num_nodes, cap, avoid, seed) -> None:
    rng = np.random.default_rng(seed)
    max_gpus = rng.integers(1, cap * num_nodes + 1, size=num_jobs)
    search = _search(num_jobs, num_nodes, cap, max_gpus, avoid, seed)
    pop = rng.integers(0, cap + 3, size=(16, num_jobs, num_nodes)).astype(np.int16)
    fixed = search.repair(search.mutate(pop))
    assert fixed.dtype == np.int16 and fixed.min() >= 0
    assert np.all(fixed.sum(axis=1) <= cap)  # node capacity
    assert np.all(fixed.sum(axis=2) <= max_gpus[None, :])  # per-job cap
    if avoid:
        spread = np.count_nonzero(fixed, axis=2) > 1
        per_node = ((fixed > 0) & spread[:, :, None]).sum(axis=1)
        assert np.all(per_node <= 1)
    # Repair never adds GPUs.
    again = search.repair(fixed)
    np.testing.assert_array_equal(again, fixed)


def test_search_finds_the_optimum_of_a_separable_problem() -> None:
    # Three jobs with linear speedup, 2 nodes x 3 GPUs: the fair optimum is 2 GPUs each.
    search = _search(3, 2, 3, [6, 6, 6], True, 0)
    pop = np.zeros((40, 3, 2), dtype=np.int16)
    pop, fit = search.run(pop, 60)
    best = pop[0]
    assert sorted(best.sum(axis=1).tolist()) == [2, 2, 2]
    assert fit[0] == pytest.approx(power_mean(np.array([2.0, 2.0, 2.0]), -1))
    assert np.all(np.diff(fit) <= 0)  # sorted best first


def test_scalable_job_gets_more_gpus() -> None:
    c = cluster(nodes=2, gpus=4)
    scalable = view("scalable", model=model(0.0001), profiled=8)
    stuck = view("stuck", model=model(5.0), profiled=8)
    policy = PolluxPolicy(seed=0, **FAST)
    d = policy.decide(round_input(c, scalable, stuck), policy.initial_state())
    a = rows(c, d.plan)
    assert 1 <= sum(a["stuck"]) < sum(a["scalable"])
    assert sum(a["scalable"]) + sum(a["stuck"]) <= 8
    # Batch configurations come from the goodput model, consistent with the GPUs.
    for name, alloc in a.items():
        b = d.plan.batches[name]
        assert b.batch_size == sum(alloc) * b.local_bsz * b.accum_steps
        assert 128 <= b.batch_size <= 4096


def test_exploration_caps_gpus_at_twice_the_profiled() -> None:
    c = cluster(nodes=4, gpus=4)
    job = view("j", nodes=4, model=model(0.0001), profiled=2)
    new = view("n", nodes=4)
    policy = PolluxPolicy(seed=1, **FAST)
    assert policy.gpu_bounds(job, c) == (0, 4)
    assert policy.gpu_bounds(new, c) == (0, 1)
    d = policy.decide(round_input(c, job, new), policy.initial_state())
    assert sum(rows(c, d.plan)["j"]) == 4
    assert sum(rows(c, d.plan)["n"]) == 1
    # A job without a model starts at max(M0, min_local * GPUs).
    assert d.plan.batches["n"].batch_size == 128


def test_restart_penalty_keeps_young_jobs_in_place() -> None:
    c = cluster(nodes=2, gpus=4)
    # Allocated on 1 GPU a second ago: a restart factor of 1/31 outweighs an 8x speedup.
    young = view("y", alloc=(1, 0), age=1.0, model=model(0.0001), profiled=8)
    policy = PolluxPolicy(seed=0, **FAST)
    d = policy.decide(round_input(c, young), policy.initial_state())
    assert rows(c, d.plan)["y"] == (1, 0)
    # Without the penalty the same job takes the whole node.
    free = PolluxPolicy(seed=0, restart_penalty=False, **FAST)
    d2 = free.decide(round_input(c, young), free.initial_state())
    assert sum(rows(c, d2.plan)["y"]) >= 4


def test_interference_avoidance_in_decisions() -> None:
    c = cluster(nodes=2, gpus=4)
    jobs = [view(f"j{i}", model=model(0.0001), profiled=8, alloc=(2, 2)) for i in range(2)]
    # The current state violates avoidance; the plan must not.
    jobs[1] = view("j1", model=model(0.0001), profiled=8, alloc=(0, 0))
    policy = PolluxPolicy(seed=0, **FAST)
    d = policy.decide(round_input(c, *jobs), policy.initial_state())
    spread = [a for a in rows(c, d.plan).values() if sum(1 for g in a if g) > 1]
    for node in range(2):
        assert sum(1 for a in spread if a[node]) <= 1


def test_deterministic_and_warm_started() -> None:
    c = cluster(nodes=2, gpus=4)
    jobs = (view("a", model=model(0.001), profiled=4), view("b", model=model(0.1), profiled=4))
    policy = PolluxPolicy(seed=7, **FAST)
    d1 = policy.decide(round_input(c, *jobs), policy.initial_state())
    d2 = policy.decide(round_input(c, *jobs), policy.initial_state())
    assert dict(rows(c, d1.plan)) == dict(rows(c, d2.plan))
    state = d1.state
    assert isinstance(state, PolluxState)
    assert state.population is not None and state.population.shape == (40, 2, 2)
    assert set(state.job_names) == {"a", "b"}
    builds = state.table_builds
    # Next round, same models: tables are reused; a new job joins the warm population.
    d3 = policy.decide(round_input(c, *jobs, view("c")), state)
    assert d3.state.table_builds == builds
    assert set(rows(c, d3.plan)) == {"a", "b", "c"}
    assert sum(rows(c, d3.plan)["c"]) == 1


def test_empty_round_and_options() -> None:
    c = cluster()
    policy = PolluxPolicy()
    d = policy.decide(round_input(c), policy.initial_state())
    assert dict(rows(c, d.plan)) == {}
    with pytest.raises(InvalidInputError):
        PolluxOptions(population=1)
    with pytest.raises(InvalidInputError):
        PolluxOptions(power=2.0)
    with pytest.raises(InvalidInputError):
        PolluxPolicy(options=PolluxOptions(), population=3)


def _crowded_round() -> tuple[ClusterView, tuple[JobView, ...]]:
    """16 nodes x 4 GPUs, 48 jobs: 40 running on 1-2 GPUs (58 GPUs in use, 6 free), 8 new
    jobs waiting. Every job fits on one GPU, so the optimum leaves nobody waiting."""
    c = cluster(nodes=16, gpus=4)
    rng = np.random.default_rng(3)
    running = []
    free = [4] * 16
    for i in range(40):
        want = 2 if i < 18 else 1
        node = max(range(16), key=lambda n: (free[n], -n))
        free[node] -= want
        row = tuple(want if n == node else 0 for n in range(16))
        running.append(
            view(
                f"r{i:02d}",
                nodes=16,
                alloc=row,
                age=float(rng.integers(1200, 9000)),
                attained=float(rng.integers(1000, 50000)),
                restarts=1,
                profiled=2,
            )
        )
    waiting = [view(f"w{i}", nodes=16, age=300.0) for i in range(8)]
    assert sum(free) == 6
    return c, (*running, *waiting)


def test_crowded_cluster_starts_every_waiting_job() -> None:
    # With p = -1, a waiting job drags the power mean towards 0, so the search must find
    # the free GPUs for the waiting jobs. A mutation that grows every job at once would
    # over-subscribe the free nodes and have repair empty other jobs in every child; growing
    # each free node by about one job keeps children feasible (the regression this guards).
    c, jobs = _crowded_round()
    for seed in range(3):
        policy = PolluxPolicy(seed=seed)
        d = policy.decide(round_input(c, *jobs), policy.initial_state())
        gpus = {name: sum(r) for name, r in rows(c, d.plan).items()}
        assert all(g >= 1 for g in gpus.values()), sorted(n for n, g in gpus.items() if not g)


def test_mutation_grows_about_one_job_per_free_node() -> None:
    # Many jobs, one node with free GPUs: a child grows about two entries there (one job
    # drawn from all, one from those already on the node), not one per job.
    num_jobs, size = 40, 400
    search = replace(_search(num_jobs, 4, 4, [4] * num_jobs, False, 0), reset_prob=0, zero_prob=0)
    pop = np.zeros((size, num_jobs, 4), dtype=np.int16)
    pop[:, :16, :] = np.eye(4, dtype=np.int16)[np.arange(16) % 4]  # nodes 0-3 full
    pop[:, 3, 3] = 0  # one GPU free on node 3
    grown = (search.mutate(pop) > pop).sum(axis=(1, 2))
    assert 1.0 <= grown.mean() <= 3.0
    assert np.all((search.mutate(pop) > pop)[:, :, :3] == 0)  # only the free node grows
