"""The one contract every cloud adapter satisfies (AWS, GCP, local, fake).

Rules that hold for every method of every provider:

* **Ownership.** A provider only lists, and only terminates, instances tagged
  ``coadapt-cluster-id=<cluster_id>`` and ``coadapt-managed-by=coadapt`` (``providers.tags``).
  An untagged or foreign instance is invisible to ``list_instances`` and refused by
  ``terminate``.
* **The launch rule (idempotency by request id).** The instances of a request are those that
  carry its request id tag/label and are not ``TERMINATED`` (the same states ``list_instances``
  returns: pending, running, stopping). A launch first finds them *in the cloud* (tag or label
  lookup, never only the provider's memory) and then:

  - ``found < count``: creates only the shortfall, ``count - found``, never more, and returns
    the found and the created instances together;
  - ``found >= count``: creates nothing, terminates nothing, and returns all ``found`` (when
    ``found > count`` the surplus is logged as a likely leak; reconciling it is the caller's
    decision, never the launch's).

  So re-issuing a recorded launch after a crash (the first answer lost, a new provider object
  over the same cloud) never duplicates and returns every instance of the request; re-issuing
  it after some of its instances ended tops it back up to ``count``. Cloud idempotency tokens
  (EC2 ``ClientToken``, GCE ``requestId``) only cover the window in which the lookup may not
  see fresh instances yet; they never replace the lookup. ``launch_shortfall`` states the rule
  in code. ``terminate`` of an instance that is already gone counts as done.
* **One pool walk.** Every provider places the shortfall with ``providers.capacity.walk_pools``:
  pools marked unavailable are skipped without a call and reported with an
  ``InsufficientCapacityError`` whose code is ``SKIPPED_UNAVAILABLE_CODE``; pools that report
  no capacity, or fill only part of what they were asked, are marked unavailable.
* **Partial success is normal.** ``launch`` fills as much of ``count`` as it can from the
  request's pools and reports a typed error per pool that failed; it raises only when the
  request itself is invalid (``InvalidRequestError``, before any cloud call) or the provider is
  unreachable/unauthorised.
* **Capacity errors fail fast.** A pool that reported no capacity is marked unavailable for a
  while (``providers.capacity.UnavailableOfferings``); later launches skip it (see the pool
  walk above) instead of retrying it in a hot loop.
* **Eventually consistent.** ``list_instances`` reflects the cloud's view, which may lag a
  launch or terminate by seconds; callers reconcile against it and never assume.
* **Injected clock.** Providers that wait or retry take an ``coadapt_common.clock.Clock``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from providers.errors import InvalidRequestError, ProviderError
from providers.tags import validate_id, validate_user_tags

log = logging.getLogger(__name__)


class Market(StrEnum):
    """How an instance is bought."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"


class InstanceState(StrEnum):
    """Provider-neutral lifecycle state of an instance."""

    PENDING = "pending"  # accepted by the cloud, not yet running
    RUNNING = "running"
    STOPPING = "stopping"  # shutting down / being terminated
    TERMINATED = "terminated"  # gone (may still be listed briefly by the cloud)


class InterruptionKind(StrEnum):
    """What an interruption notice announces."""

    SPOT_INTERRUPTION = "spot-interruption"  # AWS 2-minute warning: will be reclaimed
    REBALANCE = "rebalance"  # AWS rebalance recommendation: elevated risk, no deadline
    PREEMPTED = "preempted"  # GCP preemption (30 s) / instance already reclaimed
    TERMINATED = "terminated"  # observed state change to stopping/terminated


def offering_key(provider: str, instance_type: str, zone: str, market: str) -> str:
    """The one name of an offering (a pool) across the system, ``provider/instance_type/zone/
    market`` (market ``spot`` or ``on-demand``): the key of :attr:`Offering.key`,
    :attr:`Instance.offering_key`, the controller's rows, plans, sizing and ledgers, and a job
    spec's ``offerings`` (``autoscaler.decide.views.OfferingRef.key`` spells the same format for
    the decision core, which imports no provider; a test holds the two equal)."""
    return f"{provider}/{instance_type}/{zone}/{market}"


@dataclass(frozen=True)
class Offering:
    """One pool: an instance type in a zone, bought on one market.

    ``gpu_type`` is the vendor model name shared by all providers ("T4", "A10G", "L4", "A100",
    "H100", ...), so sizing can compare pools across clouds; local agent slots use "cpu-slot".
    ``price_usd_per_hour`` is ``None`` when the provider cannot tell (e.g. no price feed).
    ``key`` identifies the pool across the system (capacity cache, sizing, ledgers, job specs):
    :func:`offering_key`.
    """

    provider: str
    instance_type: str
    gpu_type: str
    gpus: int
    vcpus: int
    memory_gib: float
    region: str
    zone: str
    market: Market
    price_usd_per_hour: float | None = None

    @property
    def key(self) -> str:
        return offering_key(self.provider, self.instance_type, self.zone, self.market)


@dataclass(frozen=True)
class Instance:
    """An instance as the provider sees it. ``instance_id`` is the cloud's id."""

    instance_id: str
    provider: str
    instance_type: str
    zone: str
    market: Market
    state: InstanceState
    cluster_id: str
    request_id: str
    tags: Mapping[str, str] = field(default_factory=dict)
    launched_at_s: float | None = None
    private_ip: str | None = None

    @property
    def offering_key(self) -> str:
        """The key of the offering (pool) it was launched from: :func:`offering_key`."""
        return offering_key(self.provider, self.instance_type, self.zone, self.market)


@dataclass(frozen=True)
class LaunchRequest:
    """Launch ``count`` instances from one or more pools of the same market.

    ``offerings`` are the acceptable pools (e.g. several types/zones for a spot fleet); the
    provider chooses among them by its strategy and fills what it can. ``request_id`` names the
    intent: re-issuing it creates only what the cloud lacks of ``count`` (the launch rule).
    ``user_data`` is the agent start-up data handed to the instance (cloud-init /
    startup-script / local agent argv).
    """

    request_id: str
    cluster_id: str
    offerings: tuple[Offering, ...]
    count: int
    tags: Mapping[str, str] = field(default_factory=dict)
    user_data: str = ""

    def validate(self) -> None:
        """Raise ``InvalidRequestError`` unless the request is well formed.

        Providers call this before any cloud call; it does not check that the offerings exist
        at this provider (each provider does that against its own catalogue).
        """
        validate_id(self.request_id, field="request_id")
        validate_id(self.cluster_id, field="cluster_id")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count <= 0:
            raise InvalidRequestError(f"count must be a positive integer, got {self.count!r}")
        if not self.offerings:
            raise InvalidRequestError("a launch request needs at least one offering")
        markets = {o.market for o in self.offerings}
        if len(markets) != 1:
            raise InvalidRequestError(
                f"all offerings of one launch request must share a market, got {sorted(markets)}"
            )
        keys = [o.key for o in self.offerings]
        if len(set(keys)) != len(keys):
            raise InvalidRequestError("duplicate offerings in launch request")
        validate_user_tags(self.tags)

    @property
    def market(self) -> Market:
        return self.offerings[0].market


@dataclass(frozen=True)
class PoolError:
    """Why one pool of a launch request did not (fully) fill."""

    offering_key: str
    error: ProviderError


@dataclass(frozen=True)
class LaunchResult:
    """Outcome of a launch: the instances that exist for the request, and per-pool errors.

    ``instances`` includes instances found from an earlier call with the same request id (all
    of them, also when there are more than ``requested``: see the launch rule in the module
    docstring). ``fulfilled`` is true when ``len(instances) >= requested``.
    """

    request_id: str
    requested: int
    instances: tuple[Instance, ...]
    errors: tuple[PoolError, ...] = ()

    @property
    def fulfilled(self) -> bool:
        return len(self.instances) >= self.requested


@dataclass(frozen=True)
class TerminateResult:
    """Outcome of a terminate call.

    ``terminated``: ids now shutting down or gone because of this call; ``already_gone``: ids
    the cloud did not know (treated as done); ``refused``: ids not owned by the cluster, left
    untouched.
    """

    request_id: str
    terminated: tuple[str, ...] = ()
    already_gone: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class InterruptionNotice:
    """One spot notice or preemption, whatever its source.

    ``deadline_s`` is epoch seconds by which the instance will be gone (``None`` for a
    rebalance recommendation, which carries no deadline). ``source`` says where it was read
    (``imds``, ``eventbridge``, ``gce-metadata``, ``gce-operation``, ``fake``, ``local``).
    """

    instance_id: str
    kind: InterruptionKind
    deadline_s: float | None
    source: str
    noticed_at_s: float | None = None


@dataclass(frozen=True)
class SpotPrice:
    """A spot price observation for one type in one zone."""

    instance_type: str
    zone: str
    price_usd_per_hour: float
    timestamp_s: float


@runtime_checkable
class Provider(Protocol):
    """A cloud, as coadapt sees it. See the module docstring for the rules every method keeps."""

    name: str

    def offerings(self) -> Sequence[Offering]:
        """Every pool this provider can launch (GPU types only), with prices when known."""
        ...

    def launch(self, request: LaunchRequest) -> LaunchResult:
        """Bring the request's instances up to ``request.count`` (the launch rule, module doc).

        Validates the request first (``InvalidRequestError`` before any cloud call, also for an
        offering this provider does not have). Creates only ``launch_shortfall(request,
        found)``; returns the found and the created instances of the request id, and one
        ``PoolError`` per pool that failed or was skipped.
        """
        ...

    def terminate(
        self, cluster_id: str, instance_ids: Sequence[str], request_id: str
    ) -> TerminateResult:
        """Terminate owned instances; unknown ids are ``already_gone``, foreign ids ``refused``.

        Idempotent: calling it again with the same ids terminates nothing new and raises nothing.
        """
        ...

    def list_instances(self, cluster_id: str) -> Sequence[Instance]:
        """Non-terminated instances owned by ``cluster_id`` (by tag/label only)."""
        ...

    def interruptions(self, cluster_id: str) -> Sequence[InterruptionNotice]:
        """Interruption notices for owned instances seen since the last call (drained)."""
        ...

    def spot_prices(self) -> Sequence[SpotPrice]:
        """Latest known spot price per (instance type, zone) of this provider's offerings."""
        ...


def find_offering(offerings: Sequence[Offering], wanted: Offering) -> Offering:
    """Return the provider's own offering matching ``wanted.key``, or raise InvalidRequestError."""
    for o in offerings:
        if o.key == wanted.key:
            return o
    raise InvalidRequestError(f"unknown offering {wanted.key!r} for this provider")


def launch_shortfall(request: LaunchRequest, found: Sequence[Instance]) -> int:
    """How many instances a launch of ``request`` creates, given the request's instances
    ``found`` in the cloud: ``count`` minus the non-terminated ones, never below zero.

    ``found`` beyond ``count`` is logged as a likely leak (and left alone).
    """
    live = sum(1 for i in found if i.state is not InstanceState.TERMINATED)
    if live > request.count:
        log.warning(
            "request %s asked for %d instances but %d exist: creating none, terminating none "
            "(likely a leak or a reused request id)",
            request.request_id,
            request.count,
            live,
        )
    return max(0, request.count - live)
