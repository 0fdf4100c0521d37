"""Cloud mode of the simulator: a fleet of priced instances that come and go.

With :attr:`SimConfig.cloud <autoscaler.sim.config.SimConfig.cloud>` set, the cluster is no
longer fixed. Every round, before the policy decides:

1. instances whose provisioning delay has passed become nodes (``provisioning_delay_s``,
   default 2 min for GPU VMs; the delay is billed: the VM runs while drivers and the job's
   image start);
2. instances preempted during the last round leave (their jobs stopped at the preemption);
3. spot prices in effect are read from each offering's price series (a price that changed
   within a round takes effect at the next round start, and is recorded then);
4. the fleet strategy proposes instance counts per offering from what it sees (the jobs as the
   policy sees them, the prices, the offerings marked unavailable);
5. the fleet is reconciled: launches for the missing instances (an offering at its capacity
   answers with a capacity error and is marked unavailable for ``unavailable_s``), releases
   for the surplus (pending ones first, then the ready ones running the fewest GPUs of jobs;
   their jobs stop with a checkpoint and are re-placed by the policy);
6. the fleet's price per hour must stay within the budget, if one is set: asserted.

**Preemptions.** A spot offering's :class:`PreemptionModel` gives, for each instance, a
preemption time (a seeded hazard model), or the offering's capacity over time (a replayed
availability trace; when capacity falls below the instances held, the newest are
preempted). The provider's notice (AWS 120 s, GCP 30 s) comes before it: jobs on the instance
write a checkpoint if ``checkpoint_write_s`` fits in the notice and lose nothing but the
restart; otherwise they fall back to their last checkpoint (written every
``checkpoint_interval_s`` of running, and at every planned stop). A preempted job stops at the
preemption time; the next round re-places it.

**Cost.** Every launch, price change, release and preemption goes to a
:class:`~autoscaler.costs.CostLedger`, with each job's GPU-seconds per instance; the result
carries the closed :class:`~autoscaler.costs.CostRecord` (price in effect integrated over each
instance's life, per-second billing with the provider's minimum).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from autoscaler.costs import CostLedger, CostRecord
from autoscaler.errors import AutoscalerError, InvalidInputError
from autoscaler.fleet import FleetStrategy, FleetView
from autoscaler.jobs import NodeView, OfferingRef
from autoscaler.sim.cluster import NodeGroup
from autoscaler.sizing import FleetOption

__all__ = [
    "CloudConfig",
    "CloudFleet",
    "CloudOffering",
    "FleetStrategy",
    "FleetView",
    "PreemptionModel",
    "PriceSeries",
]


class PriceSeries(Protocol):
    """Price per instance-hour in effect at a time (seconds from the start of the run)."""

    def price_at(self, t_s: float) -> float: ...


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
    checkpoint_interval_s: float = 600.0
    checkpoint_write_s: float = 20.0
    unavailable_s: float = 600.0
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
            "unavailable_s",
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


@dataclass
class _Instance:
    instance_id: str
    offering: CloudOffering
    launched_at_s: float
    ready_at_s: float
    usd_per_hour: float
    preempt_at_s: float | None = None
    node: NodeView | None = None


@dataclass
class CloudFleet:
    """The simulated fleet (driven by :class:`~autoscaler.sim.engine.Simulator`)."""

    config: CloudConfig
    ledger: CostLedger = field(default_factory=CostLedger)
    instances: dict[str, _Instance] = field(default_factory=dict)
    unavailable_until: dict[str, float] = field(default_factory=dict)
    launches: int = 0
    preemptions: int = 0
    capacity_errors: int = 0
    notice_s: dict[str, float] = field(default_factory=dict)  # by instance id, ended too
    _serial: int = 0
    _budget_peak_usd_per_hour: float = 0.0

    # ---- queries ---------------------------------------------------------------------------

    def nodes(self, now_s: float) -> tuple[NodeView, ...]:
        """Ready nodes at ``now_s``, in launch order."""
        return tuple(
            inst.node
            for inst in self.instances.values()
            if inst.node is not None and inst.ready_at_s <= now_s
        )

    def group_of(self, node_id: str) -> NodeGroup:
        return self.instances[node_id].offering.group

    def held(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for inst in self.instances.values():
            out[inst.offering.key] = out.get(inst.offering.key, 0) + 1
        return out

    def usd_per_hour(self) -> float:
        return sum(inst.usd_per_hour for inst in self.instances.values())

    def options(self, now_s: float) -> tuple[FleetOption, ...]:
        out = []
        for o in self.config.offerings:
            capacity = None
            if o.preemption is not None:
                cap = o.preemption.capacity_at(now_s)
                capacity = None if cap is None else max(0, cap)
            out.append(
                FleetOption(
                    key=o.key,
                    gpu_type=o.gpu_type,
                    gpus=o.gpus,
                    market="spot" if o.ref.market == "spot" else "on-demand",
                    usd_per_hour=o.price.price_at(now_s),
                    hazard_per_hour=o.hazard_per_hour,
                    capacity=capacity,
                    available=self.unavailable_until.get(o.key, -math.inf) <= now_s,
                )
            )
        return tuple(out)

    def preemptions_in(self, t0_s: float, t1_s: float) -> dict[str, float]:
        """Node id -> preemption time for ready nodes preempted in ``[t0_s, t1_s)``."""
        return {
            iid: inst.preempt_at_s
            for iid, inst in self.instances.items()
            if inst.preempt_at_s is not None and t0_s <= inst.preempt_at_s < t1_s
        }

    def notice_suffices(self, node_id: str) -> bool:
        """Whether the preemption notice of ``node_id`` (live or ended) leaves time to write
        a checkpoint."""
        return self.notice_s[node_id] >= self.config.checkpoint_write_s

    # ---- the round -------------------------------------------------------------------------

    def begin_round(self, now_s: float, interval_s: float) -> dict[str, float]:
        """Steps 1-3 of the module docstring; returns the nodes that left (preempted), with
        their preemption times."""
        gone: dict[str, float] = {}
        for iid, inst in list(self.instances.items()):
            if inst.preempt_at_s is not None and inst.preempt_at_s <= now_s:
                self._end(iid, inst.preempt_at_s, "preempted")
                gone[iid] = inst.preempt_at_s
        for inst in self.instances.values():
            price = inst.offering.price.price_at(now_s)
            if price != inst.usd_per_hour:
                self.ledger.price_change(inst.instance_id, now_s, price)
                inst.usd_per_hour = price
        self._trace_preemptions(now_s, now_s + interval_s)
        return gone

    def reconcile(
        self, now_s: float, target: Mapping[str, int], used_gpus: Mapping[str, int]
    ) -> set[str]:
        """Step 5: launch and release toward ``target``; returns the ids of ready nodes
        released. ``used_gpus`` counts job GPUs per node id (released last)."""
        released: set[str] = set()
        unknown = set(target) - {o.key for o in self.config.offerings}
        if unknown:
            raise InvalidInputError(
                f"unknown offerings in the plan: {sorted(unknown)}", field="plan"
            )
        held = self.held()
        for o in self.config.offerings:
            want = max(0, int(target.get(o.key, 0)))
            have = held.get(o.key, 0)
            if want < have:
                mine = [i for i in self.instances.values() if i.offering.key == o.key]
                mine.sort(
                    key=lambda i: (
                        i.ready_at_s <= now_s,  # pending first
                        used_gpus.get(i.instance_id, 0),
                        -i.launched_at_s,
                        i.instance_id,
                    )
                )
                for inst in mine[: have - want]:
                    if inst.ready_at_s <= now_s:
                        released.add(inst.instance_id)
                    self._end(inst.instance_id, now_s, "released")
        held = self.held()
        for o in self.config.offerings:
            want = max(0, int(target.get(o.key, 0)))
            have = held.get(o.key, 0)
            for k in range(want - have):
                if not self._launch(o, now_s, have + k):
                    break
        budget = self.config.budget_usd_per_hour
        price = self.usd_per_hour()
        self._budget_peak_usd_per_hour = max(self._budget_peak_usd_per_hour, price)
        if budget is not None and price > budget + 1e-9:
            raise BudgetExceededError(
                f"{self.config.strategy.name}: fleet at {price:.4f} $/h exceeds the budget "
                f"{budget:.4f} $/h at t={now_s:.0f} s"
            )
        return released

    def close(self, now_s: float) -> CostRecord:
        for iid in list(self.instances):
            self._end(iid, now_s, "end_of_run")
        return self.ledger.close(now_s)

    @property
    def peak_usd_per_hour(self) -> float:
        return self._budget_peak_usd_per_hour

    # ---- internals -------------------------------------------------------------------------

    def _launch(self, o: CloudOffering, now_s: float, held: int) -> bool:
        """Launch one instance of ``o`` (``held`` of it held already); ``False`` if the
        offering is unavailable or at capacity (then marked unavailable)."""
        if self.unavailable_until.get(o.key, -math.inf) > now_s:
            return False
        if o.preemption is not None:
            cap = o.preemption.capacity_at(now_s)
            if cap is not None and held >= cap:
                self.capacity_errors += 1
                self.unavailable_until[o.key] = now_s + self.config.unavailable_s
                return False
        self._serial += 1
        iid = f"{o.gpu_type.lower()}-{self._serial:05d}"
        price = o.price.price_at(now_s)
        ready = now_s + self.config.provisioning_delay_s
        inst = _Instance(iid, o, now_s, ready, price)
        inst.node = NodeView(iid, o.gpu_type, o.gpus, o.ref)
        if o.preemption is not None:
            inst.preempt_at_s = o.preemption.preemption_time_s(iid, now_s)
        self.instances[iid] = inst
        self.notice_s[iid] = o.notice_s
        self.launches += 1
        self.ledger.launch(
            iid,
            offering_key=o.key,
            provider=o.ref.provider,
            instance_type=o.ref.instance_type,
            gpu_type=o.gpu_type,
            gpus=o.gpus,
            zone=o.ref.zone,
            market=o.ref.market,
            t_s=now_s,
            usd_per_hour=price,
            min_billed_s=self.config.min_billed_s,
            ondemand_usd_per_hour=o.ondemand_usd_per_hour,
        )
        return True

    def _end(self, iid: str, t_s: float, reason: str) -> None:
        self.instances.pop(iid)
        if reason == "preempted":
            self.preemptions += 1
        self.ledger.end(iid, t_s, reason)

    def _trace_preemptions(self, t0_s: float, t1_s: float) -> None:
        """Capacity drops of replayed traces in ``(t0_s, t1_s]`` preempt the newest instances
        of the offering held above the new capacity."""
        for o in self.config.offerings:
            if o.preemption is None:
                continue
            for t_s, cap in o.preemption.capacity_changes(t0_s - 1e-9, t1_s):
                mine = [
                    i
                    for i in self.instances.values()
                    if i.offering.key == o.key and (i.preempt_at_s is None or i.preempt_at_s > t_s)
                ]
                surplus = len(mine) - max(0, cap)
                if surplus <= 0:
                    continue
                mine.sort(key=lambda i: (i.launched_at_s, i.instance_id))
                for inst in mine[len(mine) - surplus :]:
                    inst.preempt_at_s = max(t_s, t0_s)
