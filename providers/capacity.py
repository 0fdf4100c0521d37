"""Unavailable-offerings cache: after a capacity error, skip that pool for a while.

A pool (``Offering.key``) that reported ``InsufficientCapacityError`` is marked unavailable for
``ttl_s`` (default 3 minutes) on the injected clock. Launch paths skip marked pools and report a
capacity error for them without a cloud call; sizing reads ``unavailable()`` to route around.
"""

from __future__ import annotations

from coadapt_common.clock import Clock


class UnavailableOfferings:
    """Time-bounded set of pool keys with no capacity."""

    def __init__(self, clock: Clock, ttl_s: float = 180.0) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self._clock = clock
        self._ttl_s = ttl_s
        self._until_s: dict[str, float] = {}

    def mark(self, pool_key: str, ttl_s: float | None = None) -> None:
        """Mark ``pool_key`` unavailable for ``ttl_s`` (default: the cache's TTL) from now."""
        self._until_s[pool_key] = self._clock.monotonic_s() + (
            self._ttl_s if ttl_s is None else ttl_s
        )

    def is_unavailable(self, pool_key: str) -> bool:
        until = self._until_s.get(pool_key)
        if until is None:
            return False
        if self._clock.monotonic_s() >= until:
            del self._until_s[pool_key]
            return False
        return True

    def unavailable(self) -> frozenset[str]:
        """Pool keys currently marked."""
        return frozenset(k for k in list(self._until_s) if self.is_unavailable(k))

    def clear(self) -> None:
        self._until_s.clear()
