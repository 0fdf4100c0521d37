"""What each job cost: instances' billed cost split by the GPU-time jobs held on them.

Pure. An instance's cost record (``[start_s, end_s]`` at its price, billed per second with the
provider minimum) is spread evenly over its life and its GPUs: each job pays for the
GPU-seconds it held on the instance (its assignment spans) at that rate; GPU-seconds no job
held are ``IDLE``. The parts of every record sum to its cost, so the jobs and ``IDLE``
together sum to the fleet's total.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.reconcile import NOTICE_REASON, VANISHED_REASON
from autoscaler.controller.store import AssignmentSpan, CostRecordRow, JobStatus, Store
from autoscaler.costs import CostLedger, CostRecord

__all__ = ["IDLE", "cost_record_from_store", "job_costs"]

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


def cost_record_from_store(store: Store, now_s: float) -> CostRecord:
    """The controller's fleet as a :class:`~autoscaler.costs.CostRecord` (what ``coadapt cost
    report`` reads): every instance that ran, from when it was first seen running to when it
    was seen gone (still running: to ``now_s``) at its price; every job's GPU-time on them
    from the assignment history (clamped to the instance's life); submissions, and
    completions at the job's last update. An instance whose history shows a spot notice or a
    vanishing ended ``preempted``, the others ``released``."""
    ledger = CostLedger()
    life: dict[str, tuple[float, float | None]] = {}
    preempted_keys: set[str] = set()
    for row in store.list_instances():
        _, started = store.status_times(row.instance_key)
        if started is None or row.provider_instance_id is None:
            continue  # never ran: never billed
        history = store.history(row.instance_key)
        ended = history[-1].at_s if row.status is InstanceStatus.TERMINATED else None
        ledger.launch(
            row.instance_key,
            offering_key=row.offering_key,
            provider=row.provider,
            instance_type=row.instance_type,
            gpu_type=row.gpu_type,
            gpus=row.gpus,
            zone=row.zone,
            market=row.market.value,
            t_s=started,
            usd_per_hour=row.price_usd_per_hour,
        )
        life[row.instance_key] = (started, None if ended is None else max(ended, started))
        if any(h.reason in (NOTICE_REASON, VANISHED_REASON) for h in history):
            preempted_keys.add(row.instance_key)
    jobs = store.list_jobs()
    for job in jobs:
        ledger.job_event(job.name, job.submitted_at_s, "submitted")
    last_use: dict[str, float] = {}
    for span in store.assignment_history():
        if span.instance_key not in life:
            continue
        start, end = life[span.instance_key]
        t0 = max(span.from_s, start)
        t1 = min(now_s if span.to_s is None else span.to_s, now_s if end is None else end)
        if t1 > t0:
            ledger.job_usage(span.job_name, span.instance_key, t0, t1, span.gpus)
            last_use[span.job_name] = max(last_use.get(span.job_name, t1), t1)
    for job in jobs:
        if job.status is JobStatus.COMPLETED:
            at = max(job.updated_at_s, last_use.get(job.name, job.submitted_at_s))
            ledger.job_event(job.name, at, "finished")
    for key, (_, end) in sorted(life.items()):
        if end is not None:
            ledger.end(key, end, "preempted" if key in preempted_keys else "released")
    return ledger.close(now_s)
