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
  fleet may grow to); a job is refused when, on every pool of a type it allows, it needs more
  GPUs than the pool or its ceiling allow. The reason names the spec field to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoscaler.gputypes import SpeedTable, limits_on
from autoscaler.jobs import JobView

__all__ = ["PoolCapacity", "fewest_gpus_on", "gpu_ceiling", "refusal"]


@dataclass(frozen=True)
class PoolCapacity:
    """GPUs of one type that one job could be given at most, in one pool: ``name`` says
    which (for messages)."""

    name: str
    gpu_type: str
    capacity_gpus: int


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
    allowed = [p for p in pools if job.allows_type(p.gpu_type)]
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
