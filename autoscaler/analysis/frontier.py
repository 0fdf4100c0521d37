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
- ``reach``: the reference's frontier reaches a lower mean JCT than every other fleet's;
- ``cheapest``: the reference's cheapest point costs no more than any other fleet's cheapest.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autoscaler.errors import InvalidInputError

__all__ = [
    "FrontierPoint",
    "check_frontiers",
    "cost_at",
    "pareto",
    "points_from_json",
]


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
    frontiers: Mapping[str, Sequence[FrontierPoint]], reference: str
) -> dict[str, object]:
    """The three conditions of the module docstring, ``reference`` against every other fleet
    of ``frontiers``, as JSON-ready data::

        {"reference": str, "range_s": [lo, hi],
         "dominance": {fleet: {"holds": bool, "points": [{"knob", "mean_jct_s", "cost_usd",
                        "reference_cost_usd", "cost_ratio"}]}},   # points within the range
         "reach": {fleet: {"holds": bool, "reference_min_jct_s", "min_jct_s"}},
         "cheapest": {fleet: {"holds": bool, "reference_min_cost_usd", "min_cost_usd"}},
         "holds": {"dominance": bool, "reach": bool, "cheapest": bool, "all": bool}}

    ``cost_ratio`` is the reference's cost over the point's (below 1: the reference is
    cheaper; ``None`` for a point of zero cost). Raises
    :class:`~autoscaler.errors.InvalidInputError` when ``reference`` has no points or there is
    no other fleet."""
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
            "holds": ref_min_jct < min_jct,
            "reference_min_jct_s": ref_min_jct,
            "min_jct_s": min_jct,
        }
        min_cost = min(p.cost_usd for p in pts)
        cheapest[name] = {
            "holds": ref_min_cost <= min_cost,
            "reference_min_cost_usd": ref_min_cost,
            "min_cost_usd": min_cost,
        }

    def every(part: dict[str, object]) -> bool:
        return all(bool(v["holds"]) for v in part.values())  # type: ignore[index]

    holds = {"dominance": every(dominance), "reach": every(reach), "cheapest": every(cheapest)}
    holds["all"] = all(holds.values())
    return {
        "reference": reference,
        "range_s": [lo, hi],
        "dominance": dominance,
        "reach": reach,
        "cheapest": cheapest,
        "holds": holds,
    }
