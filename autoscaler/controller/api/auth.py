"""Who may call the API, and how often: bearer credentials, roles, revocation, rates.

A request carries ``Authorization: Bearer <credential>`` (:mod:`autoscaler.controller.
credentials`): none, or one that is not valid, is 401; a valid one of another role, or of
the right role for another instance or job, is 403; an agent credential whose instance ended
or failed to start is revoked (401). :func:`authorize` decides that from the headers alone,
before the body is read, and leaves the caller's :class:`Principal` in the request's environ
(:func:`principal_of`). :class:`Throttle` then refuses an agent or a job that calls more often
than its limit allows (429 with ``Retry-After``: :mod:`autoscaler.controller.ratelimit`).
Credentials are compared in constant time (by the credentials module) and never logged.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Final, NoReturn

from werkzeug.wrappers import Request, Response

from autoscaler.controller.api.wire import error_response
from autoscaler.controller.client import ApiError
from autoscaler.controller.credentials import CredentialSource, Principal, Role
from autoscaler.controller.errors import UnknownRowError
from autoscaler.controller.lifecycle import AGENT_REVOKED
from autoscaler.controller.ratelimit import RateLimiter, RequestLimits, retry_after_s
from autoscaler.controller.store import Store
from coadapt_common.clock import Clock

__all__ = ["PRINCIPAL", "Throttle", "authorize", "principal_of", "unauthorized"]

PRINCIPAL: Final = "coadapt.principal"
"""The WSGI environ key of the authenticated caller."""
_WARN_EVERY_S: Final = 60.0
_WARNED_HOLDERS: Final = 10_000
_log = logging.getLogger(__name__)


def unauthorized(message: str) -> NoReturn:
    """Refuse the request with 401."""
    raise ApiError(401, message)


def principal_of(request: Request) -> Principal:
    """The caller :func:`authorize` let through."""
    principal: Principal = request.environ[PRINCIPAL]
    return principal


def authorize(
    request: Request,
    role: Role | frozenset[Role],
    args: Mapping[str, str],
    credentials: CredentialSource,
    now_s: float,
    store: Callable[[], Store],
) -> None:
    """Let the request through if its credential is valid (401 otherwise), of ``role`` (or
    of one of the set of roles ``role``: ``GET /metrics`` takes the users' and the scrape
    token; 403 otherwise) and, for an agent or a report credential, for the instance or job the
    path (``args``) names (403 otherwise); an agent's is also checked against its instance's
    row in ``store()`` (read only then): revoked is 401. The caller's :class:`Principal` goes
    in the request's environ for the handler (:func:`principal_of`)."""
    header = request.headers.get("Authorization")
    if not header:
        unauthorized("a bearer token is required (Authorization: Bearer <token>)")
    scheme, _, presented = header.partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        unauthorized("the Authorization header must be 'Bearer <token>'")
    principal = credentials.current().authenticate(presented, now_s)
    if principal is None:
        unauthorized("the token is not valid")
    if isinstance(role, frozenset):
        if principal.role not in role:
            needs = " or ".join(sorted(r.value for r in role))
            raise ApiError(403, f"this endpoint needs the {needs} role, not {principal.role.value}")
        request.environ[PRINCIPAL] = principal
        return
    if principal.role is not role:
        raise ApiError(
            403, f"this endpoint needs the {role.value} role, not {principal.role.value}"
        )
    named = args.get("instance_key" if role is Role.AGENT else "job_id")
    if role is not Role.USER and named is not None and named != principal.subject:
        what = "instance" if role is Role.AGENT else "job"
        raise ApiError(403, f"this credential is for {what} {principal.subject!r}, not {named!r}")
    if role is Role.AGENT and principal.subject is not None:
        _check_not_revoked(store(), principal.subject)
    request.environ[PRINCIPAL] = principal


def _check_not_revoked(store: Store, instance_key: str) -> None:
    """401 when ``instance_key``'s agent credential is revoked: its instance ended or
    failed to start (:data:`~autoscaler.controller.lifecycle.AGENT_REVOKED`). An
    instance the store does not know is left to the endpoint (404)."""
    try:
        row = store.get_instance(instance_key)
    except UnknownRowError:
        return
    if row.status in AGENT_REVOKED:
        unauthorized(
            f"the credential of instance {instance_key!r} was revoked: the instance is "
            f"{row.status.value}"
        )


class Throttle:
    """The request rates of agents (per instance) and trainers (per job) under ``limits``;
    users are not limited. Thread-safe."""

    def __init__(self, limits: RequestLimits, clock: Clock) -> None:
        self.limits = limits
        self._clock = clock
        self._limiters = {
            Role.REPORT: RateLimiter(limits.report, clock),
            Role.AGENT: RateLimiter(limits.agent, clock),
        }
        self._warned: dict[tuple[Role, str], float] = {}  # monotonic s of the last warning
        self._lock = threading.Lock()

    def check(self, principal: Principal) -> Response | None:
        """429 with ``Retry-After`` when ``principal`` (an agent's or a job's credential) has
        used up its rate (:mod:`autoscaler.controller.ratelimit`); ``None``: go on."""
        limiter = self._limiters.get(principal.role)
        if limiter is None or principal.subject is None:
            return None
        wait_s = limiter.take(principal.subject)
        if wait_s <= 0:
            return None
        after = retry_after_s(wait_s)
        what = "job" if principal.role is Role.REPORT else "instance"
        limit = limiter.limit
        message = (
            f"too many requests for {what} {principal.subject!r} (at most "
            f"{limit.per_s:g}/s, {limit.burst} at once): retry after {after} s"
        )
        self._warn((principal.role, principal.subject), message)
        response = error_response(429, message)
        response.headers["Retry-After"] = str(after)
        return response

    def _warn(self, holder: tuple[Role, str], message: str) -> None:
        """Log a refusal for its rate at WARNING, at most once a minute per holder (a flood
        is seen by the operator, not logged request by request)."""
        now = self._clock.monotonic_s()
        with self._lock:
            if now - self._warned.get(holder, -math.inf) < _WARN_EVERY_S:
                return
            if len(self._warned) >= _WARNED_HOLDERS:
                self._warned.clear()
            self._warned[holder] = now
        _log.warning("refused (429): %s", message)
