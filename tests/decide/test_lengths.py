"""Job lengths learned from the finished jobs (autoscaler/decide/lengths.py) and the bounds on
what carries them to a policy (RoundInput.finished_gpu_s)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.decide.lengths import MIN_FINISHED_JOBS, remaining_service_gpu_s
from autoscaler.decide.views import MAX_FINISHED_JOBS, ClusterView, RoundInput
from autoscaler.errors import InvalidInputError


@pytest.mark.parametrize("rule", ["expected", "gittins"])
def test_finished_jobs_all_of_one_length_leave_that_length_less_the_attained(rule: str) -> None:
    """Every finished job ran 1000 GPU-s: a job at a < 1000 has 1000 - a left, by either
    rule; one at or past 1000 has outlived every finished job, and Gott's prior gives it as
    much again as it has had; one that has not run is floored, never taken as done."""
    got = remaining_service_gpu_s(
        [0.0, 300.0, 999.5, 1000.0], [1000.0] * 6, rule=rule, floor_gpu_s=60.0
    )
    np.testing.assert_allclose(got, [1000.0, 700.0, 60.0, 1000.0])


def test_too_few_finished_jobs_leave_the_prior() -> None:
    few = [1000.0] * (MIN_FINISHED_JOBS - 1)
    got = remaining_service_gpu_s([0.0, 300.0, 4000.0], few, floor_gpu_s=60.0)
    np.testing.assert_allclose(got, [60.0, 300.0, 4000.0])


def test_a_heavy_tail_is_read_from_the_lengths() -> None:
    """Lengths 10, 20, 40, 80, 1000: a fresh job expects the mean (230); past 80 only the long
    one remains (1000 - 100 = 900). The Gittins rule counts a fresh job short (a quantum of
    20 ends it with probability 2/5: 90 / 2 = 45 GPU-s per completion), never longer than the
    mean residual."""
    lengths = [10.0, 20.0, 40.0, 80.0, 1000.0]
    expected = remaining_service_gpu_s([0.0, 15.0, 100.0], lengths)
    np.testing.assert_allclose(expected, [230.0, 285.0 - 15.0, 900.0])
    gittins = remaining_service_gpu_s([0.0, 15.0, 100.0], lengths, rule="gittins")
    np.testing.assert_allclose(gittins, [45.0, 20.0, 900.0])


def test_running_jobs_count_as_censored_lengths() -> None:
    """The "censored" rule reads the running jobs as lengths of at least their attained
    service (Kaplan-Meier): six finished at 1000 and one job still running at 5000 leave a
    job at 300 with 1/7 of the mass past 1000, which Gott's prior runs as long again past the
    last observation (5000 more): 6/7 x 700 + 1/7 x (4700 + 5000) = 13900/7; the job at 5000
    has outlived every observation and is given 5000."""
    got = remaining_service_gpu_s([300.0, 5000.0], [1000.0] * 6, rule="censored")
    np.testing.assert_allclose(got, [13900.0 / 7.0, 5000.0])


@given(
    st.lists(st.floats(0.0, 1e7), min_size=0, max_size=40),
    st.lists(st.floats(0.0, 1e7), min_size=1, max_size=20),
)
def test_every_estimate_is_finite_floored_and_gittins_is_never_above_the_mean(
    lengths: list[float], attained: list[float]
) -> None:
    expected = remaining_service_gpu_s(attained, lengths, floor_gpu_s=60.0)
    gittins = remaining_service_gpu_s(attained, lengths, rule="gittins", floor_gpu_s=60.0)
    censored = remaining_service_gpu_s(attained, lengths, rule="censored", floor_gpu_s=60.0)
    for got in (expected, gittins, censored):
        assert got.shape == (len(attained),)
        assert np.all(np.isfinite(got)) and np.all(got >= 60.0)
    assert np.all(gittins <= expected * (1 + 1e-9) + 1e-6)


@pytest.mark.parametrize(
    ("attained", "lengths", "kwargs", "field"),
    [
        ([1.0], [1.0], {"rule": "oracle"}, "rule"),
        ([1.0], [1.0], {"floor_gpu_s": 0.0}, "floor_gpu_s"),
        ([-1.0], [1.0], {}, "attained_gpu_s"),
        ([1.0], [math.nan], {}, "finished_gpu_s"),
        ([1.0], [math.inf], {}, "finished_gpu_s"),
    ],
)
def test_bad_inputs_are_refused(attained, lengths, kwargs, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidInputError) as e:
        remaining_service_gpu_s(attained, lengths, **kwargs)
    assert e.value.field == field


def test_the_round_input_bounds_the_finished_lengths() -> None:
    c = ClusterView.uniform(1, 4)
    ok = RoundInput(c, (), [1, 2.5] * (MAX_FINISHED_JOBS // 2))  # type: ignore[arg-type]
    assert len(ok.finished_gpu_s) == MAX_FINISHED_JOBS
    assert ok.finished_gpu_s[:2] == (1.0, 2.5) and isinstance(ok.finished_gpu_s, tuple)
    assert RoundInput(c, ()).finished_gpu_s == ()
    for bad in ((1.0,) * (MAX_FINISHED_JOBS + 1), (-1.0,), (math.nan,), (math.inf,), (True,)):
        with pytest.raises(InvalidInputError, match="finished"):
            RoundInput(c, (), bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="finished"):
        RoundInput(c, (), ("12",))  # type: ignore[arg-type]
