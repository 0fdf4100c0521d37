"""Jobs as the decision plane sees them: specifications, per-round views, allocations, plans.

These are the values that flow between whoever observes the jobs (the simulator today, the
controller later) and the policies in :mod:`autoscaler.policy`:

- :class:`JobSpec` — what a user submitted (validated on construction);
- :class:`JobView` — what a policy may know about one active job in one round;
- :class:`ClusterView` — the nodes and their GPU capacity, and the round's settings;
- :class:`RoundInput` — one round's complete input to a policy;
- :class:`Plan` — a policy's output: GPUs per node and a batch configuration for every job.

An *allocation* is a tuple with one entry per cluster node: the number of GPUs (= replicas) the
job holds on that node. Its *placement* is the non-zero entries sorted descending.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING

from autoscaler.errors import InvalidInputError

if TYPE_CHECKING:  # imported for annotations only; keeps ``import autoscaler.jobs`` light
    from autoscaler.goodput import BatchLimits, GoodputModel

__all__ = [
    "Allocation",
    "BatchChoice",
    "ClusterView",
    "JobSpec",
    "JobView",
    "Oracle",
    "Plan",
    "PolicyName",
    "RoundInput",
    "fixed_batch_choice",
    "num_nodes_of",
    "placement_of",
]

#: GPUs per node, one entry per cluster node.
Allocation = tuple[int, ...]


class PolicyName(StrEnum):
    """The scheduling policies coadapt implements."""

    POLLUX = "pollux"
    TIRESIAS = "tiresias"
    OPTIMUS = "optimus"


def placement_of(allocation: Allocation) -> tuple[int, ...]:
    """The non-zero GPU counts of ``allocation``, sorted descending."""
    return tuple(sorted((g for g in allocation if g), reverse=True))


def num_nodes_of(allocation: Allocation) -> int:
    """How many nodes ``allocation`` uses."""
    return sum(1 for g in allocation if g)


@dataclass(frozen=True)
class JobSpec:
    """A submitted training job.

    ``num_replicas`` and ``batch_size`` are the user's own settings (the paper's "TunedJobs"):
    fixed-size baselines run the job with exactly these; Pollux ignores them and adapts both.
    """

    name: str
    application: str
    submit_time_s: float
    num_replicas: int
    batch_size: int

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInputError("job name must not be empty", field="name")
        if not math.isfinite(self.submit_time_s) or self.submit_time_s < 0:
            raise InvalidInputError(
                f"submit time must be finite and >= 0, got {self.submit_time_s}", field="time"
            )
        if self.num_replicas < 1:
            raise InvalidInputError(
                f"num_replicas must be >= 1, got {self.num_replicas}", field="num_replicas"
            )
        if self.batch_size < 1:
            raise InvalidInputError(
                f"batch_size must be >= 1, got {self.batch_size}", field="batch_size"
            )


@dataclass(frozen=True)
class BatchChoice:
    """How a job trains on its allocation: ``batch_size = num_gpus * local_bsz * accum_steps``.

    ``local_bsz`` is the per-GPU micro-batch; ``accum_steps`` (>= 1) the micro-batches per
    iteration (gradient accumulation).
    """

    batch_size: int
    local_bsz: int
    accum_steps: int

    def __post_init__(self) -> None:
        if self.local_bsz < 1 or self.accum_steps < 1 or self.batch_size < 1:
            raise InvalidInputError(f"invalid batch choice {self}", field="batch")


def fixed_batch_choice(batch_size: int, num_gpus: int, limits: BatchLimits) -> BatchChoice:
    """The configuration a job with a fixed total batch ``batch_size`` runs at on ``num_gpus``.

    Splits the batch evenly (rounding the micro-batch up), using the fewest accumulation steps
    that keep the micro-batch within ``limits.max_local_bsz``; the micro-batch is then clamped to
    ``[min_local_bsz, max_local_bsz]`` and shrunk, if needed, so the total stays within
    ``limits.max_batch_size``. The resulting total may thus differ slightly from ``batch_size``.
    """
    if num_gpus < 1 or batch_size < 1:
        raise InvalidInputError(
            f"need batch_size >= 1 and num_gpus >= 1, got {batch_size}, {num_gpus}",
            field="num_gpus",
        )
    per_gpu = math.ceil(batch_size / num_gpus - 1e-9)
    accum = max(1, math.ceil(per_gpu / limits.max_local_bsz - 1e-9))
    local = math.ceil(per_gpu / accum - 1e-9)
    local = min(max(local, limits.min_local_bsz), limits.max_local_bsz)
    cap = limits.max_batch_size // (num_gpus * accum)
    if local > cap:
        local = max(limits.min_local_bsz, cap)
    return BatchChoice(num_gpus * local * accum, local, accum)


@dataclass(frozen=True)
class Oracle:
    """Ground truth an oracle baseline (Optimus+Oracle) is given, at the job's fixed batch size.

    ``remaining_iterations``: real iterations left to completion; ``step_time_s[g - 1]``: true
    seconds per iteration on ``g`` GPUs packed onto the fewest nodes, ``g = 1 .. len``.
    """

    remaining_iterations: float
    step_time_s: tuple[float, ...]


@dataclass(frozen=True)
class JobView:
    """What a policy may know about one active (submitted, unfinished) job in one round.

    Attributes:
        name: the job's id.
        application: the job's application (model) name.
        submit_time_s: submission time; ``age_s`` is the time since.
        attained_gpu_s: GPU-seconds held so far (restart delays included).
        num_restarts: allocation changes so far (the first allocation is not a restart).
        allocation: GPUs held on each node now (one entry per cluster node).
        limits: batch-size limits of the job.
        requested_gpus: the user's ``num_replicas`` (gang size for fixed-size policies).
        fixed_batch_size: the user's batch size (fixed-batch policies use it).
        max_profiled_gpus: largest GPU count the job has run on (0 if never run).
        model: the job's goodput model fitted online from its profiles (``None`` before its
            first profile).
        oracle: ground truth for oracle baselines (``None`` unless the observer provides it).
        adaptive: ``False`` if the user opted the job out of adaptation: it then runs on at most
            ``requested_gpus`` GPUs at ``fixed_batch_size``, under every policy.
    """

    name: str
    application: str
    submit_time_s: float
    age_s: float
    attained_gpu_s: float
    num_restarts: int
    allocation: Allocation
    limits: BatchLimits
    requested_gpus: int
    fixed_batch_size: int
    max_profiled_gpus: int = 0
    model: GoodputModel | None = None
    oracle: Oracle | None = None
    adaptive: bool = True

    @property
    def max_gpus(self) -> int | None:
        """The user's cap on the job's GPUs: ``requested_gpus`` for a non-adaptive job, else
        none (``None``)."""
        return None if self.adaptive else self.requested_gpus

    @property
    def num_gpus(self) -> int:
        return sum(self.allocation)

    @property
    def num_nodes(self) -> int:
        return num_nodes_of(self.allocation)


@dataclass(frozen=True)
class ClusterView:
    """The cluster in one round.

    ``gpus_per_node[i]`` is node ``i``'s GPU capacity. ``restart_delay_s`` is what any change of
    a job's allocation costs; ``interference_avoidance`` asks policies to keep at most one
    multi-node job on each node.
    """

    gpus_per_node: tuple[int, ...]
    now_s: float
    round_index: int
    interval_s: float = 60.0
    restart_delay_s: float = 30.0
    interference_avoidance: bool = True

    @property
    def num_nodes(self) -> int:
        return len(self.gpus_per_node)

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_per_node)


@dataclass(frozen=True)
class RoundInput:
    """A policy's complete input for one round: the cluster and its active jobs."""

    cluster: ClusterView
    jobs: tuple[JobView, ...]


@dataclass(frozen=True)
class Plan:
    """A policy's decision for one round.

    ``allocations`` holds every active job's GPUs per node (all zeros = not running);
    ``batches`` the batch configuration of every job that runs. Read-only mappings.
    """

    allocations: Mapping[str, Allocation] = field(default_factory=dict)
    batches: Mapping[str, BatchChoice] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allocations", MappingProxyType(dict(self.allocations)))
        object.__setattr__(self, "batches", MappingProxyType(dict(self.batches)))

    def validate(self, round_input: RoundInput, *, max_gpus: Mapping[str, int] | None = None):
        """Check the plan against the round: raises :class:`InvalidInputError` if a job is
        unknown or missing, an allocation has the wrong length or a negative entry, a node is
        over-allocated, a running job lacks a batch choice (or its batch does not match its GPU
        count), a job exceeds ``max_gpus[name]``, or — when the cluster asks for interference
        avoidance — a node holds two or more multi-node jobs."""
        cluster = round_input.cluster
        names = {job.name for job in round_input.jobs}
        if set(self.allocations) != names:
            extra = sorted(set(self.allocations) - names)
            missing = sorted(names - set(self.allocations))
            raise InvalidInputError(
                f"plan jobs differ from round jobs (extra {extra}, missing {missing})",
                field="allocations",
            )
        used = [0] * cluster.num_nodes
        multi_node = [0] * cluster.num_nodes
        for name, alloc in self.allocations.items():
            if len(alloc) != cluster.num_nodes or min(alloc, default=0) < 0:
                raise InvalidInputError(f"bad allocation for {name}: {alloc}", field="allocations")
            gpus = sum(alloc)
            if max_gpus is not None and gpus > max_gpus.get(name, gpus):
                raise InvalidInputError(
                    f"{name} holds {gpus} GPUs, more than its maximum {max_gpus[name]}",
                    field="allocations",
                )
            spread = num_nodes_of(alloc) > 1
            for i, g in enumerate(alloc):
                used[i] += g
                if g and spread:
                    multi_node[i] += 1
            if gpus:
                choice = self.batches.get(name)
                if choice is None:
                    raise InvalidInputError(f"no batch choice for {name}", field="batches")
                if choice.batch_size != gpus * choice.local_bsz * choice.accum_steps:
                    raise InvalidInputError(
                        f"batch choice {choice} of {name} does not match its {gpus} GPUs",
                        field="batches",
                    )
        for i, (u, cap) in enumerate(zip(used, cluster.gpus_per_node, strict=True)):
            if u > cap:
                raise InvalidInputError(
                    f"node {i} over-allocated: {u} > {cap} GPUs", field="allocations"
                )
            if cluster.interference_avoidance and multi_node[i] > 1:
                raise InvalidInputError(
                    f"node {i} holds {multi_node[i]} multi-node jobs", field="allocations"
                )
