"""cost_series_usd(): the dashboard's cumulative cost series starts at the first instance's
start and grows with the instances running (issue 41: it started at "now" while no instance
had ended, a vertical line at x = 0)."""

from __future__ import annotations

import itertools

import pytest

from autoscaler.accounting.costs import MAX_SERIES_POINTS, cost_series_usd


def test_a_fleet_with_no_ended_instance_starts_at_its_first_launch_and_grows() -> None:
    # two instances running since t=1000 and t=1060, $0.36/h and $0.72/h; now t=1120
    points = cost_series_usd([], [(1000.0, 0.36), (1060.0, 0.72)], 1120.0)
    assert points[0] == (1000.0, 0.0)
    assert [t for t, _ in points] == [1000.0, 1060.0, 1120.0]
    assert points[1][1] == pytest.approx(0.36 * 60 / 3600)
    assert points[2][1] == pytest.approx((0.36 * 120 + 0.72 * 60) / 3600)
    assert points[-1][0] - points[0][0] == 120.0  # two minutes of axis, not 0


def test_closed_bills_end_at_their_total_and_a_minimum_is_a_step_at_the_end() -> None:
    # one instance 0..30 s at $3.6/h billed the 60 s minimum (0.06 USD); one running from 10 s
    points = cost_series_usd([(0.0, 30.0, 3.6, 0.06)], [(10.0, 1.8)], 70.0)
    assert points[0] == (0.0, 0.0)
    at_30 = [usd for t, usd in points if t == 30.0]
    assert at_30 == [pytest.approx(0.03 + 0.01), pytest.approx(0.06 + 0.01)]
    assert points[-1] == (70.0, pytest.approx(0.06 + 1.8 * 60 / 3600))
    assert all(b[1] >= a[1] and b[0] >= a[0] for a, b in itertools.pairwise(points))


def test_nothing_ran_is_no_series_and_a_long_one_is_thinned_keeping_its_ends() -> None:
    assert cost_series_usd([], [], 5.0) == []
    closed = [(float(i), float(i) + 0.5, 3.6, 0.0005) for i in range(3000)]
    points = cost_series_usd(closed, [], 4000.0)
    assert len(points) == MAX_SERIES_POINTS
    assert points[0] == (0.0, 0.0) and points[-1] == (4000.0, pytest.approx(1.5))
