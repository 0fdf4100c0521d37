"""Map GCE errors onto coadapt's typed provider errors (pure functions over plain data).

GCE reports failures in two places, and both are mapped here:

* **HTTP errors** of the call itself: status plus ``error.errors[].reason`` in the body
  (``{"error": {"code": 404, "message": ..., "errors": [{"reason": "notFound"}]}}``).
* **Operation errors**: the call was accepted (200 + an Operation) but the operation ended
  ``DONE`` with ``error.errors[].code`` such as ``ZONE_RESOURCE_POOL_EXHAUSTED``, plus
  ``httpErrorStatusCode``. Capacity and quota failures of inserts usually arrive this way, with
  status 503/403, so the *code* decides, never the status alone.

Mapping (first match wins):

==================================================  =====================================
capacity: ``ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS]``, a message "does not have enough
resources", reason ``resourceExhausted`` on a 503    ``InsufficientCapacityError``
``QUOTA_EXCEEDED`` / reason ``quotaExceeded``        ``QuotaExceededError``
``RESOURCE_ALREADY_EXISTS`` / 409 ``alreadyExists``  ``ResourceAlreadyExistsError``
404, ``RESOURCE_NOT_FOUND``                         ``InstanceNotFoundError``
429, 5xx, 403 ``rateLimitExceeded``, 400 ``resourceNotReady``,
``RESOURCE_OPERATION_RATE_EXCEEDED``, ``INTERNAL_ERROR``    ``TransientError``
401, other 403                                      ``AuthError``
other 400/4xx                                       ``InvalidRequestError``
==================================================  =====================================
"""

from __future__ import annotations

from collections.abc import Sequence

from providers.errors import (
    AuthError,
    InstanceNotFoundError,
    InsufficientCapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaExceededError,
    TransientError,
)

CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "REGION_RESOURCE_POOL_EXHAUSTED",
    }
)
CAPACITY_MESSAGE = "does not have enough resources"
QUOTA_CODES = frozenset({"QUOTA_EXCEEDED", "quotaExceeded"})
ALREADY_EXISTS_CODES = frozenset({"RESOURCE_ALREADY_EXISTS", "alreadyExists"})
NOT_FOUND_CODES = frozenset({"RESOURCE_NOT_FOUND", "notFound"})
TRANSIENT_CODES = frozenset(
    {
        "rateLimitExceeded",
        "userRateLimitExceeded",
        "resourceNotReady",
        "backendError",
        "internalError",
        "RESOURCE_OPERATION_RATE_EXCEEDED",
        "RATE_LIMIT_EXCEEDED",
        "INTERNAL_ERROR",
        "SERVICE_UNAVAILABLE",
        "TIMEOUT",
    }
)


class ResourceAlreadyExistsError(ProviderError):
    """GCE already has a resource of that name (409 ``alreadyExists``).

    For our deterministic instance names this usually means an earlier attempt of the same
    request already created it; the provider then checks the labels and adopts it.
    """


def _is_capacity(codes: Sequence[str], message: str) -> bool:
    return any(c in CAPACITY_CODES for c in codes) or CAPACITY_MESSAGE in message.lower()


def error_from_http(
    status: int, message: str, reasons: Sequence[str] = (), *, pool: str | None = None
) -> ProviderError:
    """Typed error for an HTTP error of a GCE call (``status`` + body reasons/message)."""
    code = reasons[0] if reasons else str(status)
    text = f"GCE HTTP {status}: {message}"
    if _is_capacity(reasons, message) or (status == 503 and "resourceExhausted" in reasons):
        return InsufficientCapacityError(text, code=code, pool=pool)
    if any(r in QUOTA_CODES for r in reasons):
        return QuotaExceededError(text, code=code, pool=pool)
    if status == 409 and any(r in ALREADY_EXISTS_CODES for r in reasons):
        return ResourceAlreadyExistsError(text, code=code, pool=pool)
    if status == 404:
        return InstanceNotFoundError(text, code=code, pool=pool)
    if status == 429 or status >= 500 or any(r in TRANSIENT_CODES for r in reasons):
        return TransientError(text, code=code, pool=pool)
    if status in (401, 403):
        return AuthError(text, code=code, pool=pool)
    if status == 409:
        # A conflicting concurrent operation on the same resource: settles by itself.
        return TransientError(text, code=code, pool=pool)
    if 400 <= status < 500:
        return InvalidRequestError(text, code=code, pool=pool)
    return ProviderError(text, code=code, pool=pool)


def error_from_operation(
    errors: Sequence[tuple[str, str]],
    http_status: int | None = None,
    *,
    pool: str | None = None,
) -> ProviderError:
    """Typed error for an operation that ended ``DONE`` with ``error.errors`` = ``errors``.

    ``errors`` are ``(code, message)`` pairs in the order GCE lists them; ``http_status`` is
    the operation's ``httpErrorStatusCode`` when set.
    """
    codes = [c for c, _ in errors]
    message = "; ".join(f"{c}: {m}" for c, m in errors) or f"operation failed ({http_status})"
    code = codes[0] if codes else (str(http_status) if http_status else None)
    text = f"GCE operation failed: {message}"
    if _is_capacity(codes, message):
        return InsufficientCapacityError(text, code=code, pool=pool)
    if any(c in QUOTA_CODES for c in codes):
        return QuotaExceededError(text, code=code, pool=pool)
    if any(c in ALREADY_EXISTS_CODES for c in codes):
        return ResourceAlreadyExistsError(text, code=code, pool=pool)
    if any(c in NOT_FOUND_CODES for c in codes):
        return InstanceNotFoundError(text, code=code, pool=pool)
    if any(c in TRANSIENT_CODES for c in codes):
        return TransientError(text, code=code, pool=pool)
    if http_status is not None:
        mapped = error_from_http(http_status, message, codes, pool=pool)
        return type(mapped)(text, code=code, pool=pool)
    return ProviderError(text, code=code, pool=pool)
