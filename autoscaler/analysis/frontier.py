"""Cost-time frontiers: what each fleet costs at the mean JCT a user wants.

Pure: points in, checks out; no simulation, no I/O.

A fleet strategy run at several settings of its trade-off knob (``SizingConfig.min_efficiency``)
gives one :class:`FrontierPoint` per setting: the cost of a workload set and its mean JCT. Its
*frontier* (:func:`pareto`) keeps the points no other point of the same fleet beats on both
(cost and mean JCT no higher, one lower): a user picking a knob for a speed never wants a
dominated one. Between two frontier points the cost at a mean JCT is linear
(:func:`cost_at`); outside the frontier's mean-JCT range it is undefined.

:func:`check_frontiers` compares a *reference* fleet (one that may choose among every GPU type)
with the others (each restricted to one type) in three conditions, the acceptance of E3 on
frontiers:

- ``dominance``: every point of each other fleet whose mean JCT lies within the reference's
  frontier range costs more than the reference's frontier there (strictly);
- ``reach``: the reference's frontier reaches a lower mean JCT than every other fleet's (with a
  ``tolerance``: its fastest point's mean JCT at most ``1 + tolerance`` times each other's);
- ``cheapest``: the reference's cheapest point costs no more than any other fleet's cheapest (with
  a ``tolerance``: at most ``1 + tolerance`` times it).

E3's acceptance takes the ends within :data:`END_TOLERANCE`.

**Sweeping a knob to the ends.** A fleet's frontier is only as wide as the knob settings run. The
sweep (:func:`next_knob`, :func:`sweep_ends`, :func:`sweep`) starts from a coarse grid
(:class:`SweepSpec`) and extends toward each end of the knob's valid range until the two
outermost points at that end differ by less than ``tolerance`` in that end's own axis: mean JCT
at the *fast* end (the lowest knob: the least efficiency demanded of a purchase), cost at the
*cheap* end (the highest knob). Toward the lower bound each step moves the knob to ``shrink``
of its distance from the bound (onto the bound once that distance is at most ``min_step``);
toward the upper bound each step multiplies the distance from the lower bound by ``grow``
(capped at the upper bound). An end is ``"flat"`` when its two outermost points differ by less
than ``tolerance``; ``"range"`` when its outermost point sits on the knob's bound and they still
differ (the knob can go no further: what remains is another knob's, or none's); ``"stopped"``
when the runs ran out (``max_runs``, or an explicit grid's last knob) before either; ``"open"``
while the sweep may still extend it. The sweep is a pure function of the points run so far: the
caller runs the knob it names and asks again.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from autoscaler.errors import InvalidInputError

__all__ = [
    "END_TOLERANCE",
    "EndState",
    "FrontierPoint",
    "SweepSpec",
    "check_frontiers",
    "cost_at",
    "dominated",
    "next_knob",
    "pareto",
    "points_from_json",
    "sweep",
    "sweep_ends",
]

END_TOLERANCE = 0.02
"""E3's acceptance on the ends: the reference's fastest point's mean JCT and its cheapest point's
cost within 2% of the best single-type fleet's."""


@dataclass(frozen=True)
class FrontierPoint:
    """One run of a fleet: its knob setting, the total cost (USD) and the mean JCT (s)."""

    knob: float
    cost_usd: float
    mean_jct_s: float

    def __post_init__(self) -> None:
        for name in ("knob", "cost_usd", "mean_jct_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidInputError(f"{name} must be a number, got {value!r}", field=name)
            if not math.isfinite(value) or value < 0:
                raise InvalidInputError(f"{name} must be finite and >= 0, got {value}", field=name)

    def to_json(self) -> dict[str, float]:
        return {"knob": self.knob, "cost_usd": self.cost_usd, "mean_jct_s": self.mean_jct_s}


def points_from_json(data: object, where: str = "frontier") -> list[FrontierPoint]:
    """A list of ``{"knob", "cost_usd", "mean_jct_s"}`` objects (extra keys ignored) as points;
    :class:`~autoscaler.errors.InvalidInputError` naming the path when malformed."""
    if not isinstance(data, list) or not data:
        raise InvalidInputError(f"{where}: expected a non-empty list of points", field=where)
    if len(data) > 1000:
        raise InvalidInputError(f"{where}: more than 1000 points", field=where)
    out = []
    for n, item in enumerate(data):
        if not isinstance(item, Mapping):
            raise InvalidInputError(f"{where}[{n}]: expected an object", field=f"{where}[{n}]")
        missing = [k for k in ("knob", "cost_usd", "mean_jct_s") if k not in item]
        if missing:
            raise InvalidInputError(
                f"{where}[{n}]: missing {', '.join(missing)}", field=f"{where}[{n}]"
            )
        try:
            out.append(FrontierPoint(item["knob"], item["cost_usd"], item["mean_jct_s"]))
        except InvalidInputError as e:
            raise InvalidInputError(f"{where}[{n}]: {e}", field=f"{where}[{n}].{e.field}") from None
    return out


def pareto(points: Sequence[FrontierPoint]) -> list[FrontierPoint]:
    """The points no other point dominates (cost and mean JCT no higher, one of them lower),
    by mean JCT ascending (so cost descending); of equal points, the first kept."""
    ordered = sorted(points, key=lambda p: (p.mean_jct_s, p.cost_usd))
    out: list[FrontierPoint] = []
    for p in ordered:
        if out and p.cost_usd >= out[-1].cost_usd:
            continue  # as slow or slower, and no cheaper than a kept point
        out.append(p)
    return out


def dominated(points: Sequence[FrontierPoint]) -> list[FrontierPoint]:
    """The points another point dominates (cost and mean JCT no higher, one of them lower), by
    mean JCT then knob; a point equal to another is not dominated by it."""

    def beats(q: FrontierPoint, p: FrontierPoint) -> bool:
        no_worse = q.cost_usd <= p.cost_usd and q.mean_jct_s <= p.mean_jct_s
        return no_worse and (q.cost_usd < p.cost_usd or q.mean_jct_s < p.mean_jct_s)

    out = [p for p in points if any(beats(q, p) for q in points)]
    return sorted(out, key=lambda p: (p.mean_jct_s, p.knob))


def cost_at(points: Sequence[FrontierPoint], mean_jct_s: float) -> float | None:
    """The cost of the frontier of ``points`` (:func:`pareto`) at ``mean_jct_s``, linear between
    its points; ``None`` outside its mean-JCT range."""
    front = pareto(points)
    if not front or not front[0].mean_jct_s <= mean_jct_s <= front[-1].mean_jct_s:
        return None
    for a, b in itertools.pairwise(front):
        if a.mean_jct_s <= mean_jct_s <= b.mean_jct_s:
            span = b.mean_jct_s - a.mean_jct_s
            if span <= 0:
                return min(a.cost_usd, b.cost_usd)
            w = (mean_jct_s - a.mean_jct_s) / span
            return a.cost_usd + w * (b.cost_usd - a.cost_usd)
    return front[0].cost_usd  # a single point, at its own JCT


def check_frontiers(
    frontiers: Mapping[str, Sequence[FrontierPoint]], reference: str, tolerance: float = 0.0
) -> dict[str, object]:
    """The three conditions of the module docstring, ``reference`` against every other fleet
    of ``frontiers``, as JSON-ready data::

        {"reference": str, "range_s": [lo, hi], "tolerance": float,
         "dominance": {fleet: {"holds": bool, "points": [{"knob", "mean_jct_s", "cost_usd",
                        "reference_cost_usd", "cost_ratio"}]}},   # points within the range
         "reach": {fleet: {"holds": bool, "reference_min_jct_s", "min_jct_s", "jct_ratio"}},
         "cheapest": {fleet: {"holds": bool, "reference_min_cost_usd", "min_cost_usd",
                      "cost_ratio"}},
         "holds": {"dominance": bool, "reach": bool, "cheapest": bool, "all": bool}}

    ``cost_ratio`` is the reference's cost over the point's (below 1: the reference is
    cheaper; ``None`` for a point of zero cost); ``jct_ratio`` the reference's fastest mean JCT
    over the fleet's (``None`` for zero). ``tolerance`` (``>= 0``) eases ``reach`` and
    ``cheapest`` (module docstring); at 0 ``reach`` is strict. Raises
    :class:`~autoscaler.errors.InvalidInputError` when ``reference`` has no points, there is
    no other fleet, or ``tolerance`` is negative or not finite."""
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise InvalidInputError(f"tolerance must be >= 0, got {tolerance}", field="tolerance")
    if not frontiers.get(reference):
        raise InvalidInputError(f"no frontier for the reference {reference!r}", field="reference")
    others = [name for name in frontiers if name != reference and frontiers[name]]
    if not others:
        raise InvalidInputError("no other fleet to compare with", field="frontiers")
    ref = frontiers[reference]
    front = pareto(ref)
    lo, hi = front[0].mean_jct_s, front[-1].mean_jct_s
    ref_min_jct = front[0].mean_jct_s
    ref_min_cost = min(p.cost_usd for p in ref)
    dominance: dict[str, object] = {}
    reach: dict[str, object] = {}
    cheapest: dict[str, object] = {}
    for name in others:
        pts = sorted(frontiers[name], key=lambda p: p.mean_jct_s)
        checked = []
        for p in pts:
            c = cost_at(ref, p.mean_jct_s)
            if c is None:
                continue
            checked.append(
                {
                    "knob": p.knob,
                    "mean_jct_s": p.mean_jct_s,
                    "cost_usd": p.cost_usd,
                    "reference_cost_usd": c,
                    "cost_ratio": c / p.cost_usd if p.cost_usd > 0 else None,
                    "holds": c < p.cost_usd,
                }
            )
        dominance[name] = {"holds": all(bool(x["holds"]) for x in checked), "points": checked}
        min_jct = min(p.mean_jct_s for p in pts)
        reach[name] = {
            "holds": (
                ref_min_jct < min_jct
                if tolerance == 0
                else ref_min_jct <= min_jct * (1 + tolerance)
            ),
            "reference_min_jct_s": ref_min_jct,
            "min_jct_s": min_jct,
            "jct_ratio": ref_min_jct / min_jct if min_jct > 0 else None,
        }
        min_cost = min(p.cost_usd for p in pts)
        cheapest[name] = {
            "holds": ref_min_cost <= min_cost * (1 + tolerance),
            "reference_min_cost_usd": ref_min_cost,
            "min_cost_usd": min_cost,
            "cost_ratio": ref_min_cost / min_cost if min_cost > 0 else None,
        }

    def every(part: dict[str, object]) -> bool:
        return all(bool(v["holds"]) for v in part.values())  # type: ignore[index]

    holds = {"dominance": every(dominance), "reach": every(reach), "cheapest": every(cheapest)}
    holds["all"] = all(holds.values())
    return {
        "reference": reference,
        "range_s": [lo, hi],
        "tolerance": tolerance,
        "dominance": dominance,
        "reach": reach,
        "cheapest": cheapest,
        "holds": holds,
    }


# ---- sweeping the knob to the ends ------------------------------------------------------------

End = Literal["fast", "cheap"]
EndStatus = Literal["open", "flat", "range", "stopped"]


@dataclass(frozen=True)
class SweepSpec:
    """How :func:`next_knob` sweeps one fleet's knob (module docstring). ``grid``: the coarse
    knobs run first (ascending, distinct, within ``[knob_min, knob_max]``); ``tolerance``: the
    relative difference below which an end is flat; ``max_runs``: the most knobs run (at least
    the grid's). The defaults are ``benchmarks/cloud_cost.py --frontier auto``'s for
    ``SizingConfig.min_efficiency``, valid in ``[0, inf)``: its lower bound is 0 (buy while a
    purchase gains anything, up to ``max_instances``, the budget or the offering's capacity);
    an efficiency is a share of perfect scaling, so a knob far above 1 lets the sizing buy only
    what starts a waiting job, and 10 stands for the upper end."""

    grid: tuple[float, ...] = (0.15, 0.5, 0.85)
    knob_min: float = 0.0
    knob_max: float = 10.0
    tolerance: float = 0.01
    shrink: float = 0.25
    grow: float = 2.0
    min_step: float = 0.04
    max_runs: int = 8

    def __post_init__(self) -> None:
        for name in ("knob_min", "knob_max", "tolerance", "shrink", "grow", "min_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidInputError(f"{name} must be a number, got {value!r}", field=name)
            if not math.isfinite(value):
                raise InvalidInputError(f"{name} must be finite, got {value}", field=name)
        if not 0 <= self.knob_min < self.knob_max:
            raise InvalidInputError("need 0 <= knob_min < knob_max", field="knob_max")
        if not 0 < self.tolerance < 1:
            raise InvalidInputError("tolerance must be in (0, 1)", field="tolerance")
        if not 0 < self.shrink < 1:
            raise InvalidInputError("shrink must be in (0, 1)", field="shrink")
        if not self.grow > 1:
            raise InvalidInputError("grow must be > 1", field="grow")
        if not self.min_step > 0:
            raise InvalidInputError("min_step must be > 0", field="min_step")
        grid = self.grid
        if (
            len(grid) < 2
            or any(not isinstance(k, int | float) or isinstance(k, bool) for k in grid)
            or any(not self.knob_min <= k <= self.knob_max for k in grid)
            or any(a >= b for a, b in itertools.pairwise(grid))
        ):
            raise InvalidInputError(
                f"grid must be 2 or more ascending knobs in [{self.knob_min:g}, "
                f"{self.knob_max:g}], got {grid!r}",
                field="grid",
            )
        if isinstance(self.max_runs, bool) or not isinstance(self.max_runs, int):
            raise InvalidInputError("max_runs must be an integer", field="max_runs")
        if not len(grid) <= self.max_runs <= 1000:
            raise InvalidInputError(
                f"max_runs must be {len(grid)} (the grid's knobs) to 1000, got {self.max_runs}",
                field="max_runs",
            )

    def to_json(self) -> dict[str, object]:
        return {
            "grid": list(self.grid),
            "knob_min": self.knob_min,
            "knob_max": self.knob_max,
            "tolerance": self.tolerance,
            "shrink": self.shrink,
            "grow": self.grow,
            "min_step": self.min_step,
            "max_runs": self.max_runs,
        }


@dataclass(frozen=True)
class EndState:
    """One end of a fleet's sweep: its status (module docstring), its two outermost knobs
    (outermost first) and their relative difference in the end's axis (``axis``: ``mean_jct_s``
    at the fast end, ``cost_usd`` at the cheap end; ``None`` before two points)."""

    end: End
    status: EndStatus
    axis: str
    knobs: tuple[float, ...]
    change: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "status": self.status,
            "axis": self.axis,
            "knobs": list(self.knobs),
            "change": self.change,
        }


def _relative_change(a: float, b: float) -> float:
    """``|a - b|`` over the smaller of the two (0 for two zeros, ``inf`` for a zero and not)."""
    low = min(a, b)
    if a == b:
        return 0.0
    return abs(a - b) / low if low > 0 else math.inf


def _extension(end: End, outer: float, spec: SweepSpec) -> float | None:
    """The next knob beyond ``outer`` toward ``end``'s bound; ``None`` on the bound."""
    if end == "fast":
        gap = outer - spec.knob_min
        if gap <= 0:
            return None
        return spec.knob_min if gap <= spec.min_step else spec.knob_min + gap * spec.shrink
    if outer >= spec.knob_max:
        return None
    return min(spec.knob_max, spec.knob_min + max(outer - spec.knob_min, spec.min_step) * spec.grow)


def _end(points: Sequence[FrontierPoint], end: End, spec: SweepSpec) -> EndState:
    axis = "mean_jct_s" if end == "fast" else "cost_usd"
    by_knob: dict[float, FrontierPoint] = {}
    for p in points:
        by_knob.setdefault(p.knob, p)
    knobs = sorted(by_knob, reverse=end == "cheap")
    if len(knobs) < 2:
        return EndState(end, "open", axis, tuple(knobs), None)
    outer, inner = by_knob[knobs[0]], by_knob[knobs[1]]
    change = _relative_change(getattr(outer, axis), getattr(inner, axis))
    status: EndStatus
    if change < spec.tolerance:
        status = "flat"
    elif _extension(end, outer.knob, spec) is None:
        status = "range"
    elif len(by_knob) >= spec.max_runs and all(k in by_knob for k in spec.grid):
        status = "stopped"
    else:
        status = "open"
    return EndState(end, status, axis, (outer.knob, inner.knob), change)


def sweep_ends(points: Sequence[FrontierPoint], spec: SweepSpec) -> dict[End, EndState]:
    """Both ends of one fleet's points (knob, cost, mean JCT; the first of equal knobs kept)
    as :class:`EndState`, ``{"fast": ..., "cheap": ...}``."""
    return {"fast": _end(points, "fast", spec), "cheap": _end(points, "cheap", spec)}


def next_knob(points: Sequence[FrontierPoint], spec: SweepSpec) -> float | None:
    """The knob to run next for a fleet whose runs so far gave ``points``; ``None`` when both
    ends are settled (flat, on the knob's bound) or ``spec.max_runs`` knobs have run. The grid's
    knobs first, in order; then an extension of the open end with fewer knobs beyond the grid
    (the fast end on a tie), so that a cap on runs shares them between the ends."""
    done = {p.knob for p in points}
    for k in spec.grid:
        if k not in done:
            return k
    if len(done) >= spec.max_runs:
        return None
    ends = sweep_ends(points, spec)
    beyond = {
        "fast": sum(1 for k in done if k < spec.grid[0]),
        "cheap": sum(1 for k in done if k > spec.grid[-1]),
    }
    open_ends = sorted(
        (e for e in ("fast", "cheap") if ends[e].status == "open"),  # type: ignore[index]
        key=lambda e: (beyond[e], e != "fast"),
    )
    for end in open_ends:
        knob = _extension(end, ends[end].knobs[0], spec)  # type: ignore[arg-type,index]
        if knob is not None and knob not in done:
            return knob
    return None


def sweep(
    run: Callable[[float], FrontierPoint], spec: SweepSpec
) -> tuple[list[FrontierPoint], dict[End, EndState]]:
    """Run ``run(knob)`` at each knob :func:`next_knob` names until it names none; the points
    by knob, and :func:`sweep_ends` of them. ``run`` must return a point of the knob it was
    given."""
    points: list[FrontierPoint] = []
    while (knob := next_knob(points, spec)) is not None:
        point = run(knob)
        if point.knob != knob:
            raise InvalidInputError(
                f"run({knob}) returned a point of knob {point.knob}", field="knob"
            )
        points.append(point)
    return sorted(points, key=lambda p: p.knob), sweep_ends(points, spec)
