"""One rule for what a restart costs (issue 40: the sizing buys no instance for a growth the
policy will not make): the restart factor the ``coadapt`` policy weighs a candidate with is
the one the fleet sizing gates a running job's growth with."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from autoscaler.decide.restarts import RESTART_HORIZON_S, restart_factor, restart_factors
from autoscaler.decide.strategies import GoodputSizing, demands_of
from autoscaler.decide.views import Allocation, ClusterView
from tests.decide.test_deadlines import _sized_job, fleet_view


def test_the_restart_factor() -> None:
    assert restart_factor(None, 30.0) == pytest.approx(
        (RESTART_HORIZON_S - 30.0) / RESTART_HORIZON_S
    )
    assert restart_factor(60.0, 30.0) == pytest.approx(0.5)  # half of its last minute lost
    assert restart_factor(20.0, 30.0) == 0.0  # done before it would be back
    assert restart_factor(1e9, 0.0) == 1.0
    left = np.array([math.inf, 60.0, 20.0])
    assert list(restart_factors(left, 30.0)) == [
        restart_factor(x, 30.0) for x in (None, 60.0, 20.0)
    ]


def test_the_sizing_values_only_the_growth_the_policy_would_make() -> None:
    cluster = ClusterView.uniform(2, 4, gpu_type="T4")
    job = dataclasses.replace(_sized_job(None, 400.0), allocation=Allocation({"node-00": 1}))
    speeds = GoodputSizing("c").speeds
    view = dataclasses.replace(fleet_view(job), cluster=cluster)
    free = dataclasses.replace(view, cluster=dataclasses.replace(cluster, restart_delay_s=0.0))
    (gated,) = demands_of(view, speeds, growth_factor=4)
    (whole,) = demands_of(free, speeds, growth_factor=4)  # no restart cost: no gate
    rho = restart_factor(gated.remaining_s, cluster.restart_delay_s)
    assert 0 < rho < 1
    changed = 0
    for kind, curve in gated.curves.items():
        full = whole.curves[kind]
        if kind[0] != "T4":
            assert curve == full
            continue
        base = full[0]  # it holds one GPU
        assert curve[0] == base
        for g, (v, w) in enumerate(zip(curve, full, strict=True), start=1):
            if g == 1:
                continue
            # Worth its full value where it beats the restart, else what it has now.
            assert v == (w if rho * w > base else base), (kind, g, v, w, base)
            changed += v != w
    assert changed, "a growth the restart does not pay for is valued at what the job has"
    # A job that is not running is not gated.
    (waiting,) = demands_of(fleet_view(_sized_job(None, 5000.0)), speeds, growth_factor=4)
    (waiting_free,) = demands_of(
        dataclasses.replace(fleet_view(_sized_job(None, 5000.0))), speeds, growth_factor=4
    )
    assert waiting.curves == waiting_free.curves
