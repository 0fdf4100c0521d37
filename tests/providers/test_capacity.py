"""``providers.capacity.UnavailableOfferings`` on a ``FakeClock``."""

from __future__ import annotations

import pytest

from coadapt_common.clock import FakeClock
from providers.capacity import UnavailableOfferings

POOL_A = "fake/us-east-1a/g4dn.xlarge/spot"
POOL_B = "fake/us-east-1b/g4dn.xlarge/spot"


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
