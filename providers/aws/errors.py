"""EC2/SQS error codes -> coadapt's typed provider errors.

``error_from_code`` is pure (no botocore needed) and is the single place where an AWS error
code gets its meaning. ``translate`` turns any exception raised by a botocore client (a
``ClientError`` or a transport-level ``BotoCoreError``) into a ``ProviderError``; it imports
botocore lazily so this module stays importable without boto3.

Rules, in order:

1. A known code decides (capacity, quota, not-found, auth, transient, invalid). The code wins
   over the HTTP status: EC2 answers ``InsufficientInstanceCapacity`` with HTTP 500, and that is
   a capacity error, not a transient one.
2. An unknown code with HTTP 5xx is transient; an unknown ``*.NotFound``/``*.Malformed``/
   ``Invalid*`` code is an invalid request; anything else is a plain ``ProviderError`` (not
   retried), keeping the cloud's code in ``.code``.
3. Transport failures (connection refused/reset, connect/read timeouts) are transient; missing
   or unusable credentials are ``AuthError``; botocore's own parameter validation failures are
   ``InvalidRequestError``.
"""

from __future__ import annotations

from providers.errors import (
    AuthError,
    InstanceNotFoundError,
    InsufficientCapacityError,
    InvalidRequestError,
    ProviderError,
    QuotaExceededError,
    TransientError,
)

# The pool has no capacity now: mark it unavailable, route elsewhere, never retry in place.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacityOnHost",
        "MaxSpotInstanceCountExceeded",  # spot: no more spot instances for this pool/account
        "SpotMaxPriceTooLow",  # spot: the market price is above our max price
        "UnfulfillableCapacity",
        "InsufficientFreeAddressesInSubnet",  # the zone's subnet is full: zone-level capacity
        "Unsupported",  # "instance type not supported in the requested zone": pool-level
        "capacity-not-available",  # spot request status code
        "capacity-oversubscribed",
        "price-too-low",
    }
)

# An account limit: not retried, not pool-specific.
QUOTA_CODES = frozenset(
    {
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "MaxFleetCountExceeded",
        "MaxSpotFleetRequestCountExceeded",
        "TargetCapacityLimitExceededException",
        "ResourceLimitExceeded",
        "VolumeLimitExceeded",
        "MaxIOPSLimitExceeded",
        "AddressLimitExceeded",
        "LimitExceeded",
        "LimitExceededException",
        "OverQuota",
    }
)

# Safe to retry with backoff.
TRANSIENT_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "EC2ThrottledException",
        "TooManyRequestsException",
        "SlowDown",
        "PriorRequestNotComplete",
        "InternalError",
        "InternalFailure",
        "InternalServerError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "Unavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "RequestExpired",  # clock skew / slow network: a fresh signature fixes it
        "BandwidthLimitExceeded",
        "IncorrectState",  # e.g. an instance mid-transition; retry later
    }
)

NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})

AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "AccessDeniedException",
        "OptInRequired",
        "Blocked",
        "PendingVerification",
        "MissingAuthenticationToken",
        "InvalidAccessKeyId",
        "InvalidToken",
    }
)

INVALID_CODES = frozenset(
    {
        "InvalidParameterValue",
        "InvalidParameter",
        "InvalidParameterCombination",
        "MissingParameter",
        "UnknownParameter",
        "ValidationError",
        "UnsupportedOperation",
        "IdempotentParameterMismatch",
        "InvalidFleetConfiguration",
        "InvalidAMIID.NotFound",
        "InvalidAMIID.Malformed",
        "InvalidSubnetID.NotFound",
        "InvalidLaunchTemplateId.NotFound",
        "InvalidLaunchTemplateName.NotFoundException",
        "InvalidUserData.Malformed",
        "DryRunOperation",
    }
)


def _with_pool(err: ProviderError, pool: str | None) -> ProviderError:
    err.pool = pool
    return err


def error_from_code(
    code: str | None,
    message: str = "",
    *,
    http_status: int | None = None,
    pool: str | None = None,
) -> ProviderError:
    """The typed error for an AWS error ``code`` (see the module docstring for the rules).

    ``code`` may carry EC2's ``Server.``/``Client.`` prefix (fleet and spot-request errors
    sometimes do); it is stripped. ``pool`` (an ``Offering.key``) is recorded on the error.
    """
    raw = code or ""
    bare = raw.split(".", 1)[1] if raw.startswith(("Server.", "Client.")) else raw
    text = f"{raw}: {message}" if raw else message or "unknown AWS error"
    if http_status is not None and not raw:
        text = f"HTTP {http_status}: {text}"
    cls: type[ProviderError]
    if bare in CAPACITY_CODES:
        cls = InsufficientCapacityError
    elif bare in QUOTA_CODES:
        cls = QuotaExceededError
    elif bare in NOT_FOUND_CODES:
        cls = InstanceNotFoundError
    elif bare in AUTH_CODES:
        cls = AuthError
    elif bare in TRANSIENT_CODES:
        cls = TransientError
    elif bare in INVALID_CODES:
        cls = InvalidRequestError
    elif http_status is not None and http_status >= 500:
        cls = TransientError
    elif http_status in (401, 403):
        cls = AuthError
    elif http_status == 429:
        cls = TransientError
    elif bare.endswith((".NotFound", ".Malformed", "NotFoundException")) or bare.startswith(
        "Invalid"
    ):
        cls = InvalidRequestError
    else:
        cls = ProviderError
    return _with_pool(cls(text, code=raw or None), pool)


def translate(exc: BaseException, *, pool: str | None = None) -> ProviderError:
    """Map an exception from a botocore client call to a ``ProviderError``.

    ``ProviderError`` passes through unchanged. Exceptions that are neither botocore's nor ours
    are not expected here; they become a plain ``ProviderError`` so callers never see a raw
    SDK type.
    """
    if isinstance(exc, ProviderError):
        return exc
    from botocore import exceptions as bce  # lazy: keeps this module importable without boto3

    if isinstance(exc, bce.ClientError):
        response = getattr(exc, "response", None) or {}
        error = response.get("Error", {}) or {}
        status = (response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode")
        return error_from_code(
            error.get("Code"), error.get("Message", "") or "", http_status=status, pool=pool
        )
    if isinstance(exc, bce.ConnectionError | bce.HTTPClientError):
        # Endpoint unreachable, connection reset/closed, connect or read timeout, proxy/SSL.
        return _with_pool(
            TransientError(f"AWS transport error: {exc}", code=type(exc).__name__), pool
        )
    if isinstance(
        exc,
        bce.NoCredentialsError
        | bce.PartialCredentialsError
        | bce.CredentialRetrievalError
        | bce.TokenRetrievalError,
    ):
        return _with_pool(AuthError(f"AWS credentials: {exc}", code=type(exc).__name__), pool)
    if isinstance(exc, bce.ParamValidationError | bce.NoRegionError):
        return _with_pool(
            InvalidRequestError(f"AWS request rejected locally: {exc}", code=type(exc).__name__),
            pool,
        )
    return _with_pool(ProviderError(f"AWS error: {exc!r}", code=type(exc).__name__), pool)
