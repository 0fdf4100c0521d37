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

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autoscaler.controller.jobs import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.loop import Controller, ControllerConfig, RoundReport
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import JobBatch, Store
from autoscaler.fleet import FleetStrategy
from autoscaler.jobs import Allocation, BatchChoice, Oracle
from autoscaler.policy.base import Policy
from coadapt_common.clock import FakeClock
from providers.base import Market, Offering
from providers.fake import FakeProvider
from trainer.report import TrainerReport

__all__ = ["CLUSTER_ID", "SIM_PROVIDER", "World", "WorldConfig"]

_AGENT_UP = (InstanceStatus.RUNNING, InstanceStatus.DRAINING)
CLUSTER_ID = "sim"
SIM_PROVIDER = "sim"


@dataclass(frozen=True)
class WorldConfig:
    """The controller's settings in a simulation: its round interval, the restart delay the
    policy plans with, the interference avoidance and refit tolerance of the run, and how
    many rounds it may take to bring up a fixed fleet before the first job (``warmup_rounds``,
    run at negative times)."""

    interval_s: float = 60.0
    restart_delay_s: float = 30.0
    interference_avoidance: bool = True
    refit_tolerance: float = 0.05
    max_job_retries: int = 3
    warmup_rounds: int = 8


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
        capacity: Mapping[str, int | None] | None = None,
    ) -> None:
        self.config = config
        self.clock = FakeClock(start_s=-config.warmup_rounds * config.interval_s)
        self._dir = Path(tempfile.mkdtemp(prefix="coadapt-sim-"))
        try:
            self.store = Store.create(self._dir / "store.db", CLUSTER_ID, self.clock)
            self.store.set_durable(False)
            self.provider = FakeProvider(
                offerings, capacity, clock=self.clock, name=SIM_PROVIDER, boot_s=boot_s
            )
            counter = iter(range(1, 1 << 62))
            self.controller = Controller(
                self.store,
                self.provider,
                self.clock,
                ControllerConfig(
                    cluster_id=CLUSTER_ID,
                    interval_s=config.interval_s,
                    policy=str(policy.name),
                    restart_delay_s=config.restart_delay_s,
                    max_job_retries=config.max_job_retries,
                    interference_avoidance=config.interference_avoidance,
                    refit_tolerance=config.refit_tolerance,
                    reconcile=ReconcileConfig(),
                    offerings_refresh_s=config.interval_s,
                ),
                strategy=strategy,
                unavailable=self.provider.unavailable,
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
        """A job submitted now, as the API adds it."""
        self.store.add_job(spec.name, spec.to_json())

    def report(self, report: TrainerReport) -> None:
        """A trainer's report, stored as the API stores it."""
        self.store.add_report(report.job_id, report.to_json())

    def exited(self, name: str, *, failed: bool = False) -> None:
        """A job's processes ended on their own (the agent reports it)."""
        self.controller.job_exited(name, failed=failed)

    def heartbeat(self) -> None:
        """Every running instance's agent is alive now."""
        now = self.clock.now_s()
        for row in self.store.list_instances(statuses=_AGENT_UP):
            if row.provider_instance_id is not None:
                self.store.record_heartbeat(row.instance_key, now)

    # ---- the round -------------------------------------------------------------------------

    def run_round(self) -> RoundReport:
        """The product's round, after the agents' heartbeats."""
        self.heartbeat()
        return self.controller.run_round()

    def plan(self) -> tuple[dict[str, Allocation], dict[str, BatchChoice]]:
        """What the controller planned for each job: its GPUs by instance key (what its node
        agents read) and its batch (what the API answers its trainer)."""
        alloc: dict[str, dict[str, int]] = {}
        for (job, key), gpus in self.store.list_assignments().items():
            alloc.setdefault(job, {})[key] = gpus
        batches = {name: _choice(b) for name, b in self.store.list_batches().items()}
        return {job: Allocation(a) for job, a in alloc.items()}, batches

    def instance_types(self) -> dict[str, str]:
        """Instance key -> its instance type, for every instance the store knows."""
        return {r.instance_key: r.instance_type for r in self.store.list_instances()}

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
