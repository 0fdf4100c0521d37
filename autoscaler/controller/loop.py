"""The controller's round: observe -> decide -> reconcile -> act, over a store and a provider.

One :meth:`Controller.run_round`:

1. **observe**: the store's jobs and new trainer reports (profiles into the
   :class:`~autoscaler.controller.jobbook.JobBook`, refit only what changed), the store's live
   instance rows, and the provider's listing and interruption notices (one ``list_instances``
   and one ``interruptions`` call). A provider error here ends the round before anything is
   decided: the controller never acts on a partial view.
2. **decide**: each job is admitted first (:meth:`Controller._admit`): a job whose stored
   spec no longer passes is failed with the reason; a queued job that no fleet this
   controller may build could ever hold (:func:`autoscaler.decide.bounds.refusal`) is ``refused``
   with the reason, and waits for the user; a job whose trainer reported it finished keeps
   the GPUs it holds, untouched, until its processes exit. Each job's view carries its
   remaining work from the length its script declared (the trainer's own rule) and its spec's
   GPU bounds and types; a running job whose length and model are known gets its ETA (when
   it will be done at the allocation it holds, :func:`~autoscaler.decide.deadlines.
   remaining_s`), recorded in the store for the API. The fleet strategy (goodput-per-dollar
   sizing by default) proposes instances per offering from the jobs' views, the ready nodes
   and the prices;
   :func:`~autoscaler.controller.reconcile.reconcile` turns target, rows and the observed
   cloud into actions; the policy (``coadapt`` by default) allocates the jobs on the nodes
   that stay (running, not draining) and chooses each one's batch. A job the policy or the
   sizing raises on is found by deciding each job alone, failed with the reason, and the
   round goes on without it (:class:`~autoscaler.controller.errors.RoundError` only when no
   job can be blamed).
3. **act**: store first, cloud second. Transitions and new rows are written (each against
   the version read), the plan, the jobs' assignments and their planned batches (what the
   API answers each trainer) are recorded, then every launch is
   written as an intent (``queued -> requested`` with its request id) before its provider
   call, and every termination (``-> terminating``) before its call; answers are recorded
   after. Every cloud call follows a write of its intent or a check of the leader lease
   (:meth:`Store.check_fence <autoscaler.controller.store.Store.check_fence>`): a controller
   whose store is fenced at an epoch the lease has left stops the round at the first refused
   write (:class:`~autoscaler.controller.errors.FencedError`) and calls no cloud after it
   (:mod:`autoscaler.controller.leader`). A controller killed at any point restarts from the
   store: a launch whose answer was lost is re-issued with the same request id (the
   provider's launch rule creates nothing twice) or adopted from the listing; an instance the
   store never heard of is terminated.

Cloud calls per round are bounded: two observation calls, plus one call per launch,
termination or leak the reconcile decided, which :class:`~autoscaler.controller.reconcile.
ReconcileConfig` caps (launch rate per offering, launches in flight, disruption budget). A
capacity error marks the offering unavailable for ``unavailable_ttl_s``, a quota error for
``quota_ttl_s``, in the one memory the controller and its provider share; sizing sees it as
unavailable and routes around it, and queued launches for it fail without a call.

``crash_hook`` (tests) is called with the name of each point between a store write and a cloud
call (:data:`CRASH_POINTS`); the crash-safety tests kill the process there.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, TypeVar

from autoscaler.controller.errors import (
    FencedError,
    RoundError,
    StaleVersionError,
    UnknownFleetError,
    UnknownRowError,
)
from autoscaler.controller.events import DEADLINE_REASON
from autoscaler.controller.hold import (
    BatchLeft,
    HoldConfig,
    damp_batches,
    fixed_allocations,
    held_instances,
    hold_target,
    kept_empty,
)
from autoscaler.controller.jobbook import (
    MAX_JOB_GPUS,
    AssignedRun,
    JobBook,
    JobSubmission,
    credited_gpu_type,
)
from autoscaler.controller.lifecycle import (
    BootPhase,
    InstanceStatus,
    boot_phase,
    preempted_at,
    terminate_retries,
)
from autoscaler.controller.liveness import AwakeLog
from autoscaler.controller.reconcile import (
    HELD,
    Actions,
    ReconcileConfig,
    ReconcileInput,
    RowView,
    reconcile,
    unavailable_launch,
)
from autoscaler.controller.store import InstanceRow, JobRow, JobStatus, Store
from autoscaler.decide.bounds import PoolCapacity, refusal
from autoscaler.decide.deadlines import fastest_finish_s, held_gpu_type, remaining_s, time_left_s
from autoscaler.decide.fleet import FleetStrategy, FleetView
from autoscaler.decide.policy import make_policy
from autoscaler.decide.policy.base import Decision, Policy
from autoscaler.decide.sizing import FleetOption, SizingConfig
from autoscaler.decide.strategies import FixedFleet, GoodputSizing
from autoscaler.decide.views import (
    MAX_FINISHED_JOBS,
    Allocation,
    BatchChoice,
    ClusterView,
    JobView,
    NodeView,
    OfferingRef,
    Oracle,
    Plan,
    RoundInput,
)
from autoscaler.errors import InvalidInputError
from autoscaler.market.preemption import band_hazard_per_hour, load_hazard_model
from autoscaler.market.terms import instance_cost_usd
from autoscaler.model.gputypes import default_speed_table
from coadapt_common.clock import Clock
from providers.base import Instance, InstanceState, LaunchRequest, Offering, Provider
from providers.capacity import SKIPPED_UNAVAILABLE_CODE, UnavailableOfferings
from providers.errors import (
    InsufficientCapacityError,
    ProviderError,
    QuotaExceededError,
    error_kind,
)
from trainer.report import TrainerReport

__all__ = ["CRASH_POINTS", "Controller", "ControllerConfig", "DownReport", "RoundReport"]

CRASH_POINTS: Final = (
    "after-store-writes",  # transitions, new rows, plan and assignments written
    "after-launch-intent",  # a row is requested with its request id; no call made yet
    "after-launch-call",  # the provider answered; the answer not recorded yet
    "after-terminate-intent",  # a row is terminating; no call made yet
    "after-terminate-call",  # the provider answered; not recorded yet
)
ACTIVE_JOBS: Final = (JobStatus.QUEUED, JobStatus.RUNNING)
DEFAULT_REPORT_HISTORY: Final = 100
"""Reports kept per job once read (a report every 5 s: the last ~8 minutes; every 30 s: the
last 50 minutes)."""
DEFAULT_RETENTION_S: Final = 30 * 86_400.0
"""How long the store keeps old reports, prices and events (30 days; the bill's records are
kept whole: :mod:`autoscaler.controller.store.retention`)."""
RETENTION_EVERY_S: Final = 600.0
"""How often (the clock's seconds) a round prunes the store, unless the last pass left more."""
RETENTION_BATCHES: Final = 10
"""The most :meth:`Store.prune_old` batches one round runs (a backlog drains over rounds)."""
_log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass(frozen=True)
class ControllerConfig:
    """The controller's knobs. Sizing expects a spot offering to be preempted at the rate of
    its AWS Spot Instance Advisor band (the shipped ``aws_spot_advisor_gpu.csv``, by region
    and instance type); ``default_spot_band`` is used for offerings the advisor does not list
    (default: the most pessimistic band);
    ``interval_s`` the time between rounds; ``max_job_retries`` how many failures a job may
    have before it is ``failed`` (rescales and preemptions never count);
    ``gpu_type_aliases`` names, for an offering's GPU type the speed table does not know, the
    type the decision core values it as (the local provider's ``cpu-slot`` -> ``T4``);
    ``offerings_refresh_s`` how often the catalogue and its prices (spot prices move) are read
    again from the provider and recorded in the price history; an offering whose launch hit
    a capacity error is avoided for ``unavailable_ttl_s``, one that hit a quota for
    ``quota_ttl_s``. ``interference_avoidance`` asks a policy that supports it to keep at most
    one multi-node job on a node; a job's throughput fit is redone when a new configuration's
    step time is mispredicted by more than ``refit_tolerance``. ``report_history``: how many
    of each job's reports the store keeps once read (the newest; what they taught is in the
    job's profiles and ``models``, so the model is the same whatever it is:
    :meth:`Store.prune_reports`). ``stall_gap_s``: a gap longer than this between two of the
    controller's own notes of being alive (each round, and :meth:`Controller.note_alive`,
    which the service calls every second) is a stall of the controller, never counted
    against an agent's silence (:mod:`autoscaler.controller.liveness`); ``None`` (default):
    only the time before the controller started is (a controller driven by another's
    rounds, like the simulator's, has no ticker). ``retention_s``: how long the store keeps
    trainer reports, prices and events (older ones are pruned a batch at a time, at most
    every :data:`RETENTION_EVERY_S`; the bill's records never are:
    :mod:`autoscaler.controller.store.retention`); ``None``: forever. ``hold``: how long
    the round's decisions hold (:mod:`autoscaler.controller.hold`: no cost drain of a young
    instance, no move of a non-adaptive job for cost, no batch reversal)."""

    cluster_id: str
    interval_s: float = 60.0
    policy: str = "coadapt"
    sizing: SizingConfig = field(default_factory=SizingConfig)
    reconcile: ReconcileConfig = field(default_factory=ReconcileConfig)
    unavailable_ttl_s: float = 180.0
    quota_ttl_s: float = 1800.0
    default_spot_band: str = ">20%"
    restart_delay_s: float = 30.0
    max_job_retries: int = 3
    gpu_type_aliases: Mapping[str, str] = field(default_factory=dict)
    offerings_refresh_s: float = 300.0
    interference_avoidance: bool = True
    refit_tolerance: float = 0.05
    report_history: int = DEFAULT_REPORT_HISTORY
    stall_gap_s: float | None = None
    retention_s: float | None = DEFAULT_RETENTION_S
    hold: HoldConfig = field(default_factory=HoldConfig)

    def unavailable_offerings(self, clock: Clock) -> UnavailableOfferings:
        """The unavailable-offerings memory of this config (capacity errors kept for
        ``unavailable_ttl_s``, quotas for ``quota_ttl_s``): the one object the controller and
        its provider share (build the provider with it, and pass it to the controller)."""
        return UnavailableOfferings(clock, self.unavailable_ttl_s, self.quota_ttl_s)

    def __post_init__(self) -> None:
        if not (self.unavailable_ttl_s > 0 and self.quota_ttl_s > 0):
            raise InvalidInputError(
                "unavailable_ttl_s and quota_ttl_s must be > 0", field="unavailable_ttl_s"
            )
        if self.retention_s is not None and not (
            self.retention_s > 0 and math.isfinite(self.retention_s)
        ):
            raise InvalidInputError("retention_s must be a finite number > 0", field="retention_s")
        if (
            isinstance(self.report_history, bool)
            or not isinstance(self.report_history, int)
            or self.report_history < 1
        ):
            raise InvalidInputError(
                "report_history must be an integer >= 1", field="report_history"
            )
        if self.stall_gap_s is not None and not (
            self.stall_gap_s > 0 and math.isfinite(self.stall_gap_s)
        ):
            raise InvalidInputError("stall_gap_s must be a finite number > 0", field="stall_gap_s")
        if not self.offerings_refresh_s > 0:
            raise InvalidInputError("offerings_refresh_s must be > 0", field="offerings_refresh_s")
        band_hazard_per_hour(self.default_spot_band)  # InvalidInputError for an unknown band
        if self.max_job_retries < 0:
            raise InvalidInputError("max_job_retries must be >= 0", field="max_job_retries")
        if not self.interval_s > 0:
            raise InvalidInputError("interval_s must be > 0", field="interval_s")


@dataclass(frozen=True)
class RoundReport:
    """What one round did, with the time of each phase (seconds; ``policy_s`` the policy's
    own share of ``decide_s``, ``fit_s`` the refit of the jobs' throughput models, part of
    ``observe_s``; a round ended early by a provider error has only ``observe_s``).
    ``notices``: instances drained this round for a spot interruption notice;
    ``preemptions``: instances the provider took back this round, each counted once in its
    life (its first change recorded as a preemption: the notice's drain, or vanishing from the
    listing without one); ``provider_errors``: the provider errors the round met, by
    :func:`~providers.errors.error_kind` (a pool's capacity error in a launch's walk counts,
    the skip of an offering already marked unavailable does not)."""

    round_index: int
    observed_instances: int
    actions: Actions
    allocations: Mapping[str, Allocation]
    cloud_calls: int
    observe_s: float
    decide_s: float
    reconcile_s: float
    act_s: float
    error: str | None = None
    policy_s: float = 0.0
    fit_s: float = 0.0
    notices: int = 0
    preemptions: int = 0
    provider_errors: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DownReport:
    """What :meth:`Controller.down` left: ``remaining`` cloud ids still listed (empty: the
    fleet is gone), the provider calls it made, and the last provider error, if any."""

    remaining: tuple[str, ...]
    calls: int
    error: str | None = None

    @property
    def clean(self) -> bool:
        return not self.remaining


class Controller:
    """One cluster's control loop over ``store`` and ``provider`` (see the module
    docstring). Not thread-safe: one controller process per store."""

    def __init__(
        self,
        store: Store,
        provider: Provider,
        clock: Clock,
        config: ControllerConfig,
        *,
        strategy: FleetStrategy | None = None,
        crash_hook: Callable[[str], None] | None = None,
        user_data: Callable[[InstanceRow], str] | None = None,
        unavailable: UnavailableOfferings | None = None,
        policy: Policy | None = None,
        instance_keys: Callable[[], str] | None = None,
        oracle: Callable[[str], Oracle | None] | None = None,
    ) -> None:
        """``policy``: a policy object (default: ``make_policy(config.policy)``);
        ``instance_keys``: where new instance keys come from (default: random; the simulator
        numbers them, so a seed gives one run); ``oracle``: ground truth for an oracle
        baseline by job name (the simulator's; a real cluster has none)."""
        self.store = store
        self.provider = provider
        self.clock = clock
        self.config = config
        self.policy = policy or make_policy(config.policy)
        self.policy_state = self.policy.initial_state()
        self.speeds = default_speed_table()
        self.hazards = load_hazard_model()
        self._speed_known: dict[str, bool] = {}
        self.strategy = strategy or GoodputSizing("coadapt", config.sizing, self.speeds)
        # One unavailable-offerings memory: the provider's own walk marks and skips what is
        # marked here (pass the provider the same object: config.unavailable_offerings), and
        # sizing routes around it. Its TTLs are the config's, or it is refused.
        if unavailable is not None and (unavailable.ttl_s, unavailable.quota_ttl_s) != (
            config.unavailable_ttl_s,
            config.quota_ttl_s,
        ):
            raise InvalidInputError(
                f"the unavailable-offerings memory keeps marks for {unavailable.ttl_s} s "
                f"(quota {unavailable.quota_ttl_s} s), the config says "
                f"{config.unavailable_ttl_s} s (quota {config.quota_ttl_s} s): build it with "
                "ControllerConfig.unavailable_offerings",
                field="unavailable",
            )
        self.unavailable = unavailable or config.unavailable_offerings(clock)
        self._type_aware = bool(getattr(self.policy, "type_aware", False))
        self.book = JobBook(config.refit_tolerance, typed=self._type_aware, speeds=self.speeds)
        self._new_key = instance_keys or (lambda: f"i-{uuid.uuid4().hex[:16]}")
        self._oracle = oracle if getattr(self.policy, "uses_oracle", False) else None
        self._fit_s = 0.0
        self._policy_s = 0.0
        self._errors: dict[str, int] = {}  # the round's provider errors by kind
        self._crash = crash_hook or (lambda point: None)
        self._user_data = user_data  # the agent start-up of a launched instance
        self._issued: set[str] = set()  # request ids launched or terminated by this process
        self._report_cursor = -1  # -1: restore from the store first
        self._round = 0
        self._planned = False  # the store has recorded a plan (checked until it has)
        self._pruned_at_s: float | None = None  # the last retention pass (the clock's time)
        self._prune_more = False  # it left rows to prune
        self._offerings: dict[str, Offering] = {}
        self._offerings_read_s = -math.inf  # monotonic, when they were last read
        # No heartbeat could reach a controller that was not running: an agent's silence
        # counts only while this one runs (a restart adopts a live fleet, however long the
        # controller was away; a stall, e.g. SIGSTOP, is not held against the agents).
        self._started_s = clock.now_s()
        self._awake = AwakeLog(self._started_s, config.stall_gap_s)
        self._suspected: tuple[str, ...] = ()
        self._etas_said = True  # a store may hold a past run's ETAs: the first round replaces them
        # The lengths of the latest completed jobs, oldest first (read from the store once, then
        # kept as jobs leave the active set: see _learn_lengths), and last round's active jobs.
        self._lengths: deque[float] | None = None
        self._watched: frozenset[str] = frozenset()
        # The batch each job last left, and when (the hold's batch damping); a restarted
        # controller starts with none.
        self._batch_left: dict[str, BatchLeft] = {}
        self._hold_s = config.hold.hold_s(config.interval_s, config.restart_delay_s)
        # Since when each ready instance has run no job (hold.kept_empty); in process: a
        # restarted controller keeps an empty instance for one more break-even at most.
        self._empty_since: dict[str, float] = {}
        self._keep_empty_s = config.hold.empty_keep_s(config.sizing.provisioning_delay_s)

    def note_alive(self) -> None:
        """The controller is running now (the service's ticker calls it about every second;
        each round notes it too): a longer gap than ``stall_gap_s`` since the last note was a
        stall (see :mod:`autoscaler.controller.liveness`). Thread-safe."""
        self._note(self.clock.now_s())

    def _note(self, now_s: float) -> None:
        stall = self._awake.note(now_s)
        if stall is not None:
            _log.warning(
                "the controller was not running for %.1f s: agents' silence in that time is "
                "not held against them",
                stall[1] - stall[0],
            )

    # ---- the round -------------------------------------------------------------------------

    def run_round(self) -> RoundReport:
        """One observe -> decide -> reconcile -> act round. Raises
        :class:`~autoscaler.controller.errors.StoreError` (before any cloud call) if the
        store was deleted, replaced or damaged, :class:`~autoscaler.controller.errors.
        UnknownFleetError` (touching nothing) if a store that never planned meets a cloud
        holding instances of its cluster, and :class:`~autoscaler.controller.errors.
        RoundError` when the policy or the sizing fails and no job can be blamed (a job that
        can be blamed is failed with the reason, and the round goes on without it); a
        provider error while observing ends the round early and is reported in
        :attr:`RoundReport.error`."""
        t0 = time.perf_counter()
        self.store.ensure_present()  # StoreMissingError before any cloud call
        now = self.clock.now_s()
        self._note(now)
        self._round += 1
        self._errors = {}
        rows = self.store.list_instances(statuses=_LIVE)  # the store is read first: a
        read_jobs = self.store.list_jobs(statuses=ACTIVE_JOBS)  # damaged one fails here, before
        assignments = self.store.list_assignments()  # any cloud call
        lengths = self._learn_lengths(read_jobs, now)
        try:
            observed = tuple(self.provider.list_instances(self.config.cluster_id))
            self._refuse_unknown_fleet(observed)
            notices = tuple(self.provider.interruptions(self.config.cluster_id))
            mono = self.clock.monotonic_s()
            if mono - self._offerings_read_s >= self.config.offerings_refresh_s:
                self._offerings = {o.key: o for o in self.provider.offerings()}
                self._offerings_read_s = mono
                self._record_prices()
        except ProviderError as e:
            self._provider_error(e)
            elapsed = time.perf_counter() - t0
            return RoundReport(
                self._round, 0, Actions(), {}, 1, elapsed, 0.0, 0.0, 0.0, str(e),
                provider_errors=self._errors,
            )  # fmt: skip
        gpu_type_of = {r.instance_key: self._type(r.gpu_type) for r in rows}
        self._read_reports(assignments, gpu_type_of)
        t1 = time.perf_counter()

        # Ready (lifecycle.boot_phase): running in the store and in the cloud's listing
        # (booted, not pending), its agent heard where agents are, and not noticed of an
        # interruption. Only ready instances are given jobs.
        booted = {i.instance_id for i in observed if i.state is InstanceState.RUNNING}
        noticed = {n.instance_id for n in notices}
        needs_agent = self.config.reconcile.heartbeat_timeout_s is not None
        ready = [
            r
            for r in rows
            if boot_phase(
                r.status,
                cloud_running=r.provider_instance_id in booted,
                heard_s=r.last_heartbeat_s,
                needs_agent=needs_agent,
            )
            is BootPhase.READY
            and r.provider_instance_id not in noticed
        ]
        unavailable = self.unavailable.unavailable()
        options = self._options(unavailable)
        jobs, views, pinned = self._admit(read_jobs, assignments, ready, options, now)
        cluster = self._cluster(ready, now)
        held: dict[str, int] = {}
        for r in rows:
            if r.status in HELD:
                held[r.offering_key] = held.get(r.offering_key, 0) + 1
        target, views = self._propose(FleetView(now, views, cluster, held, options))
        self._record_etas(views, cluster, now)
        t2 = time.perf_counter()

        used: dict[str, int] = {}  # GPUs of active jobs: an ended job's are being cleared
        active = {j.name for j in read_jobs}
        for (name, key), gpus in assignments.items():
            if name in active:
                used[key] = used.get(key, 0) + gpus
        row_views = tuple(self._row_view(r) for r in rows)
        # An empty ready instance is kept for the next job while that is cheaper than a
        # relaunch (hold.kept_empty): the target keeps it, and it is not drained for cost.
        empty_now = {r.instance_key for r in ready if used.get(r.instance_key, 0) == 0}
        self._empty_since = {k: self._empty_since.get(k, now) for k in empty_now}
        spare = kept_empty(now, self._keep_empty_s, self._empty_since)
        held_rows: dict[str, list[str]] = {}
        for r in rows:
            if r.status in HELD:
                held_rows.setdefault(r.offering_key, []).append(r.instance_key)
        target = hold_target(target, held_rows, empty_now, spare)
        held_keys = spare | held_instances(
            now,
            self._hold_s,
            self.store.placed_since(j.name for j in read_jobs),
            fixed_on=(k for v in views if not v.adaptive for k in v.allocation),
            within_cap=sum(1 for r in row_views if r.status in HELD)
            <= self.config.sizing.max_instances,
        )
        finishing: dict[str, int] = {}  # GPUs of jobs that finished training: free in seconds
        for alloc in pinned.values():
            for key, gpus in alloc.items():
                finishing[key] = finishing.get(key, 0) + gpus
        actions = reconcile(
            ReconcileInput(
                now_s=now,
                rows=row_views,
                observed=observed,
                notices=notices,
                target=target,
                used_gpus=used,
                finishing_gpus=finishing,
                unavailable=unavailable,
                issued=frozenset(self._issued),
                terminal_request_ids=self.store.terminal_request_ids(
                    among=[i.request_id for i in observed]
                ),
                stalls=self._awake.stalls(),
                held=held_keys,
            ),
            self.config.reconcile,
        )
        if actions.suspected and actions.suspected != self._suspected:
            _log.warning(
                "%d of the running instances' agents look dead at once (%s): suspecting the "
                "controller's own view, releasing none of them yet",
                len(actions.suspected),
                ", ".join(actions.suspected),
            )
        self._suspected = actions.suspected
        noticed_before = {r.key for r in row_views if r.noticed}
        preemptions = [t for t in actions.transitions if t.preemption]
        drained_for_notice = sum(1 for t in preemptions if t.to is InstanceStatus.DRAINING)
        first_preemptions = sum(1 for t in preemptions if t.key not in noticed_before)
        t3 = time.perf_counter()
        staying = [r for r in ready if r.instance_key not in actions.leaving]
        # A non-adaptive job whose instances all stay keeps them (the hold): not decided.
        fixed = fixed_allocations(views, (r.instance_key for r in staying), self._hold_s)
        kept = {**pinned, **fixed}
        cluster = self._cluster(staying, now, held_by=kept)
        on_nodes = {n.instance_key for n in cluster.nodes}
        views = tuple(
            _with_allocation(v, {k: g for k, g in v.allocation.items() if k in on_nodes})
            for v in views
            if v.name not in fixed
        )
        # No job, or no node to put one on (every instance booting): nothing to decide.
        plan = self._decide(cluster, views, lengths) if views and cluster.nodes else Plan({}, {})
        # A job the policy refuses on the nodes of this round is not refused for good: the
        # fleet may grow. It waits; a job no fleet this controller may build could hold was
        # refused at admission (_admit), with the same rule.
        allocations = {**plan.allocations}
        for name, alloc in kept.items():
            allocations[name] = alloc
        decided = {v.name for v in views} | set(kept)
        jobs = [j for j in jobs if j.name in decided]  # a job failed while deciding is gone
        batches = self._damp(plan.batches, allocations, assignments, now)
        t4 = time.perf_counter()

        calls = 2 + self._act(actions, allocations, batches, jobs, rows, assignments, now)
        self._prune_old(now)
        t5 = time.perf_counter()
        return RoundReport(
            self._round,
            len(observed),
            actions,
            allocations,
            calls,
            observe_s=t1 - t0,
            decide_s=(t2 - t1) + (t4 - t3),
            reconcile_s=t3 - t2,
            act_s=t5 - t4,
            policy_s=self._policy_s,
            fit_s=self._fit_s,
            notices=drained_for_notice,
            preemptions=first_preemptions,
            provider_errors=self._errors,
        )

    def _provider_error(self, error: ProviderError) -> None:
        """Count ``error`` in the round's :attr:`RoundReport.provider_errors`."""
        kind = error_kind(error)
        self._errors[kind] = self._errors.get(kind, 0) + 1

    def _damp(
        self,
        batches: Mapping[str, BatchChoice],
        allocations: Mapping[str, Allocation],
        assignments: Mapping[tuple[str, str], int],
        now: float,
    ) -> Mapping[str, BatchChoice]:
        """The plan's batches with reversals damped (:func:`~autoscaler.controller.hold.
        damp_batches`), the memory of the batches left moved on."""
        if not batches:
            self._batch_left = {}
            return batches
        held: dict[str, dict[str, int]] = {}
        for (job, key), gpus in assignments.items():
            held.setdefault(job, {})[key] = gpus
        planned = self.store.list_batches(sorted(batches))
        out, self._batch_left = damp_batches(
            batches,
            allocations,
            {name: Allocation(a) for name, a in held.items()},
            planned,
            self._batch_left,
            now,
            self._hold_s,
        )
        return out

    # ---- decide, one job at a time when it must ---------------------------------------------

    def _admit(
        self,
        jobs: Sequence[JobRow],
        assignments: Mapping[tuple[str, str], int],
        ready: Sequence[InstanceRow],
        options: Sequence[FleetOption],
        now: float,
    ) -> tuple[list[JobRow], tuple[JobView, ...], dict[str, Allocation]]:
        """The jobs the round decides for, their views, and the jobs it leaves as they are.

        A job whose stored spec or view cannot be read is failed with the reason; a queued
        job that no fleet this controller may build could ever run (:func:`autoscaler.
        bounds.refusal` on :meth:`_possible_pools`) is ``refused`` with the policy's reason;
        a job whose trainer reported that it finished training keeps the GPUs it holds until
        its processes exit (``pinned``: no rescale, no new batch, no relaunch), or is
        completed at once when it holds none. Returns the remaining rows, their views, and
        the pinned jobs' allocations."""
        alloc: dict[str, dict[str, int]] = {}
        for (job, key), gpus in assignments.items():
            alloc.setdefault(job, {})[key] = gpus
        pools = self._possible_pools(ready, options)
        usage = self.store.usage([row.name for row in jobs], now)
        kept: list[JobRow] = []
        views: list[JobView] = []
        pinned: dict[str, Allocation] = {}
        for row in jobs:
            held = Allocation(alloc.get(row.name, {}))
            if self.book.done(row.name):
                if held:
                    pinned[row.name] = held
                    kept.append(row)
                else:
                    self._end_job(
                        row,
                        JobStatus.COMPLETED,
                        "finished training (its trainer reported done); its processes are gone",
                    )
                continue
            try:
                spec = JobSubmission.from_json(row.spec_json)
                attained, restarts = usage.get(row.name, (0.0, 0))
                view = self.book.view(
                    spec,
                    row.submitted_at_s,
                    now,
                    held,
                    attained_gpu_s=attained,
                    num_restarts=restarts,
                    oracle=None if self._oracle is None else self._oracle(row.name),
                    deadline_s=row.deadline_s,
                )
                if view.deadline_s is not None:
                    row = self._check_deadline(row, view, options)
                reason = None
                if row.status is JobStatus.QUEUED and not held and pools:
                    reason = refusal(view, pools, self.speeds, max_gpus_per_job=MAX_JOB_GPUS)
            except FencedError:
                raise  # deposed: the round stops here
            except Exception as e:  # one bad job never stops a round
                self._end_job(row, JobStatus.FAILED, f"cannot be scheduled: {_one_line(e)}")
                continue
            if reason is not None:
                self._end_job(row, JobStatus.REFUSED, reason)
                continue
            kept.append(row)
            views.append(view)
        return kept, tuple(views), pinned

    def job_views(self, now_s: float) -> tuple[JobView, ...]:
        """Every active job as the policy would see it now (from the store and the job
        book, its attained service and restarts from :meth:`Store.usage` as a round reads
        them; no side effects: a job whose spec cannot be read is left out)."""
        alloc: dict[str, dict[str, int]] = {}
        for (job, key), gpus in self.store.list_assignments().items():
            alloc.setdefault(job, {})[key] = gpus
        rows = self.store.list_jobs(statuses=ACTIVE_JOBS)
        usage = self.store.usage([row.name for row in rows], now_s)
        out = []
        for row in rows:
            with contextlib.suppress(InvalidInputError):
                spec = JobSubmission.from_json(row.spec_json)
                held = Allocation(alloc.get(row.name, {}))
                attained, restarts = usage.get(row.name, (0.0, 0))
                out.append(
                    self.book.view(
                        spec,
                        row.submitted_at_s,
                        now_s,
                        held,
                        attained_gpu_s=attained,
                        num_restarts=restarts,
                        deadline_s=row.deadline_s,
                    )
                )
        return tuple(out)

    def _record_etas(self, views: Sequence[JobView], cluster: ClusterView, now: float) -> None:
        """Record when each job of ``views`` will be done, by its fitted model at the
        allocation it holds on ``cluster``'s nodes (:func:`autoscaler.decide.deadlines.
        remaining_s`, bounded there): ``now`` plus its time left, for a job that runs with a
        declared length and a model of the type it runs on; no estimate for any other job
        (:meth:`Store.record_etas` forgets its last one). The store is what the API and an
        offline ``status`` read: no model is evaluated per request. A round with nothing to
        say after one that said nothing writes nothing."""
        etas: dict[str, float] = {}
        for view in views:
            left = remaining_s(view, held_gpu_type(view, cluster))
            if left is not None:
                etas[view.name] = now + left
        if not etas and not self._etas_said:
            return
        try:
            self.store.record_etas(etas)
        except UnknownRowError as e:  # a job deleted meanwhile: the next round says it again
            _log.warning("ETAs not recorded this round: %s", e)
            return
        self._etas_said = bool(etas)

    def _check_deadline(self, row: JobRow, view: JobView, options: Sequence[FleetOption]) -> JobRow:
        """Once it is certain that ``view``'s job cannot meet its deadline -- even at once,
        on the fastest configuration any offering gives it (its fitted model, its remaining
        work), it would finish late -- its ``reason`` says so with the estimate (a
        ``deadline`` event tells it, :mod:`autoscaler.controller.events`). Said once. The
        job's row as it is now."""
        if row.reason and row.reason.startswith(DEADLINE_REASON):
            return row
        fastest = fastest_finish_s(view, {o.kind for o in options if o.allows(view)}, self.speeds)
        left = time_left_s(view)
        if fastest is None or left is None or fastest <= left:
            return row
        when = f"{left:.0f} s to its deadline" if left >= 0 else f"its deadline {-left:.0f} s ago"
        message = (
            f"{DEADLINE_REASON}: {view.remaining_work:.0f} samples left take at least "
            f"{fastest:.0f} s on any offering (its fitted model), {when}"
        )
        try:
            row = self.store.update_job(row.name, row.version, reason=message)
        except StaleVersionError:
            return row
        _log.warning("job %s: %s", row.name, message)
        return row

    def _possible_pools(
        self, ready: Sequence[InstanceRow], options: Sequence[FleetOption]
    ) -> list[PoolCapacity]:
        """The most GPUs of each type one job could ever get: the instances ready now, or
        what the sizing may buy of an offering (``max_instances`` of its largest instance,
        within ``max_gpus``; a fixed fleet: what it holds). Empty until the offerings are
        known (nothing is refused then)."""
        if not self._offerings:
            return []
        most: dict[str, int] = {}
        offerings: dict[str, set[OfferingRef | None]] = {}  # where each type's GPUs come from
        for r in ready:
            t = self._type(r.gpu_type)
            most[t] = most.get(t, 0) + r.gpus
            offerings.setdefault(t, set()).add(
                OfferingRef(r.provider, r.instance_type, r.zone, r.market)
            )
        growable: dict[str, int] = {}
        sizing = self.config.sizing
        fixed = self.strategy.counts if isinstance(self.strategy, FixedFleet) else None
        for o in options:
            if fixed is None or fixed.get(o.key, 0):
                offerings.setdefault(o.gpu_type, set()).add(o.ref)
            if fixed is not None:  # a static cluster: what it holds, nothing more
                cap = fixed.get(o.key, 0) * o.gpus
                growable[o.gpu_type] = growable.get(o.gpu_type, 0) + cap
                continue
            cap = sizing.max_instances * o.gpus
            if sizing.max_gpus is not None:
                cap = min(cap, sizing.max_gpus)
            growable[o.gpu_type] = max(growable.get(o.gpu_type, 0), cap)
        for t, cap in growable.items():
            most[t] = max(most.get(t, 0), cap)
        return [
            PoolCapacity(t, t, cap, frozenset(offerings.get(t, ())))
            for t, cap in sorted(most.items())
        ]

    def _propose(self, view: FleetView) -> tuple[Mapping[str, int], tuple[JobView, ...]]:
        """The fleet strategy's target, with a job it fails on failed and left out (see
        :meth:`_isolate`); returns the target and the jobs that remain."""
        jobs, target = self._isolate(
            view.jobs,
            lambda views: self.strategy.propose(replace(view, jobs=views)),
            "the fleet sizing",
        )
        return target, jobs

    def _learn_lengths(self, active: Sequence[JobRow], now: float) -> tuple[float, ...]:
        """The attained service at which each of the latest completed jobs ended, the latest
        first, at most :data:`~autoscaler.decide.views.MAX_FINISHED_JOBS` (what the round
        input carries to the policy: :attr:`RoundInput.finished_gpu_s`). The first round
        reads them from the store (:meth:`Store.finished_gpu_s`); after that a round reads
        no past: a job that was active last round and is not now is looked up by name, and
        its service (:meth:`Store.usage`) is added if it completed (failed, cancelled and
        refused jobs are no lengths; one deleted within a round is missed)."""
        if self._lengths is None:
            latest = self.store.finished_gpu_s(MAX_FINISHED_JOBS)
            self._lengths = deque(reversed(latest), maxlen=MAX_FINISHED_JOBS)
        else:
            names = {row.name for row in active}
            ended: list[JobRow] = []
            for name in sorted(self._watched - names):
                with contextlib.suppress(UnknownRowError):  # deleted meanwhile
                    row = self.store.get_job(name)
                    if row.status is JobStatus.COMPLETED:
                        ended.append(row)
            if ended:
                usage = self.store.usage([row.name for row in ended], now)
                for row in sorted(ended, key=lambda r: (r.updated_at_s, r.name)):
                    self._lengths.append(usage.get(row.name, (0.0, 0))[0])
        self._watched = frozenset(row.name for row in active)
        return tuple(reversed(self._lengths))

    def _decide(
        self, cluster: ClusterView, views: tuple[JobView, ...], finished: tuple[float, ...] = ()
    ) -> Plan:
        """The policy's plan, with a job it fails on failed and left out (see
        :meth:`_isolate`); the policy's state moves on only with a plan. ``finished``: the
        latest completed jobs' lengths (:meth:`_learn_lengths`), for the round input."""
        state = self.policy_state

        def decide(jobs: tuple[JobView, ...]) -> Decision:
            if not jobs:  # every job was failed: nothing left to decide
                return Decision(Plan({}, {}), state)
            round_input = RoundInput(cluster, jobs, finished)
            decision = self.policy.decide(round_input, state)
            self._check_plan(round_input, decision.plan)
            return decision

        t0 = time.perf_counter()
        _, decision = self._isolate(views, decide, "the policy")
        self._policy_s = time.perf_counter() - t0
        self.policy_state = decision.state
        return decision.plan

    def _check_plan(self, round_input: RoundInput, plan: Plan) -> None:
        """The policy's plan holds (:meth:`~autoscaler.decide.views.Plan.validate`: known nodes,
        none over-allocated, a batch for every running job, within each job's GPU bounds, one GPU
        type per job for a type-aware policy, interference avoidance when asked); a plan
        that does not is never acted on (:class:`InvalidInputError`, isolated as a policy
        failure)."""
        bounds = {v.name: self.policy.gpu_bounds(v, round_input.cluster) for v in round_input.jobs}
        plan.validate(
            round_input,
            max_gpus={name: high for name, (_, high) in bounds.items()},
            single_type=self._type_aware,
        )
        for name, alloc in plan.allocations.items():
            low = bounds[name][0]
            if 0 < alloc.num_gpus < low:
                raise InvalidInputError(
                    f"{self.policy.name} gave {name} {alloc.num_gpus} GPUs, below its minimum "
                    f"{low}",
                    field="allocations",
                )

    def _isolate(
        self, views: tuple[JobView, ...], call: Callable[[tuple[JobView, ...]], _T], what: str
    ) -> tuple[tuple[JobView, ...], _T]:
        """``call(views)``; if it raises, each job is tried alone, those it raises on are
        failed with the reason, and the rest tried again. :class:`RoundError` when it still
        raises (no job can be blamed: the round cannot finish)."""
        try:
            return views, call(views)
        except Exception as first:  # one bad job never stops a round
            blamed: dict[str, str] = {}
            for view in views:
                try:
                    call((view,))
                except Exception as e:
                    blamed[view.name] = _one_line(e)
            rest = tuple(v for v in views if v.name not in blamed)
            try:
                result = call(rest) if blamed else None
            except Exception as again:
                raise RoundError(f"{what} failed: {_one_line(again)}") from again
            if result is None:
                raise RoundError(f"{what} failed: {_one_line(first)}") from first
            for name, reason in blamed.items():
                row = self.store.get_job(name)
                self._end_job(row, JobStatus.FAILED, f"{what} failed on it: {reason}")
            return rest, result

    def _end_job(self, row: JobRow, status: JobStatus, reason: str) -> None:
        """``row`` ends (failed, refused or completed) with ``reason``, unless it changed
        since it was read (cancelled meanwhile: it is decided again next round from what it
        became); its assignments and planned batch go."""
        try:
            self.store.update_job(row.name, row.version, status=status, reason=reason)
        except StaleVersionError:
            return
        self.store.set_assignments(row.name, {})
        self.store.clear_batch(row.name)
        self.book.drop(row.name)
        _log.info("job %s %s: %s", row.name, status.value, reason)

    # ---- job outcomes ----------------------------------------------------------------------

    def job_exited(self, name: str, *, failed: bool) -> JobStatus:
        """:func:`record_job_exit` on this controller's store (and the job's models are
        dropped once it ended)."""
        status = record_job_exit(
            self.store, name, failed=failed, max_retries=self.config.max_job_retries
        )
        if status is not JobStatus.QUEUED:
            self.book.drop(name)
        return status

    # ---- shutdown --------------------------------------------------------------------------

    def down(self, *, timeout_s: float = 600.0, poll_s: float = 5.0) -> DownReport:
        """Release every instance and confirm, by listing, that none is left.

        Each live row goes to ``terminating`` (written before its call) or, when it never got
        a cloud instance, to ``allocation_failed``; every listed instance (also one no row
        knows) is terminated; then the listing is polled on the injected clock until it is
        empty or ``timeout_s`` passes, and the rows whose instance is gone become
        ``terminated``. Jobs keep their status (a later ``up`` places them again) and lose
        their assignments. Raises nothing for a provider error: the report says what is
        left."""
        cid = self.config.cluster_id
        started = self.clock.monotonic_s()
        calls = 0
        for job in self.store.list_jobs(statuses=ACTIVE_JOBS):
            self.store.set_assignments(job.name, {})
        left: tuple[str, ...] = ()
        error: str | None = None
        while True:
            try:
                listed = {i.instance_id: i for i in self.provider.list_instances(cid)}
                calls += 1
            except ProviderError as e:
                error = str(e)
                listed = None
            if listed is not None:
                calls += self._release_all(listed)
                left = tuple(sorted(listed))
                if not listed:
                    break
            if self.clock.monotonic_s() - started >= timeout_s:
                break
            self.clock.sleep(poll_s)
        return DownReport(left, calls, None if not left else error)

    def _release_all(self, listed: Mapping[str, Instance]) -> int:
        """One pass of :meth:`down` over the rows and the listing; the calls made."""
        calls = 0
        for row in self.store.list_instances(statuses=_LIVE):
            pid = row.provider_instance_id
            if pid is None:
                found = next((i for i in listed.values() if i.request_id == row.request_id), None)
                if found is None:
                    if row.status in (InstanceStatus.QUEUED, InstanceStatus.REQUESTED):
                        self.store.transition(
                            row.instance_key,
                            row.version,
                            InstanceStatus.ALLOCATION_FAILED,
                            reason="down: released before it launched",
                        )
                    continue
                pid = found.instance_id
                if row.status is InstanceStatus.QUEUED:
                    row = self.store.transition(
                        row.instance_key, row.version, InstanceStatus.REQUESTED, reason="down"
                    )
                if row.status is InstanceStatus.REQUESTED:
                    row = self.store.transition(
                        row.instance_key,
                        row.version,
                        InstanceStatus.RUNNING,
                        reason="down: adopted to release it",
                        provider_instance_id=pid,
                    )
            if pid not in listed:
                if row.status is not InstanceStatus.ALLOCATION_FAILED:
                    self._terminated(row, "down: gone from the listing")
                continue
            if row.status is not InstanceStatus.TERMINATING:
                adopted: dict[str, object] = {}
                if row.provider_instance_id is None:
                    adopted["provider_instance_id"] = pid
                row = self.store.transition(
                    row.instance_key,
                    row.version,
                    InstanceStatus.TERMINATING,
                    reason="down: releasing every instance",
                    preemption=False,
                    **adopted,
                )
        ids = sorted(listed)  # ours by row, and any leak the listing shows
        if ids:
            calls += 1
            with contextlib.suppress(ProviderError):  # polled again: retried then
                self.provider.terminate(self.config.cluster_id, ids, "down")
        return calls

    def _prune_old(self, now: float) -> None:
        """Retention: prune what is older than ``retention_s`` (see :class:`ControllerConfig`),
        at most every :data:`RETENTION_EVERY_S` unless the last pass left more, in at most
        :data:`RETENTION_BATCHES` short transactions per table."""
        if self.config.retention_s is None:
            return
        due = self._pruned_at_s is None or now - self._pruned_at_s >= RETENTION_EVERY_S
        if not (due or self._prune_more):
            return
        self._pruned_at_s = now
        for _ in range(RETENTION_BATCHES):
            pruned = self.store.prune_old(now - self.config.retention_s)
            self._prune_more = pruned.more
            if not pruned.more:
                return

    # ---- observe ---------------------------------------------------------------------------

    def _refuse_unknown_fleet(self, observed: Sequence[Instance]) -> None:
        """:class:`UnknownFleetError` if the store has never planned and the cloud lists
        instances it does not know. (A store writes its first plan before its first launch,
        so a store that never planned cannot own any instance.)"""
        if self._planned or not observed:
            return
        if self.store.planned_at_s() is not None:
            self._planned = True
            return
        known = {r.request_id for r in self.store.list_instances()}
        strangers = tuple(sorted(i.instance_id for i in observed if i.request_id not in known))
        if strangers:
            raise UnknownFleetError(self.config.cluster_id, strangers, self.store.location)

    def _restore(self) -> None:
        """After a (re)start: the profiles from the store's ``models`` rows, each job's
        latest gradient statistics from its latest report, and the report cursor past every
        report (they are all in the profiles already)."""
        for row in self.store.list_models():
            self.book.restore(row.job_name, row.gpu_type, row.params_json)
        for report in self.store.latest_reports().values():
            self.book.record_gradient(TrainerReport.from_json(report.payload_json))
        self._report_cursor = self.store.last_report_id()

    def _read_reports(
        self, assignments: Mapping[tuple[str, str], int], gpu_type_of: Mapping[str, str]
    ) -> None:
        """New reports into the job book, each credited to the GPU type its job is assigned
        to only if it describes that assignment (:func:`~autoscaler.controller.jobbook.
        credited_gpu_type`: its world size, nodes and launch; a late report of the
        configuration before a rescale or a move is dropped from the profiles, and one of a
        launch older than one already read is ignored, :meth:`JobBook.record`); the profiles
        they changed are written back to the store (what a restart reads). The one place
        reports are read."""
        if self._report_cursor < 0:
            self._restore()
        self._report_cursor, reports = self.store.reports_after(self._report_cursor)
        reporting = {job for job, _ in reports}
        type_of_job: dict[str, str] = {}
        gpus_of_job: dict[str, int] = {}
        nodes_of_job: dict[str, int] = {}
        for (job, key), gpus in assignments.items():
            if job not in reporting:
                continue
            gpus_of_job[job] = gpus_of_job.get(job, 0) + gpus
            nodes_of_job[job] = nodes_of_job.get(job, 0) + 1
            if key in gpu_type_of:
                type_of_job[job] = gpu_type_of[key]
        placed_at = self.store.placed_at(sorted(type_of_job)) if type_of_job else {}
        runs = {
            job: AssignedRun(gpu_type, gpus_of_job[job], nodes_of_job[job], placed_at[job])
            for job, gpu_type in type_of_job.items()
            if job in placed_at
        }
        touched: set[tuple[str, str]] = set()
        for job, payload in reports:
            report = TrainerReport.from_json(payload)
            gpu_type = credited_gpu_type(report, runs.get(job))  # None: not credited
            if self.book.record(report, gpu_type) and gpu_type:
                touched.update((job, key) for key in self.book.changed_keys(gpu_type))
        t0 = time.perf_counter()
        self.book.refit()
        self._fit_s = time.perf_counter() - t0
        self.store.upsert_models(
            [(job, t, self.book.profile_json(job, t)) for job, t in sorted(touched)]
        )
        # Read and learned (the profiles just written): only a bounded history stays.
        self.store.prune_reports(reporting, self._report_cursor, self.config.report_history)

    def _cluster(
        self,
        ready: Sequence[InstanceRow],
        now: float,
        *,
        held_by: Mapping[str, Allocation] | None = None,
    ) -> ClusterView:
        """The ready instances as nodes; ``held_by``'s GPUs (jobs left as they are) are not
        offered (a node they fill is left out)."""
        taken: dict[str, int] = {}
        for alloc in (held_by or {}).values():
            for key, gpus in alloc.items():
                taken[key] = taken.get(key, 0) + gpus
        nodes = tuple(
            NodeView(
                r.instance_key,
                self._type(r.gpu_type),
                r.gpus - taken.get(r.instance_key, 0),
                OfferingRef(r.provider, r.instance_type, r.zone, r.market),
            )
            for r in sorted(ready, key=lambda r: r.instance_key)
            if r.gpus > taken.get(r.instance_key, 0)
        )
        return ClusterView(
            nodes,
            now,
            self._round,
            interval_s=self.config.interval_s,
            restart_delay_s=self.config.restart_delay_s,
            interference_avoidance=self.config.interference_avoidance
            and bool(getattr(self.policy, "avoids_interference", False)),
        )

    def _options(self, unavailable: frozenset[str]) -> tuple[FleetOption, ...]:
        out = []
        for key, o in sorted(self._offerings.items()):
            gpu_type = self._type(o.gpu_type)
            if o.price_usd_per_hour is None or o.gpus < 1 or not self._known_type(gpu_type):
                continue  # sizing cannot value it: no price, or a GPU type of unknown speed
            spot = o.market.value == "spot"
            out.append(
                FleetOption(
                    key=key,
                    gpu_type=gpu_type,
                    gpus=o.gpus,
                    market="spot" if spot else "on-demand",
                    usd_per_hour=o.price_usd_per_hour,
                    hazard_per_hour=self._hazard(o) if spot else 0.0,
                    available=key not in unavailable,
                    ref=OfferingRef(
                        o.provider, o.instance_type, o.zone, "spot" if spot else "on-demand"
                    ),
                )
            )
        return tuple(out)

    def _hazard(self, o: Offering) -> float:
        band = self.hazards.bands.get((o.region, o.instance_type))
        if band is not None:
            return band.hazard_per_hour
        return band_hazard_per_hour(self.config.default_spot_band)

    def _type(self, gpu_type: str) -> str:
        """The GPU type the decision core values ``gpu_type`` as (its alias, if any)."""
        return self.config.gpu_type_aliases.get(gpu_type, gpu_type)

    def _known_type(self, gpu_type: str) -> bool:
        known = self._speed_known.get(gpu_type)
        if known is None:
            try:
                self.speeds.relative_speed(gpu_type)
                known = True
            except InvalidInputError:
                known = False
            self._speed_known[gpu_type] = known
        return known

    def _row_view(self, r: InstanceRow) -> RowView:
        since, started = self.store.status_times(r.instance_key)
        retries = r.request_tries
        noticed = False
        if r.status is InstanceStatus.TERMINATING:
            retries = terminate_retries(self.store.history(r.instance_key))
        elif r.status is InstanceStatus.DRAINING:
            noticed = preempted_at(self.store.history(r.instance_key)) is not None
        return RowView(
            key=r.instance_key,
            request_id=r.request_id,
            offering_key=r.offering_key,
            status=r.status,
            since_s=since,
            retries=retries,
            provider_instance_id=r.provider_instance_id,
            last_heartbeat_s=r.last_heartbeat_s,
            started_s=started,
            noticed=noticed,
        )

    # ---- act -------------------------------------------------------------------------------

    def _act(
        self,
        actions: Actions,
        allocations: Mapping[str, Allocation],
        batches: Mapping[str, BatchChoice],
        jobs: Sequence[JobRow],
        rows: Sequence[InstanceRow],
        assignments: Mapping[tuple[str, str], int],
        now: float,
    ) -> int:
        """Execute ``actions`` (store, then cloud); returns the cloud calls made.
        ``assignments`` are the ones the round read; ``batches`` the plan's batch of each job
        it runs (what the API answers the job's trainer, and what its next launch starts
        with)."""
        store = self.store
        by_key = {r.instance_key: r for r in rows}
        for t in actions.transitions:
            row = by_key[t.key]
            changes: dict[str, object] = {}
            if t.provider_instance_id is not None:
                changes["provider_instance_id"] = t.provider_instance_id
            by_key[t.key] = store.transition(
                t.key, row.version, t.to, reason=t.reason, preemption=t.preemption, **changes
            )
            if t.to is InstanceStatus.TERMINATED:
                self._record_cost(by_key[t.key])
        new_keys: list[str] = []
        for intent in actions.new_rows:
            o = self._offerings[intent.offering_key]
            key = self._new_key()
            new_keys.append(key)
            by_key[key] = store.add_instance(
                instance_key=key,
                request_id=launch_request_id(self.config.cluster_id, key),
                offering_key=o.key,
                provider=o.provider,
                instance_type=o.instance_type,
                zone=o.zone,
                market=o.market.value,
                gpu_type=o.gpu_type,
                gpus=o.gpus,
                price_usd_per_hour=o.price_usd_per_hour or 0.0,
            )
        store.mark_planned()  # before the launches: a store that never planned owns nothing
        active = {j.name for j in jobs}
        for name in sorted({job for job, _ in assignments} - active):
            store.set_assignments(name, {})  # ended (completed, failed, cancelled): released
        held: dict[str, dict[str, int]] = {}
        for (job, key), gpus in assignments.items():
            held.setdefault(job, {})[key] = gpus
        planned = store.list_batches(sorted(active))
        for j in jobs:
            alloc = allocations.get(j.name, Allocation())
            if dict(alloc) != held.get(j.name, {}):  # an unchanged one is not written again
                store.set_assignments(j.name, dict(alloc))
            batch = batches.get(j.name)
            old = planned.get(j.name)
            if batch is not None and alloc.num_gpus:
                new = (batch.batch_size, batch.local_bsz, batch.accum_steps, alloc.num_gpus)
                if old is None or new != (
                    old.global_batch_size,
                    old.local_batch_size,
                    old.accum_steps,
                    old.gpus,
                ):
                    store.set_batch(
                        j.name,
                        global_batch_size=batch.batch_size,
                        local_batch_size=batch.local_bsz,
                        accum_steps=batch.accum_steps,
                        gpus=alloc.num_gpus,
                    )
            elif not alloc.num_gpus and old is not None:
                store.clear_batch(j.name)
            want = JobStatus.RUNNING if alloc.num_gpus else JobStatus.QUEUED
            if j.status is not want:
                # A job changed since it was read (cancelled, exited): left as it is now, and
                # decided again next round from what it became.
                with contextlib.suppress(StaleVersionError):
                    store.update_job(j.name, j.version, status=want)
        self._crash("after-store-writes")

        calls = 0
        for key in list(actions.launch) + new_keys:
            calls += self._launch(by_key, key)
        for key in actions.terminate:
            calls += self._terminate(by_key, key)
        for leak in actions.leaks:
            store.check_fence()  # a leak has no row to write its intent in
            calls += 1
            try:
                self.provider.terminate(
                    self.config.cluster_id, [leak.instance.instance_id], f"leak-{now:.0f}"
                )
            except ProviderError as e:  # listed again next round: retried then
                self._provider_error(e)
        return calls

    def _terminated(self, row: InstanceRow, reason: str) -> InstanceRow:
        """``row`` -> ``terminated``, and what it cost from when it was first seen running to
        now, at its price (per-second billing with the provider minimum,
        :func:`~autoscaler.market.terms.instance_cost_usd`), into the store's cost records."""
        new = self.store.transition(
            row.instance_key, row.version, InstanceStatus.TERMINATED, reason=reason
        )
        self._record_cost(new)
        return new

    def _record_cost(self, row: InstanceRow) -> None:
        _, started = self.store.status_times(row.instance_key)
        if started is None or row.provider_instance_id is None:
            return  # it never ran: nothing billed
        end = self.clock.now_s()
        runtime = max(0.0, end - started)
        price = row.price_usd_per_hour
        self.store.add_cost_record(
            row.instance_key, started, started + runtime, price, instance_cost_usd(price, runtime)
        )

    def _record_prices(self) -> None:
        for key, o in sorted(self._offerings.items()):
            if o.price_usd_per_hour is not None:
                self.store.record_price(key, o.price_usd_per_hour, o.market)

    def _launch(self, by_key: dict[str, InstanceRow], key: str) -> int:
        row = by_key[key]
        o = self._offerings.get(row.offering_key)
        if o is None:
            return 0
        refused = unavailable_launch(key, row.status, o.key, self.unavailable)
        if refused is not None:  # marked by an earlier launch of this round
            by_key[key] = self.store.transition(key, row.version, refused.to, reason=refused.reason)
            return 0
        if o.key in self.unavailable:
            return 0  # a requested row is not re-issued into it: it waits for its timeout
        if row.status is InstanceStatus.QUEUED:
            row = by_key[key] = self.store.transition(
                key,
                row.version,
                InstanceStatus.REQUESTED,
                reason="launch intent written before the provider call",
            )
            self._crash("after-launch-intent")
        else:  # a re-issue follows no write of this round: the lease is checked first
            self.store.check_fence()
        user_data = self._user_data(row) if self._user_data else ""
        request = LaunchRequest(
            row.request_id, self.config.cluster_id, (o,), 1, user_data=user_data
        )
        self._issued.add(row.request_id)
        try:
            result = self.provider.launch(request)
        except QuotaExceededError as e:  # raised before the provider's pool walk saw it
            self._provider_error(e)
            self.unavailable.mark_error(o.key, e)
            by_key[key] = self.store.transition(
                key, row.version, InstanceStatus.ALLOCATION_FAILED, reason="quota exceeded"
            )
            return 1
        except ProviderError as e:
            self._provider_error(e)
            return 1  # stays requested: re-issued or timed out later
        self._crash("after-launch-call")
        if result.instances:
            inst = result.instances[0]
            by_key[key] = self.store.transition(
                key,
                row.version,
                InstanceStatus.RUNNING,
                reason="launched",
                provider_instance_id=inst.instance_id,
            )
            return 1
        # The provider's pool walk marked the offering by the memory's one rule; marked again
        # here by the same rule (a no-op in the memory it shares; the mark itself for a
        # provider that keeps its own). A quota lasts longer: the next round's sizing routes
        # around it (another zone, type or market).
        for error in result.errors:
            self.unavailable.mark_error(error.offering_key, error.error)
            skipped = (
                isinstance(error.error, InsufficientCapacityError)
                and error.error.code == SKIPPED_UNAVAILABLE_CODE
            )
            if not skipped:
                self._provider_error(error.error)
        if any(isinstance(e.error, InsufficientCapacityError) for e in result.errors):
            by_key[key] = self.store.transition(
                key, row.version, InstanceStatus.ALLOCATION_FAILED, reason="capacity error"
            )
        elif any(isinstance(e.error, QuotaExceededError) for e in result.errors):
            by_key[key] = self.store.transition(
                key, row.version, InstanceStatus.ALLOCATION_FAILED, reason="quota exceeded"
            )
        return 1

    def _terminate(self, by_key: dict[str, InstanceRow], key: str) -> int:
        row = by_key[key]
        self._crash("after-terminate-intent")
        self._issued.add(row.request_id)
        if row.provider_instance_id is None:
            return 0
        self.store.check_fence()  # its intent may be a past round's: the lease is checked
        try:
            result = self.provider.terminate(
                self.config.cluster_id, [row.provider_instance_id], f"term-{row.request_id}"
            )
        except ProviderError as e:
            self._provider_error(e)
            return 1  # stays terminating: retried on its timeout
        self._crash("after-terminate-call")
        if row.provider_instance_id in result.already_gone:
            by_key[key] = self._terminated(row, "the cloud no longer knows it")
        return 1


def launch_request_id(cluster_id: str, instance_key: str) -> str:
    """The request id an instance is launched under (the ``coadapt-request-id`` tag the cloud
    keeps on it): ``<cluster id>-<instance key>``."""
    return f"{cluster_id}-{instance_key}"


def instance_key_from_request_id(cluster_id: str, request_id: str) -> str:
    """The instance key in a launch request id (what a node reads from its own tags);
    ``ValueError`` when the request id is not one of ``cluster_id``'s."""
    prefix = f"{cluster_id}-"
    if not request_id.startswith(prefix) or len(request_id) == len(prefix):
        raise ValueError(f"request id {request_id!r} is not one of cluster {cluster_id!r}'s")
    return request_id[len(prefix) :]


def record_job_exit(
    store: Store, name: str, *, failed: bool, max_retries: int, deterministic: bool = False
) -> JobStatus:
    """A job's processes ended on their own (the agent saw them exit): ``completed`` when they
    succeeded; on a failure the job is retried (``queued``, placed again next round) until it
    has failed ``max_retries`` times, then it is ``failed``; a ``deterministic`` failure (one
    that cannot succeed when run again: :func:`~autoscaler.controller.agent.deterministic_reason`)
    is ``failed`` at once. Processes the controller stopped
    (a rescale, a drain, a preemption) are never reported here, so they never count against
    the job. A job that already ended keeps its status. Returns the job's new status. Safe
    from another thread with that thread's own store (the API's)."""
    job = store.get_job(name)
    if job.status not in ACTIVE_JOBS:
        return job.status  # already ended (a late or repeated report)
    if not failed:
        status, retries = JobStatus.COMPLETED, job.retries
    else:
        retries = job.retries + 1
        final = deterministic or retries > max_retries
        status = JobStatus.FAILED if final else JobStatus.QUEUED
    store.update_job(name, job.version, status=status, retries=retries)
    if status is not JobStatus.QUEUED:
        store.set_assignments(name, {})
        store.clear_batch(name)  # nothing more is planned for a job that ended
    return status


_LIVE: Final = tuple(s for s in InstanceStatus if s is not InstanceStatus.TERMINATED)


def _with_allocation(view: JobView, allocation: Mapping[str, int]) -> JobView:
    return replace(view, allocation=Allocation(allocation))


def _one_line(error: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return (f"{type(error).__name__}: {text}" if text else type(error).__name__)[:300]
