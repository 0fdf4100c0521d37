"""Typed provider errors, all rooted at ``ProviderError``.

Callers branch on the type, never on message text:

* ``InsufficientCapacityError`` — the pool (offering) has no capacity now; mark it unavailable
  for a while and route around it. Never retried in place.
* ``QuotaExceededError`` — an account limit; not retried.
* ``InstanceNotFoundError`` — the instance does not exist (any more). ``terminate`` treats this
  as success, which is what makes it idempotent.
* ``TransientError`` — throttling, 5xx, timeouts: safe to retry with backoff.
* ``InvalidRequestError`` — rejected before any cloud call (bad offering, count, tags), or the
  cloud said the request itself is malformed.
* ``AuthError`` — credentials missing/expired or permission denied; not retried.
* ``FakeStateError`` — the fake cloud's state file (``FakeProvider(state_path=...)``) is gone,
  unreadable or not in its format; it names the file.
"""

from __future__ import annotations

from coadapt_common.errors import CoadaptError


class ProviderError(CoadaptError):
    """Root of all provider errors. ``code`` is the cloud's own error code when there is one."""

    def __init__(self, message: str, *, code: str | None = None, pool: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.pool = pool

    @property
    def retryable(self) -> bool:
        return False


class InsufficientCapacityError(ProviderError):
    """No capacity in this pool (instance type x zone x market) right now."""


class QuotaExceededError(ProviderError):
    """An account or project quota/limit would be exceeded."""


class InstanceNotFoundError(ProviderError):
    """The instance does not exist. Terminate treats it as already done."""


class TransientError(ProviderError):
    """A temporary failure (throttling, server error, timeout); retry with backoff."""

    @property
    def retryable(self) -> bool:
        return True


class InvalidRequestError(ProviderError, ValueError):
    """The request is invalid; raised before any cloud call when we can tell."""


class AuthError(ProviderError):
    """Authentication or authorisation failed."""


class FakeStateError(ProviderError):
    """The fake cloud's state file is gone, unreadable or not a ``coadapt-fake-cloud`` file.

    ``path`` is the file, also named in the message."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


# Alias with the contract's short name.
InvalidRequest = InvalidRequestError


ERROR_KINDS: tuple[str, ...] = (
    "capacity",
    "quota",
    "not_found",
    "transient",
    "invalid_request",
    "auth",
    "fake_state",
    "other",
)
"""Every kind :func:`error_kind` names (a bounded set: a metric's label values)."""


def error_kind(error: ProviderError) -> str:
    """The kind of a provider error, one of :data:`ERROR_KINDS`, by its type (most specific
    first); ``other`` for the root type or a provider's own subclass of it."""
    kinds: tuple[tuple[type[ProviderError], str], ...] = (
        (InsufficientCapacityError, "capacity"),
        (QuotaExceededError, "quota"),
        (InstanceNotFoundError, "not_found"),
        (TransientError, "transient"),
        (InvalidRequestError, "invalid_request"),
        (AuthError, "auth"),
        (FakeStateError, "fake_state"),
    )
    return next((kind for cls, kind in kinds if isinstance(error, cls)), "other")
