"""The model book: when fits go stale, batched warm refits, bounded profiles."""

from __future__ import annotations

import pytest

from autoscaler.errors import InvalidInputError
from autoscaler.model.fitting import ModelBook
from autoscaler.model.goodput import ProfileSample, fit_perf_params, predict_step_time_s
from autoscaler.model.traces import load_app


def samples(app: str = "cifar10", count: int = 6) -> list[ProfileSample]:
    rows = load_app(app).rows
    step = max(1, len(rows) // count)
    return [
        ProfileSample(r.placement, r.local_bsz, 1, r.step_time_s, r.sync_time_s)
        for r in rows[::step][:count]
    ]


def test_new_configurations_refit_only_when_mispredicted() -> None:
    book = ModelBook(refit_tolerance=0.05)
    first = samples()[0]
    assert book.record("a", None, first) is True  # no fit yet
    assert book.perf("a", None) is None
    assert book.refit() == 1 and book.perf("a", None) is not None
    assert book.record("a", None, first) is False  # a configuration already profiled
    perf = book.perf("a", None)
    # A configuration the fit predicts within 5% does not make it stale...
    s = first
    good = ProfileSample(
        s.placement,
        s.local_bsz,
        2,
        float(predict_step_time_s(perf, s.num_nodes, s.num_gpus, s.local_bsz, 2)),
        s.sync_time_s,
    )
    assert book.record("a", None, good) is False
    assert book.refit() == 0
    # ... one it mispredicts by more does.
    bad = ProfileSample(s.placement, s.local_bsz, 3, good.step_time_s * 10, s.sync_time_s)
    assert book.record("a", None, bad) is True
    assert book.refit() == 1 and book.perf("a", None) != perf


@pytest.mark.slow
def test_refits_are_batched_and_match_the_scalar_fit() -> None:
    book = ModelBook(refit_tolerance=0.0)
    profiles = {app: samples(app) for app in ("cifar10", "bert", "imagenet")}
    for app, profile in profiles.items():
        for s in profile:
            book.record(app, "T4", s)
    assert book.refit() == 3 and book.refit_rounds == 1  # one call for all three
    for app, profile in profiles.items():
        ours, ref = book.perf(app, "T4"), fit_perf_params(profile)
        assert ours is not None
        for s in profile:  # same model where it was measured (different optimiser)
            args = (s.num_nodes, s.num_gpus, s.local_bsz, s.accum_steps)
            assert float(predict_step_time_s(ours, *args)) == pytest.approx(
                float(predict_step_time_s(ref, *args)), rel=0.05
            )


def test_profiles_are_bounded_keys_and_drop() -> None:
    book = ModelBook(max_samples=3)
    profile = samples(count=5)
    for s in profile:
        book.record("a", "V100", s)
        book.record("a", None, s)
    assert book.profile_size("a", "V100") == 3  # the three most recent configurations
    assert set(book.keys("a")) == {"V100", None}
    book.refit()
    book.drop("a")
    assert book.perf("a", "V100") is None and list(book.keys("a")) == []


def test_bad_settings() -> None:
    with pytest.raises(InvalidInputError):
        ModelBook(refit_tolerance=-1)
    with pytest.raises(InvalidInputError):
        ModelBook(max_samples=0)
