"""Parse GCE REST resources (camelCase JSON as the API returns them) into coadapt values.

Pure functions over ``Mapping`` values: the provider converts the client library's messages to
their JSON form (``json_format.MessageToDict``) and calls these, and tests feed them JSON from
the API reference directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from providers.base import Instance, InstanceState, Market
from providers.gcp.naming import format_instance_id, last_segment
from providers.tags import CLUSTER_ID_TAG, REQUEST_ID_TAG

PROVIDER_NAME = "gcp"
PREEMPTED_OPERATION_TYPE = "compute.instances.preempted"

# GCE instance status -> coadapt state. Edges (from the GCE lifecycle docs):
# PROVISIONING/STAGING: resources being allocated / booting -> PENDING
# RUNNING, REPAIRING (host error being fixed, comes back RUNNING) -> RUNNING
# PENDING_STOP/STOPPING/SUSPENDING/DEPROVISIONING: shutting down -> STOPPING
# STOPPED/SUSPENDED/TERMINATED: no longer running (a STOP-action spot VM ends here) -> TERMINATED
_STATE_BY_STATUS: dict[str, InstanceState] = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "PENDING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "REPAIRING": InstanceState.RUNNING,
    "PENDING_STOP": InstanceState.STOPPING,
    "STOPPING": InstanceState.STOPPING,
    "SUSPENDING": InstanceState.STOPPING,
    "DEPROVISIONING": InstanceState.STOPPING,
    "STOPPED": InstanceState.TERMINATED,
    "SUSPENDED": InstanceState.TERMINATED,
    "TERMINATED": InstanceState.TERMINATED,
}


def state_from_status(status: str) -> InstanceState:
    """coadapt state of a GCE instance ``status``; unknown statuses count as PENDING."""
    return _STATE_BY_STATUS.get(status, InstanceState.PENDING)


def parse_timestamp_s(value: str | None) -> float | None:
    """RFC 3339 (``2024-05-01T10:00:00.123-07:00``) -> epoch seconds; ``None`` if absent/bad."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.timestamp()


def instance_type_of(resource: Mapping[str, Any]) -> str:
    """coadapt ``instance_type`` of an instance resource (see ``providers.gcp.config``).

    Machine types with built-in GPUs (G2/A2) list those GPUs in ``guestAccelerators`` too; only
    N1-style attached GPUs become part of the instance type.
    """
    machine = last_segment(str(resource.get("machineType", "")))
    accelerators = resource.get("guestAccelerators") or []
    if accelerators and machine.startswith("n1-"):
        acc = accelerators[0]
        count = int(acc.get("acceleratorCount", 0))
        return f"{machine}+{count}x{last_segment(str(acc.get('acceleratorType', '')))}"
    return machine


def market_of(resource: Mapping[str, Any]) -> Market:
    """SPOT when the scheduling says so (Spot or legacy preemptible), else ON_DEMAND."""
    scheduling = resource.get("scheduling") or {}
    if scheduling.get("provisioningModel") == "SPOT" or scheduling.get("preemptible") is True:
        return Market.SPOT
    return Market.ON_DEMAND


def instance_from_resource(resource: Mapping[str, Any]) -> Instance:
    """An ``Instance`` from a GCE instance resource; the id is ``"<zone>/<name>"``.

    Ownership is *not* checked here (callers filter by label); ``cluster_id``/``request_id``
    are read from the labels and are empty strings for an unlabelled instance.
    """
    labels = dict(resource.get("labels") or {})
    zone = last_segment(str(resource.get("zone", "")))
    name = str(resource.get("name", ""))
    interfaces = resource.get("networkInterfaces") or []
    private_ip = interfaces[0].get("networkIP") if interfaces else None
    return Instance(
        instance_id=format_instance_id(zone, name),
        provider=PROVIDER_NAME,
        instance_type=instance_type_of(resource),
        zone=zone,
        market=market_of(resource),
        state=state_from_status(str(resource.get("status", ""))),
        cluster_id=labels.get(CLUSTER_ID_TAG, ""),
        request_id=labels.get(REQUEST_ID_TAG, ""),
        tags=labels,
        launched_at_s=parse_timestamp_s(resource.get("creationTimestamp")),
        private_ip=private_ip,
    )


def instances_from_aggregated_page(page: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The instance resources of one ``aggregated/instances`` page (all scopes, in order).

    Scopes without instances carry only a ``warning`` (``NO_RESULTS_ON_PAGE``) and are skipped.
    """
    out: list[Mapping[str, Any]] = []
    for scoped in (page.get("items") or {}).values():
        out.extend(scoped.get("instances") or [])
    return out


def operation_errors(operation: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(code, message)`` pairs of a finished operation's ``error.errors`` (empty if none)."""
    errors = (operation.get("error") or {}).get("errors") or []
    return [(str(e.get("code", "")), str(e.get("message", ""))) for e in errors]


@dataclass(frozen=True)
class PreemptionEvent:
    """One ``compute.instances.preempted`` system operation, parsed."""

    operation_name: str
    zone: str
    instance_id: str
    preempted_at_s: float | None


def preemption_from_operation(operation: Mapping[str, Any]) -> PreemptionEvent | None:
    """Parse a zone operation; ``None`` unless it is a preemption of an instance.

    GCE records a preemption as a system operation with
    ``operationType = "compute.instances.preempted"`` whose ``targetLink`` is the instance;
    ``insertTime``/``startTime`` tell when it happened.
    """
    if operation.get("operationType") != PREEMPTED_OPERATION_TYPE:
        return None
    target = str(operation.get("targetLink", ""))
    parts = target.rstrip("/").split("/")
    if len(parts) < 4 or parts[-2] != "instances" or parts[-4] != "zones":
        return None
    zone, name = parts[-3], parts[-1]
    when = parse_timestamp_s(operation.get("insertTime")) or parse_timestamp_s(
        operation.get("startTime")
    )
    return PreemptionEvent(
        operation_name=str(operation.get("name", "")),
        zone=zone,
        instance_id=format_instance_id(zone, name),
        preempted_at_s=when,
    )


def preemptions_from_operations(operations: Iterable[Mapping[str, Any]]) -> list[PreemptionEvent]:
    """All preemption events among ``operations`` (other operations are ignored)."""
    events = (preemption_from_operation(op) for op in operations)
    return [e for e in events if e is not None]


def parse_preempted_value(body: str) -> bool:
    """The metadata server's ``instance/preempted`` value: ``TRUE`` or ``FALSE``.

    Raises ``ValueError`` for anything else (a proxy's error page must not read as FALSE).
    """
    value = body.strip().upper()
    if value == "TRUE":
        return True
    if value == "FALSE":
        return False
    raise ValueError(f"unexpected instance/preempted value: {body[:80]!r}")
