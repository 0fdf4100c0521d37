"""A job's GPU bounds and the one admission rule: can any fleet of these pools ever run it?

Pure: numbers in, numbers (or a reason) out. Every policy and the controller use these, so a
job's spec bounds mean the same thing everywhere:

* :func:`fewest_gpus_on` -- the fewest GPUs of a type a job may run on: the user's floor
  (``gpus.min``; exactly its requested GPUs for a job that does not adapt) and what its batch
  needs (its initial batch, or its fixed one, split into micro-batches of at most the type's
  per-GPU batch, at most ``max_accum_steps`` of them);
* :func:`gpu_ceiling` -- the most GPUs it may run on: the user's cap (``gpus.max``; the
  requested GPUs of a job that does not adapt) and its batch limit (``max_batch_size //
  min_local_bsz``: one sample fewer per GPU is impossible);
* :func:`refusal` -- why no pool can ever hold the job (``None`` if one can): a pool is GPUs
  of one type, ``capacity_gpus`` of them at most (the nodes of a fixed cluster, or what a
  fleet may grow to), from some offerings; a job is refused when no pool is of a type and
  from an offering it allows (:meth:`~autoscaler.decide.views.JobView.allows_type`,
  :meth:`~autoscaler.decide.views.JobView.allows_offering`: ``gpu_types``, ``markets``,
  ``offerings``), or when, on every pool it allows, it needs more GPUs than the pool or its
  ceiling allow. The reason names the spec field to change. A pool that mixes offerings the
  job allows with others counts whole (the controller's pools of what a fleet may grow to are
  per type): a refusal is certain, a pass is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoscaler.decide.views import JobView, OfferingRef
from autoscaler.model.gputypes import SpeedTable, limits_on

__all__ = ["PoolCapacity", "fewest_gpus_on", "gpu_ceiling", "refusal"]


@dataclass(frozen=True)
class PoolCapacity:
    """GPUs of one type that one job could be given at most, in one pool: ``name`` says
    which (for messages); ``offerings``: those its GPUs may come from (``None`` in the set: a
    node of no known offering; the set ``None``: not told, and a job's market and offering
    limits are then not judged)."""

    name: str
    gpu_type: str
    capacity_gpus: int
    offerings: frozenset[OfferingRef | None] | None = None

    def allows(self, job: JobView) -> bool:
        """Whether ``job`` may run on this pool's GPUs: their type, and some offering of
        theirs (:meth:`~autoscaler.decide.views.JobView.allows_offering`)."""
        if not job.allows_type(self.gpu_type):
            return False
        if self.offerings is None or not job.restricts_offerings:
            return True
        return any(job.allows_offering(o) for o in self.offerings)


def fewest_gpus_on(job: JobView, gpu_type: str, speeds: SpeedTable) -> int:
    """The fewest GPUs of ``gpu_type`` the job may run on (see the module docstring)."""
    limits = limits_on(job.limits, job.application, gpu_type, speeds)
    batch = limits.init_batch_size if job.adaptive else job.fixed_batch_size
    by_batch = max(1, -(-batch // (limits.max_local_bsz * limits.max_accum_steps)))
    return max(job.fewest_gpus, by_batch)


def gpu_ceiling(job: JobView) -> int:
    """The most GPUs the job may run on: its batch limit and the user's cap."""
    by_batch = max(1, job.limits.max_batch_size // job.limits.min_local_bsz)
    cap = job.max_gpus
    return by_batch if cap is None else min(by_batch, cap)


def refusal(
    job: JobView, pools: Sequence[PoolCapacity], speeds: SpeedTable, *, max_gpus_per_job: int
) -> str | None:
    """Why the job can never run on ``pools`` (``None`` if it can; see the module docstring).
    ``max_gpus_per_job`` is the policy's own cap."""
    allowed = [p for p in pools if p.allows(job)]
    if not allowed and any(job.allows_type(p.gpu_type) for p in pools):
        return _offering_refusal(job, pools)
    if not allowed:
        have = ", ".join(sorted({p.gpu_type for p in pools})) or "none"
        wanted = ", ".join(sorted(job.gpu_types or ()))
        return f"gpu_types allows {wanted}; the fleet can have only {have}"
    ceiling = min(gpu_ceiling(job), max_gpus_per_job)
    need = {p.name: fewest_gpus_on(job, p.gpu_type, speeds) for p in allowed}
    if any(need[p.name] <= min(ceiling, p.capacity_gpus) for p in allowed):
        return None
    fewest = min(need.values())
    if fewest > ceiling:
        if job.max_gpus is not None and fewest > job.max_gpus:
            return (
                f"needs at least {fewest} GPUs (gpus.min, or its batch size over its largest "
                f"local batch) but gpus.max allows {job.max_gpus}"
            )
        return (
            f"needs at least {fewest} GPUs but its batch limits allow at most {ceiling} "
            "(batch_size.max / local_batch_size.min)"
        )
    largest = max(allowed, key=lambda p: (p.capacity_gpus, p.name))
    floor = "gpus.min" if job.fewest_gpus >= fewest else "its batch size"
    return (
        f"needs at least {fewest} GPUs of one type ({floor}); the largest pool it may use "
        f"({largest.name}) holds {largest.capacity_gpus}"
    )


def _offering_refusal(job: JobView, pools: Sequence[PoolCapacity]) -> str:
    """The reason for a job whose markets or offerings exclude every pool of a type it
    allows."""
    have = sorted(
        {
            "(no offering)" if o is None else o.key
            for p in pools
            if job.allows_type(p.gpu_type)
            for o in p.offerings or ()
        }
    )
    shown = ", ".join(have[:8]) + (f" and {len(have) - 8} more" if len(have) > 8 else "")
    limits = []
    if job.markets is not None:
        limits.append(f"markets allows {', '.join(sorted(job.markets))}")
    if job.offerings is not None:
        limits.append(f"offerings allows {', '.join(sorted(o.key for o in job.offerings))}")
    return f"{'; '.join(limits)}; the fleet can have only {shown or 'none'}"
