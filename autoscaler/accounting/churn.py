"""Churn as a measured cost: launches, boots billed, restarts, reversals, and idle by cause.

Pure: no I/O, no clock. :func:`autoscaler.accounting.billing.churn_from_store` reads what these
functions take from a controller's store (the instance and assignment histories); the cost
report and both simulator benchmarks call it, so every figure below has this one definition.

Idle by cause (:func:`idle_usd_by_cause`)
    The idle cost of a :class:`~autoscaler.accounting.costs.CostRecord` (what no job held:
    :func:`~autoscaler.accounting.costs.idle_cost_usd`) split, GPU-second by GPU-second, by the
    phase of its instance's life (:class:`InstancePhases`):

    * ``drain``: from the instance's drain decision (it entered ``draining``, for cost or for a
      spot notice, or went to ``terminating`` without draining) to its end;
    * ``boot``: before that, from its launch until a job was first placed on it (the store's
      assignment history: the store keeps an agent's last heartbeat, not its first, so the first
      placement marks the end of the boot); an instance no job ever held is ``boot`` until its
      drain decision;
    * ``empty_ready``: after its first job and before its drain decision, while it holds no job;
    * ``fragmentation``: the same span, while it holds a job but not all its GPUs (the free
      GPUs' share of its price);
    * ``minimum_billing``: each instance's minimum-billing shortfall (billed past its life).

    The causes sum to the record's idle cost (up to float rounding of the accumulation).

Reversals (:func:`placement_reversals`, :func:`batch_reversals`)
    A decision changed back within :data:`REVERSAL_ROUNDS` rounds: per job, a change of its GPU
    count (or of its global batch) whose direction is the opposite of the change before it, or a
    change of its set of instances back to the set it left, at most ``REVERSAL_ROUNDS *
    interval_s`` after that earlier change. Only placed states count (a stop is no state: a job
    stopped on 2 GPUs and resumed on 2 has not changed); one change back is one reversal, even
    when its GPU count and its instances both went back.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from autoscaler.accounting.costs import CostRecord

__all__ = [
    "IDLE_CAUSES",
    "REVERSAL_ROUNDS",
    "ChurnFigures",
    "InstancePhases",
    "batch_reversals",
    "idle_usd_by_cause",
    "placement_reversals",
    "sum_churn_json",
]

IDLE_CAUSES: Final = ("boot", "drain", "empty_ready", "fragmentation", "minimum_billing")
"""The causes idle cost is split into (see the module docstring), in the order reports show."""

REVERSAL_ROUNDS: Final = 5
"""A change undone within this many rounds of the change before it is a reversal."""

_S_PER_HOUR = 3600.0
_TOLERANCE_S = 1e-6


@dataclass(frozen=True)
class InstancePhases:
    """When an instance's idle changes cause, in the record's time base: ``first_job_s`` when
    a job was first placed on it (``None``: never), ``drain_s`` its drain decision (``None``:
    none; it ran to its end, was preempted without a notice, or the run ended first)."""

    first_job_s: float | None
    drain_s: float | None


def idle_usd_by_cause(record: CostRecord, phases: Mapping[str, InstancePhases]) -> dict[str, float]:
    """USD of ``record``'s idle cost per cause of :data:`IDLE_CAUSES` (every key present).
    ``phases`` by the record's instance ids; an instance missing from it has its first job
    read from its usages in the record and no drain decision."""
    usages: dict[str, list[tuple[float, float, int]]] = {}
    for job in record.jobs:
        for use in job.usages:
            usages.setdefault(use.instance_id, []).append((use.t0_s, use.t1_s, use.gpus))
    parts: dict[str, list[float]] = {cause: [] for cause in IDLE_CAUSES}
    for inst in record.instances:
        mine = usages.get(inst.instance_id, [])
        phase = phases.get(inst.instance_id)
        if phase is None:
            phase = InstancePhases(min((u[0] for u in mine), default=None), None)
        parts["minimum_billing"].append(inst.shortfall_usd)
        if inst.gpus <= 0:
            continue
        delta: dict[float, int] = {}
        for t0, t1, gpus in mine:
            delta[t0] = delta.get(t0, 0) + gpus
            delta[t1] = delta.get(t1, 0) - gpus
        marks = {inst.launched_s, inst.ended_s, *delta}
        marks.update(s.t0_s for s in inst.segments)
        for t in (phase.first_job_s, phase.drain_s):
            if t is not None:
                marks.add(min(max(t, inst.launched_s), inst.ended_s))
        times = sorted(t for t in marks if inst.launched_s <= t <= inst.ended_s)
        held = sum(g for t, g in delta.items() if t < inst.launched_s)
        seg = 0
        for a, b in itertools.pairwise(times):
            held += delta.get(a, 0)
            while seg + 1 < len(inst.segments) and inst.segments[seg + 1].t0_s <= a:
                seg += 1
            free = inst.gpus - min(max(held, 0), inst.gpus)
            if free == 0 or b <= a:
                continue
            usd = inst.segments[seg].usd_per_hour * (b - a) / _S_PER_HOUR * free / inst.gpus
            parts[_cause(a, phase, held)].append(usd)
    return {cause: math.fsum(values) for cause, values in parts.items()}


def _cause(t_s: float, phase: InstancePhases, held_gpus: int) -> str:
    """The cause of idle GPU-time starting at ``t_s`` (see the module docstring)."""
    if phase.drain_s is not None and t_s >= phase.drain_s - _TOLERANCE_S:
        return "drain"
    if phase.first_job_s is None or t_s < phase.first_job_s - _TOLERANCE_S:
        return "boot"
    return "fragmentation" if held_gpus > 0 else "empty_ready"


def _direction_reversals(states: Sequence[tuple[float, float]], horizon_s: float) -> int:
    """Changes of a number whose direction undoes the change before, within ``horizon_s``."""
    out = 0
    last: tuple[float, float] | None = None  # (time, signed step) of the previous change
    prev: float | None = None
    for at, value in states:
        if prev is not None and value != prev:
            step = value - prev
            if last is not None and last[1] * step < 0 and at - last[0] <= horizon_s + 1e-6:
                out += 1
            last = (at, step)
        prev = value
    return out


def batch_reversals(batches: Sequence[tuple[float, int]], horizon_s: float) -> int:
    """Reversals (see the module docstring) of one job's global batch, given as ``(at_s,
    global batch)`` in time order (each round's, or only its changes)."""
    return _direction_reversals([(t, float(b)) for t, b in batches], horizon_s)


def placement_reversals(
    placements: Sequence[tuple[float, Mapping[str, int]]], horizon_s: float
) -> tuple[int, int]:
    """``(gpu count reversals, instance reversals)`` of one job, from its placements (``at_s``
    and GPUs by instance, in time order; an empty one is a stop and is skipped). A change back
    that is both is counted once, as a GPU count reversal."""
    placed = [(t, dict(p)) for t, p in placements if p and sum(p.values()) > 0]
    gpu_out = inst_out = 0
    last_change: tuple[float, frozenset[str]] | None = None  # when, and the set it left
    last_step: tuple[float, int] | None = None
    prev: dict[str, int] | None = None
    for at, now in placed:
        if prev is None or now == prev:
            prev = now
            continue
        step = sum(now.values()) - sum(prev.values())
        keys, left = frozenset(now), frozenset(prev)
        count_back = (
            step != 0
            and last_step is not None
            and last_step[1] * step < 0
            and at - last_step[0] <= horizon_s + 1e-6
        )
        inst_back = (
            keys != left
            and last_change is not None
            and keys == last_change[1]
            and at - last_change[0] <= horizon_s + 1e-6
        )
        if count_back:
            gpu_out += 1
        elif inst_back:
            inst_out += 1
        if step != 0:
            last_step = (at, step)
        if keys != left:
            last_change = (at, left)
        prev = now
    return gpu_out, inst_out


@dataclass(frozen=True)
class ChurnFigures:
    """A run's churn (see the module docstring): ``launches`` (launch calls made: instance
    rows that were requested), ``boots_billed`` (instances that ran and were billed, each for
    its boot), ``jobs`` and their ``restarts`` (the store's count), ``reversals_by_kind``
    (``gpus``, ``instances``, ``batch``; ``batch`` is ``None`` where no batch history was
    given: a controller's store keeps only each job's latest batch) and
    ``idle_usd_by_cause`` (:func:`idle_usd_by_cause`)."""

    launches: int
    boots_billed: int
    jobs: int
    restarts: int
    reversals_by_kind: Mapping[str, int | None]
    idle_usd_by_cause: Mapping[str, float] = field(default_factory=dict)
    interval_s: float = 60.0

    @property
    def restarts_per_job(self) -> float:
        return self.restarts / self.jobs if self.jobs else 0.0

    @property
    def reversals(self) -> int:
        return sum(v for v in self.reversals_by_kind.values() if v is not None)

    @property
    def idle_usd(self) -> float:
        return math.fsum(self.idle_usd_by_cause.values())

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON (the benchmarks' keys)."""
        return {
            "launches": self.launches,
            "boots_billed": self.boots_billed,
            "jobs": self.jobs,
            "restarts": self.restarts,
            "restarts_per_job": self.restarts_per_job,
            "reversals": self.reversals,
            "reversals_by_kind": dict(self.reversals_by_kind),
            "reversal_horizon_s": REVERSAL_ROUNDS * self.interval_s,
            "idle_usd_by_cause": dict(self.idle_usd_by_cause),
        }


def sum_churn_json(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The churn JSON (:meth:`ChurnFigures.to_json`) of several runs together (the workloads of
    one strategy): counts and USD summed, ``restarts_per_job`` over all their jobs, a reversal
    kind ``None`` where any run has none."""
    rows = list(items)
    jobs = sum(int(r["jobs"]) for r in rows)
    restarts = sum(int(r["restarts"]) for r in rows)
    kinds: dict[str, int | None] = {}
    for r in rows:
        for kind, n in r["reversals_by_kind"].items():
            before = kinds.get(kind, 0)
            kinds[kind] = None if n is None or before is None else before + int(n)
    return {
        "launches": sum(int(r["launches"]) for r in rows),
        "boots_billed": sum(int(r["boots_billed"]) for r in rows),
        "jobs": jobs,
        "restarts": restarts,
        "restarts_per_job": restarts / jobs if jobs else 0.0,
        "reversals": sum(int(r["reversals"]) for r in rows),
        "reversals_by_kind": kinds,
        "idle_usd_by_cause": {
            c: math.fsum(float(r["idle_usd_by_cause"].get(c, 0.0)) for r in rows)
            for c in IDLE_CAUSES
        },
    }
