"""Cost-time frontiers (autoscaler.analysis.frontier): the Pareto set, the interpolation, the
checks."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from autoscaler.analysis.frontier import (
    FrontierPoint,
    SweepSpec,
    check_frontiers,
    cost_at,
    dominated,
    next_knob,
    pareto,
    points_from_json,
    sweep,
    sweep_ends,
)
from autoscaler.errors import InvalidInputError


def P(knob: float, cost: float, jct: float) -> FrontierPoint:
    return FrontierPoint(knob, cost, jct)


def test_pareto_drops_dominated_points_and_sorts_by_jct() -> None:
    pts = [P(0.85, 100, 900), P(0.15, 300, 400), P(0.5, 200, 600), P(0.7, 250, 800)]
    # 0.7 costs more and is slower than 0.5: dominated.
    assert [p.knob for p in pareto(pts)] == [0.15, 0.5, 0.85]
    # Equal JCT: only the cheaper stays; equal points: the first.
    assert [p.knob for p in pareto([P(1, 10, 5), P(2, 9, 5), P(3, 9, 5)])] == [2]


def test_dominated_are_the_points_another_beats_not_their_twins() -> None:
    pts = [P(0.85, 100, 900), P(0.15, 300, 400), P(0.5, 200, 600), P(0.7, 250, 800)]
    assert dominated(pts) == [P(0.7, 250, 800)]
    # Equal cost and slower: dominated; a twin (the same cost and JCT at another knob): not.
    assert dominated([P(1, 10, 5), P(2, 10, 6), P(3, 10, 5)]) == [P(2, 10, 6)]
    assert dominated([P(1.7, 379, 1791), P(3.4, 379, 1791)]) == []


def test_cost_at_is_linear_between_points_and_none_outside() -> None:
    pts = [P(0.15, 300, 400), P(0.5, 200, 600), P(0.85, 100, 900)]
    assert cost_at(pts, 400) == pytest.approx(300)
    assert cost_at(pts, 500) == pytest.approx(250)
    assert cost_at(pts, 750) == pytest.approx(150)
    assert cost_at(pts, 900) == pytest.approx(100)
    assert cost_at(pts, 399.9) is None and cost_at(pts, 900.1) is None
    # A dominated point does not bend the line: (800, 250) is ignored.
    assert cost_at([*pts, P(0.7, 250, 800)], 750) == pytest.approx(150)
    assert cost_at([P(0.3, 50, 70)], 70) == 50 and cost_at([P(0.3, 50, 70)], 71) is None


def _ref() -> list[FrontierPoint]:
    return [P(0.15, 300, 400), P(0.5, 200, 600), P(0.85, 100, 900)]


def test_checks_hold_when_the_reference_is_below_faster_and_cheapest() -> None:
    other = [P(0.15, 320, 450), P(0.5, 260, 700), P(0.85, 150, 1000)]
    out = check_frontiers({"coadapt": _ref(), "coadapt-t4": other}, "coadapt")
    assert out["holds"] == {"dominance": True, "reach": True, "cheapest": True, "all": True}
    dom = out["dominance"]["coadapt-t4"]
    # 1000 s lies outside the reference's range: two points checked.
    assert [p["knob"] for p in dom["points"]] == [0.15, 0.5]
    assert dom["points"][0]["reference_cost_usd"] == pytest.approx(275)
    assert dom["points"][1]["cost_ratio"] == pytest.approx((200 - 100 / 3) / 260)
    assert out["range_s"] == [400, 900]
    json.dumps(out, allow_nan=False)  # JSON-ready


def test_dominance_fails_on_one_point_below_the_reference_line() -> None:
    # At 750 s the reference costs 150; a point at 140 is cheaper there.
    other = [P(0.15, 320, 450), P(0.5, 140, 750), P(0.85, 150, 1000)]
    out = check_frontiers({"coadapt": _ref(), "coadapt-a100": other}, "coadapt")
    assert out["holds"]["dominance"] is False and out["holds"]["all"] is False
    verdicts = [(p["knob"], p["holds"]) for p in out["dominance"]["coadapt-a100"]["points"]]
    assert verdicts == [(0.15, True), (0.5, False)]
    # Level is not less: a point exactly on the line fails too.
    level = check_frontiers({"coadapt": _ref(), "x": [P(0.5, 250, 500)]}, "coadapt")
    assert level["holds"]["dominance"] is False


def test_reach_and_cheapest_fail_separately() -> None:
    faster = [P(0.15, 500, 350), P(0.85, 400, 420)]
    out = check_frontiers({"coadapt": _ref(), "a100": faster}, "coadapt")
    assert out["reach"]["a100"] == {
        "holds": False,
        "reference_min_jct_s": 400,
        "min_jct_s": 350,
        "jct_ratio": pytest.approx(400 / 350),
    }
    assert out["holds"]["dominance"] and out["holds"]["cheapest"]
    cheaper = [P(0.85, 90, 2000)]
    out = check_frontiers({"coadapt": _ref(), "v100": cheaper}, "coadapt")
    assert out["cheapest"]["v100"]["holds"] is False
    assert out["holds"] == {"dominance": True, "reach": True, "cheapest": False, "all": False}
    # Equal cheapest cost holds ("no more than").
    out = check_frontiers({"coadapt": _ref(), "v100": [P(0.85, 100, 2000)]}, "coadapt")
    assert out["holds"]["cheapest"] is True


def test_checks_refuse_missing_fleets() -> None:
    with pytest.raises(InvalidInputError):
        check_frontiers({"coadapt-t4": _ref()}, "coadapt")
    with pytest.raises(InvalidInputError):
        check_frontiers({"coadapt": _ref()}, "coadapt")


def test_points_from_json_checks_every_field() -> None:
    pts = points_from_json([{"knob": 0.3, "cost_usd": 10, "mean_jct_s": 5.5, "extra": 1}])
    assert pts == [P(0.3, 10, 5.5)]
    for bad, where in (
        ([], "frontier"),
        ({}, "frontier"),
        ([{"knob": 0.3, "cost_usd": 10}], "frontier[0]"),
        ([{"knob": 0.3, "cost_usd": "10", "mean_jct_s": 1}], "frontier[0].cost_usd"),
        ([{"knob": 0.3, "cost_usd": 1, "mean_jct_s": float("nan")}], "frontier[0].mean_jct_s"),
        ([{"knob": True, "cost_usd": 1, "mean_jct_s": 1}], "frontier[0].knob"),
        ([{"knob": 0.3, "cost_usd": -1, "mean_jct_s": 1}], "frontier[0].cost_usd"),
        (["x"], "frontier[0]"),
    ):
        with pytest.raises(InvalidInputError) as e:
            points_from_json(bad)
        assert e.value.field == where


# ---- the sweep to the ends ---------------------------------------------------------------------


def _fleet(fast_floor_knob: float = 0.0, cheap_knob: float = 1.0):
    """A synthetic fleet: mean JCT grows and cost falls with the knob until ``cheap_knob``
    (flat beyond), and the JCT stops falling below ``fast_floor_knob`` (flat below)."""

    def run(knob: float) -> FrontierPoint:
        k = min(max(knob, fast_floor_knob), cheap_knob)
        return P(knob, 400 + 400 * (cheap_knob - k), 300 + 600 * k)

    return run


def test_sweep_runs_the_grid_then_extends_until_both_ends_flatten() -> None:
    spec = SweepSpec(grid=(0.15, 0.5, 0.85))
    asked: list[float] = []

    def run(knob: float) -> FrontierPoint:
        asked.append(knob)
        return _fleet(fast_floor_knob=0.1, cheap_knob=1.0)(knob)

    points, ends = sweep(run, spec)
    # The grid first, then one extension per end in turn (the fast end first on a tie):
    # 0.0375 (a quarter of 0.15) runs 360 s against 0.15's 390 s, 8.3% apart, and 1.7 costs
    # $400 against 0.85's $460; then 0 (0.0375 is within min_step of it) runs 360 s again:
    # flat; and 3.4 costs $400 again: flat.
    assert asked == [0.15, 0.5, 0.85, 0.0375, 1.7, 0.0, 3.4]
    assert [p.knob for p in points] == sorted(asked)
    assert ends["fast"].status == "flat" and ends["fast"].knobs == (0.0, 0.0375)
    assert ends["fast"].change == 0 and ends["fast"].axis == "mean_jct_s"
    assert ends["cheap"].status == "flat" and ends["cheap"].knobs == (3.4, 1.7)
    assert ends["cheap"].change == 0 and ends["cheap"].axis == "cost_usd"


def test_the_fast_end_reaches_the_knob_bound_and_says_range() -> None:
    # The JCT keeps falling to knob 0: the fast end cannot flatten; it ends on the bound.
    points, ends = sweep(_fleet(), SweepSpec(grid=(0.15, 0.5, 0.85)))
    knobs = [p.knob for p in points]
    assert knobs[:2] == [0.0, 0.0375]
    assert ends["fast"].status == "range" and ends["fast"].knobs == (0.0, 0.0375)
    assert ends["fast"].change == pytest.approx((322.5 - 300) / 300)
    assert ends["cheap"].status == "flat"
    # A flat fast end: the JCT is the same below 0.2, so 0.15 and 0.0375 agree.
    _, ends = sweep(_fleet(fast_floor_knob=0.2), SweepSpec(grid=(0.15, 0.5, 0.85)))
    assert ends["fast"].status == "flat" and ends["fast"].change == 0


def _falling(fast_floor_knob: float) -> Callable[[float], FrontierPoint]:
    """Cost falls as 1 / (1 + knob) at every knob; the JCT is flat below ``fast_floor_knob``."""
    return lambda k: P(k, 1000 / (1 + k), 300 + 100 * max(k, fast_floor_knob))


def test_the_cheap_end_climbs_to_knob_max_and_says_range() -> None:
    # Cost falls all the way to the bound: the cheap end ends there, not flat.
    spec = SweepSpec(grid=(0.15, 0.5, 0.85), knob_max=4.0, max_runs=20)
    points, ends = sweep(_falling(fast_floor_knob=0.2), spec)
    assert [p.knob for p in points] == [0.0375, 0.15, 0.5, 0.85, 1.7, 3.4, 4.0]
    assert ends["cheap"].status == "range" and ends["cheap"].knobs == (4.0, 3.4)
    assert ends["cheap"].change == pytest.approx((1000 / 4.4) / (1000 / 5) - 1)
    assert ends["fast"].status == "flat"


def test_the_cap_on_runs_stops_the_sweep_and_shares_runs_between_the_ends() -> None:
    spec = SweepSpec(grid=(0.15, 0.5, 0.85), max_runs=5)
    points, ends = sweep(_falling(fast_floor_knob=0.0), spec)
    # Five knobs: the grid and one extension of each end.
    assert [p.knob for p in points] == [0.0375, 0.15, 0.5, 0.85, 1.7]
    assert ends["fast"].status == "stopped" and ends["cheap"].status == "stopped"
    assert next_knob(points, spec) is None


def test_an_explicit_grid_reports_its_ends_without_running_more() -> None:
    spec = SweepSpec(grid=(0.0, 0.5, 4.0), max_runs=3)
    pts = [_fleet(cheap_knob=2.0)(k) for k in spec.grid]
    assert next_knob(pts, spec) is None
    ends = sweep_ends(pts, spec)
    assert ends["fast"].status == "range"  # 0 is the bound, and 0 and 0.5 differ
    # 4.0 and 0.5 cost $400 and $1000, and 4.0 is short of the bound: the grid stopped it.
    assert ends["cheap"].status == "stopped" and ends["cheap"].knobs == (4.0, 0.5)


def test_next_knob_follows_the_points_given_not_a_hidden_state() -> None:
    spec = SweepSpec()
    assert next_knob([], spec) == 0.15
    assert next_knob([P(0.15, 10, 10)], spec) == 0.5
    # Out of order and with a knob off the grid: the grid's missing knob first.
    assert next_knob([P(0.85, 5, 30), P(0.01, 20, 5)], spec) == 0.15
    grid_done = [P(0.15, 10, 10), P(0.5, 8, 20), P(0.85, 6, 30)]
    assert next_knob(grid_done, spec) == 0.0375
    assert next_knob([*grid_done, P(0.0375, 11, 9)], spec) == 1.7  # the cheap end's turn
    # Both ends flat: nothing more to run.
    flat = [P(0.0375, 11, 10.05), *grid_done, P(1.7, 5, 40), P(3.4, 5, 41)]
    ends = sweep_ends(flat, spec)
    assert ends["fast"].status == "flat" and ends["cheap"].status == "flat"
    assert next_knob(flat, spec) is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"grid": (0.5,)}, "grid"),
        ({"grid": (0.5, 0.2)}, "grid"),
        ({"grid": (0.5, 0.5)}, "grid"),
        ({"grid": (0.5, 11.0)}, "grid"),
        ({"knob_min": 1.0, "knob_max": 1.0}, "knob_max"),
        ({"tolerance": 0.0}, "tolerance"),
        ({"tolerance": float("nan")}, "tolerance"),
        ({"shrink": 1.0}, "shrink"),
        ({"grow": 1.0}, "grow"),
        ({"min_step": 0.0}, "min_step"),
        ({"max_runs": 2}, "max_runs"),
        ({"max_runs": 1001}, "max_runs"),
        ({"max_runs": 5.0}, "max_runs"),
    ],
)
def test_sweep_spec_refuses_bad_settings(kwargs, field) -> None:
    with pytest.raises(InvalidInputError) as e:
        SweepSpec(**kwargs)
    assert e.value.field == field


def test_sweep_refuses_a_run_that_answers_another_knob() -> None:
    with pytest.raises(InvalidInputError):
        sweep(lambda k: P(k + 1, 1, 1), SweepSpec())


def test_checks_take_the_ends_within_a_tolerance() -> None:
    ref = [P(0.0, 400, 404), P(0.5, 200, 600), P(2.0, 101.5, 900)]
    other = [P(0.0, 500, 400), P(2.0, 100, 1500)]
    strict = check_frontiers({"coadapt": ref, "v": other}, "coadapt")
    assert strict["holds"]["reach"] is False and strict["holds"]["cheapest"] is False
    eased = check_frontiers({"coadapt": ref, "v": other}, "coadapt", tolerance=0.02)
    assert eased["tolerance"] == 0.02
    assert eased["reach"]["v"]["holds"] and eased["reach"]["v"]["jct_ratio"] == pytest.approx(1.01)
    assert eased["cheapest"]["v"]["holds"]
    assert eased["cheapest"]["v"]["cost_ratio"] == pytest.approx(1.015)
    # 2% is the bound: 3% off fails.
    far = check_frontiers({"coadapt": ref, "v": [P(0.0, 500, 392)]}, "coadapt", tolerance=0.02)
    assert far["reach"]["v"]["holds"] is False
    with pytest.raises(InvalidInputError):
        check_frontiers({"coadapt": ref, "v": other}, "coadapt", tolerance=-0.01)
