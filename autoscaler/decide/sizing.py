"""Goodput-per-dollar fleet sizing: how many instances of which offering and market to hold.

Pure: numbers in, a :class:`FleetProposal` out; no clock, no cloud, no I/O.

**What an instance is worth.** Every job has a *value curve* per instance kind (GPU type, GPUs
per instance): its goodput on ``g`` GPUs of that type packed onto the fewest instances, in
units of its goodput on one GPU of the reference type (T4): "T4-GPU equivalents of useful
work" (:func:`job_demand`). A job's curve on a type comes from its fitted model there (its
sync raised to what its other types' fits carry), else the ratio rule (both
:func:`autoscaler.model.gputypes.estimate_model`); with ``optimistic``
(``SizingConfig.optimistic_nodes``, off by default), shapes on more instances than the job has
run on (or on several instances with more GPUs than it has run on) are valued at the better of
its fit and its fit with the inter-node sync taken as the intra-node one
(:func:`~autoscaler.model.goodput.optimistic_internode`: a fleet that never offers a second instance
would never learn what it is worth); a job with no profile yet is valued at ``g x`` its
application's measured speed on the type (:meth:`~autoscaler.model.gputypes.SpeedTable.model_speed`,
the generic speed for an application the table does not know, as the policy values it) up to
its cap (the policy will grow it that far if it scales), or up to the GPUs it asked for if it
does not adapt. With ``value="throughput"``
the curves count samples per second at the largest per-GPU batch and ignore statistical
efficiency (the
rule of throughput-driven autoscaling, Or et al., MLSys'20) -- the only difference between
the ``coadapt`` and ``throughput-autoscale`` strategies.

**Growing a fleet** (:func:`size_fleet`). Starting from no instances, repeatedly price one more
instance of every offering: its *marginal value* is what the jobs gain when its GPUs are handed,
one at a time, to the job whose fairness-kernel value ``U_p`` rises most per GPU (a job takes
one GPU type; a waiting job needs its minimum GPUs at once; a value curve is taken along its
least concave majorant, so that a dip at the first multi-instance shape does not hide the
larger shapes beyond it). Its *effective* value discounts

- spot preemptions: ``x max(0, 1 - hazard_per_hour x preemption_loss_s / 3600)`` (each
  preemption costs the restart, the progress since the last checkpoint and the replacement's
  provisioning, ``preemption_loss_s`` in all);
- provisioning, for an instance not yet held: what each job gains from its GPUs ``x max(0,
  1 - provisioning_delay_s / horizon)``, the horizon being ``planning_horizon_s``, or for a
  running job whose remaining time is known (``JobDemand.remaining_s``), that time if shorter:
  a job that will be done before a new instance is ready gains nothing from it, and the fleet
  does not launch instances for growth that never comes.

**The user's limits.** A job that limits its markets or offerings (``JobDemand.options``, from
:meth:`~autoscaler.decide.views.JobView.allows_offering`, the rule the policies place by) is handed
GPUs only of offerings it allows: the GPUs of one kind are modelled apart for each set of jobs
they are refused to, and a deadline's instances are bought for it only among its offerings. A
fleet without such a job is sized exactly as before.

The *efficiency* of a candidate is its effective value over its ideal: its GPUs times the
type's generic speed (:meth:`~autoscaler.model.gputypes.SpeedTable.relative_speed`), i.e. the share
of perfect scaling the added instance would achieve. Among the candidates whose efficiency is
at least ``min_efficiency`` (``x (1 - hysteresis)`` for an instance already held, so a fleet
does not thrash between two sizes; no floor at all for a candidate that starts a waiting
job, so no job waits for efficiency's sake), the one of most effective value per dollar is
added --
cheapest goodput first -- while the budget (``$/h``, at the prices in effect) and
``max_instances`` allow and the offering has capacity. ``min_instances`` are added whatever
their efficiency. A proposal names what stopped the growth (``limited_by``).

Jobs and their GPUs are a model of what the policy will do with the fleet, not its plan: the
policy allocates on the proposal next, and the pair is scored together in the simulator.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import numpy as np

from autoscaler.decide.views import JobView, OfferingRef
from autoscaler.errors import InvalidInputError
from autoscaler.model.goodput import GoodputModel, optimistic_internode
from autoscaler.model.goodput_batch import JobArrays, optimize_many
from autoscaler.model.gputypes import REFERENCE_GPU_TYPE, SpeedTable, estimate_model, limits_on

__all__ = [
    "FleetOption",
    "FleetProposal",
    "JobDemand",
    "SizingConfig",
    "job_demand",
    "modelled_value",
    "size_fleet",
]

#: Exponent of the per-GPU speed in the choice of a job's GPU type (see :func:`size_fleet`).
SPEED_PREFERENCE = 1.0

Market = Literal["spot", "on-demand"]
ValueKind = Literal["goodput", "throughput"]


@dataclass(frozen=True)
class FleetOption:
    """One pool the fleet can buy from: ``key`` (the name the strategy counts it by), its GPU
    type and GPUs per instance, the market, the price in effect (``usd_per_hour`` per
    instance), the expected preemptions per instance-hour (0 on demand), how many more
    instances it can give (``capacity``; ``None``: unlimited), whether it may be used now
    (``available``: false after a capacity error) and the offering it is (``ref``: what a
    job's ``offerings`` limit is judged on, whatever the key's format; ``None``: not told,
    and a job that limits its offerings is not given its GPUs)."""

    key: str
    gpu_type: str
    gpus: int
    market: Market
    usd_per_hour: float
    hazard_per_hour: float = 0.0
    capacity: int | None = None
    available: bool = True
    ref: OfferingRef | None = None

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise InvalidInputError(f"{self.key}: GPUs per instance must be >= 1", field="gpus")
        if not (self.usd_per_hour > 0 and math.isfinite(self.usd_per_hour)):
            raise InvalidInputError(
                f"{self.key}: price must be a positive number, got {self.usd_per_hour!r}",
                field="usd_per_hour",
            )
        if not self.hazard_per_hour >= 0:
            raise InvalidInputError(f"{self.key}: negative hazard", field="hazard_per_hour")
        if self.market not in ("spot", "on-demand"):
            raise InvalidInputError(f"{self.key}: unknown market {self.market!r}", field="market")

    @property
    def kind(self) -> tuple[str, int]:
        return (self.gpu_type, self.gpus)

    def allows(self, job: JobView) -> bool:
        """Whether ``job`` may run on instances of this offering: its GPU type, market and
        offering (:meth:`~autoscaler.decide.views.JobView.allows_type`,
        :meth:`~autoscaler.decide.views.JobView.allows_offering`: the rule the policies place
        by)."""
        return job.allows_type(self.gpu_type) and job.allows_offering(self.ref, self.market)

    def may_hold(self, count: int, held: Mapping[str, int]) -> bool:
        """Whether a fleet may hold ``count`` instances of this offering, ``held`` counting
        the instances held now per offering key (launched, ready or not): as many as are
        held, whatever the offering's state (a capacity error stops new launches, never the
        instances already had), more only while it is ``available`` and within its
        ``capacity``. The one rule of a held offering: :func:`size_fleet` and the per-job
        strategies (:mod:`autoscaler.decide.strategies`) both size by it."""
        if count <= held.get(self.key, 0):
            return True
        return self.available and (self.capacity is None or count <= self.capacity)


@dataclass(frozen=True)
class SizingConfig:
    """The knobs of :func:`size_fleet` (see the module docstring).

    ``power`` is the fairness kernel's ``p`` (1: total goodput; lower values favour giving
    every job something before growing any); ``budget_usd_per_hour`` caps the fleet's price
    at the prices in effect (``None``: no cap); ``optimistic_nodes``: value multi-instance
    shapes a job has not run optimistically (off by default: the policy does not share that
    hope, and a fleet bought on it stays idle; ``benchmarks/cloud_cost.py --optimistic-nodes``
    measures it). ``min_efficiency`` 0.15 is the measured default: in ``cloud_cost.py`` E1 and
    E2 a higher floor lengthened JCTs more than it saved. ``max_gpus`` caps the fleet's GPUs
    (``None``: no cap; the local provider's machine-wide slot budget, say).
    """

    value: ValueKind = "goodput"
    min_efficiency: float = 0.15
    hysteresis: float = 0.2
    budget_usd_per_hour: float | None = None
    min_instances: int = 0
    max_instances: int = 256
    preemption_loss_s: float = 300.0
    provisioning_delay_s: float = 120.0
    planning_horizon_s: float = 1800.0
    power: float = 1.0
    optimistic_nodes: bool = False
    max_gpus: int | None = None

    def __post_init__(self) -> None:
        if self.max_gpus is not None and self.max_gpus < 1:
            raise InvalidInputError("max_gpus must be >= 1 (or None)", field="max_gpus")
        if self.value not in ("goodput", "throughput"):
            raise InvalidInputError(f"unknown value {self.value!r}", field="value")
        if not 0 <= self.min_efficiency < math.inf:
            raise InvalidInputError("min_efficiency must be >= 0", field="min_efficiency")
        if not 0 <= self.hysteresis < 1:
            raise InvalidInputError("hysteresis must be in [0, 1)", field="hysteresis")
        if self.budget_usd_per_hour is not None and not self.budget_usd_per_hour >= 0:
            raise InvalidInputError("budget must be >= 0 $/h", field="budget_usd_per_hour")
        if not 0 <= self.min_instances <= self.max_instances:
            raise InvalidInputError(
                "need 0 <= min_instances <= max_instances", field="min_instances"
            )
        if not 0 < self.power <= 1:
            raise InvalidInputError("power must be in (0, 1]", field="power")
        for name in ("preemption_loss_s", "provisioning_delay_s"):
            if not getattr(self, name) >= 0:
                raise InvalidInputError(f"{name} must be >= 0", field=name)
        if not self.planning_horizon_s > 0:
            raise InvalidInputError("planning_horizon_s must be > 0", field="planning_horizon_s")


@dataclass(frozen=True)
class JobDemand:
    """A job's value curves: ``curves[(gpu_type, gpus_per_instance)][g - 1]`` is its value on
    ``g`` GPUs (non-decreasing in ``g``; T4-GPU equivalents, see the module docstring);
    ``min_gpus`` it needs to run at all; ``gpu_type`` the type it runs on now (``None``: not
    running), which the sizing keeps it on; ``remaining_s`` the seconds it has left at the
    allocation it runs on now (``None``: not running, or its training length is unknown),
    which bounds what an instance still to be provisioned is worth to it. A job with a
    deadline it needs GPUs for has ``deadline_gpus``: per kind, the fewest GPUs that finish it
    in time (:func:`autoscaler.decide.deadlines.assess`), bought for it before any growth, on demand
    only if ``urgent``. ``options``: the keys of the offerings it may be given GPUs of
    (``None``: any; the user's market and offering limits)."""

    name: str
    curves: Mapping[tuple[str, int], tuple[float, ...]]
    min_gpus: int = 1
    gpu_type: str | None = None
    remaining_s: float | None = None
    deadline_gpus: Mapping[tuple[str, int], int] = field(default_factory=dict)
    urgent: bool = False
    options: frozenset[str] | None = None

    def allows(self, option: FleetOption) -> bool:
        """Whether the job may be given GPUs of ``option``."""
        return self.options is None or option.key in self.options

    def __post_init__(self) -> None:
        object.__setattr__(self, "curves", MappingProxyType(dict(self.curves)))
        object.__setattr__(self, "deadline_gpus", MappingProxyType(dict(self.deadline_gpus)))
        if self.min_gpus < 1:
            raise InvalidInputError(f"{self.name}: min_gpus must be >= 1", field="min_gpus")
        if self.remaining_s is not None and not self.remaining_s >= 0:
            raise InvalidInputError(
                f"{self.name}: remaining_s must be >= 0 (or None)", field="remaining_s"
            )


@dataclass(frozen=True)
class FleetProposal:
    """Instances to hold per offering key (keys with 0 omitted), their price per hour at the
    prices in effect, the modelled total value (sum of the jobs' values), the efficiency of
    the last instance added, and what stopped the growth: ``"efficiency"``, ``"budget"``,
    ``"max_instances"``, ``"max_gpus"``, ``"capacity"`` or ``"no_demand"``."""

    counts: Mapping[str, int]
    usd_per_hour: float
    value: float
    last_efficiency: float
    limited_by: str
    gpus_by_job: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", MappingProxyType(dict(self.counts)))
        object.__setattr__(self, "gpus_by_job", MappingProxyType(dict(self.gpus_by_job)))


# ---- value curves ---------------------------------------------------------------------------


def unseen_shapes(
    nodes: np.ndarray,
    gpus: np.ndarray,
    profiled_nodes: int | np.ndarray,
    profiled_gpus: int | np.ndarray,
) -> np.ndarray:
    """Which shapes (``nodes`` instances holding ``gpus`` GPUs, elementwise) a job's fit has
    not seen: more instances than it has run on (at least one counts as seen), or several
    instances with more GPUs than it has run on. The one rule of "unseen" for every optimistic
    valuation (the sizing's ``optimistic_nodes`` and the deadline curves,
    :func:`~autoscaler.decide.deadlines.goodput_curves`): a fit from one instance knows nothing
    of the network, and one from two instances of one GPU each knows nothing of a ring of
    sixteen."""
    seen_nodes = np.maximum(1, profiled_nodes)
    return (nodes > seen_nodes) | ((nodes > 1) & (gpus > profiled_gpus))


def with_unseen_hope(
    values: np.ndarray,
    nodes: np.ndarray,
    gpus: np.ndarray,
    profiled_nodes: int | np.ndarray,
    profiled_gpus: int | np.ndarray,
    hopeful: Callable[[], np.ndarray],
) -> np.ndarray:
    """``values`` with each unseen shape (:func:`unseen_shapes`) valued at the better of its
    value and its ``hopeful`` one (the same shapes valued by
    :func:`~autoscaler.model.goodput.optimistic_internode` of the model; called only when
    some shape is unseen)."""
    unseen = unseen_shapes(nodes, gpus, profiled_nodes, profiled_gpus)
    if not unseen.any():
        return values
    return np.where(unseen, np.maximum(values, hopeful()), values)


def _raw(model: GoodputModel, nodes: np.ndarray, g: np.ndarray, value: ValueKind) -> np.ndarray:
    if value == "goodput":
        return model.optimize(nodes, g).goodput
    m = model.limits.max_local_bsz
    return model.throughput(nodes, g, np.full_like(g, m), np.ones_like(g))


def _curve(
    model: GoodputModel,
    per_node: int,
    max_gpus: int,
    value: ValueKind,
    scale: float,
    profiled_nodes: int,
    profiled_gpus: int,
    optimistic: bool,
) -> tuple[float, ...]:
    g = np.arange(1, max_gpus + 1)
    nodes = -(-g // per_node)
    raw = _raw(model, nodes, g, value)
    if optimistic:
        raw = with_unseen_hope(
            raw,
            nodes,
            g,
            profiled_nodes,
            profiled_gpus,
            lambda: _raw(optimistic_internode(model), nodes, g, value),
        )
    out = np.maximum.accumulate(np.maximum(raw, 0.0)) / scale
    return tuple(float(x) for x in out)


def job_demand(
    job: JobView,
    kinds: Sequence[tuple[str, int]],
    speeds: SpeedTable,
    *,
    max_gpus: int,
    min_gpus: int = 1,
    gpu_type: str | None = None,
    value: ValueKind = "goodput",
    optimistic: bool = False,
) -> JobDemand:
    """The job's :class:`JobDemand` over instance ``kinds`` ``(gpu_type, gpus_per_instance)``,
    up to ``max_gpus`` GPUs (see the module docstring for the units and the rules);
    ``gpu_type`` is the type it runs on now, if it runs; ``optimistic`` values unseen
    multi-instance shapes optimistically (see the module docstring)."""
    return job_demands(
        [job],
        kinds,
        speeds,
        max_gpus=[max_gpus],
        gpu_types=[gpu_type],
        min_gpus=min_gpus,
        value=value,
        optimistic=optimistic,
    )[0]


def job_demands(
    jobs: Sequence[JobView],
    kinds: Sequence[tuple[str, int]],
    speeds: SpeedTable,
    *,
    max_gpus: Sequence[int],
    gpu_types: Sequence[str | None],
    min_gpus: int = 1,
    value: ValueKind = "goodput",
    optimistic: bool = False,
) -> list[JobDemand]:
    """:func:`job_demand` of every job (``max_gpus[i]`` and ``gpu_types[i]`` are job ``i``'s),
    with the goodput curves of all jobs on one kind computed together by
    :func:`~autoscaler.model.goodput_batch.optimize_many` (bit-for-bit the per-job
    ``GoodputModel.optimize``, so the curves are the same as one job at a time)."""
    if len(max_gpus) != len(jobs) or len(gpu_types) != len(jobs):
        raise InvalidInputError("one max_gpus and gpu_type per job", field="max_gpus")
    for job, cap in zip(jobs, max_gpus, strict=True):
        if cap < 1:
            raise InvalidInputError(f"{job.name}: max_gpus must be >= 1", field="max_gpus")
    out: list[JobDemand | None] = [None] * len(jobs)
    modelled: list[tuple[int, Mapping[str, GoodputModel]]] = []
    for i, job in enumerate(jobs):
        models: Mapping[str, GoodputModel] = job.models or (
            {REFERENCE_GPU_TYPE: job.model} if job.model is not None else {}
        )
        if models:
            modelled.append((i, models))
            continue
        cap = max_gpus[i]
        want = cap if job.adaptive else max(job.requested_gpus, min_gpus, 1)
        curves = {}
        for kind in kinds:
            g = np.arange(1, cap + 1)
            curves[kind] = tuple(
                float(x) for x in np.minimum(g, want) * speeds.model_speed(job.application, kind[0])
            )
        out[i] = JobDemand(job.name, curves, min_gpus, gpu_types[i])
    if modelled:
        refs = [
            models.get(REFERENCE_GPU_TYPE)
            or estimate_model(models, REFERENCE_GPU_TYPE, speeds).model
            for _, models in modelled
        ]
        if value == "goodput":
            base = optimize_many(JobArrays.from_models(refs), 1, 1).goodput
        else:
            base = np.array([r.throughput(1, 1, r.limits.max_local_bsz, 1) for r in refs])
        scale = np.maximum(np.asarray(base, dtype=float), 1e-12)
        per_job: list[dict[tuple[str, int], tuple[float, ...]]] = [{} for _ in modelled]
        for kind in kinds:
            kind_models = [
                estimate_model(
                    models,
                    kind[0],
                    speeds,
                    limits=limits_on(jobs[i].limits, jobs[i].application, kind[0], speeds),
                ).model
                for i, models in modelled
            ]
            kind_curves = _curves(
                kind_models,
                kind[1],
                [max_gpus[i] for i, _ in modelled],
                value,
                scale,
                [(jobs[i].max_profiled_nodes, jobs[i].max_profiled_gpus) for i, _ in modelled],
                optimistic,
            )
            for k, curve in enumerate(kind_curves):
                per_job[k][kind] = curve
        for k, (i, _) in enumerate(modelled):
            out[i] = JobDemand(jobs[i].name, per_job[k], min_gpus, gpu_types[i])
    return [d for d in out if d is not None]


def _curves(
    models: Sequence[GoodputModel],
    per_node: int,
    caps: Sequence[int],
    value: ValueKind,
    scale: np.ndarray,
    profiled: Sequence[tuple[int, int]],
    optimistic: bool,
) -> list[tuple[float, ...]]:
    """:func:`_curve` of many jobs on one instance kind (goodput values batched)."""
    if value != "goodput":
        return [
            _curve(m, per_node, cap, value, float(sc), pn, pg, optimistic)
            for m, cap, sc, (pn, pg) in zip(models, caps, scale, profiled, strict=True)
        ]
    width = max(caps)
    g = np.broadcast_to(np.arange(1, width + 1), (len(models), width))
    nodes = -(-g // per_node)
    raw = optimize_many(JobArrays.from_models(models), nodes, g).goodput
    if optimistic:
        raw = with_unseen_hope(
            raw,
            nodes,
            g,
            np.array([n for n, _ in profiled])[:, None],
            np.array([p for _, p in profiled])[:, None],
            lambda: (
                optimize_many(
                    JobArrays.from_models([optimistic_internode(m) for m in models]), nodes, g
                ).goodput
            ),
        )
    out = []
    for k, cap in enumerate(caps):
        row = np.maximum.accumulate(np.maximum(raw[k, :cap], 0.0)) / scale[k]
        out.append(tuple(float(x) for x in row))
    return out


# ---- growing the fleet ----------------------------------------------------------------------


def _upper_hull(curve: Sequence[float]) -> np.ndarray:
    """The least concave majorant of ``(0, 0), (1, curve[0]), (2, curve[1]), ...`` at ``g = 1,
    2, ...``: a job whose value dips across an instance boundary (a slow first multi-instance
    shape) is handed GPUs along the line to its better, larger shapes."""
    points = [(0, 0.0)] + [(g + 1, float(v)) for g, v in enumerate(curve)]
    hull: list[tuple[int, float]] = []
    for p in points:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (p[0] - x1) <= (p[1] - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append(p)
    xs, ys = zip(*hull, strict=True)
    return np.interp(np.arange(1, len(curve) + 1), xs, ys)


def _kernel(x: np.ndarray, power: float) -> np.ndarray:
    return np.power(np.asarray(x, dtype=float) + 1e-3, power)


_Slot = tuple[str, int, frozenset[int]]
"""GPUs of one instance kind (GPU type, GPUs per instance) refused to a set of jobs (by index:
those whose market or offering limits exclude the offerings they come from; empty for all
when no job limits them)."""


def _slots(demands: Sequence[JobDemand], options: Sequence[FleetOption]) -> dict[str, _Slot]:
    """Each option's :data:`_Slot` among ``demands``, by key."""
    limited = [(j, d) for j, d in enumerate(demands) if d.options is not None]
    return {
        o.key: (o.gpu_type, o.gpus, frozenset(j for j, d in limited if not d.allows(o)))
        for o in options
    }


class _Allocation:
    """The modelled allocation of GPUs to jobs while the fleet grows: per slot (instance
    kind, and the jobs its GPUs are refused to: :data:`_Slot`), a table ``U[j, g]`` of job
    ``j``'s kernel value on ``g`` GPUs of that kind (``-inf`` where the job cannot run on
    it). GPUs of an instance not yet held are handed out on the same table with each job's
    row times its ``delay[j]`` (the provisioning discount)."""

    memoise = True  # fill memo on (tests compare with it off)

    def __init__(
        self, demands: Sequence[JobDemand], power: float, delay: np.ndarray | None = None
    ) -> None:
        self.demands = demands
        self.power = power
        self.delay = np.ones(len(demands)) if delay is None else np.asarray(delay, dtype=float)
        self.gpus = np.zeros(len(demands), dtype=np.int64)
        self.kind: list[_Slot | None] = [None] * len(demands)
        self._kind_ids: dict[_Slot, int] = {}
        self._kind_of = np.full(len(demands), -1, dtype=np.int64)  # self.kind as ids (-1: None)
        self._waiting: dict[_Slot, set[int]] = {}  # memo, cleared by each commit
        self._fills: dict[
            tuple[_Slot, int, bool], tuple[float, int, np.ndarray, np.ndarray, int]
        ] = {}
        self.min_gpus = np.array([d.min_gpus for d in demands], dtype=np.int64)
        self.free: dict[_Slot, int] = {}  # GPUs bought but not handed out, per kind
        self._tables: dict[tuple[_Slot, bool], np.ndarray] = {}

    def give(self, j: int, kind: _Slot, gpus: int, spare: int) -> None:
        """Job ``j`` holds ``gpus`` GPUs of ``kind`` (a deadline's reservation, made before
        any growth); ``spare`` more GPUs of the kind are free."""
        kind_id = self._kind_ids.setdefault(kind, len(self._kind_ids))
        self.gpus = self.gpus.copy()
        self.gpus[j] = gpus
        self.kind[j] = kind
        self._kind_of[j] = kind_id
        self.free[kind] = self.free.get(kind, 0) + spare
        self._waiting.clear()
        self._fills.clear()

    def waiting_minimums(self, kind: _Slot) -> set[int]:
        """Minimum GPUs of the jobs not yet given any that could run on ``kind``."""
        memo = self._waiting.get(kind)
        if memo is None:
            waiting = (self.gpus == 0) & np.isfinite(self._table(kind)[:, 0])
            memo = self._waiting[kind] = {int(m) for m in np.unique(self.min_gpus[waiting])}
        return memo

    def _table(self, kind: _Slot, new: bool = False) -> np.ndarray:
        """The kind's table; ``new``: for the GPUs of an instance not yet held."""
        table = self._tables.get((kind, new))
        if table is None and new:
            base = self._table(kind)
            with np.errstate(invalid="ignore"):  # -inf x 0: the job cannot run there either
                table = np.where(np.isfinite(base), base * self.delay[:, None], -np.inf)
            self._tables[(kind, new)] = table
        if table is None:
            shape = kind[:2]
            width = 1 + max((len(d.curves.get(shape, ())) for d in self.demands), default=0)
            table = np.full((len(self.demands), width + 1), -np.inf)
            for j, d in enumerate(self.demands):
                curve = d.curves.get(shape)
                if curve is None or (d.gpu_type is not None and d.gpu_type != kind[0]):
                    continue
                if j in kind[2]:  # its limits refuse it these GPUs
                    continue
                table[j, 0] = _kernel(np.zeros(1), self.power)[0]
                table[j, 1 : len(curve) + 1] = _kernel(_upper_hull(curve), self.power)
            self._tables[(kind, False)] = table
        return table

    def value(self) -> float:
        total = 0.0
        for j, d in enumerate(self.demands):
            kind = self.kind[j]
            if kind is not None and self.gpus[j]:
                total += d.curves[kind[:2]][int(self.gpus[j]) - 1]
        return total

    def fill(self, kind: _Slot, gpus: int, commit: bool, new: bool = False) -> tuple[float, int]:
        """Hand ``gpus`` more GPUs of ``kind`` (with those of that kind still free) to the
        jobs, each step to the job whose kernel value rises most per GPU (a waiting job's
        step is its minimum GPUs); the utility gained and the number of waiting jobs started.
        ``new``: the GPUs come with instances not yet held (gains discounted per job, see the
        class docstring). The allocation changes only if ``commit``.

        Results are memoised per ``(kind, gpus)`` until a commit could change them: a commit
        of ``kind`` drops that kind's, and a commit of another kind drops those whose greedy
        touched a job the commit changed (a job it did not touch only leaves the candidates,
        which cannot change an argmax it never won, so the memo stays exact)."""
        if not self.demands:
            return 0.0, 0
        key = (kind, gpus, new)
        memo = self._fills.get(key) if self.memoise else None
        if memo is None:
            memo = self._fills[key] = self._fill(kind, gpus, new)
        gain, started, touched, values, free = memo
        if commit:
            kind_id = self._kind_ids[kind]
            self.free[kind] = free
            held = self.gpus.copy()
            held[touched] = values  # only the jobs this fill gave GPUs to (the rest may have
            changed = held != self.gpus  # moved since the memo was made, by other kinds)
            for index in np.flatnonzero(changed):
                self.kind[int(index)] = kind
            self._kind_of[changed] = kind_id
            self.gpus = held
            self._waiting.clear()
            stale = [k for k, m in self._fills.items() if k[0] == kind or changed[m[2]].any()]
            for k in stale:
                del self._fills[k]
        return gain, started

    def _fill(
        self, kind: _Slot, gpus: int, new: bool
    ) -> tuple[float, int, np.ndarray, np.ndarray, int]:
        """The greedy of :meth:`fill` from the current allocation: (gain, jobs started, the
        jobs it gave GPUs to, their GPUs after it, GPUs of ``kind`` left free)."""
        table = self._table(kind, new)
        kind_id = self._kind_ids.setdefault(kind, len(self._kind_ids))
        allowed = (self._kind_of == -1) | (self._kind_of == kind_id)
        held = self.gpus.copy()
        rows = np.arange(len(self.demands))
        width = table.shape[1] - 1
        gain, free = 0.0, gpus + self.free.get(kind, 0)
        while free > 0:
            step = np.where(held == 0, self.min_gpus, 1)
            nxt = np.minimum(held + step, width)
            with np.errstate(invalid="ignore"):
                du = table[rows, nxt] - table[rows, held]
            ok = allowed & (held + step <= width) & (step <= free) & np.isfinite(du)
            rate = np.where(ok, du / step, -np.inf)
            j = int(np.argmax(rate))
            if not (rate[j] > 1e-12):
                break
            held[j] += step[j]
            gain += float(du[j])
            free -= int(step[j])
        started = int(np.count_nonzero((held > 0) & (self.gpus == 0)))
        touched = np.flatnonzero(held != self.gpus)
        return gain, started, touched, held[touched], free


def size_fleet(
    demands: Sequence[JobDemand],
    options: Sequence[FleetOption],
    held: Mapping[str, int],
    config: SizingConfig,
    speeds: SpeedTable,
) -> FleetProposal:
    """The fleet to hold (see the module docstring). ``held`` counts the instances held now
    per offering key (launched, ready or not); keys not among ``options`` are proposed at 0.
    Deterministic: ties go to the lower price, then the key.

    With several GPU types on offer, the growth runs twice. After the first pass, each job
    takes the type of the best value per dollar for the GPUs it got, priced at what they
    would cost on that kind of instance given what the pass bought (:class:`_KindSupply`:
    spot capacity the pass used is not offered again, so a job too large for what is left
    pays on-demand for the rest), times its value per GPU there to the power
    :data:`SPEED_PREFERENCE` (between two types of about the same goodput per dollar, the
    faster one finishes the job sooner, on fewer instances to lose to preemptions; 1 was
    measured against 0.5 and 2 in ``benchmarks/cloud_cost.py`` E1 and E3). A running job
    leaves its type only for more than ``1 + hysteresis`` times its type's figure. The second
    pass grows the fleet with those types. Of the two, the larger is proposed if what it adds
    is as efficient as the growth asks of an instance, else the smaller; if a cap or the
    budget stopped either, the one of more value per dollar (:func:`_choose`)."""
    usable = [o for o in options if o.available or held.get(o.key, 0) > 0]
    keys = [o.key for o in usable]
    if len(set(keys)) != len(keys):
        raise InvalidInputError("duplicate offering keys", field="options")
    if not usable:
        return FleetProposal({}, 0.0, 0.0, 0.0, "capacity")
    first = _grow(demands, usable, held, config, speeds)
    types = sorted({o.gpu_type for o in usable})
    if len(types) < 2 or not demands:
        return first.proposal()
    supplies: dict[frozenset[str] | None, dict[tuple[str, int], _KindSupply]] = {
        None: _supply(usable, first.counts, config)
    }
    repinned = []
    for j, d in enumerate(demands):
        supply = supplies.get(d.options)
        if supply is None:  # what the offerings the job allows supply
            allowed = [o for o in usable if d.allows(o)]
            supply = supplies[d.options] = _supply(allowed, first.counts, config)
        g = max(int(first.alloc.gpus[j]), d.min_gpus)
        rates: dict[str, float] = {}
        held_kind = first.alloc.kind[j]
        for kind, curve in sorted(d.curves.items()):
            hull = _upper_hull(curve)
            n = min(g, len(hull))
            mine = held_kind is not None and held_kind[:2] == kind
            own = min(n, int(first.alloc.gpus[j])) if mine else 0
            price = supply[kind].price_per_gpu(own, n - own) if kind in supply else None
            if price is None:
                continue
            per = float(hull[n - 1]) / n
            rate = per / price * per**SPEED_PREFERENCE
            rates[kind[0]] = max(rates.get(kind[0], -math.inf), rate)
        if not rates:
            repinned.append(d)
            continue
        best_type = max(sorted(rates), key=lambda t: rates[t])
        # A running job moves (a restart) only for more than the hysteresis margin.
        if d.gpu_type in rates and rates[best_type] <= rates[d.gpu_type] * (1 + config.hysteresis):
            best_type = d.gpu_type
        repinned.append(dataclasses.replace(d, gpu_type=best_type))
    second = _grow(repinned, usable, held, config, speeds)
    return _choose(first, second, usable, held, config, speeds).proposal()


@dataclass(frozen=True)
class _KindSupply:
    """GPUs of one instance kind after a pass, priced per GPU-hour (spot prices over their
    preemption factor): ``paid``, the dearest the pass paid for the kind (0 if it bought
    none), and ``left``, each available offering's price and the GPUs it can still give
    (``inf``: no capacity limit), cheapest first."""

    paid: float
    left: tuple[tuple[float, float], ...]

    def price_per_gpu(self, own: int, extra: int) -> float | None:
        """What a job's GPUs of the kind cost per GPU-hour: ``own`` GPUs it already has there
        at :attr:`paid`, ``extra`` more from :attr:`left`, cheapest first. ``None`` when the
        kind cannot supply them."""
        cost = own * self.paid
        need = extra
        for rate, gpus in self.left:
            if need <= 0:
                break
            take = min(need, gpus)
            if take > 0:
                cost += take * rate
                need -= int(take)
        if need > 0 or own + extra == 0:
            return None
        return cost / (own + extra)


def _supply(
    usable: Sequence[FleetOption], counts: Mapping[str, int], config: SizingConfig
) -> dict[tuple[str, int], _KindSupply]:
    """Each instance kind's :class:`_KindSupply` against a pass that bought ``counts``."""
    by_kind: dict[tuple[str, int], list[FleetOption]] = {}
    for o in usable:
        by_kind.setdefault(o.kind, []).append(o)
    out = {}
    for kind, offers in by_kind.items():
        rates = {
            o.key: o.usd_per_hour / o.gpus / _preemption_factor_or_tiny(o, config) for o in offers
        }
        offers.sort(key=lambda o: (rates[o.key], o.key))
        paid = max((rates[o.key] for o in offers if counts.get(o.key, 0)), default=0.0)
        left = tuple(
            (
                rates[o.key],
                math.inf if o.capacity is None else (o.capacity - counts.get(o.key, 0)) * o.gpus,
            )
            for o in offers
            if o.available
        )
        out[kind] = _KindSupply(paid, left)
    return out


def _choose(
    first: _Growth,
    second: _Growth,
    usable: Sequence[FleetOption],
    held: Mapping[str, int],
    config: SizingConfig,
    speeds: SpeedTable,
) -> _Growth:
    """The pass to propose. One with at least the other's value at no more than its price
    (the first on a tie). Else, if a cap or the budget stopped either pass, the one of more
    value per dollar (the first on a tie): both are cut at a limit, not at what is worth
    buying. Else (both stopped at the efficiency floor) the one of more value if what it
    buys beyond the other passes the growth's own test, its extra value at least
    ``min_efficiency`` of its extra ideal value (GPUs times the type's generic speed), the
    floor eased by ``hysteresis`` for the pass that keeps more of the ``held`` instances and
    raised as much for the other, as the growth does for one held instance; else the other.
    Comparing value per dollar there would favour the smaller fleet whenever returns
    diminish."""
    v1, v2 = first.alloc.value(), second.alloc.value()
    if v2 >= v1 - 1e-12 and second.price <= first.price + 1e-12:
        better = v2 > v1 + 1e-12 or second.price < first.price - 1e-12
        return second if better else first
    if v1 >= v2 and first.price <= second.price:
        return first
    if first.limited_by != "efficiency" or second.limited_by != "efficiency":
        per1 = v1 / first.price if first.price > 0 else 0.0
        per2 = v2 / second.price if second.price > 0 else 0.0
        return second if per2 > per1 + 1e-12 else first
    by_key = {o.key: o for o in usable}

    def ideal(grown: _Growth) -> float:
        return sum(
            n * by_key[k].gpus * speeds.relative_speed(by_key[k].gpu_type)
            for k, n in grown.counts.items()
        )

    more, less = (second, first) if v2 > v1 else (first, second)
    extra_ideal = ideal(more) - ideal(less)
    gained = more.alloc.value() - less.alloc.value()

    def kept(grown: _Growth) -> int:
        return sum(min(n, held.get(k, 0)) for k, n in grown.counts.items())

    floor = config.min_efficiency  # eased for the fleet closer to what is held: no thrash
    if kept(more) > kept(less):
        floor *= 1.0 - config.hysteresis
    elif kept(less) > kept(more):
        floor /= 1.0 - config.hysteresis
    if extra_ideal <= 0 or gained >= floor * extra_ideal:
        return more
    return less


def _preemption_factor_or_tiny(option: FleetOption, config: SizingConfig) -> float:
    return max(_preemption_factor(option, config), 1e-6)


@dataclass
class _Growth:
    """One pass of fleet growth: the modelled allocation and what was bought."""

    alloc: _Allocation
    counts: dict[str, int]
    price: float
    last_eff: float
    limited_by: str

    def proposal(self) -> FleetProposal:
        gpus_by_job = {
            d.name: int(g) for d, g in zip(self.alloc.demands, self.alloc.gpus, strict=True) if g
        }
        return FleetProposal(
            self.counts,
            self.price,
            self.alloc.value(),
            0.0 if math.isinf(self.last_eff) else self.last_eff,
            self.limited_by,
            gpus_by_job,
        )


def _grow(
    demands: Sequence[JobDemand],
    usable: Sequence[FleetOption],
    held: Mapping[str, int],
    config: SizingConfig,
    speeds: SpeedTable,
) -> _Growth:
    """One pass of the growth described in the module docstring."""
    counts: dict[str, int] = {}
    alloc = _Allocation(demands, config.power, _delay_factors(demands, config))
    price = 0.0
    last_eff = math.inf
    limited_by = "no_demand" if not demands else "efficiency"
    total = gpus = 0
    unused: dict[str, int] = {}  # GPUs of the instances bought for deadlines not yet given
    by_key = {o.key: o for o in usable}
    slot = _slots(demands, usable)
    for j, d in enumerate(demands):  # deadlines first: the GPUs each one needs
        if not d.deadline_gpus:
            continue
        shared = _deadline_share(d, by_key, unused)
        if shared is not None:  # what an instance bought for another deadline has left
            o, g = shared
            unused[o.key] -= g
            alloc.give(j, slot[o.key], g, -g)
            continue
        pick = _deadline_pick(d, usable, held, counts, config, total, gpus, price)
        if pick is None:
            continue
        o, n, g = pick
        counts[o.key] = counts.get(o.key, 0) + n
        price += n * o.usd_per_hour
        total += n
        gpus += n * o.gpus
        unused[o.key] = unused.get(o.key, 0) + n * o.gpus - g
        alloc.give(j, slot[o.key], g, n * o.gpus - g)
    while total < config.max_instances:
        best: tuple[float, float, str] | None = None
        best_option: FleetOption | None = None
        best_eff = 0.0
        blocked = ""
        best_size = 1
        best_new = False
        gains: dict[tuple[_Slot, int, bool], tuple[float, int]] = {}
        for o in sorted(usable, key=lambda o: (o.usd_per_hour, o.key)):
            n = counts.get(o.key, 0)
            # One instance, or as many as it takes to start a waiting job that needs more.
            spare = alloc.free.get(slot[o.key], 0)
            sizes = {1} | {
                -(-(m - spare) // o.gpus) for m in alloc.waiting_minimums(slot[o.key]) if m > spare
            }
            for size in sorted(sizes):
                is_held = n + size <= held.get(o.key, 0)
                if total + size > config.max_instances:
                    blocked = blocked or "max_instances"
                    continue
                if config.max_gpus is not None and gpus + size * o.gpus > config.max_gpus:
                    blocked = blocked or "max_gpus"
                    continue
                if not o.may_hold(n + size, held):
                    blocked = blocked or "capacity"
                    continue
                budget = config.budget_usd_per_hour
                if budget is not None and price + size * o.usd_per_hour > budget + 1e-9:
                    blocked = "budget"
                    continue
                fill_key = (slot[o.key], size, not is_held)
                if fill_key not in gains:  # offerings of one slot differ only in price
                    gains[fill_key] = alloc.fill(
                        slot[o.key], size * o.gpus, commit=False, new=not is_held
                    )
                gain, started = gains[fill_key]
                effective = gain * _preemption_factor(o, config)
                eff = effective / (size * o.gpus * speeds.relative_speed(o.gpu_type))
                floor = config.min_efficiency * ((1.0 - config.hysteresis) if is_held else 1.0)
                if started:  # a waiting job is never left waiting for efficiency's sake
                    floor = 0.0
                if total >= config.min_instances and eff < floor:
                    continue
                rank = (effective / (size * o.usd_per_hour), -o.usd_per_hour, o.key)
                if best is None or rank > best:
                    best, best_option, best_eff, best_size = rank, o, eff, size
                    best_new = not is_held
        if best_option is None:
            if demands and blocked:
                limited_by = blocked
            break
        alloc.fill(slot[best_option.key], best_size * best_option.gpus, commit=True, new=best_new)
        counts[best_option.key] = counts.get(best_option.key, 0) + best_size
        price += best_size * best_option.usd_per_hour
        last_eff = best_eff
        total += best_size
        gpus += best_size * best_option.gpus
    if total >= config.max_instances and demands:
        limited_by = "max_instances"
    return _Growth(alloc, counts, price, last_eff, limited_by)


def _deadline_share(
    d: JobDemand, by_key: Mapping[str, FleetOption], spare: Mapping[str, int]
) -> tuple[FleetOption, int] | None:
    """An offering whose instances, bought for other deadlines, have the GPUs ``d`` needs
    left (of its type, on spot, or on demand if it is urgent), the cheapest;
    ``(offering, GPUs)``."""
    best: tuple[float, str, FleetOption, int] | None = None
    for key, left in spare.items():
        o = by_key[key]
        need = d.deadline_gpus.get(o.kind)
        if need is None or need > left or (o.market == "spot") == d.urgent or not d.allows(o):
            continue
        if d.gpu_type is not None and o.gpu_type != d.gpu_type:
            continue
        rank = (o.usd_per_hour / o.gpus, key)
        if best is None or rank < best[:2]:
            best = (rank[0], rank[1], o, need)
    return None if best is None else (best[2], best[3])


def _deadline_pick(
    d: JobDemand,
    usable: Sequence[FleetOption],
    held: Mapping[str, int],
    counts: Mapping[str, int],
    config: SizingConfig,
    total: int,
    gpus: int,
    price: float,
) -> tuple[FleetOption, int, int] | None:
    """The cheapest way to give a deadline job its GPUs (:attr:`JobDemand.deadline_gpus`):
    ``(offering, instances, GPUs)`` of the kind it runs on (any kind if it waits), on spot
    (prices over their preemption factor) or, if it is ``urgent``, on demand; within
    capacity, the budget and the caps. ``None`` if nothing fits: a job not urgent that spot
    cannot serve is left to the growth (on demand comes when its slack runs out)."""
    best: tuple[float, str, FleetOption, int, int] | None = None
    for o in usable:
        need = d.deadline_gpus.get(o.kind)
        if need is None or (d.gpu_type is not None and o.gpu_type != d.gpu_type):
            continue
        if not d.allows(o):
            continue
        if (o.market == "spot") == d.urgent:  # spot while the slack allows, else on demand
            continue
        n = -(-need // o.gpus)
        have = counts.get(o.key, 0)
        if not o.may_hold(have + n, held):
            continue
        if total + n > config.max_instances:
            continue
        if config.max_gpus is not None and gpus + n * o.gpus > config.max_gpus:
            continue
        budget = config.budget_usd_per_hour
        if budget is not None and price + n * o.usd_per_hour > budget + 1e-9:
            continue
        cost = n * o.usd_per_hour / _preemption_factor_or_tiny(o, config)
        if best is None or (cost, o.key) < best[:2]:
            best = (cost, o.key, o, n, need)
    return None if best is None else (best[2], best[3], best[4])


def _delay_factors(demands: Sequence[JobDemand], config: SizingConfig) -> np.ndarray:
    """Per job, what an instance still to be provisioned is worth of its value (see the
    module docstring): ``max(0, 1 - provisioning_delay_s / horizon)``, the horizon the
    planning horizon or, for a running job that knows it, its remaining time if shorter."""
    horizon = np.array(
        [
            config.planning_horizon_s
            if d.remaining_s is None or d.gpu_type is None
            else min(config.planning_horizon_s, d.remaining_s)
            for d in demands
        ],
        dtype=float,
    )
    with np.errstate(divide="ignore"):
        return np.maximum(0.0, 1.0 - config.provisioning_delay_s / horizon)


def modelled_value(demands: Sequence[JobDemand], option: FleetOption, count: int) -> float:
    """The jobs' total modelled value (T4-GPU equivalents, the fairness kernel not applied)
    on ``count`` instances of ``option`` alone, GPUs handed out as :func:`size_fleet` does
    (with ``power = 1``)."""
    alloc = _Allocation(demands, 1.0)
    alloc.fill(_slots(demands, [option])[option.key], count * option.gpus, commit=True)
    return alloc.value()


def _preemption_factor(option: FleetOption, config: SizingConfig) -> float:
    if option.market != "spot" or option.hazard_per_hour <= 0:
        return 1.0
    return max(0.0, 1.0 - option.hazard_per_hour * config.preemption_loss_s / 3600.0)
