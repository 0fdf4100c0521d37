"""The controller's records as values: a job's status and the rows the store keeps, also
what the API answers (:mod:`autoscaler.controller.client` reads them without the store).
Plain data; no database here."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from autoscaler.controller.lifecycle import InstanceStatus
from providers.base import Market

__all__ = [
    "InstanceRow",
    "InstanceStatus",
    "JobBatch",
    "JobEta",
    "JobRow",
    "JobStatus",
    "ReportRow",
]


class JobStatus(StrEnum):
    """A job's status in the store."""

    QUEUED = "queued"  # submitted, holds no GPUs
    RUNNING = "running"  # holds GPUs on some instances
    COMPLETED = "completed"
    FAILED = "failed"  # its failures exceeded its budget (rescaling never counts)
    CANCELLED = "cancelled"
    REFUSED = "refused"  # no fleet the controller may build can run it (the reason says why)


@dataclass(frozen=True)
class JobRow:
    """A job. ``spec_json`` is its submitted spec (a JSON object); ``retries`` counts its
    failures only (rescaling and preemption never count); ``reason``: why it was refused or
    why it failed last, in one line (``None``: nothing to say); ``deadline_s``: when it must
    be done, the clock's time (``None``: no deadline)."""

    name: str
    spec_json: str
    status: JobStatus
    retries: int
    submitted_at_s: float
    updated_at_s: float
    version: int
    reason: str | None = None
    deadline_s: float | None = None


@dataclass(frozen=True)
class JobBatch:
    """The batch configuration a round planned for a job running on ``gpus`` GPUs:
    ``global_batch_size`` samples per optimizer step, ``local_batch_size`` per GPU and
    micro-step, ``accum_steps`` micro-steps; planned at ``at_s``."""

    job_name: str
    global_batch_size: int
    local_batch_size: int
    accum_steps: int
    gpus: int
    at_s: float


@dataclass(frozen=True)
class JobEta:
    """When a running job will be done by its fitted model (:func:`autoscaler.decide.
    deadlines.remaining_s` at the allocation it held): ``eta_s`` the clock's time it will be
    done, estimated by the round at ``eta_at_s``."""

    job_name: str
    eta_s: float
    eta_at_s: float


@dataclass(frozen=True)
class InstanceRow:
    """An instance as the controller knows it. ``instance_key`` is our id (``i-<hex>``),
    ``provider_instance_id`` the cloud's (``None`` until the cloud listed or returned it);
    ``request_id`` names its launch in the cloud (one per row, kept across retries);
    ``price_usd_per_hour`` is the offering's price when the row was created;
    ``request_tries`` the retries of its request (``requested -> queued``)."""

    instance_key: str
    request_id: str
    offering_key: str
    provider: str
    instance_type: str
    zone: str
    market: Market
    gpu_type: str
    gpus: int
    price_usd_per_hour: float
    provider_instance_id: str | None
    status: InstanceStatus
    request_tries: int
    last_heartbeat_s: float | None
    created_at_s: float
    updated_at_s: float
    version: int


@dataclass(frozen=True)
class ReportRow:
    """One trainer report (a JSON object); ``report_id`` increases with arrival."""

    report_id: int
    job_name: str
    at_s: float
    payload_json: str
