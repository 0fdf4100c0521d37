"""Goodput-per-dollar fleet sizing (autoscaler.decide.sizing): literal fleets, the budget, markets,
GPU types, hysteresis, and value curves from real goodput models."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.decide.sizing import (
    FleetOption,
    JobDemand,
    SizingConfig,
    _Allocation,
    _choose,
    _Growth,
    _supply,
    job_demand,
    modelled_value,
    size_fleet,
)
from autoscaler.errors import InvalidInputError
from autoscaler.model.gputypes import default_speed_table
from tests.decide.policy.conftest import model, view

SPEEDS = default_speed_table()
T4_OD = FleetOption("aws/g4dn.12xlarge/use1-az1/on-demand", "T4", 4, "on-demand", 3.912)
T4_SPOT = FleetOption("aws/g4dn.12xlarge/use1-az1/spot", "T4", 4, "spot", 1.3, 0.01)


def linear(name: str, gpus: int, per_gpu: float = 1.0, kind=("T4", 4)) -> JobDemand:
    """A job that scales perfectly up to ``gpus`` GPUs."""
    return JobDemand(name, {kind: tuple(per_gpu * min(g, gpus) for g in range(1, 65))})


def test_perfectly_scaling_jobs_get_exactly_their_gpus() -> None:
    demands = [linear("a", 8), linear("b", 4)]
    p = size_fleet(demands, [T4_OD], {}, SizingConfig(), SPEEDS)
    assert dict(p.counts) == {T4_OD.key: 3}
    assert p.gpus_by_job == {"a": 8, "b": 4}
    assert p.value == pytest.approx(12.0)
    assert p.usd_per_hour == pytest.approx(3 * 3.912)
    assert p.limited_by == "efficiency"


def test_no_jobs_no_fleet_unless_a_minimum_is_asked() -> None:
    assert dict(size_fleet([], [T4_OD], {}, SizingConfig(), SPEEDS).counts) == {}
    p = size_fleet([], [T4_OD], {}, SizingConfig(min_instances=2), SPEEDS)
    assert dict(p.counts) == {T4_OD.key: 2}


def test_the_efficiency_floor_stops_a_job_that_stops_scaling() -> None:
    # Each GPU beyond the fourth adds a tenth of a GPU's work: the second instance returns
    # a tenth of ideal scaling, below the default floor of 0.15.
    curve = tuple(min(g, 4) + 0.1 * max(0, g - 4) for g in range(1, 33))
    p = size_fleet([JobDemand("a", {("T4", 4): curve})], [T4_OD], {}, SizingConfig(), SPEEDS)
    assert dict(p.counts) == {T4_OD.key: 1}
    assert p.limited_by == "efficiency"
    low = size_fleet(
        [JobDemand("a", {("T4", 4): curve})], [T4_OD], {}, SizingConfig(min_efficiency=0.05), SPEEDS
    )
    assert low.counts[T4_OD.key] == 8


def test_budget_holds_and_a_budget_below_one_instance_buys_nothing() -> None:
    demands = [linear(f"j{i}", 4) for i in range(10)]
    p = size_fleet(demands, [T4_OD], {}, SizingConfig(budget_usd_per_hour=10.0), SPEEDS)
    assert p.counts[T4_OD.key] == 2 and p.usd_per_hour <= 10.0
    assert p.limited_by == "budget"
    none = size_fleet(demands, [T4_OD], {}, SizingConfig(budget_usd_per_hour=3.0), SPEEDS)
    assert dict(none.counts) == {} and none.limited_by == "budget"


def test_spot_wins_when_cheap_and_on_demand_when_preemptions_eat_the_saving() -> None:
    demands = [linear("a", 4)]
    p = size_fleet(demands, [T4_OD, T4_SPOT], {}, SizingConfig(), SPEEDS)
    assert dict(p.counts) == {T4_SPOT.key: 1}
    # 10 preemptions an hour at 300 s lost each: the spot instance does ~nothing.
    flaky = FleetOption(T4_SPOT.key, "T4", 4, "spot", 1.3, hazard_per_hour=10.0)
    p = size_fleet(demands, [T4_OD, flaky], {}, SizingConfig(), SPEEDS)
    assert dict(p.counts) == {T4_OD.key: 1}


def test_each_job_goes_to_the_gpu_type_that_pays_for_it() -> None:
    a100 = FleetOption("aws/p4d.24xlarge/use1-az1/on-demand", "A100", 8, "on-demand", 21.96)
    t4 = FleetOption("aws/g4dn.2xlarge/use1-az1/on-demand", "T4", 1, "on-demand", 0.752)
    # "fast" runs 12x faster on an A100 than on a T4; "slow" only 1.5x (per GPU, linear).
    fast = JobDemand(
        "fast",
        {
            ("A100", 8): tuple(12.0 * min(g, 8) for g in range(1, 9)),
            ("T4", 1): tuple(float(min(g, 8)) for g in range(1, 9)),
        },
    )
    slow = JobDemand(
        "slow",
        {
            ("A100", 8): tuple(1.5 * min(g, 2) for g in range(1, 9)),
            ("T4", 1): tuple(float(min(g, 2)) for g in range(1, 9)),
        },
    )
    p = size_fleet([fast, slow], [a100, t4], {}, SizingConfig(), SPEEDS)
    assert dict(p.counts) == {a100.key: 1, t4.key: 2}
    assert p.gpus_by_job == {"fast": 8, "slow": 2}


def _grown(demands: list[JobDemand], instances: int, limited_by: str = "efficiency") -> _Growth:
    """A pass that bought ``instances`` of ``T4_OD`` and handed their GPUs out."""
    alloc = _Allocation(demands, 1.0)
    alloc.fill((*T4_OD.kind, frozenset()), instances * T4_OD.gpus, commit=True)
    price = instances * T4_OD.usd_per_hour
    return _Growth(alloc, {T4_OD.key: instances}, price, 1.0, limited_by)


def _pick(first: _Growth, second: _Growth, held: dict[str, int] | None = None) -> _Growth:
    return _choose(first, second, [T4_OD], held or {}, SizingConfig(), SPEEDS)


def _two_sizes(slope: float) -> tuple[list[JobDemand], _Growth, _Growth]:
    """One job whose GPUs beyond the fourth add ``slope`` of a T4 each; passes of 1 and 2
    instances (the second's value per dollar is always the lower)."""
    curve = tuple(min(g, 4) + slope * max(0, g - 4) for g in range(1, 17))
    demands = [JobDemand("a", {T4_OD.kind: curve})]
    one, two = _grown(demands, 1), _grown(demands, 2)
    assert two.alloc.value() / two.price < one.alloc.value() / one.price
    return demands, one, two


@pytest.mark.parametrize(("slope", "larger"), [(0.5, True), (0.1, False)])
def test_the_larger_pass_is_proposed_when_what_it_adds_is_efficient(
    slope: float, larger: bool
) -> None:
    """Both passes stopped at the efficiency floor (0.15): the second instance is worth it
    when it adds more than 0.15 of a T4 per GPU, whatever value per dollar says."""
    _, one, two = _two_sizes(slope)
    assert _pick(one, two) is (two if larger else one)
    assert _pick(two, one) is (two if larger else one)


def test_held_instances_ease_the_choice_of_the_pass_that_keeps_them() -> None:
    """0.13 of a T4 per added GPU: below the floor for a new instance, above it eased by the
    hysteresis (0.15 x 0.8) when the instance is already held."""
    _, one, two = _two_sizes(0.13)
    assert _pick(one, two) is one
    assert _pick(one, two, held={T4_OD.key: 2}) is two


def test_a_pass_cut_by_a_cap_or_the_budget_is_chosen_by_value_per_dollar() -> None:
    demands, _, _ = _two_sizes(0.5)
    one, two = _grown(demands, 1, "max_instances"), _grown(demands, 2, "efficiency")
    assert _pick(one, two) is one and _pick(two, one) is one


def test_a_pass_with_no_less_value_at_no_more_cost_wins_and_a_tie_keeps_the_first() -> None:
    demands = [linear("a", 8)]
    one, same, two = _grown(demands, 1), _grown(demands, 1), _grown(demands, 2)
    assert _pick(one, same) is one
    cheaper = dataclasses.replace(two, price=one.price)  # more value at the same price
    assert _pick(one, cheaper) is cheaper and _pick(cheaper, one) is cheaper


def test_a_jobs_gpus_are_priced_at_the_capacity_left_cheapest_first() -> None:
    """Spot capacity the pass already used is not offered again: 4 more GPUs of a kind whose
    spot pool has 2 instances left cost 2 at spot and 2 on demand; GPUs the job holds cost
    what the pass paid for the kind; a kind that cannot supply them has no price."""
    spot = FleetOption("x/g4dn.xlarge/spot", "T4", 1, "spot", 0.2, capacity=3)
    od = FleetOption("x/g4dn.xlarge/on-demand", "T4", 1, "on-demand", 0.5)
    gone = FleetOption("x/g4dn.xlarge/b/on-demand", "T4", 1, "on-demand", 0.3, available=False)
    cfg = SizingConfig()
    kind = ("T4", 1)
    price = _supply([spot, od, gone], {spot.key: 1}, cfg)[kind].price_per_gpu(0, 4)
    assert price == pytest.approx((2 * 0.2 + 2 * 0.5) / 4)
    held = _supply([spot, od], {spot.key: 3, od.key: 1}, cfg)[kind].price_per_gpu(2, 2)
    assert held == pytest.approx((2 * 0.5 + 2 * 0.5) / 4)  # dearest paid, then on demand
    assert _supply([spot], {spot.key: 1}, cfg)[kind].price_per_gpu(0, 3) is None
    assert ("A100", 8) not in _supply([spot, od], {}, cfg)


def test_held_instances_stay_inside_the_hysteresis_band() -> None:
    # The second instance returns 0.45 of the reference value per dollar: below the 0.5 floor
    # for a new instance, above 0.5 x (1 - 0.2) = 0.4 for one already held.
    curve = tuple(min(g, 4) + 0.45 * max(0, min(g, 8) - 4) for g in range(1, 17))
    demands = [JobDemand("a", {("T4", 4): curve})]
    cfg = SizingConfig(provisioning_delay_s=0.0, min_efficiency=0.5)
    assert size_fleet(demands, [T4_OD], {}, cfg, SPEEDS).counts[T4_OD.key] == 1
    assert size_fleet(demands, [T4_OD], {T4_OD.key: 2}, cfg, SPEEDS).counts[T4_OD.key] == 2


def test_unavailable_and_capacity_limited_offerings_are_routed_around() -> None:
    spot = FleetOption(T4_SPOT.key, "T4", 4, "spot", 1.3, capacity=1)
    demands = [linear("a", 12)]
    p = size_fleet(demands, [T4_OD, spot], {}, SizingConfig(), SPEEDS)
    assert dict(p.counts) == {spot.key: 1, T4_OD.key: 2}
    gone = FleetOption(T4_SPOT.key, "T4", 4, "spot", 1.3, available=False)
    p = size_fleet(demands, [T4_OD, gone], {}, SizingConfig(), SPEEDS)
    assert dict(p.counts) == {T4_OD.key: 3}


def test_waiting_jobs_need_their_minimum_at_once() -> None:
    big = JobDemand("big", {("T4", 4): tuple(float(g) for g in range(1, 9))}, min_gpus=8)
    small = FleetOption("aws/g4dn.xlarge/use1-az1/on-demand", "T4", 4, "on-demand", 3.912)
    p = size_fleet([big], [small], {}, SizingConfig(max_instances=1), SPEEDS)
    assert dict(p.counts) == {}  # one 4-GPU instance cannot start an 8-GPU job
    p = size_fleet([big], [small], {}, SizingConfig(min_efficiency=0.0), SPEEDS)
    assert p.gpus_by_job == {"big": 8}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 16), min_size=0, max_size=8),
    st.floats(0.0, 60.0),
    st.integers(0, 6),
    st.one_of(st.none(), st.integers(1, 24)),
)
def test_budget_max_instances_and_max_gpus_hold_for_any_demand(
    wants: list[int], budget: float, cap: int, max_gpus: int | None
) -> None:
    demands = [linear(f"j{i}", w) for i, w in enumerate(wants)]
    cfg = SizingConfig(budget_usd_per_hour=budget, max_instances=cap, max_gpus=max_gpus)
    p = size_fleet(demands, [T4_OD, T4_SPOT], {}, cfg, SPEEDS)
    assert p.usd_per_hour <= budget + 1e-9
    assert sum(p.counts.values()) <= cap
    if max_gpus is not None:
        assert sum(n * 4 for n in p.counts.values()) <= max_gpus
    assert sum(p.gpus_by_job.values()) <= sum(n * 4 for n in p.counts.values())
    again = size_fleet(demands, [T4_OD, T4_SPOT], {}, cfg, SPEEDS)
    assert again == p


def test_value_curves_from_goodput_models_scale_and_respect_statistical_efficiency() -> None:
    job = view("a", model=model(0.001), profiled=4)
    kinds = [("T4", 4), ("A100", 8)]
    d = job_demand(job, kinds, SPEEDS, max_gpus=16)
    t4 = d.curves[("T4", 4)]
    assert t4[0] == pytest.approx(1.0)  # units: the job's goodput on one T4
    assert all(b >= a for a, b in itertools.pairwise(t4))
    assert d.curves[("A100", 8)][0] > 1.5 * t4[0]  # the ratio rule: an A100 is faster
    # Throughput ignores statistical efficiency, so it never values a GPU less.
    tp = job_demand(job, kinds, SPEEDS, max_gpus=16, value="throughput").curves[("T4", 4)]
    assert tp[15] / tp[0] >= t4[15] / t4[0] - 1e-9
    # A job never profiled is valued linearly up to its cap, or to what it asked for if it
    # does not adapt.
    new = job_demand(view("b", requested=2), kinds, SPEEDS, max_gpus=4)
    assert new.curves[("T4", 4)] == (1.0, 2.0, 3.0, 4.0)
    fixed = dataclasses.replace(view("c", requested=2), adaptive=False)
    assert job_demand(fixed, kinds, SPEEDS, max_gpus=4).curves[("T4", 4)] == (1.0, 2.0, 2.0, 2.0)
    # On another type, at its application's measured speed when the table has it (as the
    # policy values it), else at the type's generic speed.
    cifar = dataclasses.replace(view("d", requested=2), application="cifar10")
    a100 = job_demand(cifar, kinds, SPEEDS, max_gpus=4).curves[("A100", 8)]
    assert a100 == pytest.approx([g * SPEEDS.model_speed("cifar10", "A100") for g in (1, 2, 3, 4)])
    assert SPEEDS.model_speed("cifar10", "A100") > 1.5 * SPEEDS.relative_speed("A100")
    other = dataclasses.replace(view("e", requested=1), application="unknown-app")
    assert job_demand(other, kinds, SPEEDS, max_gpus=1).curves[("A100", 8)] == pytest.approx(
        (SPEEDS.relative_speed("A100"),)
    )


def test_modelled_value_and_bad_input() -> None:
    assert modelled_value([linear("a", 6)], T4_OD, 2) == pytest.approx(6.0)
    with pytest.raises(InvalidInputError, match="price"):
        FleetOption("k", "T4", 4, "spot", -1.0)
    with pytest.raises(InvalidInputError, match="market"):
        FleetOption("k", "T4", 4, "reserved", 1.0)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        SizingConfig(budget_usd_per_hour=-1.0)
    with pytest.raises(InvalidInputError, match="duplicate"):
        size_fleet([], [T4_OD, T4_OD], {}, SizingConfig(), SPEEDS)
    assert math.isfinite(size_fleet([linear("a", 4)], [T4_OD], {}, SizingConfig(), SPEEDS).value)


def test_a_dip_at_the_first_multi_instance_shape_does_not_hide_larger_shapes() -> None:
    # One instance: 4.0; two: barely more (a slow two-node sync); four: 15 of 16 GPUs' worth.
    curve = tuple(
        float(g) if g <= 4 else (4.2 if g <= 8 else 4.2 + (g - 8) * (15.0 - 4.2) / 8)
        for g in range(1, 17)
    )
    p = size_fleet([JobDemand("a", {("T4", 4): curve})], [T4_OD], {}, SizingConfig(), SPEEDS)
    assert p.counts[T4_OD.key] == 4


def test_jobs_take_the_type_that_pays_once_cheap_spot_capacity_runs_out() -> None:
    # T4 spot: the cheapest T4-equivalent, but one 1-GPU instance only; T4 on demand: dear;
    # V100 spot (8 GPUs, 3x a T4 each): cheaper per T4-equivalent than T4 on demand.
    t4_spot = FleetOption("aws/g4dn.xlarge/z/spot", "T4", 1, "spot", 0.2, capacity=1)
    t4_od = FleetOption("aws/g4dn.xlarge/z/on-demand", "T4", 1, "on-demand", 0.526)
    v100 = FleetOption("aws/p3.16xlarge/z/spot", "V100", 8, "spot", 4.85)

    def job(name: str) -> JobDemand:
        return JobDemand(
            name,
            {
                ("T4", 1): tuple(float(min(g, 4)) for g in range(1, 9)),
                ("V100", 8): tuple(3.0 * min(g, 4) for g in range(1, 9)),
            },
        )

    demands = [job(f"j{i}") for i in range(4)]
    p = size_fleet(demands, [t4_spot, t4_od, v100], {}, SizingConfig(), SPEEDS)
    assert p.counts.get(v100.key, 0) == 2
    assert p.counts.get(t4_od.key, 0) == 0
    assert sum(p.gpus_by_job.values()) == 16


def test_the_fill_memo_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded random demands over three kinds and two markets: the fleet and every job's GPUs
    are the same with the fill memo as without it."""
    import random

    from autoscaler.decide.sizing import _Allocation

    rng = random.Random(3)
    kinds = [("T4", 4), ("T4", 1), ("A100", 8)]
    options = [
        FleetOption("t4x4-od", "T4", 4, "on-demand", 3.912),
        FleetOption("t4x4-spot", "T4", 4, "spot", 1.3, 0.05),
        FleetOption("t4x1-spot", "T4", 1, "spot", 0.16, 0.2),
        FleetOption("a100-spot", "A100", 8, "spot", 12.0, 0.1),
    ]
    for trial in range(12):
        demands = []
        for i in range(rng.randint(5, 40)):
            curves = {}
            for kind in rng.sample(kinds, rng.randint(1, 3)):
                top, rate = rng.randint(1, 24), rng.uniform(0.2, 3.0)
                curves[kind] = tuple(rate * min(g, top) ** 0.8 for g in range(1, 33))
            demands.append(JobDemand(f"j{i}", curves, min_gpus=rng.choice([1, 1, 2, 4])))
        cfg = SizingConfig(max_instances=rng.randint(4, 40), min_efficiency=0.05)
        held = {"t4x4-spot": rng.randint(0, 3)}
        with_memo = size_fleet(demands, options, held, cfg, SPEEDS)
        monkeypatch.setattr(_Allocation, "memoise", False)
        without = size_fleet(demands, options, held, cfg, SPEEDS)
        monkeypatch.setattr(_Allocation, "memoise", True)
        assert with_memo == without, f"trial {trial}"


def test_max_gpus_stops_the_growth_and_says_so() -> None:
    p = size_fleet([linear("a", 16)], [T4_SPOT], {}, SizingConfig(max_gpus=8), SPEEDS)
    assert sum(p.counts.values()) == 2 and p.limited_by == "max_gpus"
    with pytest.raises(InvalidInputError, match="max_gpus"):
        SizingConfig(max_gpus=0)


def test_no_instance_is_launched_for_a_job_done_before_it_is_ready() -> None:
    # A running job on the one held instance would use four: how much more the fleet buys
    # depends on how long the job has left against the 120 s it takes to provision one.
    def job(remaining_s: float | None, gpu_type: str | None = "T4") -> JobDemand:
        return dataclasses.replace(linear("a", 16), gpu_type=gpu_type, remaining_s=remaining_s)

    held = {T4_OD.key: 1}

    def count(demand: JobDemand) -> int:
        return size_fleet([demand], [T4_OD], held, SizingConfig(), SPEEDS).counts[T4_OD.key]

    assert count(job(None)) == 4  # unknown: the planning horizon
    assert count(job(3600.0)) == 4
    assert count(job(600.0)) == 4  # 80% of its value: still worth it
    assert count(job(130.0)) == 1  # 8%: below the efficiency floor
    assert count(job(60.0)) == 1  # done before the instance is ready
    # A job not running yet is started whatever its length, and a held instance is kept.
    assert count(job(60.0, gpu_type=None)) == 4
    assert (
        size_fleet([job(0.0)], [T4_OD], {T4_OD.key: 2}, SizingConfig(), SPEEDS).counts[T4_OD.key]
        == 2
    )
    with pytest.raises(InvalidInputError, match="remaining_s"):
        job(-1.0)
