"""Jobs as the decision plane sees them: per-round views, allocations, plans.

These are the values that flow between whoever observes the jobs (the controller, run live or
in the simulator's world) and the policies in :mod:`autoscaler.decide.policy`:

- :class:`JobView` — what a policy may know about one active job in one round;
- :class:`NodeView` / :class:`ClusterView` — the fleet's nodes (instances), each with **its
  instance key** (the controller's own id of the instance, the one name of it across the
  system), its GPU type and count and (optionally) the offering it came from, and the round's
  settings;
- :class:`RoundInput` — one round's complete input to a policy;
- :class:`Plan` — a policy's output: GPUs per instance key and a batch configuration for every
  job, and the fleet (instances per offering) the plan assumes.

An :class:`Allocation` maps instance keys to the number of GPUs (= replicas) a job holds there. It
is keyed by instance key, never by position: a node that disappears between rounds (a preempted
instance) changes nothing for jobs on the other nodes. Policies may build dense matrices over
``ClusterView.nodes`` internally each round (:meth:`ClusterView.dense` /
:meth:`ClusterView.sparse`). A job's *placement* is its non-zero GPU counts sorted descending.

**One GPU type per job.** A job trains on one GPU type at a time; data parallelism across GPU
types is out of scope. A type-aware policy never mixes types in one allocation; a type-unaware
baseline (which sees every GPU as the same) may, and then the observer runs the job at the pace
of its slowest type (synchronous data parallelism waits for the straggler).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from autoscaler.errors import InvalidInputError
from autoscaler.market.terms import MARKETS, OfferingRef

if TYPE_CHECKING:  # imported for annotations only; keeps ``import autoscaler.decide.views`` light
    from autoscaler.model.goodput import BatchLimits, GoodputModel

__all__ = [
    "MAX_FINISHED_JOBS",
    "Allocation",
    "BatchChoice",
    "ClusterView",
    "JobView",
    "NodeView",
    "OfferingRef",
    "Oracle",
    "Plan",
    "PolicyName",
    "RoundInput",
    "fixed_batch_choice",
    "num_nodes_of",
    "offering_allowed",
    "placement_of",
]


class Allocation(Mapping[str, int]):
    """GPUs a job holds per instance key: an immutable, hashable mapping without zero entries.

    ``Allocation({"node-03": 4, "node-07": 2})``; ``Allocation()`` is the empty allocation (the
    job waits). Equal to any mapping with the same non-zero entries. Raises
    :class:`InvalidInputError` on an empty instance key or a negative / non-integer count.
    """

    __slots__ = ("_hash", "_items", "_map")

    def __init__(self, gpus_by_node: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        pairs = gpus_by_node.items() if isinstance(gpus_by_node, Mapping) else gpus_by_node
        merged: dict[str, int] = {}
        for instance_key, gpus in pairs:
            if not isinstance(instance_key, str) or not instance_key:
                raise InvalidInputError(f"bad instance key {instance_key!r}", field="allocation")
            if isinstance(gpus, bool) or int(gpus) != gpus or gpus < 0:
                raise InvalidInputError(
                    f"bad GPU count {gpus!r} on node {instance_key}", field="allocation"
                )
            if gpus:
                merged[instance_key] = merged.get(instance_key, 0) + int(gpus)
        self._items: tuple[tuple[str, int], ...] = tuple(sorted(merged.items()))
        self._map = dict(self._items)
        self._hash = hash(self._items)

    def __getitem__(self, instance_key: str) -> int:
        return self._map[instance_key]

    def get(self, instance_key: str, default: int = 0) -> int:  # type: ignore[override]
        return self._map.get(instance_key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Allocation):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._map == {k: v for k, v in other.items() if v}
        return NotImplemented

    def __repr__(self) -> str:
        return f"Allocation({self._map!r})"

    @property
    def num_gpus(self) -> int:
        return sum(self._map.values())

    @property
    def num_nodes(self) -> int:
        return len(self._map)

    @property
    def placement(self) -> tuple[int, ...]:
        """The GPU counts sorted descending (what throughput depends on)."""
        return tuple(sorted(self._map.values(), reverse=True))

    def without(self, instance_keys: Iterable[str]) -> Allocation:
        """This allocation less the given nodes (e.g. nodes that left the fleet)."""
        gone = set(instance_keys)
        return Allocation((k, v) for k, v in self._items if k not in gone)


class PolicyName(StrEnum):
    """The scheduling policies coadapt implements."""

    COADAPT = "coadapt"
    POLLUX = "pollux"
    TIRESIAS = "tiresias"
    OPTIMUS = "optimus"


def placement_of(allocation: Allocation | Sequence[int]) -> tuple[int, ...]:
    """The non-zero GPU counts of ``allocation`` (a mapping, or a dense row), sorted
    descending."""
    counts = allocation.values() if isinstance(allocation, Mapping) else allocation
    return tuple(sorted((int(g) for g in counts if g), reverse=True))


def num_nodes_of(allocation: Allocation | Sequence[int]) -> int:
    """How many nodes ``allocation`` (a mapping, or a dense row) uses."""
    counts = allocation.values() if isinstance(allocation, Mapping) else allocation
    return sum(1 for g in counts if g)


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
        allocation: GPUs held per instance key now (only nodes of this round's cluster).
        limits: batch-size limits of the job (on the traces' reference GPU type).
        requested_gpus: the user's ``num_replicas`` (gang size for fixed-size policies).
        fixed_batch_size: the user's batch size (fixed-batch policies use it).
        max_profiled_gpus: largest GPU count the job has run on (0 if never run).
        max_profiled_nodes: largest number of nodes the job has run on (0 if never run).
        model: the job's goodput model fitted online from all its profiles, whatever GPU type
            they ran on — what a type-unaware policy sees (``None`` before the first profile).
        models: one goodput model per GPU type the job has run on, each fitted from the job's
            own profiles on that type (filled only for type-aware policies; estimates for other
            types come from :func:`autoscaler.model.gputypes.estimate_model`).
        oracle: ground truth for oracle baselines (``None`` unless the observer provides it).
        adaptive: ``False`` if the user opted the job out of adaptation: it then runs on at
            most ``requested_gpus`` GPUs (exactly, with ``min_gpus`` equal to it, as the
            controller sets it) at ``fixed_batch_size``, under every policy.
        remaining_progress: statistical progress still to make before the job is done, in
            initial-batch-size iterations (the trainer's progress unit: one unit = ``M0``
            samples at efficiency 1; :func:`trainer.report.remaining_progress` of the length
            the job's script declared and its progress); ``None`` if the job declared no length
            (remaining-time weights and horizons then take their defaults). The controller
            and the simulator give it the same way, from the declared length only: the
            script's, else (the controller) the spec's ``length``
            (:func:`~autoscaler.decide.deadlines.length_in_force`).
            :attr:`remaining_work` gives it in ``M0``-equivalent samples.
        min_gpus: the fewest GPUs the job may run on (the user's ``gpus.min``; a job that
            cannot have that many waits).
        gpu_limit: the most GPUs the user allows (``gpus.max``; ``None``: no cap);
            :attr:`max_gpus` combines it with the fixed size of a non-adaptive job.
        gpu_types: the GPU types the job may run on (``None``: any).
        markets: the markets (``spot``, ``on-demand``) the job may run on (``None``: any).
        offerings: the offerings the job may run on (``None``: any); an
            :class:`OfferingRef` compares by its four parts, whatever a key's format.
            :meth:`allows_node` is the one rule that joins the three restrictions: every
            policy places a job only on nodes it allows, and the fleet sizing buys for it only
            offerings it allows (:meth:`allows_offering`).
        target_progress: the length the job's script declared, else its spec's, in the unit
            of ``remaining_progress`` (``None``: neither declared one, or the script's not
            reported yet).
        deadline_s: when the job must be done, on the clock of ``submit_time_s`` (``None``:
            no deadline); :mod:`autoscaler.decide.deadlines` reads it.
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
    max_profiled_nodes: int = 0
    model: GoodputModel | None = None
    models: Mapping[str, GoodputModel] = field(default_factory=dict)
    oracle: Oracle | None = None
    adaptive: bool = True
    remaining_progress: float | None = None
    min_gpus: int = 1
    gpu_limit: int | None = None
    gpu_types: frozenset[str] | None = None
    target_progress: float | None = None
    deadline_s: float | None = None
    markets: frozenset[str] | None = None
    offerings: frozenset[OfferingRef] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.min_gpus, bool) or not isinstance(self.min_gpus, int):
            raise InvalidInputError("min_gpus must be an integer", field="min_gpus")
        if self.min_gpus < 1:
            raise InvalidInputError(f"min_gpus must be >= 1, got {self.min_gpus}", field="min_gpus")
        if self.gpu_limit is not None and self.gpu_limit < self.min_gpus:
            raise InvalidInputError(
                f"gpu_limit {self.gpu_limit} < min_gpus {self.min_gpus}", field="gpu_limit"
            )
        if self.gpu_types is not None:
            if not self.gpu_types:
                raise InvalidInputError("gpu_types must not be empty", field="gpu_types")
            object.__setattr__(self, "gpu_types", frozenset(self.gpu_types))
        for name in ("markets", "offerings"):
            value = getattr(self, name)
            if value is not None:
                if not value:
                    raise InvalidInputError(f"{name} must not be empty", field=name)
                object.__setattr__(self, name, frozenset(value))
        if self.markets is not None and not self.markets <= set(MARKETS):
            raise InvalidInputError(f"unknown market in {sorted(self.markets)}", field="markets")
        if self.offerings is not None and not all(
            isinstance(o, OfferingRef) for o in self.offerings
        ):
            raise InvalidInputError("offerings must be OfferingRef values", field="offerings")
        if self.remaining_progress is not None and not (
            math.isfinite(self.remaining_progress) and self.remaining_progress >= 0
        ):
            raise InvalidInputError(
                f"remaining_progress must be finite and >= 0, got {self.remaining_progress}",
                field="remaining_progress",
            )
        if not isinstance(self.allocation, Allocation):
            object.__setattr__(self, "allocation", Allocation(self.allocation))
        object.__setattr__(self, "models", MappingProxyType(dict(self.models)))

    @property
    def max_gpus(self) -> int | None:
        """The user's cap on the job's GPUs: ``gpu_limit``, and ``requested_gpus`` for a
        non-adaptive job (``None``: no cap)."""
        caps = [c for c in (self.gpu_limit, None if self.adaptive else self.requested_gpus) if c]
        return min(caps) if caps else None

    @property
    def fewest_gpus(self) -> int:
        """The fewest GPUs the user lets the job run on (``min_gpus``). A job of the
        controller that does not adapt has ``min_gpus == requested_gpus == max_gpus``: it runs
        on exactly its GPUs. (The simulator's non-adaptive jobs, as in the Pollux paper's
        simulator, keep ``min_gpus`` 1: their requested GPUs are a cap.)"""
        return self.min_gpus

    def allows_type(self, gpu_type: str) -> bool:
        """Whether the user lets the job run on ``gpu_type`` (a necessary condition of
        :meth:`allows_node`: a type-level filter may use it alone)."""
        return self.gpu_types is None or gpu_type in self.gpu_types

    @property
    def restricts_offerings(self) -> bool:
        """Whether the user limits the job's markets or offerings."""
        return self.markets is not None or self.offerings is not None

    @property
    def restricts_nodes(self) -> bool:
        """Whether some node could be refused to the job (a GPU type, market or offering
        limit): without one, :meth:`allows_node` is true of every node."""
        return self.gpu_types is not None or self.restricts_offerings

    def allows_offering(self, offering: OfferingRef | None, market: str | None = None) -> bool:
        """Whether the user lets the job run on an instance of ``offering`` (``None``: a node
        of no known offering). ``market`` is the market when ``offering`` is unknown (a
        fleet option priced without its parts). A job that limits markets or offerings is
        never placed where they cannot be checked."""
        return offering_allowed(offering, market, self.markets, self.offerings)

    def allows_node(self, node: NodeView) -> bool:
        """Whether the user lets the job run on ``node``: its GPU type, market and offering
        (:attr:`gpu_types`, :attr:`markets`, :attr:`offerings`). The one placement rule of
        the user's limits: every policy, the fleet sizing and the refusals call it (or
        :meth:`allows_offering`, its part for an offering not yet bought)."""
        return self.allows_type(node.gpu_type) and self.allows_offering(node.offering)

    @property
    def remaining_work(self) -> float | None:
        """Work still to do in ``M0``-equivalent samples, ``remaining_progress *
        limits.init_batch_size`` (``None`` if unknown); over a goodput, it estimates the time
        left at that allocation."""
        if self.remaining_progress is None:
            return None
        return self.remaining_progress * self.limits.init_batch_size

    @property
    def num_gpus(self) -> int:
        return self.allocation.num_gpus

    @property
    def num_nodes(self) -> int:
        return self.allocation.num_nodes


def offering_allowed(
    offering: OfferingRef | None,
    market: str | None,
    markets: frozenset[str] | None,
    offerings: frozenset[OfferingRef] | None,
) -> bool:
    """The rule of :meth:`JobView.allows_offering`, for a job's ``markets`` and ``offerings``
    (``None``: any) without its view (a benchmark's check of where a limited job ran)."""
    if markets is None and offerings is None:
        return True
    if offering is not None:
        market = offering.market
    if markets is not None and market not in markets:
        return False
    return offerings is None or offering in offerings


@dataclass(frozen=True)
class NodeView:
    """One node of the fleet: our own ``instance_key`` (stable while the node lives, never reused
    for another node), its ``gpu_type`` (vendor model name: "T4", "V100", "A100", ...), its GPU
    count and, for cloud instances, the offering it came from."""

    instance_key: str
    gpu_type: str
    gpus: int
    offering: OfferingRef | None = None

    def __post_init__(self) -> None:
        if not self.instance_key:
            raise InvalidInputError("instance key must not be empty", field="instance_key")
        if not self.gpu_type:
            raise InvalidInputError(f"node {self.instance_key}: empty GPU type", field="gpu_type")
        if isinstance(self.gpus, bool) or int(self.gpus) != self.gpus or self.gpus < 1:
            raise InvalidInputError(
                f"node {self.instance_key}: GPU count must be an integer >= 1, got {self.gpus!r}",
                field="gpus",
            )


@dataclass(frozen=True)
class ClusterView:
    """The fleet in one round.

    ``nodes`` lists the nodes (ids unique) in a fixed order, the order policies use for their
    dense matrices. ``restart_delay_s`` is what any change of a job's allocation costs;
    ``interference_avoidance`` asks policies to keep at most one multi-node job on each node.
    """

    nodes: tuple[NodeView, ...]
    now_s: float
    round_index: int
    interval_s: float = 60.0
    restart_delay_s: float = 30.0
    interference_avoidance: bool = True
    _index: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        nodes = tuple(self.nodes)
        object.__setattr__(self, "nodes", nodes)
        index: dict[str, int] = {}
        for i, node in enumerate(nodes):
            if node.instance_key in index:
                raise InvalidInputError(
                    f"duplicate instance key {node.instance_key}", field="nodes"
                )
            index[node.instance_key] = i
        object.__setattr__(self, "_index", MappingProxyType(index))

    @classmethod
    def uniform(
        cls,
        num_nodes: int,
        gpus_per_node: int,
        *,
        gpu_type: str = "T4",
        now_s: float = 0.0,
        round_index: int = 0,
        **settings: float | bool,
    ) -> ClusterView:
        """``num_nodes`` identical nodes named ``node-00``, ``node-01``, ..."""
        width = max(2, len(str(num_nodes - 1)))
        nodes = tuple(
            NodeView(f"node-{i:0{width}d}", gpu_type, gpus_per_node) for i in range(num_nodes)
        )
        return cls(nodes, now_s, round_index, **settings)  # type: ignore[arg-type]

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def instance_keys(self) -> tuple[str, ...]:
        return tuple(node.instance_key for node in self.nodes)

    @property
    def gpus_per_node(self) -> tuple[int, ...]:
        """GPU capacity per node, in ``nodes`` order."""
        return tuple(node.gpus for node in self.nodes)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The distinct GPU types of the fleet, sorted."""
        return tuple(sorted({node.gpu_type for node in self.nodes}))

    @property
    def total_gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)

    def index_of(self, instance_key: str) -> int | None:
        """Position of ``instance_key`` in ``nodes`` (``None`` if it is not in the fleet)."""
        return self._index.get(instance_key)

    def node(self, instance_key: str) -> NodeView:
        i = self._index.get(instance_key)
        if i is None:
            raise InvalidInputError(f"unknown instance key {instance_key}", field="allocation")
        return self.nodes[i]

    def dense(self, allocation: Mapping[str, int]) -> tuple[int, ...]:
        """``allocation`` as one entry per node in ``nodes`` order; entries on nodes that are
        not in the fleet are dropped."""
        row = [0] * len(self.nodes)
        for instance_key, gpus in allocation.items():
            i = self._index.get(instance_key)
            if i is not None:
                row[i] += int(gpus)
        return tuple(row)

    def sparse(self, row: Sequence[int]) -> Allocation:
        """A dense row (one entry per node in ``nodes`` order) as an :class:`Allocation`."""
        if len(row) != len(self.nodes):
            raise InvalidInputError(
                f"row has {len(row)} entries for {len(self.nodes)} nodes", field="allocation"
            )
        return Allocation(
            (node.instance_key, int(g)) for node, g in zip(self.nodes, row, strict=True) if g
        )

    def gpu_types_of(self, allocation: Mapping[str, int]) -> tuple[str, ...]:
        """The distinct GPU types ``allocation`` uses (sorted); raises for unknown nodes."""
        return tuple(sorted({self.node(n).gpu_type for n, g in allocation.items() if g}))

    def fleet(self) -> Mapping[str, int]:
        """Instances per offering key among the nodes that came from an offering."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            if node.offering is not None:
                counts[node.offering.key] = counts.get(node.offering.key, 0) + 1
        return MappingProxyType(dict(sorted(counts.items())))


MAX_FINISHED_JOBS: Final = 1000
"""The most finished jobs' lengths one :class:`RoundInput` carries (the controller passes its
most recently completed ones): a bound on a round's input and cost, not a tuned setting."""


@dataclass(frozen=True)
class RoundInput:
    """A policy's complete input for one round: the cluster, its active jobs and what the
    cluster has learned of job lengths.

    ``finished_gpu_s``: the attained service (GPU-seconds, restart delays included, as
    :attr:`JobView.attained_gpu_s`) at which each of the cluster's most recently *completed*
    jobs ended (failed, cancelled and refused jobs are not lengths), at most
    :data:`MAX_FINISHED_JOBS`, in any order; empty when none is known. Each is finite and
    >= 0, else :class:`InvalidInputError`.
    """

    cluster: ClusterView
    jobs: tuple[JobView, ...]
    finished_gpu_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        lengths = tuple(self.finished_gpu_s)
        if len(lengths) > MAX_FINISHED_JOBS:
            raise InvalidInputError(
                f"at most {MAX_FINISHED_JOBS} finished jobs' lengths, got {len(lengths)}",
                field="finished_gpu_s",
            )
        out = []
        for x in lengths:
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise InvalidInputError(
                    f"a finished job's length must be a number, got {x!r}", field="finished_gpu_s"
                )
            if not (math.isfinite(x) and x >= 0):
                raise InvalidInputError(
                    f"a finished job's length must be finite and >= 0, got {x!r}",
                    field="finished_gpu_s",
                )
            out.append(float(x))
        object.__setattr__(self, "finished_gpu_s", tuple(out))


@dataclass(frozen=True)
class Plan:
    """A policy's decision for one round.

    ``allocations`` holds every active job's GPUs per instance key (empty = not running);
    ``batches`` the batch configuration of every job that runs; ``fleet`` the instances per
    offering key the plan assumes (the observed fleet unless the policy or sizing asks for
    another one; the controller reconciles it); ``refused`` the jobs the policy can never run on
    this fleet, each with the reason (e.g. its smallest feasible allocation is larger than any
    pool), so that the observer fails them at once instead of letting them wait forever; a
    refused job's allocation is empty. Read-only mappings.
    """

    allocations: Mapping[str, Allocation] = field(default_factory=dict)
    batches: Mapping[str, BatchChoice] = field(default_factory=dict)
    fleet: Mapping[str, int] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        allocations = {
            name: alloc if isinstance(alloc, Allocation) else Allocation(alloc)
            for name, alloc in self.allocations.items()
        }
        object.__setattr__(self, "allocations", MappingProxyType(allocations))
        object.__setattr__(self, "batches", MappingProxyType(dict(self.batches)))
        object.__setattr__(self, "fleet", MappingProxyType(dict(self.fleet)))
        object.__setattr__(self, "refused", MappingProxyType(dict(self.refused)))

    def validate(
        self,
        round_input: RoundInput,
        *,
        max_gpus: Mapping[str, int] | None = None,
        single_type: bool = False,
    ) -> None:
        """Check the plan against the round: raises :class:`InvalidInputError` if a job is
        unknown or missing, an allocation names a node that is not in the fleet, a node is
        over-allocated, a running job lacks a batch choice (or its batch does not match its GPU
        count), a job exceeds ``max_gpus[name]``, ``single_type`` is asked and a job spans GPU
        types, a refused job holds GPUs or is not a job of the round, or — when the cluster asks
        for interference avoidance — a node holds two or more multi-node jobs."""
        cluster = round_input.cluster
        names = {job.name for job in round_input.jobs}
        if set(self.allocations) != names:
            extra = sorted(set(self.allocations) - names)
            missing = sorted(names - set(self.allocations))
            raise InvalidInputError(
                f"plan jobs differ from round jobs (extra {extra}, missing {missing})",
                field="allocations",
            )
        for name in self.refused:
            if name not in names or self.allocations[name].num_gpus:
                raise InvalidInputError(
                    f"refused job {name} is not an idle job of the round", field="refused"
                )
        used = [0] * cluster.num_nodes
        multi_node = [0] * cluster.num_nodes
        for name, alloc in self.allocations.items():
            unknown = sorted(n for n in alloc if cluster.index_of(n) is None)
            if unknown:
                raise InvalidInputError(
                    f"{name} is placed on nodes not in the fleet: {unknown}", field="allocations"
                )
            gpus = alloc.num_gpus
            if max_gpus is not None and gpus > max_gpus.get(name, gpus):
                raise InvalidInputError(
                    f"{name} holds {gpus} GPUs, more than its maximum {max_gpus[name]}",
                    field="allocations",
                )
            if single_type and len(cluster.gpu_types_of(alloc)) > 1:
                raise InvalidInputError(
                    f"{name} spans GPU types {cluster.gpu_types_of(alloc)}", field="allocations"
                )
            spread = alloc.num_nodes > 1
            for instance_key, g in alloc.items():
                i = cluster.index_of(instance_key)
                assert i is not None  # checked above
                used[i] += g
                if spread:
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
        for node, u, multi in zip(cluster.nodes, used, multi_node, strict=True):
            if u > node.gpus:
                raise InvalidInputError(
                    f"node {node.instance_key} over-allocated: {u} > {node.gpus} GPUs",
                    field="allocations",
                )
            if cluster.interference_avoidance and multi > 1:
                raise InvalidInputError(
                    f"node {node.instance_key} holds {multi} multi-node jobs", field="allocations"
                )
