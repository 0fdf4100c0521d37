"""The controller's Prometheus metrics: what ``GET /metrics`` answers (the text format of the
standard client library, ``prometheus_client``), one :class:`ControllerMetrics` per process.

Two kinds of figures, kept apart on purpose:

* **The fleet, read from the store at scrape time** (:class:`FleetCollector`): every process
  that serves the API over the same store gives the same figures, whichever one a scraper
  reaches. Each scrape makes a bounded number of reads (grouped counts, the live rows, the
  running jobs' latest reports) and fits no model.

  ====================================  =======  ==============================================
  family                                type     labels: what
  ====================================  =======  ==============================================
  ``coadapt_instances``                 gauge    ``offering``, ``market``, ``state``: instance
                                                 rows not ``terminated``
  ``coadapt_fleet_cost_usd_per_hour``   gauge    the prices of the instances billing now
  ``coadapt_spend_usd_total``           counter  USD spent so far (closed bills + accrued):
                                                 :func:`~autoscaler.controller.spend.
                                                 fleet_cost`, what ``/v1/costs`` answers
  ``coadapt_jobs``                      gauge    ``status``: jobs in each status (every status,
                                                 0 included)
  ``coadapt_job_gpus``                  gauge    ``job``: GPUs a running job holds
  ``coadapt_job_batch_size``            gauge    ``job``: its global batch, as the round
                                                 planned it (else as its trainer runs it)
  ``coadapt_job_throughput``            gauge    ``job``: samples/s its trainer measured at the
                                                 batch it runs (its latest report)
  ``coadapt_job_statistical_efficiency``  gauge  ``job``: that batch's statistical efficiency
                                                 by the gradient noise its trainer measured
  ``coadapt_job_goodput``               gauge    ``job``: throughput x efficiency (samples/s
                                                 in initial-batch-size equivalents)
  ====================================  =======  ==============================================

  Job labels are job names: bounded by the store (a DNS label, at most the running jobs).

* **This process's own work**, counted as it happens: ``coadapt_round_duration_seconds``
  (histogram, ``phase``: ``observe``, ``decide``, ``reconcile``, ``act``: the phases of
  :meth:`~autoscaler.controller.loop.Controller.run_round`, fed by :meth:`ControllerMetrics.
  observe_round` from its :class:`~autoscaler.controller.loop.RoundReport`; a round ended
  early by a provider error has only ``observe``), ``coadapt_preemption_notices_total``,
  ``coadapt_preemptions_total``, ``coadapt_provider_errors_total`` (``kind``: one of
  :data:`~providers.errors.ERROR_KINDS`, each present from the start), and
  ``coadapt_api_request_duration_seconds`` (histogram, ``method`` and ``route``: the route's
  template, e.g. ``/v1/jobs/<name>``, never the raw path; ``(unmatched)`` for a path no route
  takes). ``coadapt_leader`` (1 on the process that runs the rounds) and
  ``coadapt_leader_epoch`` come from :meth:`ControllerMetrics.set_leadership`, the one place
  leader lease feeds (:mod:`autoscaler.controller.leader`: the holder leads, at its epoch). The
  client's ``process_*`` families (memory, CPU, open files) come along.

Each :class:`ControllerMetrics` has its own ``CollectorRegistry``, never the library's global
one: several apps in one process (the tests) do not collide.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.records import ReportRow
from autoscaler.controller.spend import fleet_cost
from autoscaler.controller.store import JobStatus, Store
from autoscaler.errors import InvalidInputError
from autoscaler.model.goodput import GradParams, efficiency
from coadapt_common.clock import Clock
from providers.base import Market
from providers.errors import ERROR_KINDS
from trainer.errors import TrainerError
from trainer.report import TrainerReport

if TYPE_CHECKING:
    from autoscaler.controller.loop import RoundReport

__all__ = [
    "FAMILIES",
    "ROUND_PHASES",
    "UNMATCHED_ROUTE",
    "ControllerMetrics",
    "FleetCollector",
    "JobSpeed",
    "Leadership",
    "measured_speed",
]

ROUND_PHASES: Final = ("observe", "decide", "reconcile", "act")
"""The ``phase`` label values of ``coadapt_round_duration_seconds``."""
UNMATCHED_ROUTE: Final = "(unmatched)"
"""The ``route`` label of a request no route takes (404, 405)."""
ROUND_BUCKETS_S: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""The ``method`` label values of a request (any other method counts as ``OTHER``)."""
REQUEST_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_LIVE: Final = tuple(s for s in InstanceStatus if s is not InstanceStatus.TERMINATED)
_JOB_GAUGES: Final = (
    ("coadapt_job_gpus", "GPUs a running job holds."),
    ("coadapt_job_batch_size", "A running job's global batch size (samples per step)."),
    ("coadapt_job_throughput", "Samples per second a running job's trainer measured."),
    (
        "coadapt_job_statistical_efficiency",
        "The statistical efficiency of a running job's batch (0-1), by its gradient noise.",
    ),
    (
        "coadapt_job_goodput",
        "A running job's goodput: throughput x statistical efficiency (samples/s).",
    ),
)

FAMILIES: Final = (
    "coadapt_instances",
    "coadapt_fleet_cost_usd_per_hour",
    "coadapt_spend_usd",
    "coadapt_jobs",
    *(name for name, _ in _JOB_GAUGES),
    "coadapt_round_duration_seconds",
    "coadapt_api_request_duration_seconds",
    "coadapt_preemption_notices",
    "coadapt_preemptions",
    "coadapt_provider_errors",
    "coadapt_leader",
    "coadapt_leader_epoch",
)
"""Every family of ours ``GET /metrics`` answers, by its family name (a counter's samples add
``_total``, a histogram's ``_bucket``, ``_sum`` and ``_count``)."""


@dataclass(frozen=True)
class Leadership:
    """Whether this process leads (runs the rounds and calls the cloud) and under which
    fencing ``epoch``."""

    leader: bool
    epoch: int = 0


@dataclass(frozen=True)
class JobSpeed:
    """What a job's trainer measured at the batch it runs: ``throughput`` samples/s (``None``:
    no timing of that configuration yet), ``efficiency`` the batch's statistical efficiency
    (``None``: no gradient statistics yet), ``goodput`` their product (``None`` unless both
    are known)."""

    throughput: float | None
    efficiency: float | None

    @property
    def goodput(self) -> float | None:
        if self.throughput is None or self.efficiency is None:
            return None
        return self.throughput * self.efficiency


def measured_speed(report: TrainerReport) -> JobSpeed:
    """The speed ``report`` measured at its own batch: the throughput of its profile entry
    for the configuration it runs (nodes, replicas, micro-batch, accumulation steps), the
    global batch over that entry's mean step time; the efficiency of its global batch by its
    gradient statistics (:func:`~autoscaler.model.goodput.efficiency`, the goodput model's
    own rule)."""
    batch = report.batch
    local = batch.local_batch_size(report.world_size)
    throughput = None
    for entry in report.profiles:
        if (
            (entry.num_nodes, entry.num_replicas, entry.local_batch_size, entry.accum_steps)
            == (report.num_nodes, report.world_size, local, batch.accum_steps)
            and math.isfinite(entry.step_s)
            and entry.step_s > 0
        ):
            throughput = batch.global_batch_size / entry.step_s
    eff = None
    g = report.gradient
    if g is not None:
        try:
            grad = GradParams(g.grad_sqr, g.grad_var)
        except InvalidInputError:
            grad = None
        if grad is not None:
            value = float(efficiency(grad, g.initial_batch_size, batch.global_batch_size))
            eff = value if math.isfinite(value) else None
    return JobSpeed(throughput, eff)


class FleetCollector(Collector):
    """The fleet's families, read from ``store()`` (the calling thread's store) at each
    scrape (see the module docstring); ``clock`` dates the spend."""

    def __init__(self, store: Callable[[], Store], clock: Clock) -> None:
        self._store = store
        self._clock = clock

    def describe(self) -> Iterable[Metric]:
        """The families without samples (read nothing: registering does not scrape)."""
        return self._families({}, {}, 0.0, 0.0, {})

    def collect(self) -> Iterable[Metric]:
        store = self._store()
        cost = fleet_cost(store, self._clock.now_s())
        instances = store.instance_counts(_LIVE)
        jobs = store.job_counts()
        running = [j.name for j in store.list_jobs(statuses=[JobStatus.RUNNING])]
        per_job: dict[str, dict[str, float]] = {name: {} for name in running}
        for (job, _), gpus in store.list_assignments().items():
            if job in per_job:
                held = per_job[job].get("coadapt_job_gpus", 0.0)
                per_job[job]["coadapt_job_gpus"] = held + gpus
        planned = store.list_batches(running)
        reports = store.latest_reports(running)
        for name in running:
            figures = per_job[name]
            figures.setdefault("coadapt_job_gpus", 0.0)
            report = _report(reports.get(name))
            batch = planned.get(name)
            if batch is not None:
                figures["coadapt_job_batch_size"] = float(batch.global_batch_size)
            elif report is not None:
                figures["coadapt_job_batch_size"] = float(report.batch.global_batch_size)
            if report is not None:
                speed = measured_speed(report)
                for family, value in (
                    ("coadapt_job_throughput", speed.throughput),
                    ("coadapt_job_statistical_efficiency", speed.efficiency),
                    ("coadapt_job_goodput", speed.goodput),
                ):
                    if value is not None:
                        figures[family] = value
        return self._families(instances, jobs, cost.usd_per_hour, cost.total_usd, per_job)

    @staticmethod
    def _families(
        instances: Mapping[tuple[str, Market, InstanceStatus], int],
        jobs: Mapping[JobStatus, int],
        usd_per_hour: float,
        total_usd: float,
        per_job: Mapping[str, Mapping[str, float]],
    ) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "coadapt_instances",
            "Instance rows that are not terminated, by offering, market and state.",
            labels=["offering", "market", "state"],
        )
        for (offering, market, state), n in sorted(instances.items(), key=str):
            family.add_metric([offering, market.value, state.value], n)
        yield family
        yield GaugeMetricFamily(
            "coadapt_fleet_cost_usd_per_hour",
            "What the instances billing now cost per hour (USD).",
            value=usd_per_hour,
        )
        yield CounterMetricFamily(
            "coadapt_spend_usd",
            "USD the fleet has cost so far (closed bills plus what running instances accrued).",
            value=total_usd,
        )
        family = GaugeMetricFamily("coadapt_jobs", "Jobs by status.", labels=["status"])
        for status in JobStatus:
            family.add_metric([status.value], jobs.get(status, 0))
        yield family
        for name, help_text in _JOB_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["job"])
            for job, figures in sorted(per_job.items()):
                if name in figures:
                    family.add_metric([job], figures[name])
            yield family


def _report(row: ReportRow | None) -> TrainerReport | None:
    """The trainer report of ``row`` (``None``: none, or one that does not parse: a bad
    report never fails a scrape)."""
    if row is None:
        return None
    try:
        return TrainerReport.from_json(row.payload_json)
    except (TrainerError, ValueError, TypeError, KeyError):
        return None


class ControllerMetrics:
    """One process's metrics (see the module docstring): its own registry, the counters and
    histograms of its rounds and requests, its leadership, and the fleet's collector once
    :meth:`watch_store` gave it a store. Thread-safe (the client library's metrics are)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self._round = Histogram(
            "coadapt_round_duration_seconds",
            "Seconds each phase of this process's controller rounds took.",
            ["phase"],
            buckets=ROUND_BUCKETS_S,
            registry=self.registry,
        )
        self._requests = Histogram(
            "coadapt_api_request_duration_seconds",
            "Seconds this process took to answer API requests, by method and route template.",
            ["method", "route"],
            buckets=REQUEST_BUCKETS_S,
            registry=self.registry,
        )
        self._notices = Counter(
            "coadapt_preemption_notices_total",
            "Instances this process drained for a spot interruption notice.",
            registry=self.registry,
        )
        self._preemptions = Counter(
            "coadapt_preemptions_total",
            "Instances the provider took back (noticed or not), each counted once.",
            registry=self.registry,
        )
        self._provider_errors = Counter(
            "coadapt_provider_errors_total",
            "Provider errors this process's rounds met, by kind.",
            ["kind"],
            registry=self.registry,
        )
        for kind in ERROR_KINDS:
            self._provider_errors.labels(kind)
        self._leader = Gauge(
            "coadapt_leader",
            "1 on the process that runs the rounds and calls the cloud, 0 on one standing by.",
            registry=self.registry,
        )
        self._epoch = Gauge(
            "coadapt_leader_epoch",
            "The fencing epoch this process leads under (or last saw).",
            registry=self.registry,
        )
        self._watching = False
        self._lock = threading.Lock()

    def watch_store(self, store: Callable[[], Store], clock: Clock) -> None:
        """Answer the fleet's families from ``store()`` (the calling thread's store) at each
        scrape (:class:`FleetCollector`); once."""
        with self._lock:
            if self._watching:
                raise InvalidInputError("these metrics already watch a store", field="store")
            self.registry.register(FleetCollector(store, clock))
            self._watching = True

    def set_leadership(self, leadership: Leadership) -> None:
        """Whether this process leads, and its epoch: the one place a leader lease feeds."""
        self._leader.set(1 if leadership.leader else 0)
        self._epoch.set(leadership.epoch)

    def observe_round(self, report: RoundReport) -> None:
        """Count one round of this process's controller, from its report."""
        phases = (report.observe_s, report.decide_s, report.reconcile_s, report.act_s)
        for phase, seconds in zip(ROUND_PHASES, phases, strict=True):
            if report.error is None or phase == "observe":
                self._round.labels(phase).observe(max(0.0, seconds))
        if report.notices:
            self._notices.inc(report.notices)
        if report.preemptions:
            self._preemptions.inc(report.preemptions)
        for kind, n in report.provider_errors.items():
            self._provider_errors.labels(kind if kind in ERROR_KINDS else "other").inc(n)

    def observe_request(self, method: str, route: str, seconds: float) -> None:
        """Count one API request: ``route`` its template (or :data:`UNMATCHED_ROUTE`); a
        ``method`` not in :data:`METHODS` counts as ``OTHER`` (label values stay bounded)."""
        label = method if method in METHODS else "OTHER"
        self._requests.labels(label, route).observe(max(0.0, seconds))

    def exposition(self) -> bytes:
        """Every family, in the Prometheus text format (what ``GET /metrics`` answers)."""
        return generate_latest(self.registry)
