"""How often one credential may call the API: a token bucket per credential holder.

A job's report credential and an instance's agent credential are each held by one party the
controller does not control (a user's training script; a node). Without a bound, one holder
could post as fast as the server answers, every report stored. So each holder (a role and its
subject: the job or the instance) gets a bucket of ``burst`` requests, refilled at ``per_s``;
a request that finds it empty is refused with 429 and ``Retry-After`` (whole seconds until a
request would be admitted), before its body is read, and costs nothing. The users' token is
not limited: its holder is the cluster's administrator.

The defaults are derived from what honest callers send (:meth:`RequestLimits.for_intervals`):

* a job's trainer (rank 0 only) reports once per report interval, plus a final report per
  launch; the limit is :data:`HEADROOM` times that rate, with a burst of
  :data:`REPORT_BURST` (a rescale's last report of the old launch and the first of the
  new one, a retry after a blip);
* an agent makes :data:`AGENT_CALLS_PER_STEP` calls per step (a heartbeat and a read of its
  assignments; job exits are rare), one step per agent interval; the limit is
  :data:`HEADROOM` times that, with a burst of :data:`AGENT_BURST` (register, the exits of
  every job of a node at once).

``make_app`` without limits uses the trainer's own default interval
(:data:`trainer.env.DEFAULT_REPORT_INTERVAL_S`, 30 s: 1/3 report/s per job) and the agent's
default (2 s: 10 calls/s per instance); ``coadapt up`` derives them from the intervals it
gives its agents (``UpConfig.report_interval_s``, default 5 s, handed to each agent as
``--report-interval-s``: 2 reports/s per job).
``tests/controller/test_ratelimit.py`` shows 200 reports/s from one job throttled to that.

Memory is bounded: only authenticated holders get a bucket (a credential is an HMAC the
controller made, so holders are its own jobs and instances), and buckets that are full again,
which a fresh bucket would equal, are dropped once more than :data:`MAX_BUCKETS` exist.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Final

from autoscaler.errors import InvalidInputError
from coadapt_common.clock import Clock
from trainer.env import DEFAULT_REPORT_INTERVAL_S

__all__ = [
    "AGENT_BURST",
    "AGENT_CALLS_PER_STEP",
    "DEFAULT_AGENT_INTERVAL_S",
    "DEFAULT_REQUEST_LIMITS",
    "HEADROOM",
    "MAX_BUCKETS",
    "REPORT_BURST",
    "RateLimit",
    "RateLimiter",
    "RequestLimits",
    "retry_after_s",
]

HEADROOM: Final = 10.0
"""How many times an honest caller's steady rate a holder may call at."""
REPORT_BURST: Final = 10
AGENT_CALLS_PER_STEP: Final = 2
AGENT_BURST: Final = 30
DEFAULT_AGENT_INTERVAL_S: Final = 2.0
"""The agent's own default time between two steps (``coadapt agent --interval-s``)."""
MAX_BUCKETS: Final = 100_000


@dataclass(frozen=True)
class RateLimit:
    """``burst`` requests at once, then ``per_s`` requests a second."""

    per_s: float
    burst: int

    def __post_init__(self) -> None:
        if (
            isinstance(self.per_s, bool)
            or not isinstance(self.per_s, int | float)
            or not math.isfinite(self.per_s)
            or self.per_s <= 0
        ):
            raise InvalidInputError("per_s must be a finite number > 0", field="per_s")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise InvalidInputError("burst must be an integer >= 1", field="burst")


@dataclass(frozen=True)
class RequestLimits:
    """The limits of the two limited roles: ``report`` per job, ``agent`` per instance."""

    report: RateLimit
    agent: RateLimit

    @staticmethod
    def for_intervals(report_interval_s: float, agent_interval_s: float) -> RequestLimits:
        """The limits for trainers that report every ``report_interval_s`` and agents that
        step every ``agent_interval_s`` (see the module docstring)."""
        for name, value in (
            ("report_interval_s", report_interval_s),
            ("agent_interval_s", agent_interval_s),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidInputError(f"{name} must be > 0", field=name)
            if not math.isfinite(value):
                raise InvalidInputError(f"{name} must be finite", field=name)
        return RequestLimits(
            report=RateLimit(HEADROOM / report_interval_s, REPORT_BURST),
            agent=RateLimit(HEADROOM * AGENT_CALLS_PER_STEP / agent_interval_s, AGENT_BURST),
        )


def retry_after_s(wait_s: float) -> int:
    """The ``Retry-After`` value (whole seconds, at least 1) for a wait of ``wait_s``."""
    return max(1, math.ceil(wait_s))


class RateLimiter:
    """Token buckets by key (a credential holder), all with one :class:`RateLimit`, on the
    clock's monotonic time. Thread-safe."""

    def __init__(self, limit: RateLimit, clock: Clock, *, max_buckets: int = MAX_BUCKETS) -> None:
        self.limit = limit
        self._clock = clock
        self._max_buckets = max_buckets
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at monotonic s)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Admit one request of ``key`` (0.0: admitted, a token taken) or say how many
        seconds until one would be (> 0: refused, nothing taken)."""
        now = self._clock.monotonic_s()
        per_s, burst = self.limit.per_s, float(self.limit.burst)
        with self._lock:
            tokens, at = self._buckets.get(key, (burst, now))
            tokens = min(burst, tokens + max(0.0, now - at) * per_s)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                if len(self._buckets) > self._max_buckets:
                    self._forget_full(now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / per_s

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled (a new bucket would be the same)."""
        per_s, burst = self.limit.per_s, float(self.limit.burst)
        for key, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * per_s >= burst:
                del self._buckets[key]

    def __len__(self) -> int:
        return len(self._buckets)


DEFAULT_REQUEST_LIMITS: Final = RequestLimits.for_intervals(
    DEFAULT_REPORT_INTERVAL_S, DEFAULT_AGENT_INTERVAL_S
)
"""What ``make_app`` uses unless told: 1/3 report/s per job (burst 10), 10 agent calls/s per
instance (burst 30)."""
