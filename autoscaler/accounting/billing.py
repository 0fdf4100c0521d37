"""What each job cost: instances' billed cost split by the GPU-time jobs held on them.

Pure. An instance's cost record (``[start_s, end_s]`` at its price, billed per second with the
provider minimum) is spread evenly over its life and its GPUs: each job pays for the
GPU-seconds it held on the instance (its assignment spans) at that rate; GPU-seconds no job
held are ``IDLE``. The parts of every record sum to its cost, so the jobs and ``IDLE``
together sum to the fleet's total.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from autoscaler.accounting.churn import (
    REVERSAL_ROUNDS,
    ChurnFigures,
    InstancePhases,
    batch_reversals,
    idle_usd_by_cause,
    placement_reversals,
)
from autoscaler.accounting.costs import CostLedger, CostRecord
from autoscaler.controller.lifecycle import InstanceStatus, launched_at, left_at, preempted_at
from autoscaler.controller.store import (
    AssignmentSpan,
    CostRecordRow,
    InstanceRow,
    JobStatus,
    Store,
    placement_instants,
)
from autoscaler.errors import InvalidInputError
from autoscaler.market.terms import BILLING_INCREMENT_S, BILLING_MINIMUM_S
from providers.base import Market, offering_key

__all__ = [
    "IDLE",
    "churn_from_store",
    "cost_record_from_store",
    "job_costs",
    "ondemand_price_usd_per_hour",
    "run_origin_s",
]

IDLE: Final = "(idle)"
"""The share of a fleet's cost no job held."""


def job_costs(
    records: Iterable[CostRecordRow],
    spans: Sequence[AssignmentSpan],
    gpus_of: Mapping[str, int],
    now_s: float,
) -> dict[str, float]:
    """USD per job (and :data:`IDLE`), from ``records`` split by ``spans`` (see the module
    docstring); ``gpus_of`` gives each instance's GPU count, ``now_s`` closes open spans."""
    by_instance: dict[str, list[AssignmentSpan]] = {}
    for span in spans:
        by_instance.setdefault(span.instance_key, []).append(span)
    out: dict[str, float] = {}
    for rec in records:
        life = rec.end_s - rec.start_s
        gpus = gpus_of.get(rec.instance_key, 0)
        attributed = 0.0
        if life > 0 and gpus > 0:
            per_gpu_second = rec.usd / (life * gpus)  # the minimum spread over its life
            for span in by_instance.get(rec.instance_key, ()):
                end = now_s if span.to_s is None else span.to_s
                overlap = min(end, rec.end_s) - max(span.from_s, rec.start_s)
                if overlap > 0:
                    share = overlap * span.gpus * per_gpu_second
                    out[span.job_name] = out.get(span.job_name, 0.0) + share
                    attributed += share
        out[IDLE] = out.get(IDLE, 0.0) + rec.usd - attributed
    return out


def _useful_samples(payload_json: str) -> float:
    """Samples of training that count, from a trainer report's JSON: its ``progress`` (in
    initial-batch-size iterations, restored from the checkpoint after a stop, so work lost to a
    preemption is not counted) times its initial batch size. ``0.0`` for a report that does not
    carry both as finite, non-negative numbers (a bad report never stops a cost report)."""
    try:
        data = json.loads(payload_json)
        progress = float(data["progress"])
        batch = float(data["hints"]["initial_batch_size"])
    except (ValueError, TypeError, KeyError):
        return 0.0
    if not (math.isfinite(progress) and math.isfinite(batch)) or progress < 0 or batch < 1:
        return 0.0
    return progress * batch


ROUND_WRITE_TOLERANCE_S: Final = 1.0
"""A round writes its assignment changes one job after another, milliseconds apart (a job
moving onto GPUs another is leaving may be written a little before the other's release):
assignment boundaries on one instance closer than this are taken as one moment."""


def _snap_spans(spans: Sequence[AssignmentSpan]) -> list[AssignmentSpan]:
    """``spans`` with, per instance, every boundary (start or end) moved to the earliest
    boundary less than :data:`ROUND_WRITE_TOLERANCE_S` before it (chained: a run of close
    boundaries becomes its first); spans that become empty are dropped, open ones stay open."""
    times: dict[str, list[float]] = {}
    for span in spans:
        marks = times.setdefault(span.instance_key, [])
        marks.append(span.from_s)
        if span.to_s is not None:
            marks.append(span.to_s)
    snapped: dict[str, dict[float, float]] = {}
    for key, marks in times.items():
        table: dict[float, float] = {}
        first = prev = None
        for t in sorted(set(marks)):
            if first is None or prev is None or t - prev >= ROUND_WRITE_TOLERANCE_S:
                first = t
            table[t] = first
            prev = t
        snapped[key] = table
    out = []
    for span in spans:
        table = snapped[span.instance_key]
        start = table[span.from_s]
        end = None if span.to_s is None else table[span.to_s]
        if end is None or end > start:
            out.append(AssignmentSpan(span.job_name, span.instance_key, span.gpus, start, end))
    return out


def run_origin_s(store: Store) -> float | None:
    """The wall-clock start of a cluster's run (``None``: nothing happened yet): its first
    launch request or its first job submission, whichever came first."""
    times = [row.created_at_s for row in store.list_instances()]
    times += [job.submitted_at_s for job in store.list_jobs()]
    return min(times) if times else None


def ondemand_price_usd_per_hour(store: Store, row: InstanceRow, at_s: float) -> float | None:
    """What ``row`` would have cost per hour on demand when it started at ``at_s``: its own
    price when it is on demand, else the price the controller recorded for the on-demand
    offering of the same instance type in the same zone (``None``: none recorded by then, or
    that offering does not exist). The savings of a cost report are measured against it."""
    if row.market is Market.ON_DEMAND:
        return row.price_usd_per_hour
    twin = offering_key(row.provider, row.instance_type, row.zone, Market.ON_DEMAND.value)
    return store.price_at(twin, at_s)


def cost_record_from_store(store: Store, now_s: float) -> CostRecord:
    """The controller's fleet as a :class:`~autoscaler.accounting.costs.CostRecord` (what ``coadapt
    cost report --state-dir`` reads), with times in seconds from :func:`run_origin_s`.

    * Every instance that ran is billed from when it was first seen running to its end, with
      the provider minimum: the billed length of the controller's own cost record of it when it
      has one (whole seconds, so the report's total is what the store billed), else when it was
      seen gone, else (still running) ``now_s``.
    * An instance the provider ended (:func:`~autoscaler.controller.lifecycle.preempted_at`:
      its history records a preemption, as the round decided it) ended ``preempted``; every
      other end is ``released`` or, still running, ``end_of_run``.
    * Each job's GPU-time from the assignment history (clamped to the instance's life, its
      boundaries snapped within :data:`ROUND_WRITE_TOLERANCE_S`: :func:`_snap_spans`); a
      ``preemption`` event for each job that held GPUs on an instance when the provider ended
      it; a ``restart`` at each of its placements after the first (the store's one
      definition of a restart: :func:`~autoscaler.controller.store.placement_instants`, whose
      count is :meth:`~autoscaler.controller.store.Store.restart_counts`); submission, and
      completion at the job's last update; its useful samples from its latest trainer report
      (:func:`_useful_samples`).
    * The record closes at ``now_s`` while anything still runs (an instance not terminated, a
      job holding GPUs), else at the last thing that happened: a finished run's report does not
      grow with the time it is read.
    """
    origin = run_origin_s(store)
    if origin is None:
        return CostLedger().close(0.0)

    def rel(t: float) -> float:
        return max(0.0, t - origin)

    ledger = CostLedger()
    life: dict[str, tuple[float, float | None]] = {}
    preempted: dict[str, float] = {}
    billed: dict[str, CostRecordRow] = {}
    for rec in store.cost_records():
        billed.setdefault(rec.instance_key, rec)
    latest = 0.0
    live = False
    for row in store.list_instances():
        _, started = store.status_times(row.instance_key)
        if started is None or row.provider_instance_id is None:
            continue  # never ran: never billed
        history = store.history(row.instance_key)
        ended: float | None = None
        if row.status is InstanceStatus.TERMINATED:
            billed_rec = billed.get(row.instance_key)
            if billed_rec is None:
                ended = max(history[-1].at_s, started)
            else:  # billed as the controller billed it: whole seconds from its start
                runtime = max(0.0, billed_rec.end_s - billed_rec.start_s)
                ended = started + math.ceil(runtime / BILLING_INCREMENT_S) * BILLING_INCREMENT_S
        else:
            live = True
        ledger.launch(
            row.instance_key,
            offering_key=row.offering_key,
            provider=row.provider,
            instance_type=row.instance_type,
            gpu_type=row.gpu_type,
            gpus=row.gpus,
            zone=row.zone,
            market=row.market.value,
            t_s=rel(started),
            usd_per_hour=row.price_usd_per_hour,
            min_billed_s=BILLING_MINIMUM_S,
            ondemand_usd_per_hour=ondemand_price_usd_per_hour(store, row, started),
        )
        life[row.instance_key] = (started, ended)
        latest = max(latest, rel(started if ended is None else ended))
        at = preempted_at(history)
        if at is not None:
            preempted[row.instance_key] = at
    jobs = store.list_jobs()
    raw_spans = store.assignment_history()
    spans = _snap_spans(raw_spans)
    live = live or any(s.to_s is None for s in raw_spans)
    end_of = {key: (rel(now_s) if end is None else rel(end)) for key, (_, end) in life.items()}
    for job in jobs:
        ledger.job_event(job.name, rel(job.submitted_at_s), "submitted")
        latest = max(latest, rel(job.submitted_at_s))
    last_use: dict[str, float] = {}
    middle: dict[str, set[tuple[float, str]]] = {}
    for span in spans:
        if span.instance_key not in life:
            continue
        start, _ = life[span.instance_key]
        t0 = max(rel(span.from_s), rel(start))
        t1 = min(rel(now_s) if span.to_s is None else rel(span.to_s), end_of[span.instance_key])
        if t1 > t0:
            # Past the snapping, a span that still finds its instance's GPUs taken is billed
            # on the GPUs left (never more than the instance has): the rest stays idle cost.
            for gpus in range(span.gpus, 0, -1):
                try:
                    ledger.job_usage(span.job_name, span.instance_key, t0, t1, gpus)
                except InvalidInputError:
                    continue
                break
            last_use[span.job_name] = max(last_use.get(span.job_name, t1), t1)
        hit = preempted.get(span.instance_key)
        if hit is not None and span.from_s <= hit and (span.to_s is None or span.to_s >= hit):
            middle.setdefault(span.job_name, set()).add((rel(hit), "preemption"))
    for name, starts in placement_instants(raw_spans).items():
        for t in starts[1:]:  # the store's restarts: every placement after the first
            middle.setdefault(name, set()).add((rel(t), "restart"))
    order = {"preemption": 0, "restart": 1}
    for name, events in middle.items():
        for t, kind in sorted(events, key=lambda e: (e[0], order[e[1]])):
            ledger.job_event(name, t, kind)
    reports = store.latest_reports(job.name for job in jobs)
    for job in jobs:
        report = reports.get(job.name)
        if report is not None:
            ledger.job_work(job.name, _useful_samples(report.payload_json))
        if job.status is JobStatus.COMPLETED:
            at = max(rel(job.updated_at_s), last_use.get(job.name, 0.0))
            at = max([at, *(t for t, _ in middle.get(job.name, ()))])
            ledger.job_event(job.name, at, "finished")
            latest = max(latest, at)
    for key, (_, end) in sorted(life.items()):
        if end is not None:
            ledger.end(key, rel(end), "preempted" if key in preempted else "released")
    return ledger.close(max(rel(now_s), latest) if live else latest)


def _placements(spans: Sequence[AssignmentSpan]) -> dict[str, list[tuple[float, dict[str, int]]]]:
    """Each job's placements over time, from the assignment history: at each moment its
    assignment changed (boundaries closer than :data:`ROUND_WRITE_TOLERANCE_S` are one round's
    writes: one moment, at the first of them), its GPUs by instance key (empty: stopped)."""
    by_job: dict[str, list[AssignmentSpan]] = {}
    for span in spans:
        by_job.setdefault(span.job_name, []).append(span)
    out: dict[str, list[tuple[float, dict[str, int]]]] = {}
    for name, mine in by_job.items():
        marks = sorted({t for s in mine for t in (s.from_s, s.to_s) if t is not None})
        moments: list[tuple[float, float]] = []  # (first, last) boundary of each moment
        for t in marks:
            if moments and t - moments[-1][1] < ROUND_WRITE_TOLERANCE_S:
                moments[-1] = (moments[-1][0], t)
            else:
                moments.append((t, t))
        states = []
        for first, last in moments:
            held: dict[str, int] = {}
            for s in mine:
                if s.from_s <= last and (s.to_s is None or s.to_s > last):
                    held[s.instance_key] = held.get(s.instance_key, 0) + s.gpus
            states.append((first, held))
        out[name] = states
    return out


def churn_from_store(
    store: Store,
    record: CostRecord,
    *,
    interval_s: float,
    origin_s: float = 0.0,
    by_cloud_id: bool = False,
    batches: Mapping[str, Sequence[tuple[float, int]]] | None = None,
) -> ChurnFigures:
    """The churn of the run ``store`` holds (:mod:`autoscaler.accounting.churn` defines each
    figure), its idle split over ``record``, the run's bill: a record built from this store
    (:func:`cost_record_from_store`, times from ``origin_s`` = :func:`run_origin_s`, instances
    by instance key) or the simulated cloud's (``origin_s`` 0, instances by their cloud id:
    ``by_cloud_id``). Reversals are counted over ``REVERSAL_ROUNDS * interval_s``; batch
    reversals only from ``batches`` (each job's ``(at_s, global batch)`` in time order, store
    clock), the store keeping only each job's latest batch (``None`` without it)."""
    spans = store.assignment_history()
    first_job: dict[str, float] = {}
    for span in spans:
        at = first_job.get(span.instance_key)
        first_job[span.instance_key] = span.from_s if at is None else min(at, span.from_s)
    phases: dict[str, InstancePhases] = {}
    launches = 0
    for row in store.list_instances():
        history = store.history(row.instance_key)
        if launched_at(history) is not None:
            launches += 1
        key = row.provider_instance_id if by_cloud_id else row.instance_key
        if key is None:
            continue
        first, left = first_job.get(row.instance_key), left_at(history)
        phases[key] = InstancePhases(
            None if first is None else first - origin_s, None if left is None else left - origin_s
        )
    horizon_s = REVERSAL_ROUNDS * interval_s
    gpus = instances = 0
    for states in _placements(spans).values():
        g, i = placement_reversals(states, horizon_s)
        gpus, instances = gpus + g, instances + i
    batch: int | None = None
    if batches is not None:
        batch = sum(batch_reversals(b, horizon_s) for b in batches.values())
    names = [job.name for job in store.list_jobs()]
    return ChurnFigures(
        launches=launches,
        boots_billed=len(record.instances),
        jobs=len(names),
        restarts=sum(store.restart_counts(names).values()),
        reversals_by_kind={"gpus": gpus, "instances": instances, "batch": batch},
        idle_usd_by_cause=idle_usd_by_cause(record, phases),
        interval_s=interval_s,
    )
