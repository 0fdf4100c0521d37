"""What the cost floor (:mod:`autoscaler.analysis.floor`) needs from a simulated cloud run, from the
simulator's own truth.

:func:`floor_problem` turns a run (its jobs, its :class:`~autoscaler.sim.results.SimResult`)
into a :class:`~autoscaler.analysis.floor.FloorProblem`:

- **work**: each job's target progress (what the simulator's "done" rule waits for), split
  into ``segments`` ordered segments of whole epochs;
- **goodput**: per offering and GPU count ``g``, per segment, an upper envelope of the
  progress per second the simulator credits the job: the best, over every integer
  micro-batch the type holds (``min_local_bsz`` .. its ``max_local_bsz``) and every number of
  accumulation steps (total batch up to ``max_batch_size``, or one micro-batch per GPU), of
  the true AdaScale progress per real iteration at the best point of the segment (the
  simulator's progress curve, cell by cell: within a cell progress grows linearly in
  iterations, so no point of the segment does better) over the true iteration time (the
  engine's rule, no interference, no restart), on ``g`` GPUs packed onto the fewest
  instances of the offering or spread evenly over one or two more. Exact over those
  configurations (no sampling). ``g`` runs up to the most GPUs a policy gives a job
  (``max_batch_size // min_local_bsz``, or the job's own request if larger) and the most
  the offering ever has (its spot capacity). **Not covered**: other placements (spread
  wider, uneven, or over instances of several types: the controller packs, and a wider
  spread only adds cross-instance sync in the traces, but the interpolated trace model does
  not guarantee it; ``tests/sim/test_floor_run.py`` checks every rate a real run credits
  against the envelope). A job spanning GPU types runs at its slowest type's pace, at most
  the goodput of its placement on either type: the program matches it, at no more cost, by
  time-sharing the two types' configurations (where the envelope covers that placement);
- **offerings**: the run's own, or (``offerings=``) a whole menu, e.g. every offering of the
  run's experiment (:func:`~autoscaler.sim.experiments.experiment_menu`);
- **prices**: each offering's price as the bill saw it: sampled at every round's start (the
  world sets prices then) over the run;
- **capacity**: a spot offering's replayed availability trace (instances over time); an
  offering with a hazard model or on demand has no capacity limit (a hazard takes instances
  back, it never caps how many);
- **finish-by**: each job's completion time in the run.

The floor is computed from these numbers only (pure, outside the simulator).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

from autoscaler.accounting.costs import job_costs, summarize
from autoscaler.analysis.floor import (
    FloorConfig,
    FloorJob,
    FloorOffering,
    FloorProblem,
    StepSeries,
    cost_floor,
    floor_summary,
)
from autoscaler.model.gputypes import default_speed_table
from autoscaler.model.traces import AppTrace, even_placement, load_app
from autoscaler.sim.cloud_config import CloudOffering
from autoscaler.sim.cluster import NodeGroup, TypeSpeed
from autoscaler.sim.results import SimResult
from autoscaler.sim.workload import TraceJob

__all__ = ["DEFAULT_SEGMENTS", "floor_problem", "goodput_envelope", "run_floor"]

DEFAULT_SEGMENTS = 8
"""Segments of work per job (more: a tighter floor, a larger program)."""

_M_CHUNK = 256


def _segment_cells(app: AppTrace, segments: int) -> list[tuple[int, int]]:
    """``[(first cell, end cell)]`` of each segment on the progress grid (whole epochs)."""
    grid = app.progress_curve(app.init_batch_size).progress_grid
    cells = len(grid) - 1
    per_epoch = max(1, cells // max(1, app.max_epochs))
    epochs = math.ceil(cells / per_epoch)
    k = max(1, min(segments, epochs))
    bounds = [min(cells, round(epochs * i / k) * per_epoch) for i in range(k + 1)]
    bounds[-1] = cells
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


@functools.lru_cache(maxsize=32)
def _progress_rate(
    app_name: str, traces_root: str | None, segments: int, max_batch: int
) -> tuple[tuple[float, ...], np.ndarray]:
    """(work per segment, ``rate[k, M]``): the most progress one real iteration at total batch
    ``M`` makes anywhere in segment ``k`` (``M`` = 0 .. ``max_batch``; row 0 unused), cell by
    cell as the simulator's :class:`~autoscaler.model.traces.ProgressCurve` credits it."""
    from pathlib import Path

    app = load_app(app_name, traces_dir=Path(traces_root) if traces_root else None)
    grid = app.progress_curve(app.init_batch_size).progress_grid
    cells = _segment_cells(app, segments)
    work = tuple(float(grid[b] - grid[a]) for a, b in cells)
    starts = np.array([a for a, _ in cells])
    rate = np.zeros((len(cells), max_batch + 1))
    for lo in range(1, max_batch + 1, _M_CHUNK):
        ms = np.arange(lo, min(max_batch, lo + _M_CHUNK - 1) + 1, dtype=float)
        inv = 1.0 / app.gain(grid[:, None], ms[None, :])  # (points, M)
        per_cell = 2.0 / (inv[1:] + inv[:-1])  # progress per iteration in each cell
        rate[:, lo : lo + len(ms)] = np.maximum.reduceat(per_cell, starts, axis=0)
    return work, rate


def _placements(g: int, per_node: int) -> list[tuple[int, ...]]:
    """The placements of ``g`` GPUs the envelope looks at: packed onto the fewest instances
    of ``per_node`` GPUs (what the controller's placement does), and spread evenly over one
    and two more instances."""
    fewest = math.ceil(g / per_node)
    return [even_placement(n, g) for n in range(fewest, min(g, fewest + 2) + 1)]


def _pairs(lo: int, hi: int, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Every ``(micro-batch b, accumulation steps a)`` with ``lo <= b <= hi``, ``a >= 1`` and
    ``b * a <= cap`` (``cap >= lo``), as two flat integer arrays."""
    bs = np.arange(lo, hi + 1)
    counts = cap // bs
    b = np.repeat(bs, counts)
    first = np.cumsum(counts) - counts  # index where each b's run starts
    a = np.arange(len(b)) - np.repeat(first, counts) + 1
    return b, a


def goodput_envelope(
    app: AppTrace,
    group: NodeGroup,
    *,
    max_gpus: int,
    segments: int = DEFAULT_SEGMENTS,
    traces_root: str | None = None,
) -> tuple[tuple[float, ...], dict[int, tuple[float, ...]]]:
    """(work per segment, ``{g: best progress per second in each segment}``) of ``app`` on
    ``group``'s instances, for ``g`` = 1 .. ``max_gpus`` (see the module docstring).

    Exact over its configurations: every integer micro-batch ``b`` from ``min_local_bsz`` to
    the type's ``max_local_bsz`` and every number of accumulation steps ``a`` with total batch
    ``g * b * a`` up to ``max(max_batch_size, g * min_local_bsz)``, each at the simulator's
    own true iteration time (:meth:`~autoscaler.sim.cluster.TypeSpeed.step_times_s`, the
    engine's accumulation rule) and the best progress per iteration its total batch makes in
    the segment (:func:`_progress_rate`); the best over the placements of :func:`_placements`."""
    speed = _type_speed(app.name, group, traces_root)
    lo = app.min_local_bsz
    top_local = max(lo, speed.max_local_bsz)
    max_batch = max(app.max_batch_size, max_gpus * lo)
    work, rate = _progress_rate(app.name, traces_root, segments, max_batch)
    out: dict[int, tuple[float, ...]] = {}
    for g in range(1, max_gpus + 1):
        per_gpu = max(app.max_batch_size, g * lo) // g  # b * a at most
        b, a = _pairs(lo, min(top_local, per_gpu), per_gpu)
        bs = np.arange(lo, min(top_local, per_gpu) + 1)
        best = np.zeros(len(work))
        for placement in _placements(g, group.gpus_per_node):
            step, sync = speed.step_times_s(placement, bs.astype(float))
            i = b - lo
            t = step[i] + (a - 1) * (step[i] - sync[i])
            best = np.maximum(best, (rate[:, g * b * a] / t[None, :]).max(axis=1))
        out[g] = tuple(float(v) for v in best)
    return work, out


@functools.lru_cache(maxsize=64)
def _type_speed(app_name: str, group: NodeGroup, traces_root: str | None) -> TypeSpeed:
    from pathlib import Path

    root = Path(traces_root) if traces_root else None
    return TypeSpeed(load_app(app_name, traces_dir=root), group, default_speed_table(), root)


@functools.lru_cache(maxsize=256)
def _envelope_cached(
    app_name: str,
    group: NodeGroup,
    max_gpus: int,
    segments: int,
    traces_root: str | None,
) -> tuple[tuple[float, ...], dict[int, tuple[float, ...]]]:
    from pathlib import Path

    app = load_app(app_name, traces_dir=Path(traces_root) if traces_root else None)
    return goodput_envelope(
        app,
        group,
        max_gpus=max_gpus,
        segments=segments,
        traces_root=traces_root,
    )


def _price_series(o: CloudOffering, end_s: float, interval_s: float) -> StepSeries:
    """The price the bill used: sampled at every round's start, merged where it repeats."""
    times, values = [0.0], [o.price.price_at(0.0)]
    for i in range(1, math.ceil(end_s / interval_s) + 1):
        p = o.price.price_at(i * interval_s)
        if p != values[-1]:
            times.append(i * interval_s)
            values.append(p)
    return StepSeries(tuple(times), tuple(values))


def _capacity_series(o: CloudOffering, end_s: float) -> StepSeries | None:
    if o.preemption is None or o.preemption.capacity_at(0.0) is None:
        return None
    times, values = [0.0], [float(max(0, o.preemption.capacity_at(0.0) or 0))]
    for t, cap in o.preemption.capacity_changes(0.0, end_s):
        if t > times[-1]:
            times.append(t)
            values.append(float(max(0, cap)))
        else:
            values[-1] = float(max(0, cap))
    return StepSeries(tuple(times), tuple(values))


def _most_gpus(o: CloudOffering, end_s: float) -> int | None:
    """The most GPUs ``o`` ever offers in ``[0, end_s]`` (its replayed spot capacity);
    ``None``: no limit (on demand, or a hazard model)."""
    series = _capacity_series(o, end_s)
    return None if series is None else int(max(series.values)) * o.gpus


def floor_problem(
    specs: Sequence[TraceJob],
    result: SimResult,
    *,
    segments: int = DEFAULT_SEGMENTS,
    offerings: Sequence[CloudOffering] | None = None,
) -> FloorProblem:
    """The floor's inputs of a cloud run (see the module docstring): ``specs`` the run's jobs
    (as given to the :class:`~autoscaler.sim.engine.Simulator`), ``result`` its result.
    ``offerings``: the menu the floor may buy from (default: the run's own; give the
    experiment's whole menu for the least *any* fleet could have paid). A job's GPU counts on
    an offering go up to the most GPUs a policy gives it (``max_batch_size //
    min_local_bsz``, or its own request if larger) and the most the offering ever has."""
    cloud = result.config.cloud
    if cloud is None:
        raise ValueError("the cost floor needs a cloud run (SimConfig.cloud)")
    menu = tuple(cloud.offerings if offerings is None else offerings)
    root = None if result.config.traces_root is None else str(result.config.traces_root)
    end_s = max(j.completion_time_s for j in result.jobs)
    floor_offerings = tuple(
        FloorOffering(
            key=o.key,
            gpus_per_instance=o.gpus,
            price_usd_per_hour=_price_series(o, end_s, result.config.interval_s),
            capacity=_capacity_series(o, end_s),
        )
        for o in menu
    )
    most = {o.key: _most_gpus(o, end_s) for o in menu}
    spec_of = {s.name: s for s in specs}
    jobs = []
    for job in result.jobs:
        app = load_app(job.application, traces_dir=result.config.traces_root)
        spec = spec_of[job.name]
        max_gpus = max(1, app.max_batch_size // app.min_local_bsz, spec.num_replicas)
        configs = []
        work: tuple[float, ...] = ()
        for o in menu:
            cap = max_gpus if most[o.key] is None else min(max_gpus, most[o.key] or 0)
            work, env = _envelope_cached(job.application, o.group, max_gpus, segments, root)
            configs += [FloorConfig(o.key, g, rates) for g, rates in env.items() if g <= cap]
        jobs.append(
            FloorJob(
                job_id=job.name,
                application=job.application,
                arrival_s=job.submit_time_s,
                work=work,
                configs=tuple(configs),
                finish_by_s=job.completion_time_s,
            )
        )
    return FloorProblem(tuple(jobs), floor_offerings)


def run_floor(
    specs: Sequence[TraceJob],
    result: SimResult,
    *,
    offerings: Sequence[CloudOffering] | None = None,
) -> dict[str, object]:
    """The floors of a cloud run next to its bill
    (:func:`~autoscaler.analysis.floor.floor_summary`): what :attr:`SimResult.floor
    <autoscaler.sim.results.SimResult.floor>` and the results JSON carry, and ``coadapt cost
    report`` shows. ``offerings``: as in :func:`floor_problem`."""
    if result.cost is None:
        raise ValueError("the cost floor needs a cloud run (SimConfig.cloud)")
    problem = floor_problem(specs, result, offerings=offerings)
    floor = cost_floor(problem)
    by_job = {c.job_id: c.cost_usd for c in job_costs(result.cost)}
    keys = [o.key for o in problem.offerings]
    return floor_summary(floor, summarize(result.cost).total_usd, by_job, offerings=keys)
