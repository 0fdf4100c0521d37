"""The simulated world around the product's own controller.

The simulator replaces the world, never the decisions: a :class:`World` holds

- a **store**, a real SQLite file (:class:`~autoscaler.controller.store.Store`) in a
  temporary folder, written without waiting for the disk (it is thrown away at the end);
- a **cloud**: :class:`~providers.fake.FakeProvider` (the provider contract, its suite
  passes on it) on the simulation clock, with the cluster's offerings;
- the **agents' side**: a heartbeat of every running instance before each round, each
  job's submission as the API adds it, each trainer's :class:`~trainer.report.
  TrainerReport` as the API stores it, and each job's exit as the agent reports it
  (:func:`~autoscaler.controller.loop.record_job_exit`);
- and the product's :class:`~autoscaler.controller.loop.Controller`, whose
  :meth:`~autoscaler.controller.loop.Controller.run_round` (observe, decide, reconcile, act)
  runs unmodified every round, with the policy and the fleet strategy of the run.

The jobs' replay (true step times, statistical progress, restarts, checkpoints) is in
:mod:`autoscaler.sim.engine`, which reads back what the controller planned for each job (its
assignments and planned batch, from the store, as the node agent and the trainer do).
"""

from __future__ import annotations

import heapq
import math
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from autoscaler.accounting.costs import CostLedger, CostRecord
from autoscaler.controller.hold import HoldConfig
from autoscaler.controller.jobbook import JobSubmission, admit
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.loop import Controller, ControllerConfig, RoundReport
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import JobBatch, Store
from autoscaler.decide.fleet import FleetStrategy
from autoscaler.decide.policy.base import Policy
from autoscaler.decide.views import Allocation, BatchChoice, Oracle
from autoscaler.errors import InvalidInputError
from autoscaler.sim.cloud_config import BudgetExceededError, CloudConfig, CloudOffering
from coadapt_common.clock import FakeClock
from providers.base import Market, Offering
from providers.fake import FakeProvider
from trainer.report import TrainerReport

__all__ = ["CLUSTER_ID", "SIM_PROVIDER", "CloudWorld", "World", "WorldConfig"]

_AGENT_UP = (InstanceStatus.RUNNING, InstanceStatus.DRAINING)
_NOT_ENDED = tuple(s for s in InstanceStatus if s is not InstanceStatus.TERMINATED)
CLUSTER_ID = "sim"
SIM_PROVIDER = "sim"


@dataclass(frozen=True)
class WorldConfig:
    """The controller's settings in a simulation: its round interval, the restart delay the
    policy plans with, the interference avoidance and refit tolerance of the run, and how
    many rounds it may take to bring up a fixed fleet before the first job (``warmup_rounds``,
    run at negative times), and how long its decisions hold (``hold``)."""

    interval_s: float = 60.0
    restart_delay_s: float = 30.0
    interference_avoidance: bool = True
    refit_tolerance: float = 0.05
    max_job_retries: int = 3
    warmup_rounds: int = 8
    hold: HoldConfig = field(default_factory=HoldConfig)


class World:
    """One simulation's store, cloud, clock and controller (see the module docstring).
    Call :meth:`close` (or use it as a context manager) to remove its temporary folder."""

    def __init__(
        self,
        offerings: Sequence[Offering],
        strategy: FleetStrategy,
        policy: Policy,
        config: WorldConfig,
        *,
        oracle: Callable[[str], Oracle | None] | None = None,
        boot_s: float = 0.0,
        boot_time: Callable[[Offering], float] | None = None,
        capacity: Mapping[str, int | None] | None = None,
        provider_name: str = SIM_PROVIDER,
    ) -> None:
        self.config = config
        self.clock = FakeClock(start_s=-config.warmup_rounds * config.interval_s)
        self._iid_of: dict[str, str] = {}
        self._offering_of: dict[str, str] = {}
        self._rows_stale = True  # the store's rows changed since they were read
        self._dir = Path(tempfile.mkdtemp(prefix="coadapt-sim-"))
        try:
            self.store = Store.create(self._dir / "store.db", CLUSTER_ID, self.clock)
            self.store.set_durable(False)
            controller_config = ControllerConfig(
                cluster_id=CLUSTER_ID,
                interval_s=config.interval_s,
                policy=str(policy.name),
                restart_delay_s=config.restart_delay_s,
                max_job_retries=config.max_job_retries,
                interference_avoidance=config.interference_avoidance,
                refit_tolerance=config.refit_tolerance,
                reconcile=ReconcileConfig(),
                offerings_refresh_s=config.interval_s,
                hold=config.hold,
            )
            # One unavailable-offerings memory, with the controller's TTLs, shared with the
            # cloud's pool walk.
            unavailable = controller_config.unavailable_offerings(self.clock)
            self.provider = FakeProvider(
                offerings,
                capacity,
                clock=self.clock,
                name=provider_name,
                boot_s=boot_s,
                boot_time=boot_time,
                unavailable=unavailable,
            )
            counter = iter(range(1, 1 << 62))
            self.controller = Controller(
                self.store,
                self.provider,
                self.clock,
                controller_config,
                strategy=strategy,
                unavailable=unavailable,
                policy=policy,
                instance_keys=lambda: f"n{next(counter):05d}",
                oracle=oracle,
            )
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    # ---- time ------------------------------------------------------------------------------

    @property
    def now_s(self) -> float:
        return self.clock.now_s()

    def advance_to(self, t_s: float) -> None:
        """Move the clock forward to ``t_s`` (never back)."""
        if t_s > self.clock.now_s():
            self.clock.advance(t_s - self.clock.now_s())

    # ---- the agents' side ------------------------------------------------------------------

    def submit(self, spec: JobSubmission) -> None:
        """A job submitted now, as the API adds it (its deadline checked and fixed as the
        API does: :func:`~autoscaler.controller.jobbook.admit`, which refuses a deadline its
        declared length cannot meet)."""
        after, at, _ = admit(spec, self.now_s, self.store)
        self.store.add_job(spec.name, spec.to_json(), deadline_after_s=after, deadline_at_s=at)

    def report(self, report: TrainerReport) -> None:
        """A trainer's report, stored as the API stores it."""
        self.store.add_report(report.job_id, report.to_json())

    def exited(self, name: str, *, failed: bool = False) -> None:
        """A job's processes ended on their own (the agent reports it)."""
        self.controller.job_exited(name, failed=failed)

    def heartbeat(self) -> None:
        """Every booted instance's agent is alive now (an agent starts once its instance has
        booted: one the cloud still lists as pending is not heard)."""
        now = self.clock.now_s()
        booted = self.provider.booted_ids(CLUSTER_ID)
        for row in self.store.list_instances(statuses=_AGENT_UP):
            if row.provider_instance_id in booted:
                self.store.record_heartbeat(row.instance_key, now)

    # ---- the round -------------------------------------------------------------------------

    def run_round(self) -> RoundReport:
        """The product's round, after the agents' heartbeats."""
        self.heartbeat()
        self._rows_stale = True
        return self.controller.run_round()

    def plan(self) -> tuple[dict[str, Allocation], dict[str, BatchChoice]]:
        """What the controller planned for each job: its GPUs by instance key (what its node
        agents read) and its batch (what the API answers its trainer)."""
        alloc: dict[str, dict[str, int]] = {}
        for (job, key), gpus in self.store.list_assignments().items():
            alloc.setdefault(job, {})[key] = gpus
        batches = {name: _choice(b) for name, b in self.store.list_batches().items()}
        return {job: Allocation(a) for job, a in alloc.items()}, batches

    def running_instances(self) -> int:
        """Instances running in the store with a cloud id (a fixed fleet is up when all are)."""
        rows = self.store.list_instances(statuses=(InstanceStatus.RUNNING,))
        return sum(1 for r in rows if r.provider_instance_id is not None)

    def instance_ids(self) -> dict[str, str]:
        """Instance key -> the cloud's instance id, for every instance that got one."""
        self._refresh_rows()
        return dict(self._iid_of)

    def offering_keys(self) -> dict[str, str]:
        """Instance key -> its offering key, for every instance the store has had."""
        self._refresh_rows()
        return dict(self._offering_of)

    def _refresh_rows(self) -> None:
        """Read the live rows into the world's memory of every row (a row's offering never
        changes and its cloud id is set once: ended rows need no reading again)."""
        if not self._rows_stale:
            return
        self._rows_stale = False
        for r in self.store.list_instances(statuses=_NOT_ENDED):
            self._offering_of[r.instance_key] = r.offering_key
            if r.provider_instance_id is not None:
                self._iid_of[r.instance_key] = r.provider_instance_id

    def warm_up(self, ready: Callable[[], bool]) -> None:
        """Rounds before time 0 until ``ready()`` (a fixed fleet is up) or the warm-up runs
        out; the clock ends at 0."""
        for _ in range(self.config.warmup_rounds):
            if self.clock.now_s() >= 0:
                break
            self.run_round()
            self.advance_to(self.clock.now_s() + self.config.interval_s)
            if ready():
                break
        self.advance_to(0.0)

    def close(self) -> None:
        self.store.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _choice(batch: JobBatch) -> BatchChoice:
    return BatchChoice(batch.global_batch_size, batch.local_batch_size, batch.accum_steps)


def fixed_offering(instance_type: str, gpu_type: str, gpus: int) -> Offering:
    """The on-demand offering of a fixed cluster's node group (its price is nominal: a
    fixed fleet is never sized by price)."""
    return Offering(
        provider=SIM_PROVIDER,
        instance_type=instance_type,
        gpu_type=gpu_type,
        gpus=gpus,
        vcpus=8 * gpus,
        memory_gib=32.0 * gpus,
        region="sim",
        zone="sim-a",
        market=Market.ON_DEMAND,
        price_usd_per_hour=1.0 * gpus,
    )


@dataclass
class _Live:
    """A cloud instance the world bills: its offering and the preemption it was noticed of."""

    offering: CloudOffering
    launched_at_s: float
    deadline_s: float | None = None
    notice_s: float = 0.0


class CloudWorld(World):
    """A world whose cloud comes and goes (the simulator's cloud mode): the
    :class:`~autoscaler.sim.cloud_config.CloudConfig`'s offerings on a
    :class:`~providers.fake.FakeProvider` with its provisioning delay, spot prices moved
    along each offering's price series (the provider's catalogue, which the controller reads),
    spot preemptions from each offering's model (a replayed availability trace: capacity set
    on the pool and the newest instances above it preempted; or a hazard: one time per
    instance), each announced ``notice_s`` ahead through the provider's interruption notices;
    and the bill: a :class:`~autoscaler.accounting.costs.CostLedger` of every instance from its
    launch to its end at the price in effect, per-second with the provider's minimum (what the cloud
    charges, kept by the world, not by the controller)."""

    def __init__(
        self,
        cloud: CloudConfig,
        policy: Policy,
        config: WorldConfig,
        *,
        oracle: Callable[[str], Oracle | None] | None = None,
    ) -> None:
        self.cloud = cloud
        self._by_key = {o.key: o for o in cloud.offerings}
        provider_names = {o.ref.provider for o in cloud.offerings}
        if len(provider_names) != 1:
            raise InvalidInputError(
                f"a simulated cloud has one provider, got {sorted(provider_names)}",
                field="offerings",
            )
        offerings = [_offering(o) for o in cloud.offerings]
        super().__init__(
            offerings,
            cloud.strategy,
            policy,
            replace(config, warmup_rounds=0),
            oracle=oracle,
            boot_s=cloud.provisioning_delay_s,
            boot_time=None if cloud.boot is None else cloud.boot.draw_s,
            provider_name=provider_names.pop(),
        )
        self.ledger = CostLedger()
        self.live: dict[str, _Live] = {}
        self.ended_notice_s: dict[str, float] = {}
        self._preempted_at: dict[str, float] = {}
        self.launches = 0
        self.preemptions = 0
        self.peak_usd_per_hour = 0.0
        self._prices = {o.key: o.price.price_at(0.0) for o in cloud.offerings}
        self._events: list[tuple[float, int, str, str, int]] = []
        self._serial = 0
        self._looked_to_s = -math.inf
        for o in cloud.offerings:
            if o.preemption is not None:
                cap = o.preemption.capacity_at(0.0)
                if cap is not None:
                    self.provider.set_capacity(o.key, max(0, cap))

    # ---- the world's own events, in time order ---------------------------------------------

    def _push(self, t_s: float, kind: str, key: str, value: int = 0) -> None:
        self._serial += 1
        heapq.heappush(self._events, (t_s, self._serial, kind, key, value))

    def advance_to(self, t_s: float) -> None:
        """Move to ``t_s``, carrying out on the way every capacity change and preemption
        notice due (and ending, in the bill, every instance whose notice ran out)."""
        while self._events and self._events[0][0] <= t_s:
            at, _, kind, key, value = heapq.heappop(self._events)
            super().advance_to(at)
            if kind == "capacity":
                self.provider.set_capacity(key, max(0, value))
            elif kind == "squeeze":
                notice_s = next(o.notice_s for o in self.cloud.offerings if o.key == key)
                self._squeeze(key, value, deadline_s=at + notice_s)
            elif kind == "notice":
                self._notice(key, at + self._live_notice(key))
        super().advance_to(t_s)
        self._expire(self.clock.now_s())

    def _live_notice(self, iid: str) -> float:
        live = self.live.get(iid)
        return 0.0 if live is None else live.offering.notice_s

    def look_ahead(self, t0_s: float, t1_s: float) -> None:
        """Schedule what the offerings' models say happens in ``[t0_s, t1_s)``: a capacity
        change at ``t`` is set on the pool then, and instances above a lower capacity are
        noticed ``notice_s`` before it."""
        start = max(t0_s, self._looked_to_s)
        if t1_s <= start:
            return
        for o in self.cloud.offerings:
            if o.preemption is None:
                continue
            for t_s, cap in o.preemption.capacity_changes(start - 1e-9, t1_s - 1e-9):
                if t_s < start:
                    continue
                self._push(t_s, "capacity", o.key, cap)
                self._push(max(self.clock.now_s(), t_s - o.notice_s), "squeeze", o.key, cap)
        self._looked_to_s = t1_s

    def _squeeze(self, key: str, cap: int, *, deadline_s: float) -> None:
        """The newest instances of offering ``key`` above ``cap`` (not noticed already) are
        told they go at ``deadline_s``."""
        mine = [
            (live.launched_at_s, iid)
            for iid, live in self.live.items()
            if live.offering.key == key and live.deadline_s is None
        ]
        surplus = len(mine) - max(0, cap)
        for _, iid in sorted(mine)[max(0, len(mine) - surplus) :] if surplus > 0 else []:
            self._notice(iid, deadline_s)

    def _notice(self, iid: str, deadline_s: float) -> None:
        live = self.live.get(iid)
        if live is None or live.deadline_s is not None:
            return
        now = self.clock.now_s()
        deadline_s = max(deadline_s, now)
        live.deadline_s = deadline_s
        live.notice_s = deadline_s - now
        self.provider.preempt(iid, notice_s=deadline_s - now)

    def _expire(self, now_s: float) -> None:
        for iid, live in list(self.live.items()):
            if live.deadline_s is not None and live.deadline_s <= now_s:
                self._end(iid, live.deadline_s, "preempted")

    def _end(self, iid: str, t_s: float, reason: str) -> None:
        live = self.live.pop(iid)
        if live.deadline_s is not None:
            self.ended_notice_s[iid] = live.notice_s
        if reason == "preempted":
            self.preemptions += 1
            self._preempted_at[iid] = t_s
        self.ledger.end(iid, max(t_s, live.launched_at_s), reason)

    # ---- the round ---------------------------------------------------------------------------

    def run_round(self) -> RoundReport:
        """Prices in effect now into the catalogue (and the bill), the product's round, then
        the bill follows what the round launched and released."""
        now = self.clock.now_s()
        self._set_prices(now)
        self.look_ahead(now, now + self.config.interval_s + _NOTICE_HORIZON_S)
        report = super().run_round()
        self._observe(now)
        return report

    def _set_prices(self, now_s: float) -> None:
        for o in self.cloud.offerings:
            price = o.price.price_at(now_s)
            if price == self._prices[o.key]:
                continue
            self._prices[o.key] = price
            if o.ref.market == "spot":
                self.provider.set_spot_price(o.ref.instance_type, o.ref.zone, price)
            for iid, live in self.live.items():
                if live.offering.key == o.key:
                    self.ledger.price_change(iid, now_s, price)

    def _observe(self, now_s: float) -> None:
        listed = {i.instance_id: i for i in self.provider.list_instances(CLUSTER_ID)}
        for iid in sorted(set(self.live) - set(listed)):
            deadline = self.live[iid].deadline_s
            if deadline is None:
                self._end(iid, now_s, "released")
            else:  # noticed, drained and released before its deadline: the notice ended it
                self._end(iid, min(now_s, deadline), "preempted")
        for iid, inst in sorted(listed.items()):
            if iid in self.live:
                continue
            o = self._by_key[inst.offering_key]
            t = now_s if inst.launched_at_s is None else inst.launched_at_s
            self.live[iid] = _Live(o, t)
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
                t_s=t,
                usd_per_hour=self._prices[o.key],
                min_billed_s=self.cloud.min_billed_s,
                ondemand_usd_per_hour=o.ondemand_usd_per_hour,
            )
            if o.preemption is not None:
                t_p = o.preemption.preemption_time_s(iid, t)
                if t_p is not None:
                    self._push(max(now_s, t_p - o.notice_s), "notice", iid)
        usd = sum(self._prices[live.offering.key] for live in self.live.values())
        self.peak_usd_per_hour = max(self.peak_usd_per_hour, usd)
        budget = self.cloud.budget_usd_per_hour
        if budget is not None and usd > budget + 1e-9:
            raise BudgetExceededError(
                f"{self.cloud.strategy.name}: fleet at {usd:.4f} $/h exceeds the budget "
                f"{budget:.4f} $/h at t={now_s:.0f} s"
            )

    # ---- what the jobs see -------------------------------------------------------------------

    def preempted_in(self, t0_s: float, t1_s: float) -> dict[str, float]:
        """Cloud instance id -> preemption time, for the instances preempted in
        ``[t0_s, t1_s]``."""
        return {iid: t for iid, t in self._preempted_at.items() if t0_s <= t <= t1_s}

    def noticed(self, iid: str) -> bool:
        """Whether instance ``iid`` got a preemption notice (live or ended)."""
        live = self.live.get(iid)
        return (live is not None and live.deadline_s is not None) or iid in self.ended_notice_s

    def notice_suffices(self, iid: str) -> bool:
        """Whether the notice of ``iid``'s preemption left time to write a checkpoint."""
        notice = self.live[iid].notice_s if iid in self.live else self.ended_notice_s.get(iid, 0.0)
        return notice >= self.cloud.checkpoint_write_s

    def capacity_errors(self) -> int:
        """Launches the cloud answered with a capacity error."""
        return sum(
            1
            for r in self.store.list_instances()
            if any(
                h.status is InstanceStatus.ALLOCATION_FAILED and "capacity" in (h.reason or "")
                for h in self.store.history(r.instance_key)
            )
        )

    def close_bill(self, now_s: float) -> CostRecord:
        """Every instance still live ends now; the closed bill."""
        for iid in sorted(self.live):
            self._end(iid, now_s, "end_of_run")
        return self.ledger.close(now_s)


_NOTICE_HORIZON_S = 600.0
"""How far past a round the world looks for capacity drops (their notices come first)."""


def _offering(o: CloudOffering) -> Offering:
    return Offering(
        provider=o.ref.provider,
        instance_type=o.ref.instance_type,
        gpu_type=o.gpu_type,
        gpus=o.gpus,
        vcpus=8 * o.gpus,
        memory_gib=32.0 * o.gpus,
        region=o.region,
        zone=o.ref.zone,
        market=Market.SPOT if o.ref.market == "spot" else Market.ON_DEMAND,
        price_usd_per_hour=o.price.price_at(0.0),
    )
