"""Optimus+Oracle (Peng et al., EuroSys'18) as tuned in the Pollux paper.

Each job trains at its user batch size. Every round, each job (in arrival order, while GPUs
last) gets one GPU; the remaining GPUs are then handed out one at a time to the job whose
remaining running time drops the most with one more GPU:
``(T(g) - T(g + 1)) * remaining_iterations``, where ``T(g)`` is the job's seconds per
iteration on ``g`` GPUs packed onto the fewest nodes. "Oracle" means both come from ground truth
(:class:`~autoscaler.decide.views.Oracle`, supplied by the observer); without an oracle the job's
fitted goodput model predicts ``T`` and its remaining iterations count as 1 (pure speed-up greed).
A job never gets more GPUs than ``batch_size // min_local_bsz`` (one micro-batch each), nor
more than requested if its user opted it out of adaptation.
Jobs whose GPU count is unchanged keep their nodes; the others are packed, smallest first, onto
the nodes with the most free GPUs.
"""

from __future__ import annotations

import heapq
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

__all__ = ["OptimusPolicy"]


@dataclass(frozen=True)
class _Job:
    view: JobView
    max_gpus: int
    remaining: float
    step_time_s: tuple[float, ...]  # index g - 1


class OptimusPolicy:
    """Greedy marginal-gain GPU assignment with oracle knowledge, fixed batch size."""

    name = PolicyName.OPTIMUS
    uses_model = False
    uses_oracle = True
    avoids_interference = False

    def initial_state(self) -> None:
        return None

    def gpu_bounds(self, job: JobView, cluster: ClusterView) -> tuple[int, int]:
        cap = max(1, min(job.fixed_batch_size // job.limits.min_local_bsz, cluster.total_gpus))
        cap = max(cap, job.fewest_gpus)  # the user's floor may exceed the batch's split
        return 0, cap if job.max_gpus is None else min(cap, job.max_gpus)

    def _prepare(self, job: JobView, cluster: ClusterView) -> _Job:
        max_gpus = self.gpu_bounds(job, cluster)[1]
        if job.oracle is not None:
            times = job.oracle.step_time_s[:max_gpus]
            return _Job(job, min(max_gpus, len(times)), job.oracle.remaining_iterations, times)
        if job.model is None:  # Nothing known: no reason to give it more than its fewest.
            return _Job(job, job.fewest_gpus, 1.0, (1.0,) * job.fewest_gpus)
        per_node = max(cluster.gpus_per_node)
        g = np.arange(1, max_gpus + 1)
        nodes = -(-g // per_node)
        predicted: list[float] = []
        for k, n in zip(g, nodes, strict=True):
            c = fixed_batch_choice(job.fixed_batch_size, int(k), job.limits)
            predicted.append(float(job.model.step_time_s(n, k, c.local_bsz, c.accum_steps)))
        return _Job(job, max_gpus, 1.0, tuple(predicted))

    def decide(self, round_input: RoundInput, state: None) -> Decision:
        """Greedy assignment and placement (see the module docstring). ``round_input.jobs``
        must be in arrival order."""
        cluster = round_input.cluster
        jobs = [self._prepare(job, cluster) for job in round_input.jobs]
        gpus = [0] * len(jobs)
        left = cluster.total_gpus
        for i in range(len(jobs)):  # each job its fewest GPUs (1 unless the user says more)
            floor = jobs[i].view.fewest_gpus
            if floor > left or floor > jobs[i].max_gpus:
                continue
            gpus[i] = floor
            left -= floor

        def gain(i: int) -> float:
            g, job = gpus[i], jobs[i]
            if g == 0 or g + 1 > job.max_gpus or g >= len(job.step_time_s):
                return 0.0
            return (job.step_time_s[g - 1] - job.step_time_s[g]) * job.remaining

        heap = [(-gain(i), i) for i in range(len(jobs))]
        heapq.heapify(heap)
        while left > 0 and heap:
            neg, i = heapq.heappop(heap)
            if -neg <= 0:
                break
            gpus[i] += 1
            left -= 1
            heapq.heappush(heap, (-gain(i), i))

        free = np.array(cluster.gpus_per_node, dtype=np.int64)
        allocations: dict[str, Allocation] = {}
        for job, g in zip(jobs, gpus, strict=True):
            if g > 0 and job.view.num_gpus == g and on_allowed(job.view, cluster):
                allocations[job.view.name] = job.view.allocation
                free -= np.asarray(cluster.dense(job.view.allocation), dtype=np.int64)
        order = sorted(range(len(jobs)), key=lambda i: gpus[i])
        batches: dict[str, BatchChoice] = {}
        for i in order:
            name = jobs[i].view.name
            if gpus[i] == 0:
                allocations[name] = Allocation()
                continue
            if name not in allocations:
                row = pack_on(gpus[i], free, allowed_nodes(jobs[i].view, cluster))
                if row is None:  # not enough GPUs of the types it allows: it waits
                    allocations[name] = Allocation()
                    continue
                allocations[name] = cluster.sparse(row)
            batches[name] = fixed_batch_choice(
                jobs[i].view.fixed_batch_size, gpus[i], jobs[i].view.limits
            )
        return Decision(Plan(allocations, batches, cluster.fleet()), None)
