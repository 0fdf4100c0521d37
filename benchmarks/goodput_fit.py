"""Throughput-model accuracy and speed on the Pollux traces.

Two protocols per model (all six applications):

* interpolation: fit on a seeded random half of all rows (placements.csv + scalability.csv),
  predict the other half;
* extrapolation: fit on placements.csv (at most 4 nodes), predict scalability.csv (6-16 nodes).

Reports the mean absolute percentage error (MAPE, as a fraction) of step time, the time of one
fit, and the best-config search time per allocation vectorised over 1,000 allocations.

``--form`` picks the growth of the gradient-sync term with the GPU count ``K``:

* ``log2`` (default): ``alpha + beta * log2(K)``, the form :mod:`autoscaler.model.goodput` ships,
  fitted with :func:`autoscaler.model.goodput.fit_perf_params` itself;
* ``linear``: the Pollux paper's ``alpha + beta * (K - 2)``;
* ``sqrt``: ``alpha + beta * sqrt(K)``.

The goodput model has only the ``log2`` form, so ``linear`` and ``sqrt`` are fitted here by
:func:`fit_form`, which minimises the same objective as ``fit_perf_params`` (mean squared
log-error of step times plus that of sync times, inter-node sync >= intra-node) with a generic
optimiser. ``--fitter generic`` fits ``log2`` that way too, to compare like with like.

    python benchmarks/goodput_fit.py --out FILE [--seed 0] [--form linear|log2|sqrt]
        [--fitter production|generic]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoscaler.model.goodput import (
    BatchLimits,
    GoodputModel,
    GradParams,
    ProfileSample,
    fit_perf_params,
)
from autoscaler.model.traces import APPLICATIONS, ThroughputRow, load_app
from coadapt_common.atomic import write_json_atomic


def to_sample(row: ThroughputRow) -> ProfileSample:
    return ProfileSample(
        placement=tuple(row.placement),
        local_bsz=int(row.local_bsz),
        accum_steps=1,
        step_time_s=row.step_time_s,
        sync_time_s=row.sync_time_s,
    )


FORMS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "log2": lambda k: np.log2(k),
    "linear": lambda k: np.maximum(k - 2.0, 0.0),
    "sqrt": lambda k: np.sqrt(k),
}


def _predict(
    x: np.ndarray, form: str, nodes: np.ndarray, gpus: np.ndarray, lbsz: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(step time, sync time) for free vector ``x`` = log alpha_c, log beta_c, log alpha_n,
    log beta_n, log(alpha_r - alpha_n), log(beta_r - beta_n), gamma; one micro-step."""
    e = np.exp(x[:6])
    f = FORMS[form](gpus)
    sync = e[2] + e[3] * f + np.where(nodes > 1, e[4] + e[5] * f, 0.0)
    sync = np.where(gpus > 1, sync, 0.0)
    compute = e[0] + e[1] * lbsz
    g = x[6]
    hi = np.maximum(compute, sync)
    ratio = np.minimum(compute, sync) / hi
    return hi * (1.0 + ratio**g) ** (1.0 / g), sync


def fit_form(rows: list[ThroughputRow], form: str) -> np.ndarray:
    """Fit the free vector of :func:`_predict` for sync form ``form`` (see module docstring)."""
    from scipy.optimize import minimize

    nodes = np.array([r.num_nodes for r in rows], dtype=float)
    gpus = np.array([r.num_gpus for r in rows], dtype=float)
    lbsz = np.array([r.local_bsz for r in rows], dtype=float)
    step = np.array([r.step_time_s for r in rows])
    sync = np.array([r.sync_time_s for r in rows])
    mask = (gpus > 1) & (sync > 1e-3 * step)
    floor = np.log(1e-8)

    def loss(x: np.ndarray) -> float:
        t, s = _predict(x, form, nodes, gpus, lbsz)
        val = float(np.mean((np.log(t) - np.log(step)) ** 2))
        if mask.any():
            val += float(np.mean((np.log(s[mask]) - np.log(sync[mask])) ** 2))
        return val

    s0 = min(rows, key=lambda r: (r.num_gpus, r.local_bsz))
    t_c = max(s0.step_time_s - s0.sync_time_s, 0.5 * s0.step_time_s)
    intra = float(np.mean(sync[(gpus > 1) & (nodes == 1)])) if np.any(nodes == 1) else 1e-3
    inter = float(np.mean(sync[nodes > 1])) if np.any(nodes > 1) else intra
    x0 = np.log(
        [0.1 * t_c, 0.9 * t_c / s0.local_bsz, 0.25 * intra, 0.25 * intra]
        + [max(0.25 * (inter - intra), 1e-6)] * 2
    )
    x0 = np.append(x0, 1.5)
    bounds = [(floor, np.log(1e4))] * 6 + [(1.0, 10.0)]
    res = minimize(loss, x0, method="L-BFGS-B", bounds=bounds, options={"maxiter": 2000})
    return np.asarray(res.x)


def mape(
    train: list[ThroughputRow],
    test: list[ThroughputRow],
    form: str = "log2",
    fitter: str = "production",
) -> tuple[float, float]:
    """(MAPE of step time on ``test`` after fitting on ``train``, fit seconds)."""
    if form != "log2" or fitter == "generic":
        t0 = time.perf_counter()
        x = fit_form(train, form)
        fit_s = time.perf_counter() - t0
        nodes = np.array([r.num_nodes for r in test], dtype=float)
        gpus = np.array([r.num_gpus for r in test], dtype=float)
        lbsz = np.array([r.local_bsz for r in test], dtype=float)
        actual = np.array([r.step_time_s for r in test])
        pred, _ = _predict(x, form, nodes, gpus, lbsz)
        return float(np.mean(np.abs(pred - actual) / actual)), fit_s
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
    ap.add_argument(
        "--form", choices=sorted(FORMS), default="log2", help="sync-time growth with GPUs"
    )
    ap.add_argument(
        "--fitter",
        choices=["production", "generic"],
        default="production",
        help="log2 only: fit with autoscaler.model.goodput (production) or this script's fit_form",
    )
    args = ap.parse_args(argv)
    fitter = "generic" if args.form != "log2" else args.fitter

    import scipy.optimize  # noqa: F401  (import once, so fit_s measures fitting only)

    models: dict[str, dict[str, float]] = {}
    for name in APPLICATIONS:
        rows = list(load_app(name).rows)
        rng = np.random.default_rng(args.seed)
        order = rng.permutation(len(rows))
        half = len(rows) // 2
        train = [rows[i] for i in order[:half]]
        test = [rows[i] for i in order[half:]]
        mape_interp, fit_interp_s = mape(train, test, args.form, fitter)
        placements = [r for r in rows if r.source == "placements"]
        scalability = [r for r in rows if r.source == "scalability"]
        mape_extrap, fit_extrap_s = mape(placements, scalability, args.form, fitter)
        models[name] = {
            "mape_interp": mape_interp,
            "mape_extrap": mape_extrap,
            "fit_s": max(fit_interp_s, fit_extrap_s),
        }
    result = {
        "form": args.form,
        "fitter": fitter,
        "models": models,
        "mape_interp_mean": float(np.mean([m["mape_interp"] for m in models.values()])),
        "mape_extrap_mean": float(np.mean([m["mape_extrap"] for m in models.values()])),
        "search_us_per_alloc": search_us_per_alloc(),
    }
    print(f"sync form {args.form}, fitter {fitter}")
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
