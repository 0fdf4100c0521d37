"""Ownership tags.

Every resource coadapt creates carries three tags (AWS) / labels (GCP):

* ``coadapt-cluster-id``  — the cluster that owns it; the controller only ever lists or touches
  instances carrying its own cluster id;
* ``coadapt-request-id``  — the launch request that created it (intent is recorded under this id
  before the cloud call, so a crashed controller can adopt or terminate what it finds);
* ``coadapt-managed-by``  — always ``coadapt``.

Keys and values are restricted to what both clouds accept as GCP labels (the stricter of the
two): lowercase letters, digits, ``-`` and ``_``; keys start with a letter; at most 63 chars.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from providers.errors import InvalidRequestError

CLUSTER_ID_TAG = "coadapt-cluster-id"
REQUEST_ID_TAG = "coadapt-request-id"
MANAGED_BY_TAG = "coadapt-managed-by"
MANAGED_BY_VALUE = "coadapt"
RESERVED_TAGS = frozenset({CLUSTER_ID_TAG, REQUEST_ID_TAG, MANAGED_BY_TAG})

MAX_USER_TAGS = 32
_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def validate_id(value: str, *, field: str) -> str:
    """Check a cluster or request id: 1-63 chars of ``[a-z0-9-]``, starting alphanumeric."""
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise InvalidRequestError(
            f"{field} must be 1-63 characters of lowercase letters, digits and '-', "
            f"starting with a letter or digit; got {value!r}"
        )
    return value


def validate_user_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """Validate user-supplied tags; reserved keys are refused. Returns a plain dict copy."""
    if not isinstance(tags, Mapping):
        raise InvalidRequestError(f"tags must be a mapping of str to str, got {type(tags)!r}")
    if len(tags) > MAX_USER_TAGS:
        raise InvalidRequestError(f"at most {MAX_USER_TAGS} tags, got {len(tags)}")
    out: dict[str, str] = {}
    for key, value in tags.items():
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise InvalidRequestError(
                f"tag key {key!r} is malformed: "
                "use 1-63 chars of [a-z0-9_-], starting with a letter"
            )
        if key in RESERVED_TAGS:
            raise InvalidRequestError(f"tag key {key!r} is reserved for coadapt")
        if not isinstance(value, str) or not _VALUE_RE.fullmatch(value):
            raise InvalidRequestError(
                f"tag {key!r} has a malformed value {value!r}: use at most 63 chars of [a-z0-9_-]"
            )
        out[key] = value
    return out


def ownership_tags(cluster_id: str, request_id: str) -> dict[str, str]:
    """The three tags every created resource carries."""
    return {
        CLUSTER_ID_TAG: validate_id(cluster_id, field="cluster_id"),
        REQUEST_ID_TAG: validate_id(request_id, field="request_id"),
        MANAGED_BY_TAG: MANAGED_BY_VALUE,
    }


def all_tags(cluster_id: str, request_id: str, user_tags: Mapping[str, str]) -> dict[str, str]:
    """User tags plus ownership tags (ownership wins; user tags cannot use reserved keys)."""
    tags = validate_user_tags(user_tags)
    tags.update(ownership_tags(cluster_id, request_id))
    return tags


def is_owned_by(tags: Mapping[str, str], cluster_id: str) -> bool:
    """True only when the resource is tagged as managed by coadapt for this cluster."""
    return tags.get(CLUSTER_ID_TAG) == cluster_id and tags.get(MANAGED_BY_TAG) == MANAGED_BY_VALUE
