"""Unavailable-offerings cache: after a capacity error, skip that pool for a while.

A pool (``Offering.key``) that reported ``InsufficientCapacityError`` is marked unavailable for
``ttl_s`` (default 3 minutes) on the injected clock, one over a quota for ``quota_ttl_s`` when
the memory keeps quotas (the controller's does). Launch paths skip marked pools and report a
capacity error for them without a cloud call; sizing reads ``unavailable()`` to route around.

``walk_pools`` is the one pool walk of every provider's launch (skip marked pools, call, mark
pools that ran dry), with one skip code, ``SKIPPED_UNAVAILABLE_CODE``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from coadapt_common.clock import Clock
from providers.base import Offering, PoolError
from providers.errors import InsufficientCapacityError, ProviderError, QuotaExceededError


class UnavailableOfferings:
    """Time-bounded set of offering keys with no capacity (or over a quota).

    The one memory of unavailable offerings: a provider's pool walk and the controller that
    drives it share one object, and :meth:`mark_error` is the one rule of which error marks an
    offering for how long: a capacity error for ``ttl_s``, a quota error for ``quota_ttl_s``
    (``None``, the default: a quota error is not remembered), nothing else."""

    def __init__(
        self, clock: Clock, ttl_s: float = 180.0, quota_ttl_s: float | None = None
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        if quota_ttl_s is not None and quota_ttl_s <= 0:
            raise ValueError("quota_ttl_s must be positive")
        self._clock = clock
        self._ttl_s = ttl_s
        self._quota_ttl_s = quota_ttl_s
        self._until_s: dict[str, float] = {}

    @property
    def ttl_s(self) -> float:
        """How long a capacity error marks an offering."""
        return self._ttl_s

    @property
    def quota_ttl_s(self) -> float | None:
        """How long a quota error marks an offering (``None``: not at all)."""
        return self._quota_ttl_s

    def mark(self, offering_key: str, ttl_s: float | None = None) -> None:
        """Mark ``offering_key`` unavailable for ``ttl_s`` (default: the cache's TTL) from now."""
        self._until_s[offering_key] = self._clock.monotonic_s() + (
            self._ttl_s if ttl_s is None else ttl_s
        )

    def mark_error(self, offering_key: str, error: BaseException) -> bool:
        """Mark ``offering_key`` for what ``error`` says of it: a capacity error (not the skip
        error of an offering already marked) for ``ttl_s``, a quota error for ``quota_ttl_s``;
        whether it marked."""
        if isinstance(error, InsufficientCapacityError):
            if error.code == SKIPPED_UNAVAILABLE_CODE:
                return False
            ttl_s: float | None = self._ttl_s
        elif isinstance(error, QuotaExceededError):
            ttl_s = self._quota_ttl_s
        else:
            ttl_s = None
        if ttl_s is None:
            return False
        self.mark(offering_key, ttl_s)
        return True

    def __contains__(self, offering_key: object) -> bool:
        return isinstance(offering_key, str) and self.is_unavailable(offering_key)

    def is_unavailable(self, offering_key: str) -> bool:
        until = self._until_s.get(offering_key)
        if until is None:
            return False
        if self._clock.monotonic_s() >= until:
            del self._until_s[offering_key]
            return False
        return True

    def unavailable(self) -> frozenset[str]:
        """Pool keys currently marked."""
        return frozenset(k for k in list(self._until_s) if self.is_unavailable(k))

    def clear(self) -> None:
        self._until_s.clear()


# ------------------------------------------------------------------ the pool walk

SKIPPED_UNAVAILABLE_CODE: Final = "skipped-unavailable"
"""``ProviderError.code`` of the capacity error reported for an offering skipped because it is
marked unavailable (every provider uses this one code)."""

PARTIAL_FILL_CODE: Final = "partial-fill"
"""Code of the capacity error the walk adds when a one-pool call placed fewer than it was asked
for and said nothing about why (the pool ran dry)."""

T = TypeVar("T")


@dataclass(frozen=True)
class Placement(Generic[T]):
    """What one cloud call placed.

    ``created``: the instances it made (any type: providers pass their own records).
    ``uncertain``: how many more it may have made without saying (e.g. its operation timed
    out): they count against the shortfall, so no later pool duplicates them.
    ``errors``: offering key -> why that pool did not (fully) fill. Only keys of the pools given to
    the call are kept.
    """

    created: tuple[T, ...] = ()
    uncertain: int = 0
    errors: Mapping[str, ProviderError] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolWalk(Generic[T]):
    """The outcome of ``walk_pools``: what was created, per-pool errors (in pool order), the
    pools skipped without a call, and whether any cloud call was made."""

    created: tuple[T, ...]
    errors: tuple[PoolError, ...]
    skipped: frozenset[str]
    called: bool

    @property
    def call_errors(self) -> tuple[PoolError, ...]:
        """Errors reported by cloud calls (not the skip errors)."""
        return tuple(e for e in self.errors if e.offering_key not in self.skipped)


def skipped_error(offering_key: str) -> InsufficientCapacityError:
    """The capacity error reported, without a call, for an offering marked unavailable."""
    return InsufficientCapacityError(
        f"pool {offering_key} is marked unavailable after a recent capacity error; skipped",
        code=SKIPPED_UNAVAILABLE_CODE,
        pool=offering_key,
    )


def walk_pools(
    pools: Sequence[Offering],
    wanted: int,
    unavailable: UnavailableOfferings,
    place: Callable[[Sequence[Offering], int], Placement[T]],
    *,
    together: bool = False,
) -> PoolWalk[T]:
    """Place ``wanted`` instances over ``pools``: the one pool walk every provider's launch uses.

    1. Pools marked in ``unavailable`` are skipped: no call, a ``skipped_error`` for each.
    2. ``together=False``: the usable pools are tried one by one, in the order given, each
       asked (``place([pool], n)``) for what is still missing, until nothing is. A pool asked
       for ``n`` that placed fewer and reported no error ran dry: the walk reports a
       ``PARTIAL_FILL_CODE`` capacity error for it. ``together=True`` (a fleet call that
       chooses among pools itself): one ``place(usable, wanted)`` call.
    3. Every pool whose error marks it (:meth:`UnavailableOfferings.mark_error`: a capacity
       error; a quota error when the memory keeps quotas) is marked unavailable; other errors
       (invalid, transient) are reported without a mark.

    ``place`` decides which cloud errors become pool errors (returned in ``Placement.errors``)
    and which are raised (auth, unreachable); the walk lets raised errors through. The walk
    never creates more than ``wanted`` on its own: a call is asked only for the shortfall left
    by the calls before it (created plus uncertain).
    """
    errors: dict[str, ProviderError] = {}
    skipped: set[str] = set()
    usable: list[Offering] = []
    for pool in pools:
        if unavailable.is_unavailable(pool.key):
            errors[pool.key] = skipped_error(pool.key)
            skipped.add(pool.key)
        else:
            usable.append(pool)
    created: list[T] = []
    pending = 0
    called = False
    batches = [usable] if together else [[pool] for pool in usable]
    for batch in batches:
        missing = wanted - len(created) - pending
        if missing <= 0 or not batch:
            break
        called = True
        placed = place(batch, missing)
        created.extend(placed.created)
        pending += placed.uncertain
        keys = {p.key for p in batch}
        for key, err in placed.errors.items():
            if key in keys:
                errors[key] = err
        short = len(placed.created) + placed.uncertain < missing
        if short and len(batch) == 1 and batch[0].key not in errors:
            key = batch[0].key
            errors[key] = InsufficientCapacityError(
                f"pool {key} placed {len(placed.created)} of {missing}",
                code=PARTIAL_FILL_CODE,
                pool=key,
            )
    for key, err in errors.items():
        if key not in skipped:
            unavailable.mark_error(key, err)
    order = {p.key: n for n, p in enumerate(pools)}
    return PoolWalk(
        created=tuple(created),
        errors=tuple(PoolError(k, errors[k]) for k in sorted(errors, key=order.__getitem__)),
        skipped=frozenset(skipped),
        called=called,
    )
