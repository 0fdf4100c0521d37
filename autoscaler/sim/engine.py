"""The trace-driven cluster simulator: the product's controller under a simulated world.

Every decision is the product's. Each round of ``interval_s``, the
:class:`~autoscaler.sim.world.World` runs :meth:`Controller.run_round
<autoscaler.controller.loop.Controller.run_round>` unmodified (observe, decide, reconcile, act,
over its store, a real SQLite file, its fleet strategy and the run's policy); then each job does
what the controller told it, as its node agent and its trainer would (its assignments and
planned batch, read back from the store): a new set of GPUs is a relaunch that costs
``restart_delay_s`` without progress in the ideal world, a measured restart time in the
measured one (``SimConfig.world``, :mod:`autoscaler.sim.truths`; a planned stop writes a
checkpoint first; the first start pays the delay too) and starts with the planned batch; a
new batch on the same GPUs is applied without one when the real trainer applies it: it learns
the batch from the reply to its next report (sent at the round's end) and runs it from the
next round on (the trainer adopts it within a step of the reply, :mod:`trainer.stepping`,
"Batch changes", which the simulator rounds to the next round). The world replaces what is
outside the product: the clock, the cloud
(:class:`~providers.fake.FakeProvider`; a fixed cluster is a fleet the controller holds with
:class:`~autoscaler.decide.strategies.FixedFleet`, brought up before time 0; cloud mode is
:class:`~autoscaler.sim.world.CloudWorld`), the agents (heartbeats, exits) and the trainers,
which replay the traces:

- a job's true iteration time at its placement and micro-batch comes from
  :meth:`~autoscaler.model.traces.AppTrace.step_time_s` (plus one compute time per extra
  accumulation step), slowed by ``interference`` when it spans nodes and shares a node with another
  multi-node job; on several GPU types (only type-unaware baselines do that) it runs at its
  slowest type's pace;
- its statistical progress, in initial-batch-size iterations, grows by the true AdaScale gain of
  its total batch at its current progress per iteration
  (:meth:`~autoscaler.model.traces.AppTrace.progress_curve`);
- at the end of each round it ran, its trainer sends the same
  :class:`~trainer.report.TrainerReport` a real one sends, stored as the API stores it: the
  configurations of its launch with their true times, its gradient statistics (the true ones
  at its progress and batch), its progress, its declared length (``SimConfig.lengths``:
  every script declares its length, or none does) and whether it is done;
- it completes, at a fractional time, when its progress reaches the application's target (the
  trainer's "done" rule, :func:`trainer.report.is_done`); its processes then exit, which the
  agent reports (:meth:`Controller.job_exited <autoscaler.controller.loop.Controller.job_exited>`).

So the policy learns what the controller learns, when it learns it: throughput models fitted
online from the reports (the controller's :class:`~autoscaler.controller.jobbook.JobBook`), the
remaining work only from a declared length and only after the first report, attained service
and restarts from the store's assignment history (the results' restarts are the store's
count too: one definition). The one exception is an oracle baseline
(``optimus``, the Pollux paper's Optimus+Oracle), which is handed the true remaining iterations
by a hook a real cluster does not have.

Results (per job: JCT, GPU-seconds, restarts, finish-time fairness; per round: the policy's
wall time and, timed apart from it, the online model fitting, both measured inside the
controller's round) are in :class:`~autoscaler.sim.results.SimResult`.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final, TypeVar

from autoscaler.accounting.billing import churn_from_store, cost_record_from_store, run_origin_s
from autoscaler.accounting.churn import ChurnFigures
from autoscaler.accounting.costs import CostRecord
from autoscaler.controller.errors import RoundError
from autoscaler.controller.hold import HoldConfig
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.store import JobStatus
from autoscaler.decide.policy.base import Policy
from autoscaler.decide.strategies import FixedFleet
from autoscaler.decide.views import Allocation, BatchChoice, Oracle, fixed_batch_choice
from autoscaler.errors import AutoscalerError, InvalidInputError
from autoscaler.model.goodput import (
    BatchLimits,
    GradParams,
)
from autoscaler.model.gputypes import SpeedTable, default_speed_table
from autoscaler.model.traces import AppTrace, load_app
from autoscaler.sim.cluster import NodeGroup, TypeSpeed
from autoscaler.sim.config import PAPER_POLICIES, SimConfig
from autoscaler.sim.results import JobResult, RoundStats, SimResult
from autoscaler.sim.truths import WorldTruths
from autoscaler.sim.workload import TraceJob
from autoscaler.sim.world import CloudWorld, World, WorldConfig, fixed_offering
from providers.base import Offering
from trainer.report import (
    BatchConfig,
    GradientStats,
    JobHints,
    ProfileEntry,
    TrainerReport,
)

__all__ = ["SimulationError", "Simulator", "isolated_jct_s", "simulate"]

_GNS_EVERY_STEPS: Final = 16
"""The trainer's default gradient-noise measurement interval, in optimizer steps
(``trainer.options.JobOptions.gns_every_steps``, which imports torch: a test holds the two
equal)."""
_GNS_SMOOTHING: Final = 0.95
"""The trainer's default EMA weight of the past per gradient-noise measurement
(``trainer.options.JobOptions.gns_smoothing``; a test holds the two equal)."""
_MAX_PROFILE_STEPS: Final = 10**9
_K = TypeVar("_K")


def _ema_rho(n0: int, n: int) -> float:
    """How the trainer's gradient EMA after ``n`` measurements correlates with itself after
    ``n0 <= n``: the error it had keeps a weight of smoothing**(n - n0)."""
    return float(_GNS_SMOOTHING ** max(n - n0, 0))


def _running_mean_rho(n0: int, n: int) -> float:
    """How a running mean over ``n`` samples correlates with itself at ``n0 <= n``."""
    return math.sqrt(min(n0 / n, 1.0))


def _profile_key(placement: tuple[int, ...], batch: BatchChoice) -> tuple[int, int, int, int]:
    """A profiled configuration: GPUs, nodes, per-GPU batch, accumulation steps."""
    return (sum(placement), len(placement), batch.local_bsz, batch.accum_steps)


class SimulationError(AutoscalerError):
    """The simulation cannot proceed (a policy broke an invariant, or it ran past its limit)."""


@dataclass
class _Job:
    """Mutable simulator-side state of one job (never handed to a policy)."""

    spec: TraceJob
    index: int
    app: AppTrace
    limits: BatchLimits
    allocation: Allocation
    batch: BatchChoice | None = None  # the batch it runs
    planned: BatchChoice | None = None  # the controller's latest plan: its next report's reply
    progress: float = 0.0
    delay_left_s: float = 0.0
    starts: int = 0
    attained_gpu_s: float = 0.0
    completion_s: float | None = None
    grad: GradParams | None = None
    grad_key: tuple[int, int] | None = None
    sharers_s: float = 0.0  # integral of (active jobs) dt over the job's life
    oracle_times: tuple[float, ...] | None = None
    # Cloud mode: progress at the last checkpoint, running seconds since, preemptions.
    checkpoint_progress: float = 0.0
    since_checkpoint_s: float = 0.0
    preemptions: int = 0
    # What its trainer reports: the launch it runs (its start time) and the configurations
    # profiled in that launch (a new launch reports from zero, as a real trainer does).
    launch_s: float = 0.0
    profiles: dict[tuple[int, int, int, int], ProfileEntry] = field(default_factory=dict)
    config_steps: dict[tuple[int, int, int, int], float] = field(default_factory=dict)
    steps: float = 0.0  # optimizer steps run in all (the gradient estimator's measurements)
    # Measured world: per reading stream, its last standard normal and measurement count:
    # the gradient statistics (kept across launches, as the checkpoint keeps the estimator)
    # and each profiled configuration's step time (of this launch, as ``profiles``).
    grad_z: dict[str, tuple[float, int]] = field(default_factory=dict)
    profile_z: dict[tuple[int, int, int, int], tuple[float, int]] = field(default_factory=dict)
    ran: bool = False  # ran this round: it reports at the round's end
    last_run: tuple[BatchChoice, Allocation] | None = None  # what it last ran on
    restarts: int = 0  # as the controller's store counts them (its one definition)
    # The global batches it trained with, each from the round it started running it (its
    # changes only): the batch history the churn figures need, which the store does not keep.
    batches: list[tuple[float, int]] = field(default_factory=list)


def _limits(app: AppTrace, max_local_bsz: int | None = None) -> BatchLimits:
    return BatchLimits(
        init_batch_size=app.init_batch_size,
        max_batch_size=app.max_batch_size,
        max_local_bsz=app.max_local_bsz if max_local_bsz is None else max_local_bsz,
        min_local_bsz=app.min_local_bsz,
    )


def _iteration_time_s(app: AppTrace | TypeSpeed, placement: tuple[int, ...], batch: BatchChoice):
    """True (seconds per iteration, sync seconds) with ``batch.accum_steps`` micro-batches."""
    step, sync = app.step_time_s(placement, batch.local_bsz)
    return step + (batch.accum_steps - 1) * (step - sync), sync


def _packed(num_gpus: int, per_node: int) -> tuple[int, ...]:
    full, rest = divmod(num_gpus, per_node)
    return (per_node,) * full + ((rest,) if rest else ())


def isolated_jct_s(
    spec: TraceJob, share_gpus: float, per_node: int, traces_root: Path | None = None
) -> float:
    """JCT of ``spec`` alone on ``share_gpus`` GPUs (may be fractional): trained at its own
    batch size on ``g = max(1, floor(share))`` GPUs packed onto the fewest nodes (at most its
    batch's worth of micro-batches), on the traces' T4 speeds, without restarts, its time
    scaled by ``g / share`` (a fractional share is a time-slice). The reference of the
    finish-time fairness ratio."""
    app = load_app(spec.application, traces_dir=traces_root)
    limits = _limits(app)
    batch_size = min(max(spec.batch_size, app.init_batch_size), app.max_batch_size)
    g = max(1, min(math.floor(share_gpus), batch_size // app.min_local_bsz))
    choice = fixed_batch_choice(batch_size, g, limits)
    t_iter, _ = _iteration_time_s(app, _packed(g, per_node), choice)
    iters = float(app.progress_curve(choice.batch_size).iterations(app.target_progress))
    return iters * t_iter * g / max(share_gpus, 1e-9)


class Simulator:
    """Replays one workload under one policy (see the module docstring).

    ``run()`` drives the simulation to completion and returns a
    :class:`~autoscaler.sim.results.SimResult`. ``on_round(now_s, done, total)`` is called
    after each simulated round (for progress bars). Deterministic for a given config and
    workload; the per-round policy wall times are the only measured (non-simulated) values.
    """

    def __init__(
        self,
        jobs: tuple[TraceJob, ...] | list[TraceJob],
        policy: Policy,
        config: SimConfig | None = None,
        *,
        workload_name: str = "workload",
        on_round: Callable[[float, int, int], None] | None = None,
    ) -> None:
        if not jobs:
            raise InvalidInputError("a workload needs at least one job", field="jobs")
        self.config = config or SimConfig()
        self.policy = policy
        self.workload_name = workload_name
        self.on_round = on_round
        self.speeds: SpeedTable = default_speed_table()
        cfg = self.config
        self.truths = WorldTruths.build(cfg.world, cfg.seed, cfg.speed_error)
        self._group: dict[str, NodeGroup] = {}  # instance key -> its node group (true speeds)
        self._type_speed: dict[tuple[str, NodeGroup], TypeSpeed] = {}
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].submit_time_s, i))
        self.jobs: list[_Job] = []
        root = self.config.traces_root
        for rank, i in enumerate(order):
            spec = jobs[i]
            app = load_app(spec.application, traces_dir=root)
            self.jobs.append(_Job(spec, rank, app, _limits(app), Allocation()))
        self.now_s = 0.0
        self.round_index = 0
        self.rounds: list[RoundStats] = []
        self._by_name = {job.spec.name: job for job in self.jobs}
        self._submitted = 0  # jobs (in submission order) handed to the world's store
        self.cloud: CloudWorld | None = None
        self._group_of_key: dict[str, NodeGroup] = {}  # offering key -> its node group
        self._iid: dict[str, str] = {}  # instance key -> cloud instance id
        if self.config.cloud is None:
            self.world: World = self._fixed_world()
        else:
            cloud = self.config.cloud
            cheapest = min(o.price.price_at(0.0) for o in cloud.offerings)
            if cloud.budget_usd_per_hour is not None and cloud.budget_usd_per_hour < cheapest:
                raise InvalidInputError(
                    f"budget {cloud.budget_usd_per_hour:.2f} $/h is below the cheapest "
                    f"offering's price {cheapest:.4f} $/h: nothing could be launched",
                    field="budget_usd_per_hour",
                )
            self._group_of_key = {o.key: o.group for o in cloud.offerings}
            self.cloud = CloudWorld(cloud, policy, self._world_config(), oracle=self._oracle_hook())
            self.world = self.cloud

    # ---- main loop -------------------------------------------------------------------------

    def _fixed_world(self) -> World:
        """The product's controller over a static fleet: one on-demand offering per node
        group, held at the group's count by :class:`~autoscaler.decide.strategies.FixedFleet`."""
        offerings: list[Offering] = []
        counts: dict[str, int] = {}
        types: set[str] = set()
        for i, group in enumerate(self.config.cluster_spec.groups):
            itype = group.instance_type
            if itype in types:
                itype = f"{itype}.g{i}"
            types.add(itype)
            o = fixed_offering(itype, group.gpu_type, group.gpus_per_node)
            offerings.append(o)
            counts[o.key] = counts.get(o.key, 0) + group.count
            self._group_of_key[o.key] = group
        world = World(
            offerings,
            FixedFleet("fixed", counts),
            self.policy,
            self._world_config(),
            oracle=self._oracle_hook(),
        )
        total = sum(counts.values())
        world.warm_up(lambda: world.running_instances() >= total)
        return world

    def _world_config(self) -> WorldConfig:
        cfg = self.config
        return WorldConfig(
            interval_s=cfg.interval_s,
            restart_delay_s=cfg.restart_delay_s,
            interference_avoidance=cfg.interference_avoidance,
            refit_tolerance=cfg.refit_tolerance,
            hold=HoldConfig(rounds=0) if self.policy.name in PAPER_POLICIES else HoldConfig(),
        )

    def _oracle_hook(self) -> Callable[[str], Oracle | None] | None:
        return self._oracle_of if self.policy.uses_oracle else None

    def _oracle_of(self, name: str) -> Oracle | None:
        """Ground truth for an oracle baseline (the Pollux paper's Optimus+Oracle): a
        simulator's hook; a real cluster has none."""
        job = self._by_name.get(name)
        return None if job is None else self._oracle(job)

    def _walk_to(self, t_s: float) -> None:
        """World mode: the clock moves to ``t_s``, each job submitted on the way added to the
        store at its own submission time, as the API adds it."""
        world = self.world
        while self._submitted < len(self.jobs):
            job = self.jobs[self._submitted]
            if job.spec.submit_time_s > t_s:
                break
            world.advance_to(job.spec.submit_time_s)
            world.submit(self._submission(job))
            if self.cloud is not None:
                self.cloud.ledger.job_event(job.spec.name, job.spec.submit_time_s, "submitted")
            self._submitted += 1
        world.advance_to(t_s)

    def _submission(self, job: _Job) -> JobSubmission:
        """The job as its user submits it: the application's batch limits, its own GPUs and
        batch size (what a fixed-batch policy gives it), whether it adapts, its deadline (a
        duration after submission), and the markets and offerings the config gives it."""
        app = job.app
        return JobSubmission(
            name=job.spec.name,
            init_batch_size=app.init_batch_size,
            max_batch_size=app.max_batch_size,
            max_local_bsz=app.max_local_bsz,
            min_local_bsz=app.min_local_bsz,
            application=job.spec.application,
            adaptive=job.spec.application not in self.config.fixed_applications,
            requested_gpus=max(1, job.spec.num_replicas),
            batch_size=max(1, job.spec.batch_size),
            command=(f"{job.spec.application}.py",),
            deadline=job.spec.deadline_after_s,
            markets=dict(self.config.job_markets).get(job.spec.name),
            offerings=dict(self.config.job_offerings).get(job.spec.name),
        )

    def run(self) -> SimResult:
        try:
            return self._run()
        finally:
            self.world.close()

    def _run(self) -> SimResult:
        started = time.perf_counter()
        cfg = self.config
        pending = list(self.jobs)  # sorted by submission
        active: list[_Job] = []
        done = 0
        while pending or active:
            self._walk_to(self.now_s)
            while pending and pending[0].spec.submit_time_s <= self.now_s:
                active.append(pending.pop(0))
            if not active and self.cloud is not None and self.cloud.live:
                self._round([])  # the fleet is billed while it waits: the controller sizes it
                self._walk_to(self.now_s + cfg.interval_s)
                self.now_s += cfg.interval_s
                self.round_index += 1
                continue
            if not active:
                # Fast-forward to the first round at or after the next submission.
                gap = pending[0].spec.submit_time_s - self.now_s
                skip = max(1, math.ceil(gap / cfg.interval_s - 1e-9))
                self.now_s += skip * cfg.interval_s
                self.round_index += skip
                self._walk_to(self.now_s)
                continue
            if self.now_s > cfg.max_time_s:
                raise SimulationError(
                    f"{len(active) + len(pending)} jobs unfinished after {cfg.max_time_s:.0f} s "
                    f"under {self.policy.name}"
                )
            self._round(active)
            self._walk_to(self.now_s + cfg.interval_s)  # the world's events of the round
            self._advance(active)
            finished = [job for job in active if job.completion_s is not None]
            self._report(active)
            if finished:
                done += len(finished)
                active = [job for job in active if job.completion_s is None]
            self.now_s += cfg.interval_s
            self.round_index += 1
            if self.on_round is not None:
                self.on_round(self.now_s, done, len(self.jobs))
        return self._result(time.perf_counter() - started)

    # ---- scheduling ------------------------------------------------------------------------

    def _round(self, active: list[_Job]) -> None:
        """World mode: the controller's round, then each job does what it was told: a new
        set of GPUs is a relaunch (a planned stop checkpoints first), a new batch on the
        same GPUs is applied without one (the trainer's contract)."""
        world = self.world
        try:
            report = world.run_round()
        except RoundError as e:
            raise SimulationError(f"round {self.round_index}: {e}") from e
        if report.error is not None:
            raise SimulationError(f"round {self.round_index}: {report.error}")
        allocs, batches = world.plan()
        self._group = {key: self._group_of_key[okey] for key, okey in world.offering_keys().items()}
        self._iid = world.instance_ids()
        restarts = world.store.restart_counts([job.spec.name for job in active])
        for job in active:
            name = job.spec.name
            restarted = restarts.get(name, 0) > job.restarts
            job.restarts = restarts.get(name, job.restarts)
            self._obey(job, allocs.get(name, Allocation()), batches.get(name), restarted)
        self._check_ended(active)
        used = sum(job.allocation.num_gpus for job in active)
        self.rounds.append(RoundStats(self.now_s, len(active), used, report.policy_s, report.fit_s))

    def _obey(
        self, job: _Job, alloc: Allocation, batch: BatchChoice | None, restarted: bool
    ) -> None:
        """``job`` takes the allocation and batch the controller planned; ``restarted``: the
        store counted a restart of it this round (the bill's ``restart`` event follows the
        store's one definition, :mod:`autoscaler.controller.store.assignment_table`)."""
        gpus = alloc.num_gpus
        if gpus and batch is None:
            raise SimulationError(f"{job.spec.name} holds {gpus} GPUs without a planned batch")
        if alloc != job.allocation:
            if job.allocation.num_gpus:  # a planned stop writes a checkpoint
                job.checkpoint_progress = job.progress
                job.since_checkpoint_s = 0.0
            moved_off = self._noticed(job.allocation)
            job.allocation = alloc
            job.profiles = {}
            job.config_steps = {}
            job.profile_z = {}
            if moved_off:  # the controller moved it off an instance the cloud takes back
                job.preemptions += 1
                assert self.cloud is not None
                self.cloud.ledger.job_event(job.spec.name, self.now_s, "preemption")
            if restarted and self.cloud is not None:
                self.cloud.ledger.job_event(job.spec.name, self.now_s, "restart")
            if gpus:
                job.starts += 1
                job.delay_left_s = self.truths.restart_s(job.app.name, self.config.restart_delay_s)
                job.launch_s = self.now_s
            else:
                job.delay_left_s = 0.0
            job.batch = batch if gpus else None  # a (re)launch starts with the plan's batch
            self._ran_batch(job, self.now_s)
        job.planned = batch if gpus else None
        if not gpus:
            job.batch = None

    @staticmethod
    def _ran_batch(job: _Job, from_s: float) -> None:
        """Note the batch ``job`` runs from ``from_s`` in its batch history (changes only)."""
        batch = job.batch
        if batch is not None and (not job.batches or job.batches[-1][1] != batch.batch_size):
            job.batches.append((from_s, batch.batch_size))

    def _reply(self, job: _Job) -> None:
        """The API's reply to ``job``'s report: the controller's latest plan for it, which
        its trainer runs from the next round on (a job that lost its GPUs meanwhile keeps
        none)."""
        if job.allocation.num_gpus and job.planned is not None and job.planned != job.batch:
            job.batch = job.planned
            self._ran_batch(job, self.now_s + self.config.interval_s)

    def _noticed(self, alloc: Allocation) -> bool:
        """Whether any node of ``alloc`` has a preemption notice."""
        if self.cloud is None or not alloc:
            return False
        return any(self.cloud.noticed(self._iid.get(n, "")) for n in alloc)

    def _check_ended(self, active: list[_Job]) -> None:
        """A job the controller refused or failed can never finish: the run stops, saying
        why (a simulated workload's jobs are all schedulable)."""
        world = self.world
        names = {job.spec.name for job in active}
        for row in world.store.list_jobs(statuses=(JobStatus.REFUSED, JobStatus.FAILED)):
            if row.name in names:
                raise SimulationError(
                    f"{self.policy.name}: the controller {row.status.value} {row.name}: "
                    f"{row.reason}"
                )

    def _report(self, active: list[_Job]) -> None:
        """World mode, at the round's end: each job that ran sends its trainer's report (the
        configurations of its launch with their true times, its gradient statistics, its
        progress and declared length, whether it is done), and each finished job's
        processes exit."""
        world = self.world
        now = world.now_s
        for job in active:
            if not job.ran:
                continue
            job.ran = False
            assert job.last_run is not None and job.grad is not None
            batch, alloc = job.last_run
            app = job.app
            world.report(
                TrainerReport(
                    job_id=job.spec.name,
                    attempt=job.starts,
                    started_at_s=job.launch_s,
                    sent_at_s=now,
                    world_size=alloc.num_gpus,
                    num_nodes=alloc.num_nodes,
                    batch=BatchConfig(batch.batch_size, batch.accum_steps),
                    step=0,
                    skipped_steps=0,
                    epoch=app.epoch_of(job.progress),
                    epoch_position=0,
                    progress=job.progress,
                    gradient=self._gradient_reading(job),
                    profiles=self._profile_readings(job),
                    hints=JobHints(app.init_batch_size, app.max_batch_size),
                    target_progress=self._declared(job),
                    done=job.completion_s is not None,
                )
            )
            if job.completion_s is not None:
                world.exited(job.spec.name)
            else:
                self._reply(job)

    def _gradient_reading(self, job: _Job) -> GradientStats:
        """The gradient statistics ``job``'s trainer reports: the true ones in the ideal world;
        in the measured one a reading with the spread our estimator shows after as many
        measurements as the job has made (one every ``gns_every_steps`` optimizer steps, its
        state carried across restarts in the checkpoint, as the trainer's is)."""
        assert job.grad is not None
        sqr, var = job.grad.grad_sqr, job.grad.grad_var
        noise, init = self.truths.noise(job.app.name), job.app.init_batch_size
        if noise.exact:
            return GradientStats(init, sqr, var, 1, False)
        n = max(1, int(job.steps // _GNS_EVERY_STEPS))
        # Correlated from report to report as the trainer's EMA is (:func:`_ema_rho`): a
        # world that drew them afresh would shake the policy more than a trainer does.
        rho = functools.partial(_ema_rho, n=n)
        sqr_z = self._z(job.grad_z, "grad_sqr", n, rho)
        var_z = self._z(job.grad_z, "grad_var", n, rho)
        return GradientStats(
            init,
            noise.reading(sqr, "grad_sqr", n, sqr_z),
            noise.reading(var, "grad_var", n, var_z) if var > 0 else var,
            n,
            False,
        )

    def _z(
        self,
        streams: dict[_K, tuple[float, int]],
        stream: _K,
        n: int,
        rho: Callable[[int], float],
    ) -> float:
        """The standard normal behind a job's reading of ``stream`` (one of ``streams``, the
        job's ``grad_z`` or ``profile_z``) at ``n`` measurements: the last one's, kept with
        correlation ``rho(n_last)``, plus fresh noise (seeded, :attr:`WorldTruths.rng`)."""
        eps = self.truths.rng.gauss(0.0, 1.0)
        last = streams.get(stream)
        if last is None:
            z = eps
        else:
            r = min(max(rho(last[1]), 0.0), 1.0)
            z = r * last[0] + math.sqrt(1.0 - r * r) * eps
        streams[stream] = (z, n)
        return z

    def _profile_readings(self, job: _Job) -> tuple[ProfileEntry, ...]:
        """The profile ``job``'s trainer reports of its launch: the true times in the ideal
        world; in the measured one each configuration's mean over the steps it ran (their
        count reported), read with the spread our profiler shows after that many steps (the
        step, compute and sync times scaled alike), its error carried from report to report
        as a running mean's is."""
        noise = self.truths.noise(job.app.name)
        if noise.exact:
            return tuple(job.profiles.values())
        out = []
        for config, entry in job.profiles.items():
            steps = max(1, min(int(job.config_steps.get(config, 1.0)), _MAX_PROFILE_STEPS))
            # A mean over the steps so far: the one at n0 steps correlates sqrt(n0/n) with it.
            z = self._z(job.profile_z, config, steps, functools.partial(_running_mean_rho, n=steps))
            step_s = noise.reading(entry.step_s, "step_s", steps, z)
            k = step_s / entry.step_s
            out.append(
                replace(
                    entry, steps=steps, step_s=step_s, compute_s=entry.compute_s * k,
                    sync_s=entry.sync_s * k,
                )
            )  # fmt: skip
        return tuple(out)

    def _declared(self, job: _Job) -> float | None:
        """The length the job's script declared (the workload's target), or ``None`` when
        the run lets no job declare (``SimConfig.lengths``): the one channel through which
        the policy learns how much work is left."""
        return job.app.target_progress if self.config.lengths == "declared" else None

    def _oracle(self, job: _Job) -> Oracle:
        app, cfg = job.app, self.config
        batch_size = min(max(job.spec.batch_size, app.init_batch_size), app.max_batch_size)
        if job.oracle_times is None:
            top = max(1, min(job.spec.batch_size // app.min_local_bsz, cfg.total_gpus))
            times = []
            for g in range(1, top + 1):
                choice = fixed_batch_choice(job.spec.batch_size, g, job.limits)
                times.append(_iteration_time_s(app, _packed(g, cfg.max_gpus_per_node), choice)[0])
            job.oracle_times = tuple(times)
        curve = app.progress_curve(batch_size)
        remaining = float(curve.iterations(app.target_progress) - curve.iterations(job.progress))
        return Oracle(max(remaining, 0.0), job.oracle_times)

    # ---- replay ----------------------------------------------------------------------------

    def _advance(self, active: list[_Job]) -> None:
        cfg = self.config
        slow = self._interfered(active) if cfg.interference > 0 else set()
        count = len(active)
        cut: dict[str, float] = {}
        if self.cloud is not None:
            gone = self.cloud.preempted_in(self.now_s, self.now_s + cfg.interval_s)
            cut = {key: gone[iid] for key, iid in self._iid.items() if iid in gone}
        for job in active:
            alive_s = cfg.interval_s
            if job.spec.submit_time_s > self.now_s:  # pragma: no cover - active => submitted
                alive_s = 0.0
            run_s = cfg.interval_s
            hit = [cut[n] for n in job.allocation if n in cut]
            if hit:
                run_s = max(0.0, min(hit) - self.now_s)
            held = job.allocation
            job_done = self._step(job, run_s, cfg.interference if job.index in slow else 0)
            if job_done is not None:
                alive_s = job_done
            job.sharers_s += count * alive_s
            if self.cloud is not None:
                hit_nodes = {n: cut[n] for n in held if n in cut}
                self._account(job, held, job_done if job_done is not None else run_s, hit_nodes)

    def _account(self, job: _Job, held: Allocation, ran_s: float, hit: dict[str, float]) -> None:
        """Cloud mode: the job's GPU time to the ledger, its checkpoints, its preemption."""
        world, cloud = self.cloud, self.config.cloud
        assert world is not None and cloud is not None
        ledger = world.ledger
        for instance_key, gpus in held.items():
            if ran_s > 0:
                iid = self._iid[instance_key]
                ledger.job_usage(job.spec.name, iid, self.now_s, self.now_s + ran_s, gpus)
        if job.completion_s is not None:
            ledger.job_event(job.spec.name, job.completion_s, "finished")
            ledger.job_work(job.spec.name, job.progress * job.limits.init_batch_size)
            return
        if held.num_gpus:
            job.since_checkpoint_s += ran_s
            if job.since_checkpoint_s >= cloud.checkpoint_interval_s:
                job.checkpoint_progress = job.progress
                job.since_checkpoint_s = 0.0
        if hit:
            self._preempted(job, hit)

    @staticmethod
    def _stop(job: _Job) -> None:
        """``job`` stops where it is, its progress checkpointed."""
        job.checkpoint_progress = job.progress
        job.since_checkpoint_s = 0.0
        job.allocation = Allocation()
        job.batch = None
        job.delay_left_s = 0.0
        job.profiles = {}

    def _preempted(self, job: _Job, hit: dict[str, float]) -> None:
        """``job`` lost the nodes in ``hit`` (instance key -> preemption time): it stops, and falls
        back to its last checkpoint unless every notice left time to write one (its trainer
        checkpoints on the notice its agent forwards)."""
        world = self.cloud
        assert world is not None
        job.preemptions += 1
        world.ledger.job_event(job.spec.name, min(hit.values()), "preemption")
        if not all(world.notice_suffices(self._iid[n]) for n in hit):
            job.progress = job.checkpoint_progress
        self._stop(job)

    def _interfered(self, active: list[_Job]) -> set[int]:
        """Indices of multi-node jobs on a node shared by two or more multi-node jobs."""
        spread = [job for job in active if job.allocation.num_nodes > 1]
        if len(spread) < 2:
            return set()
        count: dict[str, int] = {}
        for job in spread:
            for instance_key in job.allocation:
                count[instance_key] = count.get(instance_key, 0) + 1
        return {job.index for job in spread if any(count[n] > 1 for n in job.allocation)}

    # ---- true speeds -----------------------------------------------------------------------

    def _speed(self, job: _Job, group: NodeGroup) -> TypeSpeed:
        key = (job.spec.application, group)
        speed = self._type_speed.get(key)
        if speed is None:
            factor = self.truths.speed_factor(job.app.name, group.gpu_type)
            speed = TypeSpeed(job.app, group, self.speeds, self.config.traces_root, factor)
            self._type_speed[key] = speed
        return speed

    def _speed_of_type(self, job: _Job, gpu_type: str) -> TypeSpeed:
        if self.config.cloud is not None:
            group = next(o.group for o in self.config.cloud.offerings if o.gpu_type == gpu_type)
        else:
            group = next(g for g in self.config.cluster_spec.groups if g.gpu_type == gpu_type)
        return self._speed(job, group)

    def _true_time(
        self, job: _Job, placement: tuple[int, ...], batch: BatchChoice
    ) -> tuple[float, float, str]:
        """(seconds per iteration, sync seconds, GPU type it runs at) of ``job`` on its
        allocation: the slowest of its node groups' times when it spans several."""
        groups = {self._group[instance_key] for instance_key in job.allocation}
        best: tuple[float, float, str] | None = None
        for group in sorted(groups, key=lambda g: (g.gpu_type, g.instance_type)):
            speed = self._speed(job, group)
            if batch.local_bsz > speed.max_local_bsz:
                raise SimulationError(
                    f"{self.policy.name} ran {job.spec.name} at micro-batch {batch.local_bsz} "
                    f"on {group.gpu_type}, above its memory limit {speed.max_local_bsz}"
                )
            t_iter, sync = _iteration_time_s(speed, placement, batch)
            if best is None or t_iter > best[0]:
                best = (t_iter, sync, group.gpu_type)
        assert best is not None
        return best

    def _step(self, job: _Job, seconds: float, interference: float) -> float | None:
        """Replay ``seconds`` of ``job``; returns the seconds it ran if it completed."""
        gpus = job.allocation.num_gpus
        if not gpus:
            return None
        assert job.batch is not None
        delay = min(job.delay_left_s, seconds)
        job.delay_left_s -= delay
        job.attained_gpu_s += delay * gpus
        left = seconds - delay
        if left <= 0:
            return None
        app, batch = job.app, job.batch
        placement = job.allocation.placement
        t_iter, sync, gpu_type = self._true_time(job, placement, batch)
        self._record(job, gpu_type, placement, batch, t_iter, sync)
        rate = (1.0 - interference) / t_iter  # iterations per second
        curve = app.progress_curve(batch.batch_size)
        need = float(curve.iterations(app.target_progress) - curve.iterations(job.progress))
        if need <= rate * left:
            run_s = max(need, 0.0) / rate
            job.attained_gpu_s += run_s * gpus
            self._count_steps(job, placement, batch, max(need, 0.0))
            job.progress = app.target_progress
            job.completion_s = self.now_s + delay + run_s
            return delay + run_s
        job.attained_gpu_s += left * gpus
        self._count_steps(job, placement, batch, rate * left)
        job.progress = curve.progress_after(job.progress, rate * left)
        self._report_grad(job, batch.batch_size)
        return None

    @staticmethod
    def _count_steps(
        job: _Job, placement: tuple[int, ...], batch: BatchChoice, steps: float
    ) -> None:
        """``job`` ran ``steps`` optimizer steps of ``batch`` on ``placement``."""
        job.steps += steps
        config = _profile_key(placement, batch)
        job.config_steps[config] = job.config_steps.get(config, 0.0) + steps

    def _record(
        self,
        job: _Job,
        gpu_type: str,
        placement: tuple[int, ...],
        batch: BatchChoice,
        t_iter: float,
        sync: float,
    ) -> None:
        """What the job's trainer will report of the configuration it runs (its launch's
        profile, first measurement kept), and its first gradient statistics."""
        del gpu_type  # the controller knows it: the type of the instances it assigned
        if job.grad is None:
            self._report_grad(job, batch.batch_size)
        job.ran = True
        job.last_run = (batch, job.allocation)
        config = _profile_key(placement, batch)
        if config not in job.profiles:
            job.profiles[config] = ProfileEntry(
                num_nodes=len(placement),
                num_replicas=sum(placement),
                local_batch_size=batch.local_bsz,
                accum_steps=batch.accum_steps,
                steps=1,
                step_s=t_iter,
                compute_s=max(0.0, t_iter - sync),
                sync_s=min(sync, t_iter),
            )

    def _report_grad(self, job: _Job, batch_size: int) -> None:
        key = (job.app.epoch_of(job.progress), batch_size)
        if key != job.grad_key:
            sqr, var = job.app.grad_stats(job.progress, batch_size)
            job.grad = GradParams(float(sqr), float(var))
            job.grad_key = key

    # ---- results ---------------------------------------------------------------------------

    def _result(self, wall_s: float) -> SimResult:
        cfg = self.config
        results = []
        for job in sorted(self.jobs, key=lambda j: j.index):
            assert job.completion_s is not None
            jct = job.completion_s - job.spec.submit_time_s
            sharers = job.sharers_s / jct if jct > 0 else 1.0
            share = cfg.total_gpus / max(sharers, 1.0)
            iso = isolated_jct_s(job.spec, share, cfg.max_gpus_per_node, cfg.traces_root)
            results.append(
                JobResult(
                    name=job.spec.name,
                    application=job.spec.application,
                    submit_time_s=job.spec.submit_time_s,
                    completion_time_s=job.completion_s,
                    jct_s=jct,
                    gpu_s=job.attained_gpu_s,
                    restarts=job.restarts,
                    avg_jobs=sharers,
                    ftf_ratio=jct / iso,
                    deadline_s=(
                        None
                        if job.spec.deadline_after_s is None
                        else job.spec.submit_time_s + job.spec.deadline_after_s
                    ),
                )
            )
        cost, fleet = None, None
        if self.cloud is not None:
            cost = self.cloud.close_bill(self.now_s)
            fleet = {
                "launches": float(self.cloud.launches),
                "preemptions": float(self.cloud.preemptions),
                "capacity_errors": float(self.cloud.capacity_errors()),
                "peak_usd_per_hour": self.cloud.peak_usd_per_hour,
            }
        return SimResult(
            workload=self.workload_name,
            policy=str(self.policy.name),
            config=cfg,
            jobs=tuple(results),
            rounds=tuple(self.rounds),
            wall_s=wall_s,
            cost=cost,
            fleet=fleet,
            churn=self._churn(cost),
        )

    def _churn(self, cost: CostRecord | None) -> ChurnFigures:
        """The run's churn from the store the controller leaves (the accounting layer's one
        definition), its idle split over the cloud's bill (``cost``), or on a fixed cluster over
        the store's own record of its fleet (at the fixed offerings' nominal prices)."""
        store = self.world.store
        batches = {job.spec.name: job.batches for job in self.jobs}
        if cost is not None:
            return churn_from_store(
                store, cost, interval_s=self.config.interval_s, by_cloud_id=True, batches=batches
            )
        origin = run_origin_s(store) or 0.0
        record = cost_record_from_store(store, self.world.now_s)
        return churn_from_store(
            store, record, interval_s=self.config.interval_s, origin_s=origin, batches=batches
        )


def simulate(
    jobs: tuple[TraceJob, ...] | list[TraceJob],
    policy: Policy,
    config: SimConfig | None = None,
    *,
    workload_name: str = "workload",
    on_round: Callable[[float, int, int], None] | None = None,
) -> SimResult:
    """Run one simulation to completion (see :class:`Simulator`)."""
    return Simulator(jobs, policy, config, workload_name=workload_name, on_round=on_round).run()
