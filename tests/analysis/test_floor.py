"""The cost floor (autoscaler/analysis/floor.py): the linear program against brute force on small
generated cases, floor (a) against (b), the relaxations' edges."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.analysis.floor import (
    FloorConfig,
    FloorError,
    FloorJob,
    FloorOffering,
    FloorProblem,
    StepSeries,
    cost_floor,
)
from autoscaler.errors import InvalidInputError

SLOT = 100.0


def _brute_force(problem: FloorProblem, slots: int) -> float:
    """The program's optimum by enumerating the vertices of its polytope, from a formulation
    written here on its own (dense; every configuration kept; slots of SLOT seconds; prices and
    capacity constant in each slot), not from the module's matrix."""
    by_key = {o.key: o for o in problem.offerings}
    var: list[tuple[int, int, int, FloorConfig]] = []  # (job, segment, slot, config)
    for j, job in enumerate(problem.jobs):
        for k in range(len(job.work)):
            for t in range(slots):
                for c in job.configs:
                    var.append((j, k, t, c))
    n = len(var)
    a_rows: list[np.ndarray] = []
    b: list[float] = []
    for j, job in enumerate(problem.jobs):  # work
        for k, w in enumerate(job.work):
            a_rows.append(
                np.array([-c.goodput[k] if (vj, vk) == (j, k) else 0.0 for vj, vk, _, c in var])
            )
            b.append(-w)
    for j, job in enumerate(problem.jobs):  # seconds per slot inside the window
        end = math.inf if job.finish_by_s is None else job.finish_by_s
        for t in range(slots):
            inside = max(0.0, min(end, (t + 1) * SLOT) - max(job.arrival_s, t * SLOT))
            a_rows.append(np.array([1.0 if (vj, vt) == (j, t) else 0.0 for vj, _, vt, _ in var]))
            b.append(inside)
    for o in problem.offerings:  # capacity
        if o.capacity is None:
            continue
        for t in range(slots):
            cap = o.capacity.pieces(t * SLOT, t * SLOT + 1)[0][2]
            a_rows.append(
                np.array([c.gpus if (c.offering, vt) == (o.key, t) else 0.0 for _, _, vt, c in var])
            )
            b.append(cap * o.gpus_per_instance * SLOT)
    for i in range(n):  # x >= 0 as -x <= 0
        row = np.zeros(n)
        row[i] = -1.0
        a_rows.append(row)
        b.append(0.0)
    a = np.array(a_rows)
    bb = np.array(b)
    cost = np.array(
        [
            by_key[c.offering].price_usd_per_hour.pieces(t * SLOT, t * SLOT + 1)[0][2]
            / 3600.0
            / by_key[c.offering].gpus_per_instance
            * c.gpus
            for _, _, t, c in var
        ]
    )
    combos = np.array(list(itertools.combinations(range(len(bb)), n)))
    subs = a[combos]  # (vertices, n, n)
    ok = np.abs(np.linalg.det(subs)) > 1e-9
    xs = np.linalg.solve(subs[ok], bb[combos[ok]][..., None])[..., 0]
    feasible = np.all(xs @ a.T <= bb + 1e-7 * (1 + np.abs(bb)), axis=1)
    best = float((xs[feasible] @ cost).min()) if feasible.any() else math.inf
    return best


def _case(rng: np.random.Generator, *, configs_per_offering: int = 1) -> FloorProblem:
    """Two jobs, a spot offering with a capacity step and an on-demand one, two slots."""
    spot_price = StepSeries((0.0, SLOT), tuple(rng.uniform(0.5, 2.0, 2)))
    spot = FloorOffering(
        "spot",
        gpus_per_instance=2,
        price_usd_per_hour=spot_price,
        capacity=StepSeries((0.0, SLOT), tuple(float(c) for c in rng.integers(0, 3, 2))),
    )
    ondemand = FloorOffering("od", 1, StepSeries.constant(float(rng.uniform(2.0, 4.0))))
    jobs = []
    for j in range(2):
        arrival = float(rng.choice([0.0, 30.0, SLOT]) if j else 0.0)
        configs = []
        for key in ("spot", "od"):
            for g in range(1, configs_per_offering + 1):
                configs.append(FloorConfig(key, g, (float(rng.uniform(0.5, 1.5)) * g**0.8,)))
        jobs.append(
            FloorJob(
                f"j{j}",
                "app",
                arrival,
                (float(rng.uniform(20.0, 120.0)),),
                tuple(configs),
                finish_by_s=2 * SLOT,
            )
        )
    return FloorProblem(tuple(jobs), (spot, ondemand))


@pytest.mark.parametrize("seed", range(12))
def test_program_equals_brute_force_on_small_cases(seed):
    rng = np.random.default_rng(seed)
    problem = _case(rng)
    brute = _brute_force(problem, slots=2)
    if math.isinf(brute):
        with pytest.raises(FloorError):
            cost_floor(problem, slot_s=SLOT)
        return
    got = cost_floor(problem, slot_s=SLOT)
    assert got.at_deadline_usd == pytest.approx(brute, rel=1e-6, abs=1e-9)
    assert got.no_limit_usd <= got.at_deadline_usd + 1e-9
    assert sum(got.at_deadline_by_job.values()) == pytest.approx(got.at_deadline_usd)


@pytest.mark.parametrize("seed", range(4))
def test_dropping_dominated_configurations_changes_no_optimum(seed):
    """Three GPU counts per offering: the brute force keeps all, the module only its hull."""
    rng = np.random.default_rng(100 + seed)
    problem = _case(rng, configs_per_offering=3)
    one_job = FloorProblem(problem.jobs[:1], problem.offerings)
    brute = _brute_force(one_job, slots=2)
    if math.isinf(brute):
        return
    assert cost_floor(one_job, slot_s=SLOT).at_deadline_usd == pytest.approx(brute, rel=1e-6)


def test_no_limit_floor_is_the_cheapest_unit_cost_from_arrival_on():
    # The spot price drops to 0.5 at t=1000, but capacity is 0 from 2000 on; the on-demand
    # offering costs 3 $/h per GPU.
    spot = FloorOffering(
        "spot",
        1,
        StepSeries((0.0, 1000.0, 3000.0), (2.0, 0.5, 0.1)),
        StepSeries((0.0, 2000.0), (4.0, 0.0)),
    )
    od = FloorOffering("od", 1, StepSeries.constant(3.0))
    job = FloorJob(
        "j",
        "a",
        0.0,
        (100.0, 50.0),
        (FloorConfig("spot", 1, (1.0, 2.0)), FloorConfig("od", 2, (1.5, 5.0))),
    )
    got = cost_floor(FloorProblem((job,), (spot, od)))
    # segment 0: spot 0.5/3600 per GPU-s * 1 GPU / 1.0 per s; od 3/3600*2/1.5: spot wins.
    expected = 100.0 * 0.5 / 3600.0 + 50.0 * 0.5 / 3600.0 / 2.0
    assert got.no_limit_usd == pytest.approx(expected)
    assert got.by_application()["a"]["floor_usd"] == pytest.approx(expected)


def test_no_limit_floor_equals_the_program_with_loose_deadlines_and_no_capacity():
    rng = np.random.default_rng(7)
    for _ in range(5):
        offerings = (
            FloorOffering("x", 4, StepSeries((0.0, 500.0), tuple(rng.uniform(1, 5, 2)))),
            FloorOffering("y", 1, StepSeries.constant(float(rng.uniform(0.3, 2)))),
        )
        jobs = tuple(
            FloorJob(
                f"j{i}",
                "a",
                float(rng.uniform(0, 900)),
                tuple(rng.uniform(10, 50, 2)),
                tuple(
                    FloorConfig(o, g, tuple(rng.uniform(0.2, 2.0, 2) * g**0.7))
                    for o in ("x", "y")
                    for g in (1, 2, 4)
                ),
                finish_by_s=20_000.0,
            )
            for i in range(3)
        )
        got = cost_floor(FloorProblem(jobs, offerings), slot_s=250.0)
        assert got.at_deadline_usd == pytest.approx(got.no_limit_usd, rel=1e-6)


def test_deadline_forces_the_dearer_faster_choice():
    # Alone, the job would take 100 s on 1 GPU; finishing in 50 s needs 2 GPUs (slower per GPU).
    od = FloorOffering("od", 8, StepSeries.constant(8.0))  # 1 $/h per GPU
    configs = (FloorConfig("od", 1, (1.0,)), FloorConfig("od", 2, (1.6,)))
    free = FloorJob("j", "a", 0.0, (100.0,), configs, finish_by_s=1000.0)
    tight = FloorJob("j", "a", 0.0, (100.0,), configs, finish_by_s=75.0)
    loose = cost_floor(FloorProblem((free,), (od,)), slot_s=25.0)
    hard = cost_floor(FloorProblem((tight,), (od,)), slot_s=25.0)
    assert loose.at_deadline_usd == pytest.approx(100.0 / 3600.0)
    # x1 + x2 <= 75, x1 + 1.6 x2 >= 100: x2 = 25/0.6, x1 = 75 - x2; cost (x1 + 2 x2) / 3600.
    x2 = 25.0 / 0.6
    assert hard.at_deadline_usd == pytest.approx((75.0 - x2 + 2 * x2) / 3600.0)
    assert hard.no_limit_usd == pytest.approx(loose.no_limit_usd)
    too_tight = FloorJob("j", "a", 0.0, (100.0,), configs, finish_by_s=60.0)
    with pytest.raises(FloorError):
        cost_floor(FloorProblem((too_tight,), (od,)), slot_s=25.0)


def test_spot_capacity_binds_across_jobs():
    spot = FloorOffering("s", 1, StepSeries.constant(1.0), StepSeries.constant(1.0))
    od = FloorOffering("od", 1, StepSeries.constant(4.0))
    cfg = (FloorConfig("s", 1, (1.0,)), FloorConfig("od", 1, (1.0,)))
    jobs = tuple(FloorJob(f"j{i}", "a", 0.0, (100.0,), cfg, finish_by_s=100.0) for i in range(2))
    got = cost_floor(FloorProblem(jobs, (spot, od)), slot_s=50.0)
    # One spot instance for 100 s: one job's work on spot, the other's on demand.
    assert got.at_deadline_usd == pytest.approx((100.0 * 1.0 + 100.0 * 4.0) / 3600.0)
    assert got.no_limit_usd == pytest.approx(2 * 100.0 / 3600.0)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    slot=st.sampled_from([50.0, 100.0, 300.0]),
)
def test_floor_a_below_b_and_finer_slots_never_lower(seed, slot):
    rng = np.random.default_rng(seed)
    problem = _case(rng, configs_per_offering=2)
    try:
        coarse = cost_floor(problem, slot_s=2 * slot)
    except FloorError:
        return
    fine = cost_floor(problem, slot_s=slot) if (2 * slot) % slot == 0 else coarse
    assert coarse.no_limit_usd <= coarse.at_deadline_usd + 1e-9
    # Halving the slots only tightens the relaxation (a fine schedule is a coarse one).
    assert fine.at_deadline_usd >= coarse.at_deadline_usd - 1e-9


def test_inputs_are_checked():
    with pytest.raises(InvalidInputError):
        StepSeries((1.0, 0.0), (1.0, 1.0))
    with pytest.raises(InvalidInputError):
        FloorConfig("x", 0, (1.0,))
    with pytest.raises(InvalidInputError):
        FloorJob("j", "a", 10.0, (1.0,), (), finish_by_s=5.0)
    with pytest.raises(InvalidInputError):
        FloorProblem((FloorJob("j", "a", 0.0, (1.0,), (FloorConfig("nope", 1, (1.0,)),)),), ())
    with pytest.raises(InvalidInputError):
        cost_floor(FloorProblem((), ()), slot_s=0.0)
