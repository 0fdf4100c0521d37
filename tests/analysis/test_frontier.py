"""Cost-time frontiers (autoscaler.analysis.frontier): the Pareto set, the interpolation, the
checks."""

from __future__ import annotations

import json

import pytest

from autoscaler.analysis.frontier import (
    FrontierPoint,
    check_frontiers,
    cost_at,
    pareto,
    points_from_json,
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
