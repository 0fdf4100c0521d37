"""Deterministic names and ids for GCE resources (pure functions).

* **Instance ids.** coadapt's id for a GCE instance is ``"<zone>/<name>"`` (e.g.
  ``us-central1-a/ca-1a2b3c4d-0f1e2d3c4b-0003``): names are unique per project *and zone*, and
  every GCE call addresses an instance by (zone, name). GCE's numeric id is not used: it is
  unknown until the instance exists.
* **Instance names.** ``ca-<cluster hash 8>-<request hash 10>-<index, 4+ digits>``: derived
  from the cluster id, the request id and the instance's index within the request, so a retried
  or repeated launch asks for the *same* names and GCE refuses a second copy
  (``alreadyExists``). The cluster-hash prefix also lets the controller recognise its own
  instances in preemption operations after they are deleted (labels are gone by then).
* **Request ids.** GCE's ``requestId`` (60-minute server-side de-duplication of mutating calls)
  must be a UUID: ``operation_request_id`` is a UUID5 over the parts that identify one intended
  call, so a retry of the same call sends the same ``requestId``.
"""

from __future__ import annotations

import hashlib
import re
import uuid

from providers.errors import InvalidRequestError

# Namespace of coadapt's UUID5 request ids (fixed forever: changing it breaks idempotency).
REQUEST_ID_NAMESPACE = uuid.UUID("5b0c6a55-3b0e-5d2c-9c4e-63a3c1e7a0d1")

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def cluster_prefix(cluster_id: str) -> str:
    """Name prefix shared by every instance of ``cluster_id`` (``ca-`` + 8 hex chars + ``-``)."""
    return f"ca-{_digest('cluster:' + cluster_id, 8)}-"


def request_prefix(cluster_id: str, request_id: str) -> str:
    """Name prefix shared by every instance of one launch request."""
    return f"{cluster_prefix(cluster_id)}{_digest(f'request:{cluster_id}/{request_id}', 10)}-"


def instance_name(cluster_id: str, request_id: str, index: int) -> str:
    """The GCE name of instance ``index`` (0-based) of a launch request (at most 63 chars)."""
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 10**9:
        raise InvalidRequestError(f"instance index out of range: {index!r}")
    return f"{request_prefix(cluster_id, request_id)}{index:04d}"


def instance_index(name: str, cluster_id: str, request_id: str) -> int | None:
    """Index of ``name`` within the request, or ``None`` when it is not one of its names."""
    prefix = request_prefix(cluster_id, request_id)
    if not name.startswith(prefix):
        return None
    tail = name[len(prefix) :]
    return int(tail) if tail.isdigit() else None


def has_cluster_prefix(name: str, cluster_id: str) -> bool:
    """True when ``name`` was generated for ``cluster_id`` by ``instance_name``."""
    return name.startswith(cluster_prefix(cluster_id))


def operation_request_id(*parts: str) -> str:
    """A UUID5 ``requestId`` over ``parts`` (same parts, same id)."""
    return str(uuid.uuid5(REQUEST_ID_NAMESPACE, "\x1f".join(parts)))


def format_instance_id(zone: str, name: str) -> str:
    """coadapt's instance id: ``"<zone>/<name>"``."""
    return f"{zone}/{name}"


def parse_instance_id(instance_id: str) -> tuple[str, str]:
    """``"<zone>/<name>"`` -> ``(zone, name)``; ``InvalidRequestError`` when malformed."""
    if not isinstance(instance_id, str):
        raise InvalidRequestError(f"a GCP instance id is a string, got {instance_id!r}")
    zone, sep, name = instance_id.partition("/")
    if not sep or not _ZONE_RE.match(zone) or not _NAME_RE.match(name):
        raise InvalidRequestError(
            f"a GCP instance id has the form '<zone>/<name>', got {instance_id!r}"
        )
    return zone, name


def last_segment(url_or_name: str) -> str:
    """``https://.../zones/us-central1-a`` -> ``us-central1-a`` (a bare name is returned as is)."""
    return url_or_name.rstrip("/").rsplit("/", 1)[-1]
