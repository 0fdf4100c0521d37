"""The goodput model batched across jobs (:mod:`autoscaler.model.goodput_batch`): speed and fit
quality.

Workloads (all seeded, ``--seed``):

* ``optimize_many``: ``--jobs`` jobs (2,000) x ``--allocations`` allocations (40: 1-10 nodes x
  1-4 GPUs per node). Job ``j``'s model: a fit of 16 rows of application ``j mod 6`` of the
  Pollux traces, that application's batch limits, random gradient statistics; every fifth job
  has a fixed batch size. Median wall time over ``--repeats``, also at 64 jobs; peak memory
  (``tracemalloc``, which sees numpy's buffers) of one 2,000-job call; and the largest relative
  difference from :meth:`GoodputModel.optimize`, job by job, over ``--check-jobs`` jobs (sizes
  must be equal: ``size_mismatches``).
* ``fit_many`` speed: 2,000 and 64 jobs, each with 16 rows of application ``j mod 6`` drawn at
  random: a cold fit; then every job gets one more row and is refitted warm from its cold fit.
* ``fit_many`` quality: per application and profile size (1, 2, 3, 5, 8, 16, 32 rows drawn at
  random, like a job's online profile), ``--cases`` profiles, fitted by
  :func:`autoscaler.model.goodput.fit_perf_params` and by ``fit_perf_params_many``. Both objectives
  are evaluated by ``fit_objective_many``; ``objective_rel_gap`` is ``(batched - scalar) /
  scalar`` (negative: the batched fit is better); a case is within the bar when the gap is at
  most 1% or the absolute difference at most 1e-4. ``mape_delta_by_app`` is, per application,
  the mean over its cases of the step-time MAPE on all its rows, batched minus scalar;
  ``mape_delta_max`` its maximum. ``warm`` repeats the comparison after one more row per
  profile, the batched fit warm-started from its cold fit.

Prints JSON; ``--out FILE`` also writes it. Runs on one core: ``OPENBLAS_NUM_THREADS=1`` is set
before numpy is imported.

    python benchmarks/goodput_batch.py [--out FILE] [--seed 0] [--jobs 2000] [--allocations 40]
        [--repeats 5] [--cases 20] [--check-jobs 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoscaler.model.goodput import (
    BatchLimits,
    GoodputModel,
    GradParams,
    PerfParams,
    ProfileSample,
    fit_perf_params,
)
from autoscaler.model.goodput_batch import (
    JobArrays,
    fit_objective_many,
    fit_perf_params_many,
    optimize_many,
)
from autoscaler.model.traces import APPLICATIONS, AppTrace, ThroughputRow, load_app
from benchmarks.goodput_fit import to_sample
from coadapt_common.atomic import write_json_atomic

PROFILE_SIZES = (1, 2, 3, 5, 8, 16, 32)


def median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def random_profiles(
    apps: Sequence[AppTrace], n_jobs: int, size: int, rng: np.random.Generator
) -> tuple[list[list[ProfileSample]], list[list[ProfileSample]]]:
    """Per job, ``size`` random rows of application ``j mod 6``; and the same plus one row."""
    sets, longer = [], []
    for j in range(n_jobs):
        rows = apps[j % len(apps)].rows
        idx = rng.choice(len(rows), size=size + 1, replace=False)
        samples = [to_sample(rows[i]) for i in idx]
        sets.append(samples[:size])
        longer.append(samples)
    return sets, longer


def limits_of(app: AppTrace) -> BatchLimits:
    return BatchLimits(
        init_batch_size=app.init_batch_size,
        max_batch_size=app.max_batch_size,
        max_local_bsz=app.max_local_bsz,
        min_local_bsz=app.min_local_bsz,
    )


def bench_optimize(
    apps: Sequence[AppTrace], perf: Sequence[PerfParams], args: argparse.Namespace
) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed + 1)
    n_jobs = len(perf)
    models = [
        GoodputModel(
            perf[j],
            GradParams(float(rng.uniform(0.01, 1.0)), float(rng.uniform(0.01, 10.0))),
            limits_of(apps[j % len(apps)]),
        )
        for j in range(n_jobs)
    ]
    jobs = JobArrays.from_models(models)
    per_node = np.tile(np.arange(1, 5), 10)
    nodes_1 = np.repeat(np.arange(1, 11), 4)
    nodes = np.broadcast_to(nodes_1[: args.allocations], (n_jobs, args.allocations))
    gpus = np.broadcast_to((nodes_1 * per_node)[: args.allocations], (n_jobs, args.allocations))
    fixed = np.where(np.arange(n_jobs) % 5 == 4, jobs.init_batch_size * 2, 0)
    optimize_many(jobs, nodes, gpus, fixed_batch_size=fixed)  # warm caches
    full_s = median_s(
        lambda: optimize_many(jobs, nodes, gpus, fixed_batch_size=fixed), args.repeats
    )
    small = JobArrays.from_models(models[:64])
    small_s = median_s(
        lambda: optimize_many(small, nodes[:64], gpus[:64], fixed_batch_size=fixed[:64]),
        args.repeats * 4,
    )
    tracemalloc.start()
    result = optimize_many(jobs, nodes, gpus, fixed_batch_size=fixed)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    max_rel, mismatches = 0.0, 0
    for j in range(min(args.check_jobs, n_jobs)):
        ref = models[j].optimize(
            nodes[j], gpus[j], fixed_batch_size=int(fixed[j]) if fixed[j] else None
        )
        for name in ("goodput", "throughput", "efficiency"):
            a, b = getattr(result, name)[j], getattr(ref, name)
            rel = np.abs(a - b) / np.maximum(np.abs(b), 1e-300)
            max_rel = max(max_rel, float(rel.max()))
        for name in ("batch_size", "local_bsz", "accum_steps"):
            mismatches += int(np.sum(getattr(result, name)[j] != getattr(ref, name)))
    return {
        "jobs": n_jobs,
        "allocations": args.allocations,
        "candidates": int(n_jobs * args.allocations * 96),
        "median_s": full_s,
        "jobs_64_median_s": small_s,
        "peak_mib": peak / 2**20,
        "checked_jobs": min(args.check_jobs, n_jobs),
        "max_rel_diff_vs_scalar": max_rel,
        "size_mismatches": mismatches,
    }


def mape(model_perf: PerfParams, rows: Sequence[ThroughputRow]) -> float:
    model = GoodputModel(model_perf, GradParams(1.0, 1.0), BatchLimits(1, 1, 1))
    nodes = np.array([r.num_nodes for r in rows])
    gpus = np.array([r.num_gpus for r in rows])
    lbsz = np.array([r.local_bsz for r in rows], dtype=float)
    actual = np.array([r.step_time_s for r in rows])
    pred = model.step_time_s(nodes, gpus, lbsz, np.ones_like(lbsz))
    return float(np.mean(np.abs(pred - actual) / actual))


def compare(
    sets: Sequence[Sequence[ProfileSample]],
    scalar: Sequence[PerfParams],
    batched: Sequence[PerfParams],
) -> dict[str, Any]:
    f_scalar = fit_objective_many(sets, scalar)
    f_batched = fit_objective_many(sets, batched)
    gap = (f_batched - f_scalar) / f_scalar
    diff = f_batched - f_scalar
    within = (gap <= 0.01) | (diff <= 1e-4)
    return {
        "cases": len(sets),
        "within_1pct_frac": float(np.mean(within)),
        "worse_5pct_count": int(np.sum((gap > 0.05) & (diff > 1e-4))),
        "better_1pct_frac": float(np.mean((gap < -0.01) & (diff < -1e-4))),
        "objective_rel_gap_p95": float(np.percentile(gap, 95)),
        "objective_rel_gap_max": float(gap.max()),
    }


def bench_fit_quality(apps: Sequence[AppTrace], args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed + 2)
    cases: list[tuple[str, list[ProfileSample], list[ProfileSample]]] = []
    for app in apps:
        for size in PROFILE_SIZES:
            for _ in range(args.cases):
                idx = rng.choice(len(app.rows), size=size + 1, replace=False)
                samples = [to_sample(app.rows[i]) for i in idx]
                cases.append((app.name, samples[:size], samples))
    sets = [c[1] for c in cases]
    longer = [c[2] for c in cases]
    scalar = [fit_perf_params(s) for s in sets]
    scalar_longer = [fit_perf_params(s) for s in longer]
    batched = fit_perf_params_many(sets)
    batched_warm = fit_perf_params_many(longer, warm=batched)
    out = compare(sets, scalar, batched)
    by_app: dict[str, float] = {}
    worse_cases = 0
    for app in apps:
        sel = [i for i, c in enumerate(cases) if c[0] == app.name]
        m_s = np.array([mape(scalar[i], app.rows) for i in sel])
        m_b = np.array([mape(batched[i], app.rows) for i in sel])
        by_app[app.name] = float(np.mean(m_b) - np.mean(m_s))
        worse_cases += int(np.sum(m_b - m_s > 0.01))
    out["mape_delta_by_app"] = by_app
    out["mape_delta_max"] = max(by_app.values())
    out["mape_case_worse_frac"] = worse_cases / len(cases)
    out["warm"] = compare(longer, scalar_longer, batched_warm)
    return out


def bench_fit_speed(
    apps: Sequence[AppTrace], args: argparse.Namespace
) -> tuple[dict[str, Any], list[PerfParams]]:
    rng = np.random.default_rng(args.seed)
    out: dict[str, Any] = {}
    cold: list[PerfParams] = []
    for n_jobs, repeats in ((args.jobs, args.repeats), (64, args.repeats * 4)):
        sets, longer = random_profiles(apps, n_jobs, 16, rng)
        fits = fit_perf_params_many(sets)
        out[f"cold_{n_jobs}_median_s"] = median_s(partial(fit_perf_params_many, sets), repeats)
        out[f"warm_{n_jobs}_median_s"] = median_s(
            partial(fit_perf_params_many, longer, warm=fits), repeats
        )
        if n_jobs == args.jobs:
            cold = fits
    sets, _ = random_profiles(apps, 30, 16, rng)
    out["scalar_fit_median_s"] = statistics.median(
        median_s(partial(fit_perf_params, s), 1) for s in sets
    )
    return out, cold


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", help="also write the JSON results here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2000, help="jobs of the large workloads")
    ap.add_argument("--allocations", type=int, default=40, help="allocations per job (<= 40)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of the large workloads")
    ap.add_argument("--cases", type=int, default=20, help="profiles per application and size")
    ap.add_argument("--check-jobs", type=int, default=200, help="jobs checked against scalar")
    args = ap.parse_args(argv)
    if not 1 <= args.allocations <= 40:
        ap.error("--allocations must be in [1, 40]")

    import scipy.optimize  # noqa: F401  (import once: the scalar fit imports it lazily)

    apps = [load_app(name) for name in APPLICATIONS]
    speed, cold = bench_fit_speed(apps, args)
    result = {
        "optimize_many": bench_optimize(apps, cold, args),
        "fit_many": {**speed, **bench_fit_quality(apps, args)},
    }
    print(json.dumps(result, indent=2))
    if args.out:
        write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
