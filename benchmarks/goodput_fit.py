"""Throughput-model accuracy and speed on the Pollux traces.

Two protocols per model (all six applications):

* interpolation: fit on a seeded random half of all rows (placements.csv + scalability.csv),
  predict the other half;
* extrapolation: fit on placements.csv (at most 4 nodes), predict scalability.csv (6-16 nodes).

Reports the mean absolute percentage error (MAPE, as a fraction) of step time, the time of one
fit, and the best-config search time per allocation vectorised over 1,000 allocations.

    python benchmarks/goodput_fit.py --out FILE [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoscaler.goodput import (
    BatchLimits,
    GoodputModel,
    GradParams,
    ProfileSample,
    fit_perf_params,
)
from autoscaler.traces import APPLICATIONS, ThroughputRow, load_app
from coadapt_common.atomic import write_json_atomic


def to_sample(row: ThroughputRow) -> ProfileSample:
    return ProfileSample(
        placement=tuple(row.placement),
        local_bsz=int(row.local_bsz),
        accum_steps=1,
        step_time_s=row.step_time_s,
        sync_time_s=row.sync_time_s,
    )


def mape(train: list[ThroughputRow], test: list[ThroughputRow]) -> tuple[float, float]:
    """(MAPE of step time on ``test`` after fitting on ``train``, fit seconds)."""
    samples = [to_sample(r) for r in train]
    t0 = time.perf_counter()
    perf = fit_perf_params(samples)
    fit_s = time.perf_counter() - t0
    model = GoodputModel(perf, GradParams(1.0, 1.0), BatchLimits(1, 1, 1))
    nodes = np.array([r.num_nodes for r in test])
    gpus = np.array([r.num_gpus for r in test])
    lbsz = np.array([r.local_bsz for r in test], dtype=float)
    actual = np.array([r.step_time_s for r in test])
    pred = model.step_time_s(nodes, gpus, lbsz, np.ones_like(lbsz))
    return float(np.mean(np.abs(pred - actual) / actual)), fit_s


def search_us_per_alloc(repeats: int = 20) -> float:
    """Median time of one vectorised best-config search over 1,000 allocations, per allocation."""
    app = load_app("cifar10")
    perf = fit_perf_params([to_sample(r) for r in app.rows])
    limits = BatchLimits(
        init_batch_size=app.init_batch_size,
        max_batch_size=app.max_batch_size,
        max_local_bsz=app.max_local_bsz,
        min_local_bsz=app.min_local_bsz,
    )
    model = GoodputModel(perf, GradParams(0.5, 2.0), limits)
    rng = np.random.default_rng(0)
    nodes = rng.integers(1, 17, size=1000)
    gpus = nodes * rng.integers(1, 5, size=1000)
    model.optimize(nodes, gpus)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.optimize(nodes, gpus)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / 1000 * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, help="where to write the JSON results")
    ap.add_argument("--seed", type=int, default=0, help="seed of the interpolation split")
    args = ap.parse_args(argv)

    import scipy.optimize  # noqa: F401  (import once, so fit_s measures fitting only)

    models: dict[str, dict[str, float]] = {}
    for name in APPLICATIONS:
        rows = list(load_app(name).rows)
        rng = np.random.default_rng(args.seed)
        order = rng.permutation(len(rows))
        half = len(rows) // 2
        train = [rows[i] for i in order[:half]]
        test = [rows[i] for i in order[half:]]
        mape_interp, fit_interp_s = mape(train, test)
        placements = [r for r in rows if r.source == "placements"]
        scalability = [r for r in rows if r.source == "scalability"]
        mape_extrap, fit_extrap_s = mape(placements, scalability)
        models[name] = {
            "mape_interp": mape_interp,
            "mape_extrap": mape_extrap,
            "fit_s": max(fit_interp_s, fit_extrap_s),
        }
    result = {
        "models": models,
        "mape_interp_mean": float(np.mean([m["mape_interp"] for m in models.values()])),
        "mape_extrap_mean": float(np.mean([m["mape_extrap"] for m in models.values()])),
        "search_us_per_alloc": search_us_per_alloc(),
    }
    print(f"{'model':<12} {'interp':>8} {'extrap':>8} {'fit_s':>7}")
    for name, m in models.items():
        print(f"{name:<12} {m['mape_interp']:>8.3f} {m['mape_extrap']:>8.3f} {m['fit_s']:>7.3f}")
    print(
        f"{'mean':<12} {result['mape_interp_mean']:>8.3f} {result['mape_extrap_mean']:>8.3f}\n"
        f"best-config search: {result['search_us_per_alloc']:.1f} us per allocation (1,000)"
    )
    write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
