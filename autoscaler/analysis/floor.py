"""The cost floor of a run: the least any fleet could have paid to do the same work.

Pure: numbers in, numbers out (:func:`cost_floor`). The inputs say, for each job, the work it
had to do (in its application's statistical progress, split into ordered *segments*), when it
arrived and, optionally, by when it must finish; and for each offering it could run on, the
price in effect over time, its GPUs per instance, its spot capacity over time, and the
goodput (progress per second) each configuration (a GPU count) reaches there in each segment.

Two floors:

(a) **no time limit** (:attr:`FloorResult.no_limit_usd`): every segment of every job done at
    its least cost per unit of work over all offerings and configurations, at the cheapest
    price the offering has at any time from the job's arrival on (at a time its capacity is
    above zero; a price series' last value holds forever). It is the linear program (b) with
    no finish-by time and without the capacity constraints, which then separates by job and
    segment: hence (a) <= (b) always.
(b) **every job by its finish-by time** (:attr:`FloorResult.at_deadline_usd`): a linear
    program over time slots (fixed length ``slot_s``, aligned at 0). Its variables are the
    seconds job ``j`` runs configuration ``c`` of offering ``o`` on segment ``k`` in slot
    ``t``; it minimises the money those seconds cost at the offering's price per GPU-second
    subject to

    - work: each segment's goodput-seconds reach its work;
    - one configuration at a time: a job's seconds in a slot are at most the part of the slot
      inside ``[arrival, finish_by]``;
    - capacity: the GPU-seconds run on a spot offering in a slot are at most the integral of
      its capacity (instances x GPUs per instance) over the slot.

    A slot's price is the least the offering charges at any moment of the slot inside the
    job's window (and, on spot, while its capacity is above zero).

**What the floor relaxes** (each makes it smaller, so it is a true lower bound on any schedule
of the same work under the same prices and capacity, the run's included):

- no restart, checkpoint or lost progress: work is done once, and a job moves between
  configurations, offerings and slots for free;
- no provisioning delay and no minimum billing: only GPU-seconds a job runs are paid;
- no packing loss: a job pays per GPU, never for a whole instance (fractions of instances);
- time-sharing inside a slot (a job splits a slot's seconds between configurations), and the
  least price and the whole capacity integral of a slot are available throughout it;
- segments in any order: a segment's goodput is the best the job reaches anywhere in it (its
  upper envelope over progress), and segments may be done in any order or at once (not
  concurrently beyond the one-configuration rule);
- the goodputs are what the caller gives: for a true bound they must be upper envelopes of
  the true goodput (best batch size, best placement, no interference).

The program is solved with HiGHS (:func:`scipy.optimize.linprog`). Configurations that no
optimum needs (not on the upper concave hull of goodput against GPUs, with the origin) are
dropped before it is built; that changes no optimum, as a dropped one is matched or beaten in
work, GPU-seconds and cost by time-sharing two kept ones.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoscaler.errors import AutoscalerError, InvalidInputError

__all__ = [
    "FloorConfig",
    "FloorError",
    "FloorJob",
    "FloorOffering",
    "FloorProblem",
    "FloorResult",
    "StepSeries",
    "cost_floor",
    "floor_summary",
]

MAX_VARIABLES = 3_000_000
"""The largest program :func:`cost_floor` builds (variables); past it, slots are lengthened."""


class FloorError(AutoscalerError):
    """The floor cannot be computed (no offering can do a job's work in its window)."""


@dataclass(frozen=True)
class StepSeries:
    """A step function of time: ``values[i]`` holds from ``times_s[i]`` until ``times_s[i + 1]``;
    the last value holds forever, the first one before ``times_s[0]``. ``times_s`` strictly
    increase."""

    times_s: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        times, values = tuple(float(t) for t in self.times_s), tuple(map(float, self.values))
        object.__setattr__(self, "times_s", times)
        object.__setattr__(self, "values", values)
        if not times or len(times) != len(values):
            raise InvalidInputError("a step series needs as many values as times, at least one")
        if any(not math.isfinite(t) for t in times) or any(
            b <= a for a, b in itertools.pairwise(times)
        ):
            raise InvalidInputError("step series times must be finite and increase")
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise InvalidInputError("step series values must be finite and >= 0")

    @staticmethod
    def constant(value: float) -> StepSeries:
        return StepSeries((0.0,), (value,))

    def pieces(self, t0_s: float, t1_s: float) -> list[tuple[float, float, float]]:
        """``(start, end, value)`` of the constant pieces covering ``[t0_s, t1_s]`` (``t1_s``
        may be ``inf``); empty when ``t1_s <= t0_s``."""
        if not t1_s > t0_s:
            return []
        i = max(0, bisect.bisect_right(self.times_s, t0_s) - 1)
        out = []
        start = t0_s
        while True:
            end = self.times_s[i + 1] if i + 1 < len(self.times_s) else math.inf
            end = min(end, t1_s)
            if end > start:
                out.append((start, end, self.values[i]))
            if end >= t1_s:
                return out
            start = end
            i += 1


@dataclass(frozen=True)
class FloorOffering:
    """Where GPUs can be bought: ``price`` per instance-hour over time, ``gpus_per_instance``,
    and ``capacity`` (instances available over time; ``None``: unlimited, on demand)."""

    key: str
    gpus_per_instance: int
    price_usd_per_hour: StepSeries
    capacity: StepSeries | None = None

    def __post_init__(self) -> None:
        if not self.gpus_per_instance >= 1:
            raise InvalidInputError(f"{self.key}: gpus_per_instance must be >= 1")


@dataclass(frozen=True)
class FloorConfig:
    """One way a job runs on one offering: ``gpus`` GPUs at ``goodput[k]`` progress units per
    second in segment ``k`` (an upper envelope of what it truly reaches there)."""

    offering: str
    gpus: int
    goodput: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.gpus >= 1:
            raise InvalidInputError(f"a configuration needs >= 1 GPU, got {self.gpus}")
        if any(not math.isfinite(g) or g < 0 for g in self.goodput):
            raise InvalidInputError("goodputs must be finite and >= 0")


@dataclass(frozen=True)
class FloorJob:
    """One job: its ordered segments of work (progress units; they sum to its work), arrival,
    optional finish-by time, and its configurations (each with one goodput per segment)."""

    job_id: str
    application: str
    arrival_s: float
    work: tuple[float, ...]
    configs: tuple[FloorConfig, ...]
    finish_by_s: float | None = None

    def __post_init__(self) -> None:
        if not self.work or any(not math.isfinite(w) or w < 0 for w in self.work):
            raise InvalidInputError(f"{self.job_id}: work must be finite, >= 0, non-empty")
        if any(len(c.goodput) != len(self.work) for c in self.configs):
            raise InvalidInputError(f"{self.job_id}: one goodput per segment in each config")
        if self.finish_by_s is not None and not self.finish_by_s >= self.arrival_s:
            raise InvalidInputError(f"{self.job_id}: finish_by_s is before arrival_s")


@dataclass(frozen=True)
class FloorProblem:
    """The jobs and the offerings of a run."""

    jobs: tuple[FloorJob, ...]
    offerings: tuple[FloorOffering, ...]

    def __post_init__(self) -> None:
        keys = [o.key for o in self.offerings]
        if len(set(keys)) != len(keys):
            raise InvalidInputError("duplicate offering keys")
        known = set(keys)
        for job in self.jobs:
            for c in job.configs:
                if c.offering not in known:
                    raise InvalidInputError(f"{job.job_id}: unknown offering {c.offering!r}")


@dataclass(frozen=True)
class FloorResult:
    """The two floors (USD), and each split per job and per application; ``status``: HiGHS's
    message for (b); ``slot_s``: the slot length (b) used; ``variables``: its size."""

    no_limit_usd: float
    at_deadline_usd: float
    no_limit_by_job: Mapping[str, float] = field(default_factory=dict)
    at_deadline_by_job: Mapping[str, float] = field(default_factory=dict)
    application_of: Mapping[str, str] = field(default_factory=dict)
    status: str = ""
    slot_s: float = 0.0
    variables: int = 0

    def by_application(self) -> dict[str, dict[str, float]]:
        """Application -> ``{"floor_usd": (a), "floor_at_jct_usd": (b)}``, summed over its
        jobs."""
        out: dict[str, dict[str, float]] = {}
        for job, app in self.application_of.items():
            mine = out.setdefault(app, {"floor_usd": 0.0, "floor_at_jct_usd": 0.0})
            mine["floor_usd"] += self.no_limit_by_job.get(job, 0.0)
            mine["floor_at_jct_usd"] += self.at_deadline_by_job.get(job, 0.0)
        return out


def _min_price_per_gpu_s(o: FloorOffering, t0_s: float, t1_s: float) -> float | None:
    """The least price per GPU-second of ``o`` at a moment of ``[t0_s, t1_s)`` with capacity
    above zero; ``None`` when it has none there."""
    cap_pieces = [(t0_s, t1_s, 1.0)] if o.capacity is None else o.capacity.pieces(t0_s, t1_s)
    best: float | None = None
    for a, b, cap in cap_pieces:
        if cap <= 0:
            continue
        for _, _, price in o.price_usd_per_hour.pieces(a, b):
            best = price if best is None else min(best, price)
    return None if best is None else best / 3600.0 / o.gpus_per_instance


def _capacity_gpu_s(o: FloorOffering, t0_s: float, t1_s: float) -> float | None:
    if o.capacity is None:
        return None
    return sum((b - a) * cap for a, b, cap in o.capacity.pieces(t0_s, t1_s)) * o.gpus_per_instance


def _kept(configs: Sequence[FloorConfig], k: int) -> list[FloorConfig]:
    """Per offering, the configurations on its hull (:func:`_hull`) in segment ``k``."""
    by_offering: dict[str, list[FloorConfig]] = {}
    for c in configs:
        by_offering.setdefault(c.offering, []).append(c)
    return [c for key in sorted(by_offering) for c in _hull(by_offering[key], k)]


def _hull(configs: Sequence[FloorConfig], k: int) -> list[FloorConfig]:
    """The configurations (of one offering) on the upper concave hull of ``(gpus, goodput in
    segment k)`` with the origin, up to the best goodput (the rest are dominated: see the
    module docstring)."""
    points: dict[int, FloorConfig] = {}
    for c in configs:
        if c.goodput[k] > 0 and (c.gpus not in points or c.goodput[k] > points[c.gpus].goodput[k]):
            points[c.gpus] = c
    hull: list[tuple[float, float, FloorConfig | None]] = [(0.0, 0.0, None)]
    best = 0.0
    for g in sorted(points):
        r = points[g].goodput[k]
        if r <= best:
            continue  # more GPUs for no more goodput
        best = r
        while len(hull) >= 2:
            (x1, y1, _), (x2, y2, _) = hull[-2], hull[-1]
            if (x2 - x1) * (r - y1) - (y2 - y1) * (g - x1) >= 0:  # hull[-1] under the chord
                hull.pop()
            else:
                break
        hull.append((float(g), r, points[g]))
    return [c for _, _, c in hull if c is not None]


def _no_limit(problem: FloorProblem) -> dict[str, float]:
    by_key = {o.key: o for o in problem.offerings}
    price: dict[tuple[str, str], float | None] = {}
    out: dict[str, float] = {}
    for job in problem.jobs:
        total = 0.0
        for k, work in enumerate(job.work):
            if work <= 0:
                continue
            best: float | None = None
            for c in job.configs:
                if c.goodput[k] <= 0:
                    continue
                key = (job.job_id, c.offering)
                if key not in price:
                    price[key] = _min_price_per_gpu_s(by_key[c.offering], job.arrival_s, math.inf)
                p = price[key]
                if p is None:
                    continue
                usd = p * c.gpus / c.goodput[k]
                best = usd if best is None else min(best, usd)
            if best is None:
                raise FloorError(f"{job.job_id}: no configuration can do segment {k}")
            total += best * work
        out[job.job_id] = total
    return out


def cost_floor(problem: FloorProblem, *, slot_s: float = 300.0) -> FloorResult:
    """Floors (a) and (b) of ``problem`` (see the module docstring). Jobs without a
    ``finish_by_s`` have no deadline in (b) (their window ends with the last finish-by, or
    their arrival, plus a week). ``slot_s`` is lengthened (doubled) while the program would
    have more than :data:`MAX_VARIABLES` variables. Raises :class:`FloorError` when (b) is
    infeasible (a job cannot do its work by its finish-by time at any price) or HiGHS fails."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    if not (math.isfinite(slot_s) and slot_s > 0):
        raise InvalidInputError(f"slot_s must be finite and > 0, got {slot_s!r}", field="slot_s")
    no_limit = _no_limit(problem)
    by_key = {o.key: o for o in problem.offerings}
    ends = [j.finish_by_s for j in problem.jobs if j.finish_by_s is not None]
    default_end = max(ends + [j.arrival_s for j in problem.jobs] + [0.0]) + 7 * 86400.0
    hulls = {
        j.job_id: [_kept(j.configs, k) if w > 0 else [] for k, w in enumerate(j.work)]
        for j in problem.jobs
    }

    def windows(slot: float) -> dict[str, list[tuple[int, float, float]]]:
        out = {}
        for j in problem.jobs:
            t0 = j.arrival_s
            t1 = default_end if j.finish_by_s is None else j.finish_by_s
            first, last = math.floor(t0 / slot), math.ceil(t1 / slot)
            out[j.job_id] = [
                (t, max(t0, t * slot), min(t1, (t + 1) * slot))
                for t in range(first, max(first + 1, last))
                if min(t1, (t + 1) * slot) > max(t0, t * slot)
            ]
        return out

    while True:
        win = windows(slot_s)
        size = sum(len(win[j.job_id]) * sum(len(h) for h in hulls[j.job_id]) for j in problem.jobs)
        if size <= MAX_VARIABLES:
            break
        slot_s *= 2.0

    cost: list[float] = []
    owner: list[int] = []
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    # Rows: first each (job, segment)'s work (-goodput-seconds <= -work), then each job's
    # seconds per slot, then each (spot offering, slot)'s capacity, created on first use.
    rhs: list[float] = [-w for j in problem.jobs for w in j.work]
    work_row = np.cumsum([0] + [len(j.work) for j in problem.jobs]).tolist()
    cap_row: dict[tuple[str, int], int] = {}
    price_cache: dict[tuple[str, float, float], float | None] = {}
    for ji, job in enumerate(problem.jobs):
        for t, a, b in win[job.job_id]:
            time_row = len(rhs)
            rhs.append(b - a)  # seconds in the slot inside the window
            for k, hull in enumerate(hulls[job.job_id]):
                for c in hull:
                    o = by_key[c.offering]
                    pkey = (o.key, a, b)
                    if pkey not in price_cache:
                        price_cache[pkey] = _min_price_per_gpu_s(o, a, b)
                    p = price_cache[pkey]
                    if p is None:
                        continue
                    var = len(cost)
                    cost.append(p * c.gpus)
                    owner.append(ji)
                    rows += [work_row[ji] + k, time_row]
                    cols += [var, var]
                    vals += [-c.goodput[k], 1.0]
                    if o.capacity is not None:
                        ck = (o.key, t)
                        if ck not in cap_row:
                            cap_row[ck] = len(rhs)
                            rhs.append(_capacity_gpu_s(o, t * slot_s, (t + 1) * slot_s) or 0.0)
                        rows.append(cap_row[ck])
                        cols.append(var)
                        vals.append(float(c.gpus))
    n_vars = len(cost)
    if n_vars == 0:
        if any(sum(j.work) > 0 for j in problem.jobs):
            raise FloorError("no job can run anywhere in its window")
        return FloorResult(
            0.0,
            0.0,
            no_limit,
            {j.job_id: 0.0 for j in problem.jobs},
            {j.job_id: j.application for j in problem.jobs},
            "empty",
            slot_s,
            0,
        )
    a_ub = csr_matrix((vals, (rows, cols)), shape=(len(rhs), n_vars))
    res = linprog(
        np.asarray(cost),
        A_ub=a_ub,
        b_ub=np.asarray(rhs),
        bounds=(0, None),
        method="highs",
    )
    if res.status != 0:
        raise FloorError(f"the floor's linear program: {res.message}")
    x = np.asarray(res.x)
    spent = x * np.asarray(cost)
    by_job: dict[str, float] = {j.job_id: 0.0 for j in problem.jobs}
    sums = np.bincount(np.asarray(owner), weights=spent, minlength=len(problem.jobs))
    for ji, job in enumerate(problem.jobs):
        by_job[job.job_id] = float(sums[ji])
    no_limit_usd = float(sum(no_limit.values()))
    return FloorResult(
        no_limit_usd=no_limit_usd,
        # (b) >= (a) exactly (see the module docstring); HiGHS's optimum can fall below (a)
        # by its tolerance when the deadlines bind nothing.
        at_deadline_usd=max(float(res.fun), no_limit_usd),
        no_limit_by_job=no_limit,
        at_deadline_by_job=by_job,
        application_of={j.job_id: j.application for j in problem.jobs},
        status=str(res.message),
        slot_s=slot_s,
        variables=n_vars,
    )


def floor_summary(
    floor: FloorResult,
    cost_usd: float,
    cost_by_job: Mapping[str, float],
    *,
    offerings: Sequence[str] = (),
) -> dict[str, object]:
    """A run's floors next to its bill, JSON-ready: ``floor_usd`` (a), ``floor_at_jct_usd``
    (b), ``cost_usd``, ``cost_over_floor`` (cost / (b); ``None`` when (b) is zero), the
    ``slot_s`` of (b), the ``offerings`` the floor could buy from, and ``per_application``:
    the same per application, its cost the USD attributed to its jobs (``cost_by_job``; the
    run's idle cost is in no application)."""
    per_app: dict[str, dict[str, float | None]] = {}
    for app, f in floor.by_application().items():
        jobs = [j for j, a in floor.application_of.items() if a == app]
        cost = float(sum(cost_by_job.get(j, 0.0) for j in jobs))
        per_app[app] = {
            **f,
            "cost_usd": cost,
            "cost_over_floor": _ratio(cost, f["floor_at_jct_usd"]),
        }
    return {
        "floor_usd": floor.no_limit_usd,
        "floor_at_jct_usd": floor.at_deadline_usd,
        "cost_usd": float(cost_usd),
        "cost_over_floor": _ratio(cost_usd, floor.at_deadline_usd),
        "slot_s": floor.slot_s,
        "offerings": list(offerings),
        "per_application": per_app,
    }


def _ratio(cost_usd: float, floor_usd: float) -> float | None:
    return float(cost_usd) / floor_usd if floor_usd > 0 else None
