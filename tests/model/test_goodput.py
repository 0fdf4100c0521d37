"""Goodput model: efficiency, throughput, best batch configuration, fitting, speedup."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.errors import InvalidInputError
from autoscaler.model.goodput import (
    BatchLimits,
    GoodputModel,
    GradParams,
    PerfParams,
    ProfileSample,
    adascale_gain,
    efficiency,
    fit_perf_params,
    lr_scale,
)
from autoscaler.model.speedup import SpeedupCache, SpeedupTable
from autoscaler.model.traces import APPLICATIONS, load_app
from coadapt_common.errors import CoadaptError

positive = st.floats(min_value=1e-4, max_value=1e4, allow_nan=False, allow_infinity=False)


@st.composite
def perf_params(draw: st.DrawFn) -> PerfParams:
    alpha_n = draw(st.floats(0.0, 1.0))
    beta_n = draw(st.floats(0.0, 1.0))
    return PerfParams(
        alpha_c=draw(st.floats(1e-4, 1.0)),
        beta_c=draw(st.floats(1e-6, 1e-2)),
        alpha_n=alpha_n,
        beta_n=beta_n,
        alpha_r=alpha_n + draw(st.floats(0.0, 1.0)),
        beta_r=beta_n + draw(st.floats(0.0, 1.0)),
        gamma=draw(st.floats(1.0, 10.0)),
    )


@st.composite
def batch_limits(draw: st.DrawFn) -> BatchLimits:
    m0 = draw(st.integers(1, 512))
    min_local = draw(st.integers(1, 64))
    return BatchLimits(
        init_batch_size=m0,
        max_batch_size=m0 * draw(st.integers(1, 64)),
        min_local_bsz=min_local,
        max_local_bsz=min_local + draw(st.integers(0, 512)),
        max_accum_steps=draw(st.integers(1, 16)),
    )


# ---------------------------------------------------------------- statistical efficiency


@given(sqr=positive, var=positive, m0=st.integers(1, 10_000))
def test_efficiency_is_one_at_initial_batch_size(sqr: float, var: float, m0: int) -> None:
    assert efficiency(GradParams(sqr, var), m0, m0) == pytest.approx(1.0)
    assert adascale_gain(GradParams(sqr, var), m0, m0) == pytest.approx(1.0)


@given(sqr=positive, var=st.floats(0.0, 1e4), m0=st.integers(1, 1000))
def test_efficiency_decreases_in_batch_size_and_stays_above_m0_over_m(
    sqr: float, var: float, m0: int
) -> None:
    grad = GradParams(sqr, var)
    batch = m0 * np.geomspace(1, 1000, 50)
    eff = efficiency(grad, m0, batch)
    assert np.all(np.diff(eff) <= 1e-12)
    assert np.all(eff >= m0 / batch - 1e-12)
    assert np.all(eff <= 1 + 1e-12)
    gain = adascale_gain(grad, m0, batch)
    np.testing.assert_allclose(gain, batch / m0 * eff)
    assert np.all(gain >= 1 - 1e-9)


@pytest.mark.parametrize("sqr", [0.0, -1.0, -1e-30])
def test_nonpositive_grad_sqr_falls_back_to_efficiency_bound(sqr: float) -> None:
    eff = efficiency(GradParams(sqr, 1.0), 32, [32, 64, 1024])
    np.testing.assert_array_equal(eff, [1.0, 1.0, 1.0])


def test_negative_grad_var_means_no_noise() -> None:
    eff = efficiency(GradParams(1.0, -5.0), 32, [32, 64, 128])
    np.testing.assert_allclose(eff, [1.0, 0.5, 0.25])


@pytest.mark.parametrize("field", ["grad_sqr", "grad_var"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_gradient_statistics_are_rejected_naming_the_field(
    field: str, bad: float
) -> None:
    kwargs = {"grad_sqr": 1.0, "grad_var": 1.0, field: bad}
    with pytest.raises(InvalidInputError, match=field) as info:
        GradParams(**kwargs)
    assert info.value.field == field
    assert isinstance(info.value, CoadaptError)


def test_lr_scaling_rules() -> None:
    grad = GradParams(1.0, 3.0)
    np.testing.assert_allclose(
        lr_scale("sgd", grad, 100, [100, 400]), adascale_gain(grad, 100, [100, 400])
    )
    np.testing.assert_allclose(lr_scale("adamw", grad, 100, [100, 400]), [1.0, 2.0])
    np.testing.assert_allclose(lr_scale("adam", grad, 100, [100, 900]), [1.0, 3.0])
    with pytest.raises(ValueError):
        lr_scale("lamb", grad, 100, 100)


# ---------------------------------------------------------------- throughput model


def test_single_gpu_has_no_sync_and_accumulation_adds_compute_only() -> None:
    p = PerfParams(0.01, 0.001, 0.05, 0.02, 0.2, 0.1, 1.0)
    model = GoodputModel(p, GradParams(1, 1), BatchLimits(1, 1, 1))
    assert model.step_time_s(1, 1, 10, 1) == pytest.approx(0.02)
    assert model.step_time_s(1, 1, 10, 3) == pytest.approx(0.06)
    # gamma = 1: compute and sync add up; inter-node is slower than intra-node.
    intra = model.step_time_s(1, 4, 10, 1)
    inter = model.step_time_s(2, 4, 10, 1)
    assert intra == pytest.approx(0.02 + 0.05 + 0.02 * 2)
    assert inter == pytest.approx(0.02 + 0.2 + 0.1 * 2)
    # Larger gamma overlaps more: iteration time falls towards max(compute, sync).
    p_overlap = PerfParams(0.01, 0.001, 0.05, 0.02, 0.2, 0.1, 8.0)
    over = GoodputModel(p_overlap, GradParams(1, 1), BatchLimits(1, 1, 1))
    assert over.step_time_s(2, 4, 10, 1) < inter
    assert over.step_time_s(2, 4, 10, 1) >= 0.4 - 1e-12


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha_c": math.nan},
        {"beta_c": -1.0},
        {"gamma": 0.5},
        {"alpha_r": math.inf},
    ],
)
def test_perf_params_reject_bad_values(kwargs: dict[str, float]) -> None:
    base = {
        "alpha_c": 0.1,
        "beta_c": 0.1,
        "alpha_n": 0,
        "beta_n": 0,
        "alpha_r": 0,
        "beta_r": 0,
        "gamma": 1.0,
    }
    base.update(kwargs)
    with pytest.raises(InvalidInputError) as info:
        PerfParams(**base)
    assert info.value.field == next(iter(kwargs))


# ---------------------------------------------------------------- best batch configuration


@given(
    perf=perf_params(),
    limits=batch_limits(),
    sqr=positive,
    var=positive,
    nodes=st.lists(st.integers(1, 16), min_size=1, max_size=20),
    per_node=st.integers(1, 8),
)
def test_optimizer_stays_within_bounds_and_matches_scalar_calls(
    perf: PerfParams, limits: BatchLimits, sqr: float, var: float, nodes: list[int], per_node: int
) -> None:
    model = GoodputModel(perf, GradParams(sqr, var), limits)
    n = np.array(nodes)
    k = n * per_node
    cfg = model.optimize(n, k)
    feasible = cfg.goodput > 0
    assert np.all(cfg.batch_size[feasible] >= limits.init_batch_size)
    assert np.all(cfg.batch_size[feasible] <= limits.max_batch_size)
    assert np.all(cfg.local_bsz[feasible] >= limits.min_local_bsz)
    assert np.all(cfg.local_bsz[feasible] <= limits.max_local_bsz)
    assert np.all(
        (cfg.accum_steps[feasible] >= 1) & (cfg.accum_steps[feasible] <= limits.max_accum_steps)
    )
    np.testing.assert_array_equal(
        cfg.batch_size[feasible], (k * cfg.local_bsz * cfg.accum_steps)[feasible]
    )
    # The reported goodput is the model's goodput at the reported configuration.
    np.testing.assert_allclose(
        cfg.goodput[feasible],
        model.goodput(n, k, cfg.local_bsz, cfg.accum_steps)[feasible],
        rtol=1e-9,
    )
    assert np.all(cfg.batch_size[~feasible] == 0)
    for i in range(len(n)):
        one = model.optimize(int(n[i]), int(k[i]))
        assert float(one.goodput) == pytest.approx(float(cfg.goodput[i]), rel=1e-12)
        assert int(one.batch_size) == int(cfg.batch_size[i])
        assert int(one.local_bsz) == int(cfg.local_bsz[i])
        assert int(one.accum_steps) == int(cfg.accum_steps[i])


def test_optimizer_beats_every_feasible_configuration_on_a_grid() -> None:
    perf = PerfParams(0.02, 0.0005, 0.03, 0.01, 0.15, 0.05, 1.7)
    limits = BatchLimits(128, 8192, 512, 16, 8)
    model = GoodputModel(perf, GradParams(0.3, 2.0), limits)
    for n, k in [(1, 1), (1, 4), (2, 8), (4, 16)]:
        best = float(model.optimize(n, k).goodput)
        m = np.arange(16, 513)[:, None]
        s = np.arange(1, 9)[None, :]
        total = k * m * s
        ok = (total >= 128) & (total <= 8192)
        brute = model.goodput(n, k, m, s)[ok].max()
        assert best >= 0.98 * brute  # geometric search grid: within 2% of exhaustive


def test_optimizer_zero_gpus_and_infeasible_allocations_give_zero() -> None:
    perf = PerfParams(0.02, 0.0005, 0.03, 0.01, 0.15, 0.05, 1.7)
    model = GoodputModel(perf, GradParams(1, 1), BatchLimits(64, 128, 32, 16, 1))
    cfg = model.optimize([1, 1, 4], [0, 1, 16])
    # 0 GPUs: nothing; 1 GPU: cannot reach M0=64 with 32 per GPU and no accumulation;
    # 16 GPUs: the smallest micro-batch (16) already exceeds max batch 128.
    np.testing.assert_array_equal(cfg.goodput, [0, 0, 0])
    np.testing.assert_array_equal(cfg.batch_size, [0, 0, 0])


def test_fixed_batch_size_keeps_the_total() -> None:
    perf = PerfParams(0.02, 0.0005, 0.03, 0.01, 0.15, 0.05, 1.7)
    model = GoodputModel(perf, GradParams(1, 1), BatchLimits(64, 4096, 256, 1, 8))
    cfg = model.optimize([1, 1, 2], [1, 4, 8], fixed_batch_size=1024)
    np.testing.assert_array_equal(cfg.batch_size, [1024, 1024, 1024])
    np.testing.assert_array_equal(cfg.accum_steps, [4, 1, 1])


# ---------------------------------------------------------------- fitting


def _synthetic_samples(perf: PerfParams) -> list[ProfileSample]:
    model = GoodputModel(perf, GradParams(1, 1), BatchLimits(1, 1, 1))
    out = []
    for placement in [(1,), (2,), (4,), (2, 2), (4, 4), (4, 4, 4, 4), (1, 1, 1)]:
        for lbsz in (8, 32, 128):
            n, k = len(placement), sum(placement)
            out.append(
                ProfileSample(
                    placement,
                    lbsz,
                    1,
                    float(model.step_time_s(n, k, lbsz, 1)),
                    float(model.sync_time_s(n, k)),
                )
            )
    return out


def test_fit_recovers_a_known_model() -> None:
    truth = PerfParams(0.02, 0.001, 0.03, 0.02, 0.12, 0.06, 2.0)
    samples = _synthetic_samples(truth)
    fitted = GoodputModel(fit_perf_params(samples), GradParams(1, 1), BatchLimits(1, 1, 1))
    true_model = GoodputModel(truth, GradParams(1, 1), BatchLimits(1, 1, 1))
    for n, k, m in [(1, 1, 64), (1, 3, 16), (3, 12, 100), (8, 32, 50)]:
        assert float(fitted.step_time_s(n, k, m, 1)) == pytest.approx(
            float(true_model.step_time_s(n, k, m, 1)), rel=0.02
        )


@pytest.mark.slow
@given(perf=perf_params())
def test_fitted_parameters_are_within_bounds_and_fit_is_deterministic(perf: PerfParams) -> None:
    samples = _synthetic_samples(perf)
    a = fit_perf_params(samples)
    b = fit_perf_params(samples)
    assert a == b
    assert 1.0 <= a.gamma <= 10.0
    assert a.alpha_r >= a.alpha_n and a.beta_r >= a.beta_n
    assert all(v >= 0 and math.isfinite(v) for v in a.as_array())


def test_one_single_gpu_sample_gives_a_usable_optimistic_model() -> None:
    perf = fit_perf_params([ProfileSample((1,), 32, 1, 0.2, 0.0)])
    model = GoodputModel(perf, GradParams(1.0, 4.0), BatchLimits(32, 1024, 64))
    assert float(model.step_time_s(1, 1, 32, 1)) == pytest.approx(0.2, rel=0.01)
    # No multi-GPU data: sync is pinned near zero, inter-node no faster than intra-node.
    assert perf.alpha_r >= perf.alpha_n and perf.beta_r >= perf.beta_n
    assert float(model.sync_time_s(4, 16)) < 1e-6
    cfg = model.optimize([1, 1, 2], [1, 2, 4])
    assert np.all(np.diff(cfg.goodput) > 0)  # more GPUs, more goodput
    # Larger micro-batches cost more time (compute split into fixed + per-sample parts).
    assert float(model.step_time_s(1, 1, 64, 1)) > 0.2


def test_multi_gpu_single_node_data_pins_inter_node_to_intra_node() -> None:
    samples = [
        ProfileSample((1,), 32, 1, 0.2, 0.0),
        ProfileSample((2,), 32, 1, 0.25, 0.06),
        ProfileSample((4,), 32, 1, 0.28, 0.09),
    ]
    perf = fit_perf_params(samples)
    assert perf.alpha_r == pytest.approx(perf.alpha_n, rel=1e-6, abs=1e-7)
    assert perf.beta_r == pytest.approx(perf.beta_n, rel=1e-6, abs=1e-7)
    assert perf.alpha_n + perf.beta_n > 0.01


@pytest.mark.parametrize(
    ("sample", "field"),
    [
        (ProfileSample((1,), 32, 1, math.nan, 0.0), "samples[0].step_time_s"),
        (ProfileSample((1,), 32, 1, math.inf, 0.0), "samples[0].step_time_s"),
        (ProfileSample((1,), 32, 1, -0.1, 0.0), "samples[0].step_time_s"),
        (ProfileSample((1,), 32, 1, 0.0, 0.0), "samples[0].step_time_s"),
        (ProfileSample((1,), 32, 1, 0.1, math.nan), "samples[0].sync_time_s"),
        (ProfileSample((1,), 32, 1, 0.1, -1.0), "samples[0].sync_time_s"),
        (ProfileSample((1,), 0, 1, 0.1, 0.0), "samples[0].local_bsz"),
        (ProfileSample((1,), 32, 0, 0.1, 0.0), "samples[0].accum_steps"),
        (ProfileSample((), 32, 1, 0.1, 0.0), "samples[0].placement"),
        (ProfileSample((0, 0), 32, 1, 0.1, 0.0), "samples[0].placement"),
    ],
)
def test_bad_samples_are_rejected_naming_the_field(sample: ProfileSample, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        fit_perf_params([sample])
    assert info.value.field == field
    assert field in str(info.value)


def test_empty_samples_are_rejected() -> None:
    with pytest.raises(InvalidInputError, match="at least one"):
        fit_perf_params([])


def test_bad_sample_among_good_ones_is_named_by_index() -> None:
    good = ProfileSample((1,), 32, 1, 0.1, 0.0)
    bad = ProfileSample((2,), 32, 1, 0.1, math.nan)
    with pytest.raises(InvalidInputError) as info:
        fit_perf_params([good, good, bad])
    assert info.value.field == "samples[2].sync_time_s"


# ---------------------------------------------------------------- accuracy on the real traces


def _to_samples(rows: list) -> list[ProfileSample]:
    return [ProfileSample(r.placement, r.local_bsz, 1, r.step_time_s, r.sync_time_s) for r in rows]


def _mape(train: list, test: list) -> float:
    model = GoodputModel(
        fit_perf_params(_to_samples(train)), GradParams(1, 1), BatchLimits(1, 1, 1)
    )
    pred = model.step_time_s(
        np.array([r.num_nodes for r in test]),
        np.array([r.num_gpus for r in test]),
        np.array([r.local_bsz for r in test]),
        1,
    )
    actual = np.array([r.step_time_s for r in test])
    return float(np.mean(np.abs(pred - actual) / actual))


@pytest.mark.slow
def test_throughput_model_accuracy_on_the_pollux_traces() -> None:
    """Acceptance: MAPE <= 20% per model and <= 10% on average, in both protocols."""
    interp, extrap = [], []
    for name in APPLICATIONS:
        rows = list(load_app(name).rows)
        order = np.random.default_rng(0).permutation(len(rows))
        half = len(rows) // 2
        interp.append(_mape([rows[i] for i in order[:half]], [rows[i] for i in order[half:]]))
        extrap.append(
            _mape(
                [r for r in rows if r.source == "placements"],
                [r for r in rows if r.source == "scalability"],
            )
        )
    assert max(interp) <= 0.20 and max(extrap) <= 0.20, (interp, extrap)
    assert np.mean(interp) <= 0.10 and np.mean(extrap) <= 0.10, (interp, extrap)


# ---------------------------------------------------------------- speedup


def test_speedup_table_is_one_on_one_gpu_and_zero_outside() -> None:
    perf = PerfParams(0.02, 0.0005, 0.03, 0.01, 0.15, 0.05, 1.7)
    model = GoodputModel(perf, GradParams(0.5, 2.0), BatchLimits(128, 8192, 512, 16))
    table = SpeedupTable(model, max_nodes=4, max_gpus=16)
    assert float(table.speedup(1, 1)) == pytest.approx(1.0)
    np.testing.assert_array_equal(table.speedup([0, 2, 5, 1], [0, 1, 4, 17]), [0, 0, 0, 0])
    n = np.array([1, 1, 2, 4])
    k = np.array([2, 4, 8, 16])
    expected = model.optimize(n, k).goodput / float(model.optimize(1, 1).goodput)
    np.testing.assert_allclose(table.speedup(n, k), expected)
    bs, lbsz, accum = table.batch_config(2, 8)
    assert bs == 8 * lbsz * accum and 128 <= bs <= 8192


def test_speedup_cache_rebuilds_only_when_the_model_changes() -> None:
    perf = PerfParams(0.02, 0.0005, 0.03, 0.01, 0.15, 0.05, 1.7)
    limits = BatchLimits(128, 8192, 512, 16)
    cache = SpeedupCache(max_nodes=4, max_gpus=16)
    t1 = cache.get("job-a", GoodputModel(perf, GradParams(0.5, 2.0), limits))
    t2 = cache.get("job-a", GoodputModel(perf, GradParams(0.5, 2.0), limits))
    assert t1 is t2 and cache.builds == 1
    t3 = cache.get("job-a", GoodputModel(perf, GradParams(0.5, 8.0), limits))
    assert t3 is not t1 and cache.builds == 2
    # Noisier gradients make large batches more efficient: speedup at 16 GPUs rises.
    assert float(t3.speedup(4, 16)) > float(t1.speedup(4, 16))
    cache.drop("job-a")
    assert len(cache) == 0
