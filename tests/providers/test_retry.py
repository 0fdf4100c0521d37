"""``providers.retry``: exponential backoff with full jitter, on an injected clock."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coadapt_common.clock import FakeClock
from providers.errors import (
    AuthError,
    InstanceNotFoundError,
    InsufficientCapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaExceededError,
    TransientError,
)
from providers.retry import RetryPolicy, call_with_retries


class Flaky:
    """A callable that raises the given errors in turn, then returns ``"ok"``."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_success_needs_no_sleep() -> None:
    clock = FakeClock()
    fn = Flaky()
    assert call_with_retries(fn, clock=clock) == "ok"
    assert fn.calls == 1
    assert clock.sleeps == []


def test_transient_errors_are_retried_on_the_backoff_schedule() -> None:
    clock = FakeClock()
    start_s = clock.monotonic_s()
    policy = RetryPolicy(max_attempts=5, base_delay_s=0.5, max_delay_s=20.0)
    fn = Flaky(TransientError("throttled"), TransientError("503"), TransientError("timeout"))
    assert call_with_retries(fn, clock=clock, policy=policy, rng=random.Random(7)) == "ok"
    assert fn.calls == 4
    # The exact schedule: full jitter under a doubling ceiling, drawn from the given rng.
    rng = random.Random(7)
    expected = [rng.uniform(0.0, 0.5 * 2**k) for k in range(3)]
    assert clock.sleeps == pytest.approx(expected)
    assert clock.monotonic_s() - start_s == pytest.approx(sum(expected))


def test_the_ceiling_is_capped() -> None:
    policy = RetryPolicy(max_attempts=12, base_delay_s=1.0, max_delay_s=4.0)
    clock = FakeClock()
    fn = Flaky(*[TransientError("503") for _ in range(11)])
    call_with_retries(fn, clock=clock, policy=policy, rng=random.Random(0))
    assert len(clock.sleeps) == 11
    assert all(0.0 <= s <= 4.0 for s in clock.sleeps)
    assert max(clock.sleeps[3:]) > 2.0, "late attempts draw from the full capped range"


def test_gives_up_after_max_attempts_with_the_last_error() -> None:
    clock = FakeClock()
    errors = [TransientError(f"503 #{i}") for i in range(10)]
    fn = Flaky(*errors)
    with pytest.raises(TransientError, match="503 #2"):
        call_with_retries(fn, clock=clock, policy=RetryPolicy(max_attempts=3))
    assert fn.calls == 3
    assert len(clock.sleeps) == 2


@pytest.mark.parametrize(
    "error",
    [
        InsufficientCapacityError("no capacity"),
        QuotaExceededError("quota"),
        AuthError("denied"),
        InvalidRequestError("bad"),
        InstanceNotFoundError("gone"),
        ProviderError("unknown"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_only_transient_errors_are_retried(error: ProviderError) -> None:
    clock = FakeClock()
    fn = Flaky(error)
    with pytest.raises(type(error)) as raised:
        call_with_retries(fn, clock=clock)
    assert raised.value is error
    assert fn.calls == 1
    assert clock.sleeps == []


def test_non_provider_errors_propagate_untouched() -> None:
    clock = FakeClock()
    fn = Flaky(KeyError("bug"))
    with pytest.raises(KeyError):
        call_with_retries(fn, clock=clock)
    assert fn.calls == 1 and clock.sleeps == []


def test_a_transient_then_fatal_error_stops_at_the_fatal_one() -> None:
    clock = FakeClock()
    fn: Callable[[], str] = Flaky(TransientError("503"), QuotaExceededError("quota"))
    with pytest.raises(QuotaExceededError):
        call_with_retries(fn, clock=clock)
    assert len(clock.sleeps) == 1


@given(
    attempt=st.integers(min_value=0, max_value=1000),
    base=st.floats(min_value=0.001, max_value=10.0),
    cap=st.floats(min_value=0.001, max_value=600.0),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_delay_is_within_the_full_jitter_window(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    policy = RetryPolicy(max_attempts=5, base_delay_s=base, max_delay_s=cap)
    delay = policy.delay_s(attempt, random.Random(seed))
    assert 0.0 <= delay <= min(cap, base * 2.0**attempt)
