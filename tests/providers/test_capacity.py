"""``providers.capacity``: ``UnavailableOfferings`` on a ``FakeClock``, and ``walk_pools``."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from coadapt_common.clock import FakeClock
from providers.base import Market, Offering
from providers.capacity import (
    PARTIAL_FILL_CODE,
    SKIPPED_UNAVAILABLE_CODE,
    Placement,
    UnavailableOfferings,
    walk_pools,
)
from providers.errors import (
    InsufficientCapacityError,
    ProviderError,
    QuotaExceededError,
    TransientError,
)
from providers.fake import default_offerings

POOL_A = "fake/g4dn.xlarge/us-east-1a/spot"
POOL_B = "fake/g4dn.xlarge/us-east-1b/spot"


def test_unmarked_pools_are_available() -> None:
    cache = UnavailableOfferings(FakeClock())
    assert not cache.is_unavailable(POOL_A)
    assert cache.unavailable() == frozenset()


def test_a_mark_lasts_exactly_the_ttl() -> None:
    clock = FakeClock()
    cache = UnavailableOfferings(clock, ttl_s=180.0)
    cache.mark(POOL_A)
    assert cache.is_unavailable(POOL_A)
    assert not cache.is_unavailable(POOL_B)
    clock.advance(179.9)
    assert cache.is_unavailable(POOL_A)
    clock.advance(0.1)
    assert not cache.is_unavailable(POOL_A)
    assert cache.unavailable() == frozenset()


def test_per_mark_ttl_overrides_the_default() -> None:
    clock = FakeClock()
    cache = UnavailableOfferings(clock, ttl_s=180.0)
    cache.mark(POOL_A, ttl_s=10.0)
    cache.mark(POOL_B)
    clock.advance(10.0)
    assert cache.unavailable() == frozenset({POOL_B})


def test_marking_again_extends_from_now() -> None:
    clock = FakeClock()
    cache = UnavailableOfferings(clock, ttl_s=60.0)
    cache.mark(POOL_A)
    clock.advance(50.0)
    cache.mark(POOL_A)
    clock.advance(50.0)
    assert cache.is_unavailable(POOL_A)
    clock.advance(10.0)
    assert not cache.is_unavailable(POOL_A)


def test_unavailable_lists_only_live_marks() -> None:
    clock = FakeClock()
    cache = UnavailableOfferings(clock, ttl_s=100.0)
    cache.mark(POOL_A)
    clock.advance(60.0)
    cache.mark(POOL_B)
    assert cache.unavailable() == frozenset({POOL_A, POOL_B})
    clock.advance(40.0)
    assert cache.unavailable() == frozenset({POOL_B})


def test_clear_forgets_every_mark() -> None:
    cache = UnavailableOfferings(FakeClock())
    cache.mark(POOL_A)
    cache.mark(POOL_B)
    cache.clear()
    assert cache.unavailable() == frozenset()


@pytest.mark.parametrize("ttl_s", [0.0, -1.0])
def test_ttl_must_be_positive(ttl_s: float) -> None:
    with pytest.raises(ValueError):
        UnavailableOfferings(FakeClock(), ttl_s=ttl_s)


# ------------------------------------------------------------------ walk_pools


class Cloud:
    """A tiny cloud for the walk: offering key -> free slots; records every call it gets."""

    def __init__(self, free: dict[str, int], errors: dict[str, ProviderError] | None = None):
        self.free = dict(free)
        self.errors = dict(errors or {})
        self.calls: list[tuple[tuple[str, ...], int]] = []

    def place(self, pools: Sequence[Offering], wanted: int) -> Placement[str]:
        self.calls.append((tuple(p.key for p in pools), wanted))
        created: list[str] = []
        errors: dict[str, ProviderError] = {}
        for pool in pools:
            if pool.key in self.errors:
                errors[pool.key] = self.errors[pool.key]
                continue
            n = min(self.free[pool.key], wanted - len(created))
            self.free[pool.key] -= n
            created += [f"{pool.key}#{k}" for k in range(n)]
        return Placement(tuple(created), errors=errors)


OFFERINGS = [o for o in default_offerings() if o.instance_type == "g4dn.xlarge"]
A, B = (o for o in OFFERINGS if o.market is Market.SPOT)


def test_walk_skips_marked_pools_with_the_one_skip_code_and_no_call() -> None:
    cache = UnavailableOfferings(FakeClock())
    cache.mark(A.key)
    cloud = Cloud({A.key: 5, B.key: 5})
    walk = walk_pools([A, B], 3, cache, cloud.place)
    assert cloud.calls == [((B.key,), 3)]
    assert len(walk.created) == 3 and walk.called
    errors = [(e.offering_key, e.error.code) for e in walk.errors]
    assert errors == [(A.key, SKIPPED_UNAVAILABLE_CODE)]
    assert walk.skipped == {A.key} and walk.call_errors == ()


def test_walk_asks_each_pool_for_the_shortfall_and_marks_a_short_pool() -> None:
    cache = UnavailableOfferings(FakeClock())
    cloud = Cloud({A.key: 2, B.key: 5})
    walk = walk_pools([A, B], 5, cache, cloud.place)
    assert cloud.calls == [((A.key,), 5), ((B.key,), 3)]
    assert len(walk.created) == 5
    assert [(e.offering_key, e.error.code) for e in walk.errors] == [(A.key, PARTIAL_FILL_CODE)]
    assert isinstance(walk.errors[0].error, InsufficientCapacityError)
    assert cache.unavailable() == {A.key}


def test_walk_marks_capacity_errors_only() -> None:
    cache = UnavailableOfferings(FakeClock())
    cloud = Cloud(
        {A.key: 0, B.key: 0},
        {A.key: QuotaExceededError("quota"), B.key: InsufficientCapacityError("dry")},
    )
    walk = walk_pools([A, B], 1, cache, cloud.place)
    assert [e.offering_key for e in walk.errors] == [A.key, B.key]
    assert walk.created == () and cache.unavailable() == {B.key}


def test_walk_together_makes_one_call_and_stops_when_nothing_is_missing() -> None:
    cache = UnavailableOfferings(FakeClock())
    cloud = Cloud({A.key: 1, B.key: 5})
    walk = walk_pools([A, B], 4, cache, cloud.place, together=True)
    assert cloud.calls == [((A.key, B.key), 4)]
    assert len(walk.created) == 4 and walk.errors == ()
    cloud = Cloud({A.key: 5, B.key: 5})
    walk_pools([A, B], 2, cache, cloud.place)
    assert cloud.calls == [((A.key,), 2)], "a filled request asks no further pool"


def test_uncertain_instances_count_against_the_shortfall() -> None:
    cache = UnavailableOfferings(FakeClock())
    calls: list[str] = []

    def place(pools: Sequence[Offering], wanted: int) -> Placement[str]:
        calls.append(pools[0].key)
        return Placement((), uncertain=wanted, errors={pools[0].key: TransientError("slow")})

    walk = walk_pools([A, B], 2, cache, place)
    assert calls == [A.key], "the next pool would duplicate what may exist"
    assert [type(e.error) for e in walk.errors] == [TransientError]
    assert cache.unavailable() == frozenset()


def test_walk_on_only_marked_pools_makes_no_call() -> None:
    cache = UnavailableOfferings(FakeClock())
    cache.mark(A.key)
    cache.mark(B.key)
    cloud = Cloud({A.key: 5, B.key: 5})
    walk = walk_pools([A, B], 2, cache, cloud.place, together=True)
    assert cloud.calls == [] and not walk.called and walk.skipped == {A.key, B.key}


def test_one_marking_rule_for_the_walk_and_its_caller() -> None:
    """``mark_error`` is the one rule of what marks a pool for how long: the walk applies it
    to every pool error, the controller to an error raised before the walk saw it. A memory
    that keeps quotas marks a quota for its ``quota_ttl_s``; one that does not, never; a
    transient error and the walk's own skip error never mark."""
    clock = FakeClock()
    keeps = UnavailableOfferings(clock, ttl_s=60.0, quota_ttl_s=600.0)
    cloud = Cloud(
        {A.key: 0, B.key: 0},
        {A.key: QuotaExceededError("quota"), B.key: InsufficientCapacityError("dry")},
    )
    walk_pools([A, B], 1, keeps, cloud.place)
    assert keeps.unavailable() == {A.key, B.key}
    clock.advance(60.0)
    assert keeps.unavailable() == {A.key}, "a quota lasts longer than a dry pool"
    clock.advance(540.0)
    assert keeps.unavailable() == frozenset()
    assert not keeps.mark_error(A.key, TransientError("slow"))
    skip = walk_pools([A], 1, UnavailableOfferings(clock), cloud.place)  # nothing marked yet
    assert skip.called
    marked = UnavailableOfferings(clock)
    marked.mark(A.key)
    walk = walk_pools([A], 1, marked, cloud.place)
    assert not marked.mark_error(A.key, walk.errors[0].error), "a skip never re-marks"
    assert A.key in marked and B.key not in marked
    with pytest.raises(ValueError):
        UnavailableOfferings(clock, quota_ttl_s=0.0)
