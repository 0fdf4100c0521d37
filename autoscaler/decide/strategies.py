"""Fleet strategies: who decides how many instances of which offering to hold (pure).

A strategy sees a :class:`~autoscaler.decide.fleet.FleetView` each round (the jobs as the policy
sees them, the ready nodes, what is held, the offerings at the prices in effect) and returns
instance counts per offering key. The policy then allocates jobs on the fleet it gets. Which
offerings a strategy may buy from (spot or not, which GPU types) is the offering list it is
run with, not part of the strategy.

- :class:`FixedFleet` -- a constant fleet (``static-ondemand``: 16 x g4dn.12xlarge).
- :class:`GoodputSizing` -- :func:`autoscaler.decide.sizing.size_fleet` on the jobs' goodput
  (``coadapt`` and its variants) or throughput (``throughput-autoscale``, Or et al.,
  MLSys'20: scale out while an added instance's throughput gain per dollar stays above the
  threshold, statistical efficiency ignored).
- :class:`UtilityBand` -- our reading of the Pollux paper's cloud autoscaling
  (``pollux-autoscale``): one instance type; the fleet grows while the modelled *utility*
  (T4-GPU equivalents of goodput per GPU held, see :mod:`autoscaler.decide.sizing`) stays above
  ``high`` and shrinks while it is below ``low``.
- :class:`PerJobCheapest` -- how SkyPilot-style managed jobs behave (``cheapest-spot``):
  every active job gets its own instances of the cheapest offering (by price for the GPUs it
  asked for) that has capacity, kept while that offering can hold them (a managed job is not
  moved for price; a capacity error moves only the jobs whose instances it refused), released
  when it finishes.
- :class:`UniformProgress` -- Can't Be Late's uniform-progress rule (``uniform-progress``):
  the same per-job instances, on spot while the job is ahead of the uniform rate to its
  deadline, else on demand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoscaler.decide.deadlines import (
    assess,
    goodput_curves,
    held_gpu_type,
    remaining_s,
    time_left_s,
    uniform_progress_ahead,
)
from autoscaler.decide.fleet import FleetView
from autoscaler.decide.restarts import restart_factor
from autoscaler.decide.sizing import (
    FleetOption,
    JobDemand,
    SizingConfig,
    ValueKind,
    job_demands,
    modelled_value,
    size_fleet,
)
from autoscaler.decide.views import Allocation, ClusterView, JobView, OfferingRef
from autoscaler.errors import InvalidInputError
from autoscaler.model.gputypes import SpeedTable, default_speed_table

__all__ = [
    "FixedFleet",
    "GoodputSizing",
    "PerJobCheapest",
    "UniformProgress",
    "UtilityBand",
    "demands_of",
]


def demands_of(
    view: FleetView,
    speeds: SpeedTable,
    *,
    value: ValueKind = "goodput",
    growth_factor: int = 5,
    max_gpus: int = 64,
    optimistic: bool = True,
    cache: dict[str, tuple[tuple, JobDemand]] | None = None,
    start_s: float = 180.0,
    margin_s: float = 300.0,
    deadline_cache: dict[str, tuple[tuple, dict]] | None = None,
    observed: Mapping[str, float] | None = None,
) -> list[JobDemand]:
    """Every active job's value curves over the instance kinds on offer, up to
    ``growth_factor`` x the most GPUs it has run on (the policy's exploration cap; 1 before
    any run) and at most ``max_gpus``, with a running job's remaining time
    (``JobDemand.remaining_s``, from the trainer's progress; recomputed every round). With a
    ``cache`` (by job name), a job's curves are rebuilt only when what they depend on changed
    (its models, caps, type, profile). A job with a deadline, a known remaining work and a
    model gets its ``deadline_gpus`` and ``urgent`` (:func:`autoscaler.decide.deadlines.assess` on
    its goodput curves, starting a kind costing ``start_s``, with ``margin_s`` to spare; its
    curves calibrated by ``observed[name]``, the goodput it was measured to make where it
    runs, where given)."""
    kinds = tuple(sorted({o.kind for o in view.options}))
    out: list[JobDemand | None] = []
    missing: list[tuple[int, JobView, int, str | None, tuple]] = []
    for job in view.jobs:
        cap = growth_factor * max(1, job.max_profiled_gpus)
        cap = max(1, min(cap, max_gpus, job.limits.max_batch_size // job.limits.min_local_bsz))
        cap = max(cap, job.fewest_gpus)  # the user's floor (exactly its GPUs if fixed)
        if job.max_gpus is not None:  # the user's cap (its GPUs if it does not adapt)
            cap = max(1, min(cap, job.max_gpus))
        gpu_type = held_gpu_type(job, view.cluster)
        key = (
            optimistic,
            kinds,
            cap,
            gpu_type,
            value,
            job.model,
            tuple(sorted(job.models.items())),
            job.max_profiled_nodes,
            job.max_profiled_gpus,
            job.requested_gpus,
            job.fewest_gpus,
            job.gpu_types,
        )
        hit = cache.get(job.name) if cache is not None else None
        if hit is not None and hit[0] == key:
            out.append(hit[1])
            continue
        missing.append((len(out), job, cap, gpu_type, key))
        out.append(None)
    if missing:
        built = job_demands(
            [job for _, job, _, _, _ in missing],
            kinds,
            speeds,
            max_gpus=[cap for _, _, cap, _, _ in missing],
            gpu_types=[t for _, _, _, t, _ in missing],
            value=value,
            optimistic=optimistic,
        )
        for (slot, job, _, _, key), demand in zip(missing, built, strict=True):
            out[slot] = demand
            if cache is not None:
                cache[job.name] = (key, demand)
    for memo in (cache, deadline_cache):
        if memo is not None and len(memo) > 4 * max(1, len(view.jobs)):
            live = {job.name for job in view.jobs}
            for name in [n for n in memo if n not in live]:
                del memo[name]
    return [
        _limited(
            job,
            _restarted(
                job,
                view.cluster,
                _bounded(
                    job,
                    _with_deadline(
                        job,
                        dataclasses.replace(d, remaining_s=remaining_s(job, d.gpu_type)),
                        speeds,
                        kinds=kinds
                        if not job.restricts_offerings
                        else tuple(sorted({o.kind for o in view.options if o.allows(job)})),
                        start_s=start_s,
                        margin_s=margin_s,
                        value=value,
                        max_gpus=max_gpus,
                        cache=deadline_cache,
                        observed=None if observed is None else observed.get(job.name),
                    ),
                ),
            ),
            view.options,
        )
        for job, d in zip(view.jobs, out, strict=True)
        if d is not None
    ]


def _limited(job: JobView, demand: JobDemand, options: Sequence[FleetOption]) -> JobDemand:
    """``demand`` with the offerings the job allows (:attr:`JobDemand.options`), when it
    limits its markets or offerings."""
    if not job.restricts_offerings:
        return demand
    allowed = frozenset(o.key for o in options if o.allows(job))
    return dataclasses.replace(demand, options=allowed)


def _with_deadline(
    job: JobView,
    demand: JobDemand,
    speeds: SpeedTable,
    *,
    kinds: tuple[tuple[str, int], ...],
    start_s: float,
    margin_s: float,
    value: ValueKind,
    max_gpus: int,
    cache: dict[str, tuple[tuple, dict]] | None,
    observed: float | None = None,
) -> JobDemand:
    """``demand`` with what the job's deadline asks (see :func:`demands_of`): judged on its
    goodput up to its ceiling (:func:`autoscaler.decide.deadlines.goodput_curves`, memoised in
    ``cache`` while its models are the same), the GPUs bought for it within its curves;
    for a job that is not urgent and, where it runs, is done ``margin_s`` early, only the
    GPUs that finish it a round early (what the policy keeps for it). With ``observed``
    (samples per second measured at its allocation), every curve is scaled by the measured
    over the modelled goodput there (within [1/2, 4]): an early fit can be far off, and a
    deadline judged on it alone buys on demand for nothing; without a measure, the job is
    urgent only if it would be at twice its modelled goodput."""
    left = time_left_s(job)
    work = job.remaining_work
    if left is None or work is None or value != "goodput":
        return demand
    key = (kinds, max_gpus, job.model, tuple(sorted(job.models.items())), job.gpu_types)
    hit = cache.get(job.name) if cache is not None else None
    if hit is not None and hit[0] == key:
        goodput = hit[1]
    else:
        goodput = goodput_curves(job, kinds, speeds, most_gpus=max_gpus)
        if cache is not None:
            cache[job.name] = (key, goodput)
    if not goodput:
        return demand
    running = None
    if demand.gpu_type is not None:
        running = next((k for k in goodput if k[0] == demand.gpu_type), None)
    calibrated = False
    if observed is not None and running is not None and 0 < job.num_gpus <= len(goodput[running]):
        modelled = goodput[running][job.num_gpus - 1]
        if modelled > 0 and observed > 0:
            factor = min(4.0, max(0.5, observed / modelled))
            goodput = {k: [v * factor for v in c] for k, c in goodput.items()}
            calibrated = True
    need = assess(work, left, goodput, start_s=start_s, margin_s=margin_s, running_kind=running)
    if need.urgent and not calibrated:
        # An uncalibrated fit is trusted for urgency only within a factor of 2.
        hopeful = {k: [2.0 * v for v in c] for k, c in goodput.items()}
        urgent = assess(
            work, left, hopeful, start_s=start_s, margin_s=margin_s, running_kind=running
        )
        need = dataclasses.replace(need, urgent=urgent.urgent)
    on_track = demand.remaining_s is not None and demand.remaining_s <= left - margin_s
    if on_track and not need.urgent:
        # It makes it where it runs: it keeps only what the policy will keep for it (its
        # rate with a round to spare), the growth decides the rest.
        need = assess(work, left, goodput, start_s=start_s, margin_s=60.0, running_kind=running)
        need = dataclasses.replace(need, urgent=False)
    gpus = {
        k: min(len(demand.curves[k]), max(g, demand.min_gpus))
        for k, g in need.gpus.items()
        if demand.curves.get(k)
    }
    return dataclasses.replace(demand, deadline_gpus=gpus, urgent=need.urgent)


def _restarted(job: JobView, cluster: ClusterView, demand: JobDemand) -> JobDemand:
    """``demand`` with only the growth the policy would make (:mod:`autoscaler.decide.
    restarts`): on the type it runs on, ``g`` GPUs beyond the ``g0`` it holds are worth
    ``v(g)`` only where ``rho x v(g) > v(g0)`` (the growth beats its restart, ``rho`` the
    restart factor at its time left), else ``v(g0)``: the sizing buys no instance for a growth
    the policy would refuse, and values the growth it would make in full. Up to ``g0`` the
    curve is unchanged. A job not running is unchanged."""
    g0 = sum(job.allocation.values())
    if g0 <= 0 or demand.gpu_type is None:
        return demand
    rho = restart_factor(demand.remaining_s, cluster.restart_delay_s)
    if rho >= 1.0:
        return demand
    curves = dict(demand.curves)
    for kind, curve in demand.curves.items():
        if kind[0] != demand.gpu_type or len(curve) <= g0:
            continue
        base = curve[g0 - 1]
        curves[kind] = curve[:g0] + tuple(v if rho * v > base else base for v in curve[g0:])
    return dataclasses.replace(demand, curves=curves)


def _bounded(job: JobView, demand: JobDemand) -> JobDemand:
    """``demand`` within the user's bounds: its curves only on the GPU types the job allows,
    and never started on fewer GPUs than it may run on."""
    if job.gpu_types is None and job.fewest_gpus <= demand.min_gpus:
        return demand
    curves = {k: c for k, c in demand.curves.items() if job.allows_type(k[0])}
    return dataclasses.replace(
        demand, curves=curves, min_gpus=max(demand.min_gpus, job.fewest_gpus)
    )


@dataclass(frozen=True)
class FixedFleet:
    """Hold ``counts`` instances per offering key, whatever the jobs."""

    name: str
    counts: Mapping[str, int]

    def propose(self, view: FleetView) -> Mapping[str, int]:
        return dict(self.counts)


@dataclass
class GoodputSizing:
    """:func:`~autoscaler.decide.sizing.size_fleet` every round (see the module docstring). A job
    whose deadline is urgent (:func:`demands_of`) is sized as urgent from the second round in
    a row that finds it so."""

    name: str
    config: SizingConfig = field(default_factory=SizingConfig)
    speeds: SpeedTable = field(default_factory=default_speed_table)
    growth_factor: int = 5
    _cache: dict[str, tuple[tuple, JobDemand]] = field(default_factory=dict, repr=False)
    _deadline_cache: dict[str, tuple[tuple, dict]] = field(default_factory=dict, repr=False)
    _urgent: set[str] = field(default_factory=set, repr=False)
    _seen: dict[str, tuple[float, float, Allocation]] = field(default_factory=dict, repr=False)

    def propose(self, view: FleetView) -> Mapping[str, int]:
        demands = demands_of(
            view,
            self.speeds,
            value=self.config.value,
            growth_factor=self.growth_factor,
            optimistic=self.config.optimistic_nodes,
            cache=self._cache,
            start_s=self.config.provisioning_delay_s + 60.0,
            margin_s=self.config.preemption_loss_s,
            deadline_cache=self._deadline_cache,
            observed=self._observe(view),
        )
        # A job turns urgent (on demand) only when two rounds in a row say so: one
        # round's fit, early in a job's life, can be far off.
        urgent = {d.name for d in demands if d.urgent}
        demands = [
            d if not d.urgent or d.name in self._urgent else dataclasses.replace(d, urgent=False)
            for d in demands
        ]
        self._urgent = urgent
        return dict(size_fleet(demands, view.options, view.held, self.config, self.speeds).counts)

    def _observe(self, view: FleetView) -> dict[str, float]:
        """Per deadline job that kept its allocation since the last round, the goodput it
        made meanwhile (its remaining work's drop over the time)."""
        out: dict[str, float] = {}
        seen: dict[str, tuple[float, float, Allocation]] = {}
        for job in view.jobs:
            work = job.remaining_work
            if job.deadline_s is None or work is None or not job.allocation:
                continue
            seen[job.name] = (view.now_s, work, job.allocation)
            last = self._seen.get(job.name)
            if (
                last is not None
                and last[2] == job.allocation
                and view.now_s > last[0]
                and last[1] > work
            ):
                out[job.name] = (last[1] - work) / (view.now_s - last[0])
        self._seen = seen
        return out


@dataclass
class UtilityBand:
    """Instances of one offering ``key``, kept where the modelled utility lies in
    ``[low, high]`` (see the module docstring); at least ``min_instances``."""

    name: str
    key: str
    low: float = 0.5
    high: float = 0.8
    min_instances: int = 1
    max_instances: int = 64
    speeds: SpeedTable = field(default_factory=default_speed_table)

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise InvalidInputError("need 0 < low < high", field="low")

    def propose(self, view: FleetView) -> Mapping[str, int]:
        option = next((o for o in view.options if o.key == self.key), None)
        if option is None:
            raise InvalidInputError(f"offering {self.key!r} not on offer", field="key")
        demands = demands_of(view, self.speeds)
        n = max(self.min_instances, view.held.get(self.key, 0))
        if not demands:
            return {self.key: self.min_instances}

        def utility(count: int) -> float:
            return modelled_value(demands, option, count) / (count * option.gpus)

        while n < self.max_instances and utility(n) > self.high:
            n += 1
        while n > self.min_instances and utility(n) < self.low:
            n -= 1
        return {self.key: n}


@dataclass
class PerJobCheapest:
    """Every active job on its own instances of the cheapest offering that fits the GPUs it
    asked for and has capacity (see the module docstring); a job keeps the offering it was
    given while that offering can still hold it (:func:`_per_job`)."""

    name: str
    _kept: dict[str, str] = field(default_factory=dict, repr=False)

    def propose(self, view: FleetView) -> Mapping[str, int]:
        counts, self._kept = _per_job(view, lambda job, gpus, allowed: (allowed,), self._kept)
        return counts


@dataclass
class UniformProgress:
    """Can't Be Late's uniform-progress rule (``uniform-progress``, the deadline baseline):
    every active job on its own instances for the GPUs it asked for, as
    :class:`PerJobCheapest` buys them, of the cheapest *spot* offering while the job is at or
    ahead of the uniform rate to its deadline (:func:`autoscaler.decide.deadlines.
    uniform_progress_ahead`: the share of its declared length done against the share of the
    time from submission to deadline gone; a job that has not reported yet counts as on
    time), else of the cheapest *on-demand* one. A job whose time left, less ``margin_s``,
    would no longer cover its remaining work at its requested GPUs (by its fitted model) is
    put on demand too: near the deadline one preemption would be too many. A job without a
    deadline is on spot; where spot has no capacity, on demand. A job keeps the offering it
    was given while the rule still puts it on that market and the offering can still hold
    it (:func:`_per_job`)."""

    name: str
    margin_s: float = 300.0
    _kept: dict[str, str] = field(default_factory=dict, repr=False)

    def propose(self, view: FleetView) -> Mapping[str, int]:
        def markets(
            job: JobView, gpus: int, allowed: list[FleetOption]
        ) -> tuple[list[FleetOption], ...]:
            spot = [o for o in allowed if o.market == "spot"]
            ondemand = [o for o in allowed if o.market != "spot"]
            return (spot, ondemand) if self.on_spot(job, gpus) else (ondemand, spot)

        counts, self._kept = _per_job(view, markets, self._kept)
        return counts

    def on_spot(self, job: JobView, gpus: int) -> bool:
        """Whether the rule puts ``job`` (on ``gpus`` GPUs) on spot now."""
        left = time_left_s(job)
        if left is None:
            return True
        total, remaining = job.target_progress, job.remaining_progress
        if total is None or remaining is None:
            return left > self.margin_s
        window = job.deadline_s - job.submit_time_s if job.deadline_s is not None else 0.0
        if not uniform_progress_ahead(total - remaining, total, job.age_s, window):
            return False
        work = job.remaining_work
        model = next(iter(job.models.values()), None) if job.models else job.model
        if work is not None and model is not None:
            nodes = max(1, job.num_nodes)
            rate = float(np.ravel(model.optimize(nodes, gpus).goodput)[0])
            if rate <= 0 or work / rate > left - self.margin_s:
                return False
        return True


_Tiers = Callable[[JobView, int, list[FleetOption]], Sequence[Sequence[FleetOption]]]


def _per_job(
    view: FleetView, tiers: _Tiers, kept: Mapping[str, str]
) -> tuple[dict[str, int], dict[str, str]]:
    """Every active job, oldest first, on its own instances for the GPUs it asked for (within
    its bounds); ``(instances per offering key, the offering key each job was given)``.

    ``tiers(job, gpus, allowed)`` orders the offerings the job allows into tiers of
    preference (one tier: any; uniform progress: its market first). In the first tier that
    can hold the job, it keeps its offering (the one it was given last round, ``kept``, else
    the one its GPUs are on now: a restarted controller moves no running job) if that one is
    there and can still hold its instances, else it gets the cheapest that can. Whether an
    offering can hold them is :meth:`~autoscaler.decide.sizing.FleetOption.may_hold`, over
    what the older jobs took: an offering marked unavailable after a capacity error still
    holds the instances held of it (``view.held``), and a job given an offering is not moved
    back and forth as marks come and go: after a capacity error, the target settles in the
    next round and stays
    (``tests/decide/test_per_job_strategies.py``)."""
    counts: dict[str, int] = {}
    given: dict[str, str] = {}
    by_key = {o.key: o for o in view.options}
    by_ref = {o.ref: o for o in view.options if o.ref is not None}
    for job in sorted(view.jobs, key=lambda j: (j.submit_time_s, j.name)):
        gpus = max(1, job.requested_gpus, job.fewest_gpus)
        if job.max_gpus is not None:
            gpus = min(gpus, job.max_gpus)
        allowed = [o for o in view.options if o.allows(job)]
        own = by_key.get(kept.get(job.name, "")) or _offering_of(job, view, by_ref)
        choice = None
        for tier in tiers(job, gpus, allowed):
            fits = []  # (offering, instances) of the tier that can still hold the job
            for o in tier:
                n = -(-gpus // o.gpus)
                if o.may_hold(counts.get(o.key, 0) + n, view.held):
                    fits.append((o, n))
            choice = next(((o, n) for o, n in fits if o is own), None) or min(
                fits, key=lambda c: (c[1] * c[0].usd_per_hour, c[0].key), default=None
            )
            if choice is not None:
                break
        if choice is None:
            continue
        option, n = choice
        counts[option.key] = counts.get(option.key, 0) + n
        given[job.name] = option.key
    return counts, given


def _offering_of(
    job: JobView, view: FleetView, by_ref: Mapping[OfferingRef, FleetOption]
) -> FleetOption | None:
    """The offering all of ``job``'s GPUs are on now (``None``: it holds none, or holds them
    on nodes of several offerings or of one not on offer)."""
    refs = set()
    for key in job.allocation:
        at = view.cluster.index_of(key)
        refs.add(None if at is None else view.cluster.nodes[at].offering)
    if len(refs) != 1:
        return None
    ref = refs.pop()
    return None if ref is None else by_ref.get(ref)
