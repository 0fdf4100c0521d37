"""Tiresias (Gu et al., NSDI'19) as tuned in the Pollux paper: two-queue discretised LAS.

Each job runs as a gang of exactly its user-requested GPU count (capped at the cluster size) at
its user batch size — it either runs at that size or waits. Priority is discretised least
attained service with two queues: a job starts in queue 0 and is demoted, for good, to the end
of queue 1 once its attained service reaches ``threshold_gpu_s`` (16 GPU-hours by default);
within a queue, jobs keep their order (arrival order in queue 0, demotion order in queue 1).
Each round, the queues are scanned in order and every job whose gang still fits in the GPUs
left is run (later, smaller jobs may skip ahead of a large one that does not fit); the others
are preempted. A job that keeps running keeps its GPUs; a job that starts is packed onto the
nodes with the most free GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoscaler.decide.policy.base import Decision
from autoscaler.decide.policy.placement import allowed_nodes, on_allowed, pack_on
from autoscaler.decide.views import (
    Allocation,
    BatchChoice,
    ClusterView,
    JobView,
    Plan,
    PolicyName,
    RoundInput,
    fixed_batch_choice,
)
from autoscaler.errors import InvalidInputError

__all__ = ["TiresiasPolicy", "TiresiasState"]


@dataclass(frozen=True)
class TiresiasState:
    """Names of the jobs in queue 1, in demotion order."""

    demoted: tuple[str, ...] = ()


class TiresiasPolicy:
    """Two-queue discretised least-attained-service, gang-scheduled, fixed batch size."""

    name = PolicyName.TIRESIAS
    uses_model = False
    uses_oracle = False
    avoids_interference = False

    def __init__(self, threshold_gpu_s: float = 16 * 3600.0) -> None:
        if not threshold_gpu_s > 0:
            raise InvalidInputError("threshold_gpu_s must be > 0", field="threshold_gpu_s")
        self.threshold_gpu_s = float(threshold_gpu_s)

    def initial_state(self) -> TiresiasState:
        return TiresiasState()

    def gang_size(self, job: JobView, cluster: ClusterView) -> int:
        """The job's gang: its requested GPUs within the user's bounds (``gpus.min``,
        ``gpus.max``), at most the cluster's."""
        gang = max(job.requested_gpus, job.fewest_gpus)
        if job.max_gpus is not None:
            gang = min(gang, job.max_gpus)
        return min(gang, cluster.total_gpus)

    def gpu_bounds(self, job: JobView, cluster: ClusterView) -> tuple[int, int]:
        gang = self.gang_size(job, cluster)
        return gang, gang

    def decide(self, round_input: RoundInput, state: TiresiasState) -> Decision:
        """Queue update, gang admission, placement (see the module docstring).

        ``round_input.jobs`` must be in arrival order (the order of queue 0).
        """
        cluster = round_input.cluster
        jobs = {job.name: job for job in round_input.jobs}
        queue1 = [name for name in state.demoted if name in jobs]
        demoted = set(queue1)
        for job in round_input.jobs:
            if job.name not in demoted and job.attained_gpu_s >= self.threshold_gpu_s:
                queue1.append(job.name)
                demoted.add(job.name)
        queue0 = [job.name for job in round_input.jobs if job.name not in demoted]

        # GPUs not yet promised, by node, the nodes taken by GPU type (in name order), then
        # fleet order: a gang is promised from the nodes it allows, type by type.
        order = sorted(range(cluster.num_nodes), key=lambda i: (cluster.nodes[i].gpu_type, i))
        left = np.array([cluster.nodes[i].gpus for i in order], dtype=np.int64)
        running: list[str] = []
        for name in (*queue0, *queue1):
            job = jobs[name]
            gang = self.gang_size(job, cluster)
            mask = allowed_nodes(job, cluster)
            room = left if mask is None else np.where(mask[order], left, 0)
            if gang <= int(room.sum()):
                running.append(name)
                for k in np.flatnonzero(room):
                    take = min(gang, int(room[k]))
                    left[k] -= take
                    gang -= take
                    if not gang:
                        break
        run_set = set(running)

        free = np.array(cluster.gpus_per_node, dtype=np.int64)
        allocations: dict[str, Allocation] = {}
        for name in running:  # Running jobs that keep their GPUs.
            job = jobs[name]
            if job.num_gpus == self.gang_size(job, cluster) and on_allowed(job, cluster):
                allocations[name] = job.allocation
                free -= np.asarray(cluster.dense(job.allocation), dtype=np.int64)
        batches: dict[str, BatchChoice] = {}
        for name in running:  # Jobs that start (or restart) now.
            job = jobs[name]
            if name not in allocations:
                row = pack_on(self.gang_size(job, cluster), free, allowed_nodes(job, cluster))
                if row is None:  # its types are full after all: it waits
                    run_set.discard(name)
                    continue
                allocations[name] = cluster.sparse(row)
            batches[name] = fixed_batch_choice(
                job.fixed_batch_size, allocations[name].num_gpus, job.limits
            )
        for name in jobs:
            if name not in run_set:
                allocations[name] = Allocation()
        plan = Plan(allocations, batches, cluster.fleet())
        return Decision(plan, TiresiasState(tuple(queue1)))
