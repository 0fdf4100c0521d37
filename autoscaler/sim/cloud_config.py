"""Cloud mode of the simulator: what the simulated cloud offers (its configuration only).

With :attr:`SimConfig.cloud <autoscaler.sim.config.SimConfig.cloud>` set, the cluster is no
longer fixed: the product's controller sizes and reconciles the fleet, round by round, against
a simulated cloud (:class:`~autoscaler.sim.world.CloudWorld`) built from a
:class:`CloudConfig`:

- its offerings (:class:`CloudOffering`): a pool (provider, instance type, zone, market), its
  GPUs, a price series (spot prices move; a new price is in the catalogue, and in the bill,
  from the round it takes effect), the on-demand price of the same instance (for savings),
  and for spot a :class:`PreemptionModel`: a seeded hazard (one preemption time per
  instance) or a replayed availability trace (the pool's capacity over time: launches above
  it fail with a capacity error, and when it drops below the instances held, the newest are
  preempted), each announced by the provider's notice (AWS 120 s, GCP 30 s);
- the fleet strategy the controller runs (:mod:`autoscaler.decide.strategies`);
- each instance's boot (billed: the VM runs while it boots): drawn from ``boot``, the
  world's :class:`~autoscaler.sim.boot.BootTimes` (public measurements of AWS and GCP
  start-up, per provider and instance size, seeded), or the constant
  ``provisioning_delay_s`` when ``boot`` is ``None``; an instance's agent is heard once it
  has booted, and only then does the controller give it a job,
  checkpoints every ``checkpoint_interval_s`` of running (and at every planned stop) taking
  ``checkpoint_write_s`` (a job on a preempted instance loses nothing but the restart when
  the notice leaves time to write one; else it falls back to its last checkpoint),
  per-second billing with ``min_billed_s``, and an optional budget (the fleet's price per
  hour is checked against it every round: :class:`BudgetExceededError`).

The controller's own rules apply, not the simulator's: it avoids an offering that answered a
capacity error for its ``unavailable_ttl_s``, drains before it releases, launches within its
rate limits and disruption budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from autoscaler.decide.fleet import FleetStrategy, FleetView
from autoscaler.decide.views import OfferingRef
from autoscaler.errors import AutoscalerError, InvalidInputError
from autoscaler.market.series import PriceSeries
from autoscaler.sim.boot import BootTimes
from autoscaler.sim.cluster import NodeGroup

__all__ = [
    "CloudConfig",
    "CloudOffering",
    "FleetStrategy",
    "FleetView",
    "PreemptionModel",
]


class PreemptionModel(Protocol):
    """When spot instances of one offering are taken back.

    ``preemption_time_s`` gives one instance's preemption time (``None``: never) for a hazard
    model; ``capacity_at`` the offering's capacity at a time (``None``: unlimited) for a
    replayed trace, and ``capacity_changes(t0, t1)`` its change points in ``(t0, t1]``."""

    def preemption_time_s(self, instance_id: str, launched_at_s: float) -> float | None: ...

    def capacity_at(self, t_s: float) -> int | None: ...

    def capacity_changes(self, t0_s: float, t1_s: float) -> list[tuple[float, int]]: ...


@dataclass(frozen=True)
class CloudOffering:
    """One pool the simulated fleet may buy from: its ``ref`` (provider, instance type, zone,
    market), GPUs, price series, the on-demand price of the same instance (for savings),
    preemption model (spot) and notice, and the instance's interconnect."""

    ref: OfferingRef
    gpu_type: str
    gpus: int
    price: PriceSeries
    ondemand_usd_per_hour: float | None = None
    preemption: PreemptionModel | None = None
    notice_s: float = 120.0
    hazard_per_hour: float = 0.0
    intra_gbytes_per_s: float = 16.0
    network_gbps: float = 50.0
    region: str = ""

    @property
    def key(self) -> str:
        return self.ref.key

    @property
    def group(self) -> NodeGroup:
        """The node group its instances belong to (what the true speeds are keyed on)."""
        return NodeGroup(
            self.gpu_type,
            self.gpus,
            1,
            self.ref.instance_type,
            self.intra_gbytes_per_s,
            self.network_gbps,
        )


@dataclass(frozen=True)
class CloudConfig:
    """The cloud side of a simulation (see the module docstring)."""

    offerings: tuple[CloudOffering, ...]
    strategy: FleetStrategy
    provisioning_delay_s: float = 120.0
    boot: BootTimes | None = None
    checkpoint_interval_s: float = 600.0
    checkpoint_write_s: float = 20.0
    min_billed_s: float = 60.0
    budget_usd_per_hour: float | None = None

    def __post_init__(self) -> None:
        if not self.offerings:
            raise InvalidInputError("cloud mode needs at least one offering", field="offerings")
        keys = [o.key for o in self.offerings]
        if len(set(keys)) != len(keys):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            raise InvalidInputError(f"duplicate offerings: {dup}", field="offerings")
        for name in (
            "provisioning_delay_s",
            "checkpoint_interval_s",
            "checkpoint_write_s",
            "min_billed_s",
        ):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise InvalidInputError(f"{name} must be a finite number >= 0", field=name)
        if self.budget_usd_per_hour is not None and not self.budget_usd_per_hour >= 0:
            raise InvalidInputError("budget must be >= 0 $/h", field="budget_usd_per_hour")

    def offering(self, key: str) -> CloudOffering:
        for o in self.offerings:
            if o.key == key:
                return o
        raise InvalidInputError(f"unknown offering {key!r}", field="offering")


class BudgetExceededError(AutoscalerError):
    """The fleet's price per hour went above the budget (a strategy broke the cap)."""
