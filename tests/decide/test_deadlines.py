"""Deadlines: the spec's field, its check at submission, the shared rules
(:mod:`autoscaler.decide.deadlines`), the uniform-progress baseline, the sizing's reservation and
the controller's warning."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
import pytest

from autoscaler.controller.jobbook import (
    EARLIEST_DONE_S,
    MAX_DEADLINE_S,
    JobSubmission,
    parse_deadline,
    submission_deadline,
)
from autoscaler.controller.jobspec import JobSpecError, parse_job_spec
from autoscaler.decide.deadlines import (
    MAX_REMAINING_S,
    assess,
    goodput_curves,
    held_gpu_type,
    length_estimate_s,
    length_in_force,
    remaining_s,
    required_rate,
    time_left_s,
    uniform_progress_ahead,
)
from autoscaler.decide.fleet import FleetView
from autoscaler.decide.sizing import FleetOption, JobDemand, SizingConfig, size_fleet
from autoscaler.decide.strategies import GoodputSizing, UniformProgress, demands_of
from autoscaler.decide.views import Allocation, ClusterView, JobView, NodeView
from autoscaler.errors import InvalidInputError
from autoscaler.model.goodput import BatchLimits, GoodputModel, GradParams, PerfParams
from autoscaler.model.gputypes import default_speed_table

SPEC = "name: j\ncommand: train.py\nbatch_size: {initial: 8, max: 8}\nlocal_batch_size: {max: 8}\n"


def _sub(deadline: object) -> JobSubmission:
    return JobSubmission("j", 8, 8, 8, command=("train.py",), deadline=deadline)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "after", "at"),
    [
        (90, 90.0, None),
        (1.5, 1.5, None),
        ("90m", 5400.0, None),
        ("2h30m", 9000.0, None),
        ("1d", 86400.0, None),
        ("1h0m30s", 3630.0, None),
        ("2026-12-05T18:00:00Z", None, 1796493600.0),
        ("2026-12-05T19:00:00+01:00", None, 1796493600.0),
        (None, None, None),
    ],
)
def test_a_deadline_is_a_duration_or_a_zoned_time(given: object, after: object, at: object) -> None:
    assert parse_deadline(given) == (after, at)
    assert _sub(given).deadline == given  # and the submission keeps it as given


@pytest.mark.parametrize(
    ("given", "words"),
    [
        (0, "(0, 31622400]"),
        (-5, "(0, 31622400]"),
        (MAX_DEADLINE_S + 1, "(0, 31622400]"),
        (math.inf, "(0, 31622400]"),
        (math.nan, "(0, 31622400]"),
        ("400d", "(0, 31622400]"),
        (True, "must be seconds"),
        ([3600], "must be seconds"),
        ("soon", "a duration such as"),
        ("", "a duration such as"),
        ("2h 30m", "a duration such as"),
        ("2026-12-05T18:00:00", "needs its zone"),
        ("9" * 5000, "a duration such as"),
    ],
)
def test_absurd_deadlines_are_refused(given: object, words: str) -> None:
    with pytest.raises(InvalidInputError, match=None) as e:
        parse_deadline(given)
    assert words in str(e.value)
    with pytest.raises(InvalidInputError) as e2:
        _sub(given)
    assert e2.value.field == "deadline"


def test_the_yaml_spec_takes_a_deadline_and_hands_it_on() -> None:
    assert parse_job_spec(SPEC + "deadline: 2h\n").submission().deadline == "2h"
    assert parse_job_spec(SPEC + "deadline: 7200\n").submission().deadline == 7200.0
    quoted = parse_job_spec(SPEC + 'deadline: "2026-12-05T18:00:00Z"\n')
    assert quoted.submission().deadline == "2026-12-05T18:00:00Z"
    with pytest.raises(JobSpecError, match=r"\[deadline\]"):
        parse_job_spec(SPEC + "deadline: 0\n")
    with pytest.raises(JobSpecError, match="quoted time"):  # a YAML timestamp: quote it
        parse_job_spec(SPEC + "deadline: 2026-12-05T18:00:00Z\n")


def test_a_deadline_no_job_can_meet_is_refused_at_submission_with_the_estimate() -> None:
    now = 1_800_000_000.0
    assert submission_deadline(_sub("1h"), now) == (3600.0, None)
    assert submission_deadline(_sub(None), now) == (None, None)
    at = now + 600.0
    assert submission_deadline(_sub(_iso(at)), now) == (None, at)
    for past in (_iso(now - 60.0), _iso(now)):
        with pytest.raises(InvalidInputError, match="is in the past") as e:
            submission_deadline(_sub(past), now)
        assert f"{EARLIEST_DONE_S:.0f} s" in str(e.value) and e.value.field == "deadline"
    with pytest.raises(InvalidInputError, match=r"is 60 s after submission.*estimated 180 s"):
        submission_deadline(_sub(60), now)
    with pytest.raises(InvalidInputError, match="more than"):
        submission_deadline(_sub(_iso(now + MAX_DEADLINE_S + 10.0)), now)


def _iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


# ---- the shared rules --------------------------------------------------------------------

LIMITS = BatchLimits(64, 64, 64)
POLICY_LIMITS = BatchLimits(
    init_batch_size=128, max_batch_size=4096, max_local_bsz=512, min_local_bsz=32
)
#: A job that scales well (small sync, large noise scale), as the policy tests build one.
MODEL = GoodputModel(
    PerfParams(0.01, 0.001, 0.002, 0.0002, 0.004, 0.0004, 1.0), GradParams(0.01, 1.0), POLICY_LIMITS
)


def view(
    *,
    deadline_s: float | None = 1000.0,
    age_s: float = 100.0,
    remaining: float | None = 10.0,
    target: float | None = 20.0,
) -> JobView:
    return JobView(
        "j",
        "cifar10",
        0.0,
        age_s,
        0.0,
        0,
        Allocation(),
        LIMITS,
        1,
        64,
        remaining_progress=remaining,
        target_progress=target,
        deadline_s=deadline_s,
    )


def test_time_left_and_the_rate_a_deadline_needs() -> None:
    job = view()  # 10 progress units of 64 samples left, 900 s to the deadline
    assert time_left_s(job) == 900.0
    assert required_rate(job, 0.0) == pytest.approx(640 / 900)
    assert required_rate(job, 500.0) == pytest.approx(640 / 400)
    assert required_rate(job, 900.0) == math.inf  # no time left before the margin
    assert required_rate(view(deadline_s=None), 0.0) is None
    assert required_rate(view(remaining=None), 0.0) is None


def test_the_trainers_length_replaces_the_specs_and_a_known_length_has_a_bound() -> None:
    """length_in_force: the trainer's declaration once it comes, else the spec's; the bound
    at submission is the start plus the remaining work over perfect scaling of the best
    one-GPU goodput (the controller's deadline warning's bound)."""
    assert length_in_force(None, 400.0) == 400.0
    assert length_in_force(200.0, 400.0) == 200.0
    assert length_in_force(200.0, None) == 200.0
    assert length_in_force(None, None) is None
    job = dataclasses.replace(view(), limits=POLICY_LIMITS, models={"T4": MODEL})
    speeds = default_speed_table()
    one_gpu = goodput_curves(job, [("T4", 1)], speeds, most_gpus=1, optimistic=False)
    bound = 4 * one_gpu[("T4", 1)][0]  # 4 GPUs at most
    got = length_estimate_s(job, [("T4", 1)], speeds, most_gpus=4, start_s=180.0)
    assert got == pytest.approx(180.0 + 10 * 128 / bound)
    assert length_estimate_s(view(), [("T4", 1)], speeds, most_gpus=4, start_s=180.0) is None


def test_assess_finds_the_fewest_gpus_that_finish_with_the_margin() -> None:
    kind, other = ("T4", 4), ("V100", 8)
    curves = {kind: [1.0, 1.9, 2.7, 3.4], other: [3.0, 5.0]}
    # 1000 samples, 1000 s left, start 100 s, margin 300 s: 600 s of running at most.
    need = assess(1000.0, 1000.0, curves, start_s=100.0, margin_s=300.0)
    assert need.gpus == {kind: 2, other: 1}  # 1000/1.9 = 526 s; 1000/3 = 333 s
    assert need.fastest_s == pytest.approx(100.0 + 1000.0 / 5.0)
    assert need.feasible and not need.urgent
    tight = assess(1000.0, 520.0, curves, start_s=100.0, margin_s=300.0)
    assert tight.feasible and tight.urgent  # 300 s fastest, 220 s slack < 300 s
    # On demand no preemption is feared: the fewest done a round (60 s) early.
    assert tight.gpus == {kind: 4, other: 1}  # 1000/3.4 = 294 s, 1000/3 = 333 s <= 360 s
    tighter = assess(1000.0, 400.0, curves, start_s=100.0, margin_s=300.0)
    assert tighter.urgent and tighter.gpus == {kind: 4, other: 2}  # none in time: the fastest
    late = assess(1000.0, 250.0, curves, start_s=100.0, margin_s=0.0)
    assert not late.feasible and late.urgent
    running = assess(1000.0, 250.0, curves, start_s=100.0, margin_s=0.0, running_kind=other)
    assert running.feasible  # no start-up on the kind it runs on


def test_uniform_progress_is_ahead_while_work_keeps_up_with_time() -> None:
    assert uniform_progress_ahead(0.0, 10.0, 0.0, 100.0)  # at the start: on time
    assert uniform_progress_ahead(5.0, 10.0, 50.0, 100.0)
    assert not uniform_progress_ahead(4.9, 10.0, 50.0, 100.0)
    assert uniform_progress_ahead(10.0, 10.0, 150.0, 100.0)
    assert not uniform_progress_ahead(9.0, 10.0, 150.0, 100.0)  # past the deadline
    assert not uniform_progress_ahead(1.0, 0.0, 0.0, 100.0)


# ---- the uniform-progress baseline and the sizing ------------------------------------------

SPOT1 = FleetOption("aws/g4dn.xlarge/z/spot", "T4", 1, "spot", 0.2)
OD1 = FleetOption("aws/g4dn.xlarge/z/on-demand", "T4", 1, "on-demand", 0.5)
SPOT4 = FleetOption("aws/g4dn.12xlarge/z/spot", "T4", 4, "spot", 1.2)
OD4 = FleetOption("aws/g4dn.12xlarge/z/on-demand", "T4", 4, "on-demand", 3.9)


def fleet_view(*jobs: JobView, options=(SPOT1, OD1, SPOT4, OD4), now: float = 100.0) -> FleetView:
    return FleetView(now, tuple(jobs), ClusterView((), now, 1), {}, tuple(options))


def test_uniform_progress_runs_on_spot_while_ahead_and_on_demand_when_behind() -> None:
    rule = UniformProgress("uniform-progress", margin_s=0.0)
    # 100 s of a 1000 s window gone: 10% of the work must be done.
    ahead = view(remaining=17.0, target=20.0)  # 15% done
    behind = view(remaining=19.0, target=20.0)  # 5% done
    assert rule.propose(fleet_view(ahead)) == {SPOT1.key: 1}
    assert rule.propose(fleet_view(behind)) == {OD1.key: 1}
    assert rule.propose(fleet_view(view(deadline_s=None))) == {SPOT1.key: 1}
    assert rule.propose(fleet_view(view(remaining=None, target=None))) == {SPOT1.key: 1}
    # No spot capacity: on demand even while ahead; no on-demand either: nothing.
    gone = dataclasses.replace(SPOT1, available=False)
    assert rule.propose(fleet_view(ahead, options=(gone, OD1))) == {OD1.key: 1}
    assert rule.propose(fleet_view(behind, options=(SPOT1,))) == {SPOT1.key: 1}


def test_uniform_progress_goes_on_demand_when_a_preemption_would_be_too_many() -> None:
    rule = UniformProgress("uniform-progress", margin_s=300.0)
    # Ahead (60% done), but 8 units x 128 samples at its 1-GPU goodput leave < 300 s spare.
    fitted = dataclasses.replace(
        view(remaining=8.0, target=20.0, deadline_s=1000.0), limits=POLICY_LIMITS, model=MODEL
    )
    rate = float(np.ravel(MODEL.optimize(1, 1).goodput)[0])
    need_s = 8.0 * POLICY_LIMITS.init_batch_size / rate
    assert uniform_progress_ahead(12.0, 20.0, 100.0, 1000.0)
    on_spot = rule.on_spot(fitted, 1)
    assert on_spot == (need_s <= 900.0 - 300.0)
    late = dataclasses.replace(fitted, deadline_s=100.0 + need_s + 100.0)
    assert not rule.on_spot(late, 1)  # ahead of the uniform rate, but no slack for a preemption


def _sized_job(deadline_s: float | None, remaining: float) -> JobView:
    return JobView(
        "d",
        "cifar10",
        0.0,
        100.0,
        0.0,
        0,
        Allocation(),
        POLICY_LIMITS,
        1,
        128,
        max_profiled_gpus=4,
        max_profiled_nodes=1,
        models={"T4": MODEL},
        remaining_progress=remaining,
        target_progress=remaining,
        deadline_s=deadline_s,
    )


def test_the_sizing_buys_a_deadline_job_its_gpus_on_spot_with_slack_and_on_demand_without() -> None:
    sizing = GoodputSizing("coadapt", SizingConfig(min_efficiency=0.9))
    rate1 = float(np.ravel(MODEL.optimize(1, 1).goodput)[0])
    remaining = 2000.0
    one_gpu_s = remaining * POLICY_LIMITS.init_batch_size / rate1
    options = (SPOT1, OD1, SPOT4, OD4)
    free = sizing.propose(fleet_view(_sized_job(None, remaining), options=options))
    # A deadline 1.5 x what one GPU needs, margin and start-up included: more GPUs, still
    # on spot (the slack covers a preemption).
    margin = 300.0 + 120.0 + 180.0
    loose = sizing.propose(
        fleet_view(_sized_job(100.0 + margin + one_gpu_s / 3, remaining), options=options)
    )
    demands = demands_of(
        fleet_view(_sized_job(100.0 + margin + one_gpu_s / 3, remaining)),
        sizing.speeds,
        growth_factor=5,
    )
    need = demands[0].deadline_gpus[("T4", 4)]
    assert not demands[0].urgent and need >= 2
    assert _gpus(loose) >= need and _gpus(loose) >= _gpus(free)
    assert all(key.endswith("/spot") for key in loose)
    # A deadline it can only just meet at its fastest (on up to 64 GPUs): urgent, on demand,
    # from the second round in a row that finds it so.
    curves = goodput_curves(_sized_job(None, remaining), [("T4", 4), ("T4", 1)], sizing.speeds)
    best_s = remaining * POLICY_LIMITS.init_batch_size / max(max(c) for c in curves.values())
    tight_job = _sized_job(100.0 + 180.0 + best_s + 100.0, remaining)
    tight = demands_of(fleet_view(tight_job), sizing.speeds, growth_factor=5)
    assert tight[0].urgent
    fresh = GoodputSizing("coadapt", SizingConfig(min_efficiency=0.9))
    first = fresh.propose(fleet_view(tight_job, options=options))
    assert all(key.endswith("/spot") for key in first)  # one round's word is not enough
    urgent = fresh.propose(fleet_view(tight_job, options=options))
    assert all(key.endswith("/on-demand") for key in urgent)
    assert _gpus(urgent) >= max(tight[0].deadline_gpus.values())


def test_remaining_s_is_the_work_left_over_the_fitted_goodput_where_the_job_runs() -> None:
    """The one rule of a job's time left (the sizing's and the controller's ETA): its
    remaining work over its model's goodput at the nodes and GPUs it holds, on their type;
    no estimate without a declared length, GPUs, a model there, or a goodput worth the name."""
    cluster = ClusterView.uniform(2, 4, gpu_type="T4")
    job = dataclasses.replace(
        _sized_job(None, 500.0), allocation=Allocation({"node-00": 4, "node-01": 2})
    )
    assert held_gpu_type(job, cluster) == "T4"
    rate = float(np.ravel(MODEL.optimize(2, 6).goodput)[0])
    assert rate > 0
    assert remaining_s(job, "T4") == pytest.approx(500.0 * POLICY_LIMITS.init_batch_size / rate)
    # The sizing's remaining time is this rule's.
    (demand,) = demands_of(fleet_view(job), GoodputSizing("c").speeds)
    assert demand.remaining_s is None  # fleet_view's cluster holds none of its nodes
    placed = dataclasses.replace(fleet_view(job), cluster=cluster)
    (demand,) = demands_of(placed, GoodputSizing("c").speeds)
    assert demand.remaining_s == remaining_s(job, "T4")
    # No estimate: no declared length, no GPUs, no model on the type it runs on, no type.
    assert remaining_s(dataclasses.replace(job, remaining_progress=None), "T4") is None
    assert remaining_s(dataclasses.replace(job, allocation=Allocation()), "T4") is None
    assert remaining_s(job, "A100") is None and remaining_s(job, None) is None
    mixed = ClusterView((NodeView("node-00", "T4", 4), NodeView("node-01", "V100", 4)), 0.0, 0)
    assert held_gpu_type(job, mixed) is None
    # A fit that predicts next to no goodput gives no estimate rather than years.
    crawl = GoodputModel(PerfParams(1e6, 1e6, 1e6, 1e6, 1e6, 1e6, 1.0), MODEL.grad, POLICY_LIMITS)
    slow = dataclasses.replace(job, models={"T4": crawl})
    slow_rate = float(np.ravel(crawl.optimize(2, 6).goodput)[0])
    assert 500.0 * POLICY_LIMITS.init_batch_size / slow_rate > MAX_REMAINING_S
    assert remaining_s(slow, "T4") is None
    assert MAX_REMAINING_S == 30 * 86_400.0


def _gpus(counts: Mapping[str, int]) -> int:
    per = {o.key: o.gpus for o in (SPOT1, OD1, SPOT4, OD4)}
    return sum(per[k] * n for k, n in counts.items())


def test_deadline_jobs_share_the_instances_bought_for_them() -> None:
    v100 = FleetOption("aws/p3.16xlarge/z/spot", "V100", 8, "spot", 7.3)
    v100_od = FleetOption("aws/p3.16xlarge/z/on-demand", "V100", 8, "on-demand", 24.48)
    curve = tuple(float(g) for g in range(1, 9))

    def demand(name: str, gpus: int, urgent: bool = False) -> JobDemand:
        return JobDemand(
            name, {("V100", 8): curve}, deadline_gpus={("V100", 8): gpus}, urgent=urgent
        )

    config = SizingConfig(min_efficiency=10.0)  # no growth beyond the deadlines' needs
    speeds = default_speed_table()
    two = size_fleet([demand("a", 3), demand("b", 3)], [v100, v100_od], {}, config, speeds)
    assert dict(two.counts) == {v100.key: 1}  # 3 + 3 GPUs on one instance
    assert dict(two.gpus_by_job) == {"a": 3, "b": 3}
    big = size_fleet([demand("a", 5), demand("b", 5)], [v100, v100_od], {}, config, speeds)
    assert dict(big.counts) == {v100.key: 2}
    # An urgent job does not take what a spot instance has left: it gets on-demand.
    mixed = size_fleet(
        [demand("a", 3), demand("b", 3, urgent=True)], [v100, v100_od], {}, config, speeds
    )
    assert dict(mixed.counts) == {v100.key: 1, v100_od.key: 1}


def test_one_unseen_shape_rule_serves_the_sizing_and_the_deadline_curves() -> None:
    """The optimistic valuation of shapes a fit has not seen has one rule
    (:func:`autoscaler.decide.sizing.unseen_shapes`) and one application
    (:func:`~autoscaler.decide.sizing.with_unseen_hope`), read by the sizing's value curves
    (one job, and many batched) and the deadline curves alike. A job that ran on two instances
    of one GPU each: two instances of four GPUs are unseen for every caller (the deadline
    curves once called them seen), one instance of four is seen for every caller."""
    from autoscaler.decide.sizing import job_demand, job_demands, unseen_shapes
    from autoscaler.model.goodput import optimistic_internode

    per = 4
    g = np.arange(1, 13)
    nodes = -(-g // per)
    unseen = unseen_shapes(nodes, g, 2, 2)
    assert list(unseen) == [False] * 4 + [True] * 8  # 2 x 4 GPUs: more GPUs than it has run on
    assert list(unseen_shapes(nodes, g, 3, 12)) == [False] * 12
    assert list(unseen_shapes(nodes, g, 0, 0)) == [False] * 4 + [True] * 8  # never ran

    job = dataclasses.replace(_sized_job(None, 100.0), max_profiled_gpus=2, max_profiled_nodes=2)
    speeds = default_speed_table()
    fit = np.ravel(MODEL.optimize(nodes, g).goodput)
    hope = np.ravel(optimistic_internode(MODEL).optimize(nodes, g).goodput)
    assert (hope[unseen] > fit[unseen]).all()  # the hope is worth something on these shapes
    want = np.where(unseen, np.maximum(fit, hope), fit)

    deadline = goodput_curves(job, [("T4", per)], speeds, most_gpus=12)[("T4", per)]
    assert deadline == pytest.approx(list(want), rel=1e-12)
    one = job_demand(job, [("T4", per)], speeds, max_gpus=12, optimistic=True).curves[("T4", per)]
    many = job_demands(
        [job, job], [("T4", per)], speeds, max_gpus=[12, 12], gpu_types=[None, None],
        optimistic=True,
    )  # fmt: skip
    scale = float(np.ravel(MODEL.optimize(1, 1).goodput)[0])
    sized = np.maximum.accumulate(want) / scale  # the sizing's curve: best so far, in T4 units
    assert one == pytest.approx(list(sized), rel=1e-9)
    assert [d.curves[("T4", per)] for d in many] == [one, one]
