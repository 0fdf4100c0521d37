"""Retry with exponential backoff and full jitter, on an injected clock.

Only ``TransientError`` (``error.retryable``) is retried. Capacity, quota, auth and invalid
requests fail fast: retrying them in place is what leaves instances "stuck launching".
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from coadapt_common.clock import Clock
from providers.errors import ProviderError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff schedule: attempt k (0-based) sleeps uniform(0, min(cap, base * 2**k))."""

    max_attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        # Cap the exponent: 2.0**1024 overflows a float long before the cap matters.
        ceiling = min(self.max_delay_s, self.base_delay_s * (2.0 ** min(attempt, 60)))
        return rng.uniform(0.0, ceiling)


def call_with_retries(
    fn: Callable[[], T],
    *,
    clock: Clock,
    policy: RetryPolicy = RetryPolicy(),
    rng: random.Random | None = None,
) -> T:
    """Call ``fn``; on a retryable ``ProviderError`` sleep (via ``clock``) and try again.

    Raises the last error after ``policy.max_attempts`` attempts, or at once for a
    non-retryable error.
    """
    rng = rng or random.Random()
    attempt = 0
    while True:
        try:
            return fn()
        except ProviderError as err:
            attempt += 1
            if not err.retryable or attempt >= policy.max_attempts:
                raise
            clock.sleep(policy.delay_s(attempt - 1, rng))
