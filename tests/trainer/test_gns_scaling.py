"""Gradient-noise estimators (unbiasedness, smoothing, masking) and learning-rate scaling."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from trainer.errors import TrainerConfigError
from trainer.gns import (
    GradientNoiseEstimator,
    HostMirror,
    adam_sqrt_preconditioner,
    grad_sqr_from,
    is_adam_type,
    sigma2_from_difference,
    sigma2_from_replicas,
    small_batch_terms,
    sq_norm_flat,
    sq_norm_params,
)
from trainer.scaling import (
    ElasticOptimizer,
    ScalingRule,
    adascale_gain,
    default_rule,
    lr_factor,
)


def _population(n: int = 400, d: int = 6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) * 2 + 0.5


def _truth(grads: torch.Tensor) -> tuple[float, float]:
    mean = grads.mean(0)
    return float(mean.square().sum()), float((grads - mean).square().sum(1).mean())


def test_replica_estimator_is_unbiased() -> None:
    """Average of the per-step estimates over many random global batches (drawn without
    replacement, split over W replicas of uneven size) matches the population values."""
    grads = _population()
    n = len(grads)
    true_sqr, true_var = _truth(grads)
    gen = torch.Generator().manual_seed(1)
    batch, shares = 30, [11, 10, 9]
    sqr_sum = var_sum = 0.0
    draws = 3000
    for _ in range(draws):
        ids = torch.randperm(n, generator=gen)[:batch]
        global_sq = grads[ids].mean(0).square().sum()
        terms = torch.zeros(2, dtype=torch.float64)
        start = 0
        for s in shares:
            local = grads[ids[start : start + s]].mean(0).square().sum()
            terms += small_batch_terms(local, s, batch)
            start += s
        var = sigma2_from_replicas(global_sq, terms, len(shares))
        sqr_sum += float(grad_sqr_from(global_sq, var, batch))
        var_sum += float(var)
    # sampling without replacement from n: E[sigma2_hat] = sigma2 n/(n-1), E[|G|^2_hat] = ...
    assert var_sum / draws == pytest.approx(true_var * n / (n - 1), rel=0.03)
    assert sqr_sum / draws == pytest.approx(true_sqr - true_var / (n - 1), rel=0.05)


def test_difference_estimator_is_unbiased() -> None:
    grads = _population(seed=2)
    n = len(grads)
    true_sqr, true_var = _truth(grads)
    gen = torch.Generator().manual_seed(3)
    batch, small = 24, 8
    sqr_sum = var_sum = 0.0
    draws = 3000
    for _ in range(draws):
        ids = torch.randperm(n, generator=gen)[:batch]
        big = grads[ids].mean(0)
        diff = (grads[ids[:small]].mean(0) - big).square().sum()
        var = sigma2_from_difference(diff, small, batch)
        sqr_sum += float(grad_sqr_from(big.square().sum(), var, batch))
        var_sum += float(var)
    assert var_sum / draws == pytest.approx(true_var * n / (n - 1), rel=0.03)
    assert sqr_sum / draws == pytest.approx(true_sqr - true_var / (n - 1), rel=0.05)


def test_small_batch_must_be_smaller() -> None:
    with pytest.raises(TrainerConfigError):
        small_batch_terms(torch.tensor(1.0), 8, 8)


def test_estimator_smooths_with_bias_correction_and_masks_non_finite() -> None:
    est = GradientNoiseEstimator(64, smoothing=0.9)
    assert est.values() is None
    est.update(torch.tensor(2.0, dtype=torch.float64), torch.tensor(128.0, dtype=torch.float64))
    est.publish()
    est.refresh()
    assert est.values() == pytest.approx((2.0, 2.0))  # sigma2 / M0 = 128 / 64
    before = est.state.clone()
    est.update(torch.tensor(float("nan"), dtype=torch.float64), torch.tensor(1.0))
    est.update(torch.tensor(1.0, dtype=torch.float64), torch.tensor(float("inf")))
    assert torch.equal(est.state, before)
    est.update(torch.tensor(4.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))
    est.publish()
    est.refresh()
    w = 0.9 * 0.1 + 0.1
    assert est.values() == pytest.approx(((0.9 * 0.2 + 0.4) / w, (0.9 * 0.2) / w))
    clone = GradientNoiseEstimator(64, smoothing=0.9)
    clone.load_state_dict(est.state_dict())
    assert clone.values() == est.values() and torch.equal(clone.state, est.state)
    with pytest.raises(TrainerConfigError):
        GradientNoiseEstimator(32, smoothing=0.9).load_state_dict(est.state_dict())


def test_host_mirror_on_cpu_is_immediate() -> None:
    mirror = HostMirror([0.0])
    mirror.push(torch.tensor([3.5]))
    assert mirror.pull() == [3.5]


def test_adam_preconditioner_matches_adam_denominator() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.9, 0.99), eps=1e-6)
    assert is_adam_type(opt) and adam_sqrt_preconditioner(opt) is None
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 5)).square().sum().backward()
        opt.step()
    sqrt_p = adam_sqrt_preconditioner(opt)
    assert sqrt_p is not None
    for p in model.parameters():
        v = opt.state[p]["exp_avg_sq"] / (1 - 0.99**3)
        expected = 1 / (v.sqrt() + 1e-6)
        torch.testing.assert_close(sqrt_p[id(p)].square(), expected.reshape(-1))
    grads = [p.grad for p in model.parameters()]
    weighted = sq_norm_params(grads, list(model.parameters()), sqrt_p)
    manual = sum(
        (g.reshape(-1).double().square() * sqrt_p[id(p)].double().square()).sum()
        for g, p in zip(grads, model.parameters(), strict=True)
    )
    assert float(weighted) == pytest.approx(float(manual), rel=1e-5)
    plain = sq_norm_params(grads, list(model.parameters()), None)
    flat = torch.cat([g.reshape(-1) for g in grads])
    assert float(plain) == pytest.approx(float(sq_norm_flat(flat)), rel=1e-6)


@given(st.floats(0, 1e3), st.floats(0, 1e3), st.floats(1 / 64, 64, allow_nan=False))
def test_adascale_gain_is_between_one_and_the_scale(sqr: float, var: float, r: float) -> None:
    gain = adascale_gain(sqr, var, r)
    lo, hi = min(1.0, r), max(1.0, r)
    assert lo * (1 - 1e-12) <= gain <= hi * (1 + 1e-12)
    assert adascale_gain(sqr, var, 1.0) == 1.0


def test_adascale_gain_limits() -> None:
    assert adascale_gain(1.0, 0.0, 8.0) == pytest.approx(1.0)  # no noise: no gain
    assert adascale_gain(0.0, 1.0, 8.0) == 8.0  # pure noise: linear
    assert adascale_gain(-1.0, -1.0, 8.0) == 1.0
    assert adascale_gain(1.0, 1.0, 2.0) == pytest.approx(2 / 1.5)
    with pytest.raises(TrainerConfigError):
        adascale_gain(1.0, 1.0, 0.0)


def test_rules_and_factors() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert default_rule(torch.optim.SGD(params, lr=0.1)) is ScalingRule.ADASCALE
    assert default_rule(torch.optim.Adam(params)) is ScalingRule.SQRT
    assert default_rule(torch.optim.AdamW(params)) is ScalingRule.SQRT
    assert default_rule(torch.optim.RMSprop(params)) is ScalingRule.NONE
    assert lr_factor(ScalingRule.ADASCALE, 1.7, 4.0) == 1.7
    assert lr_factor(ScalingRule.SQRT, 1.7, 4.0) == 2.0
    assert lr_factor(ScalingRule.NONE, 1.7, 4.0) == 1.0


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
def test_scaled_step_applies_the_factor_once_and_restores_the_schedule() -> None:
    p = torch.nn.Parameter(torch.ones(1))
    inner = torch.optim.SGD([p], lr=0.5)
    opt = ElasticOptimizer(inner, job=None, rule=ScalingRule.ADASCALE)  # type: ignore[arg-type]
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    p.grad = torch.ones(1)
    opt.scaled_step(3.0, None)
    assert p.item() == pytest.approx(1 - 1.5)
    assert inner.param_groups[0]["lr"] == 0.5
    scheduler.step()
    assert inner.param_groups[0]["lr"] == pytest.approx(0.05)
    assert opt.state_dict() == inner.state_dict()
    with pytest.raises(TrainerConfigError):
        ElasticOptimizer(opt, job=None, rule=ScalingRule.NONE)  # type: ignore[arg-type]
    assert math.isfinite(p.item())
